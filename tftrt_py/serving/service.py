"""What both front ends (REST and gRPC) serve: model resolution, predict (batched or not), status and metadata
as TF Serving's protos, with each request counted and timed."""
from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import Executor, Future, InvalidStateError
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.serving.batching import BatchScheduler
from tftrt_py.serving.config import BatchingOptions
from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.metrics import Metrics
from tftrt_py.serving.models import ModelManager, Servable, Signature, VersionTable

__all__ = ["ServiceBase", "Service"]

STATUS_CODES = {"START": 10, "LOADING": 20, "AVAILABLE": 30, "UNLOADING": 40, "END": 50}  # ModelVersionStatus.State


def _queue_id(servable: Servable, signature: Signature) -> tuple:
    """The batching queue of a signature: requests batch with those to the same signature of the same version."""
    return servable.name, servable.version, signature.name


class ServiceBase:
    """What the front ends call, but predicting: request counting, model resolution, status and metadata over
    `manager`'s versions. Service predicts in this process; a front-end worker process's service sends predicts
    to the model process."""

    def __init__(self, manager: VersionTable, metrics: Metrics):
        self.manager, self.metrics = manager, metrics

    def close(self) -> None:
        """Release what the service holds (nothing here)."""

    @contextlib.contextmanager
    def request(self, model: str, api: str):
        """Count and time the request in the block by its outcome (status code name)."""
        start, status = time.perf_counter(), "OK"
        try:
            yield
        except ServingError as exc:
            status = exc.code.name
            raise
        except asyncio.CancelledError:  # an async front end's client went away
            status = "CANCELLED"
            raise
        except Exception:
            status = "INTERNAL"
            raise
        finally:  # unknown model names share one label: clients cannot grow the metrics without bound
            label = model if model in self.manager.specs else ""
            self.metrics.observe_request(label, api, status, time.perf_counter() - start)

    def resolve(self, model: str, version: Optional[int], label: Optional[str],
                signature_name: str) -> Tuple[Servable, Signature]:
        servable = self.manager.servable(model, version, label)
        return servable, servable.signature(signature_name)

    def status(self, model: str, version: Optional[int] = None, label: Optional[str] = None):
        """A GetModelStatusResponse."""
        from tensorflow_serving.apis import get_model_status_pb2

        response = get_model_status_pb2.GetModelStatusResponse()
        for status in self.manager.status(model, version, label):
            entry = response.model_version_status.add(version=status.version, state=STATUS_CODES[status.state])
            entry.status.SetInParent()  # TF Serving always writes it: error_code OK, error_message ""
            if status.error:
                entry.status.error_code = 13  # tensorflow.error.Code.INTERNAL
                entry.status.error_message = status.error
        return response

    def metadata(self, model: str, version: Optional[int] = None, label: Optional[str] = None,
                 fields: Sequence[str] = ("signature_def",)):
        """(GetModelMetadataResponse, SignatureDefMap): TF Serving's only metadata field is signature_def."""
        from tensorflow_serving.apis import get_model_metadata_pb2

        unsupported = sorted(set(fields) - {"signature_def"})
        if unsupported or not fields:
            raise ServingError(Code.INVALID_ARGUMENT, f"Metadata field(s) {unsupported or '(none)'} not supported: "
                                                      f"ask for signature_def")
        servable = self.manager.servable(model, version, label)
        signature_defs = get_model_metadata_pb2.SignatureDefMap()
        for key, value in servable.signature_defs.items():
            signature_defs.signature_def[key].CopyFrom(value)
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = servable.name
        response.model_spec.version.value = servable.version
        response.metadata["signature_def"].Pack(signature_defs)
        return response, signature_defs


class Service(ServiceBase):
    """Requests to the models of `manager`; with `batching`, predict calls of one signature run in batches on a
    `scheduler` (a class with BatchScheduler's constructor, submit, queue_depths and stop)."""

    def __init__(self, manager: ModelManager, batching: Optional[BatchingOptions] = None,
                 scheduler: Callable[..., BatchScheduler] = BatchScheduler):
        super().__init__(manager, Metrics(lambda: self.scheduler.queue_depths() if self.scheduler else {}))
        self.scheduler: Optional[BatchScheduler] = None
        if batching is not None:
            self.scheduler = scheduler(batching, on_batch=self.metrics.observe_batch)

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()

    async def predict(self, servable: Servable, signature: Signature, arrays: Mapping[str, np.ndarray],
                      output_filter: Sequence[str] = (), executor: Optional[Executor] = None) -> Dict[str, np.ndarray]:
        """submit's outputs, awaited on the running loop: a batched request waits there for its batch, whose
        answers to this loop all come in one wake-up of the loop."""
        if self.scheduler is None:
            return await asyncio.wrap_future(self.submit(servable, signature, arrays, output_filter, executor))
        arrays = signature.check(arrays)
        names = signature.output_names(output_filter)
        outputs = await self.enqueue(servable, signature, arrays, asyncio.get_running_loop())
        return {k: outputs[k] for k in names}

    def enqueue(self, servable: Servable, signature: Signature, arrays: Mapping[str, np.ndarray], loop):
        """With batching: a future of `loop` for all the signature's outputs for `arrays` (checked by
        signature.check), computed in a batch. `loop` is an asyncio loop, or any object with its create_future()
        and call_soon_threadsafe(callback, *args): the answers of one batch to the requests of one loop are set
        by one call on it."""
        return self.scheduler.submit(_queue_id(servable, signature), signature.run, arrays, servable.name, loop=loop)

    def submit(self, servable: Servable, signature: Signature, arrays: Mapping[str, np.ndarray],
               output_filter: Sequence[str] = (), executor: Optional[Executor] = None) -> Future:
        """A future of the signature's outputs (those in `output_filter`, else all) for `arrays`: the batch's (a
        caller may await it without holding a thread), or, without batching, one run on `executor` (None: computed
        here before it returns). Cancelling it drops the answer, not the run."""
        arrays = signature.check(arrays)
        names = signature.output_names(output_filter)
        if self.scheduler is not None:
            source = self.scheduler.submit(_queue_id(servable, signature), signature.run, arrays, servable.name)
        elif executor is not None:
            source = executor.submit(signature.run, arrays)
        else:
            source = Future()
            source.set_result(signature.run(arrays))
        result: Future = Future()

        def pick(done: Future) -> None:
            try:
                if done.exception() is not None:
                    result.set_exception(done.exception())
                else:
                    outputs = done.result()
                    result.set_result({k: outputs[k] for k in names})
            except InvalidStateError:  # the caller cancelled (its client went away)
                pass
        source.add_done_callback(pick)
        return result
