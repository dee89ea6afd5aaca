"""TF Serving's SavedModel warm-up: requests stored with a version, replayed when it loads, before it serves.

A version folder may hold ``assets.extra/tf_serving_warmup_requests``: a TFRecord file of at most MAX_RECORDS
``PredictionLog`` protos. Each predict log's request runs on the version's signature `iterations` times (TF
Serving's --num_request_iterations_for_warmup), so what a model does on its first calls happens at load: TensorFlow
builds its kernels, an engine op builds the engines and execution contexts for the request's shapes, and copies of
its row-wise engines for smaller batches. Those copies build on background threads (engine_op.buckets; cuDNN's
runtime compilation holds the GIL for seconds meanwhile), so the load then waits for them: the version is
AVAILABLE once its engines serve at full speed. A warm-up request that fails fails the load, as in TF Serving.
Classify, regress and multi-inference logs are skipped (the server answers predicts only), with a warning.
"""
from __future__ import annotations

import functools
import logging
import os
from typing import Callable, Optional

from tftrt_py.serving.tensors import from_tensor_proto

__all__ = ["WARMUP_PATH", "MAX_RECORDS", "warm_up", "warmer"]

logger = logging.getLogger(__name__)

#: The warm-up file, relative to the version folder.
WARMUP_PATH = os.path.join("assets.extra", "tf_serving_warmup_requests")
#: TF Serving's limit on warm-up records.
MAX_RECORDS = 1000
#: Seconds the load waits for the engine copies the warm-up started.
BUILD_WAIT_S = 600.0


def warmer(iterations: int) -> Optional[Callable[[object], int]]:
    """What a ModelManager runs on each version it loads: warm_up `iterations` times (None for 0: no warm-up)."""
    return functools.partial(warm_up, iterations=iterations) if iterations > 0 else None


def warm_up(servable, iterations: int) -> int:
    """Replay the warm-up requests of `servable`'s version folder `iterations` times; the predict requests run
    (0 without a warm-up file). ValueError names the record that is malformed, refused or failed."""
    path = os.path.join(servable.path, WARMUP_PATH)
    if iterations <= 0 or not os.path.isfile(path):
        return 0
    ran = skipped = 0
    for index, request in _predict_requests(path):
        if request is None:
            skipped += 1
            continue
        try:
            signature = servable.signature(request.model_spec.signature_name or "serving_default")
            arrays = signature.check({k: from_tensor_proto(k, v) for k, v in request.inputs.items()})
            for _ in range(iterations):
                signature.run(arrays)
        except Exception as exc:  # a ServingError's message or another failure: the version does not load
            raise ValueError(f"warm-up request {index} of {path} failed: {getattr(exc, 'message', None) or exc}"
                             ) from None
        ran += 1
    if skipped:
        logger.warning("%s: %d warm-up record(s) skipped: only predict logs are replayed (classify, regress and "
                       "multi-inference are not served)", path, skipped)
    from tftrt_py.engine_op import dispatcher

    dispatcher.wait_for_builds(BUILD_WAIT_S)
    logger.info("model %s version %d warmed up: %d request(s), %d time(s) each", servable.name, servable.version,
                ran, iterations)
    return ran


def _predict_requests(path: str):
    """(record index, PredictRequest, or None for another kind of log) for each record of the TFRecord file `path`,
    read one at a time; ValueError at a record that is not a PredictionLog, or past MAX_RECORDS records."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    from tensorflow_serving.apis import prediction_log_pb2

    index = 0
    try:
        for index, record in enumerate(tf.data.TFRecordDataset(path).take(MAX_RECORDS + 1)):
            if index == MAX_RECORDS:
                raise ValueError(f"{path} holds more than {MAX_RECORDS} warm-up records: keep at most "
                                 f"{MAX_RECORDS}")
            log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
            yield index, log.predict_log.request if log.WhichOneof("log_type") == "predict_log" else None
    except DecodeError as exc:
        raise ValueError(f"warm-up record {index} of {path} is not a PredictionLog: {exc}") from None
    except tf.errors.OpError as exc:  # a truncated or corrupt TFRecord
        raise ValueError(f"{path} is not a readable TFRecord file: {exc.message}") from None
