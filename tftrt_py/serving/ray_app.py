"""tftrt-serve on Ray Serve: replicas serving TF Serving's REST API (the app of tftrt-serve's REST port: predict,
status, metadata, health, metrics), batching by our scheduler or Ray's `@serve.batch`, one replica per GPU or per
`num_cpus` cores, autoscaling between min_replicas and max_replicas. Needs the `ray` extra.

    serve run tftrt_py.serving.ray_app:build_app model_name=cnn model_base_path=/models/cnn batching=ray
    serve deploy serve_config.yaml   # import_path: tftrt_py.serving.ray_app:build_app, args: as RayAppArgs

Not `from __future__ import annotations`: Ray reads build_app's annotation to validate its arguments.
"""
import dataclasses
import logging
from typing import List, Literal, Optional

import pydantic
from ray import serve
from ray.serve import Application

from tftrt_py.serving.batching import BatchScheduler
from tftrt_py.serving.config import BatchingOptions, ModelSpec, read_batching_parameters_file, read_model_config_file
from tftrt_py.serving.ray_batching import RayBatchScheduler

logger = logging.getLogger(__name__)

__all__ = ["RayAppArgs", "TftrtServing", "build_app"]

#: the batching setting -> its scheduler (None: off)
SCHEDULERS = {"off": None, "tftrt": BatchScheduler, "ray": RayBatchScheduler}


class RayAppArgs(pydantic.BaseModel):
    """build_app's arguments (`serve run ... key=value`, or `args:` of a `serve deploy` config)."""

    model_config = pydantic.ConfigDict(extra="forbid", protected_namespaces=())

    #: the models, as tftrt-serve's flags: one by name and base path, or a text-proto ModelServerConfig
    model_name: str = "default"
    model_base_path: Optional[str] = None
    model_config_file: Optional[str] = None
    #: "tftrt": our scheduler (TF Serving's semantics), "ray": Ray Serve's @serve.batch, "off"
    batching: Literal[tuple(SCHEDULERS)] = "off"
    #: a text-proto BatchingParameters; the fields below override it (either scheduler reads them all)
    batching_parameters_file: Optional[str] = None
    max_batch_size: Optional[int] = None
    batch_timeout_micros: Optional[int] = None
    max_enqueued_batches: Optional[int] = None
    num_batch_threads: Optional[int] = None
    allowed_batch_sizes: Optional[List[int]] = None
    #: per replica: GPUs (None: 1 where there are GPUs, else 0) and CPU cores (TF's intra-op threads on the CPU)
    num_gpus: Optional[float] = None
    num_cpus: float = 1
    #: replicas: a fixed count (min_replicas == max_replicas) or autoscaling on ongoing requests per replica
    min_replicas: int = pydantic.Field(1, ge=0)
    max_replicas: int = pydantic.Field(1, ge=1)
    target_ongoing_requests: float = 32
    #: requests a replica takes at once (>= max_batch_size, or batches cannot fill) and REST threads
    max_ongoing_requests: int = 64
    rest_threads: int = 64
    #: seconds between a replica's looks for model versions to load and unload (TF Serving's flag and default; 0:
    #: only at start): a new version loads beside the old one, which unloads once the new one serves
    file_system_poll_wait_seconds: float = pydantic.Field(1, ge=0)
    #: times each of a version's warm-up requests (assets.extra/tf_serving_warmup_requests) runs before it serves,
    #: as tftrt-serve's --num_request_iterations_for_warmup (0: no warm-up): a replica is running once warm
    num_request_iterations_for_warmup: int = pydantic.Field(1, ge=0)
    #: Ray Serve's access log, a line per request in each replica's log (Ray's default); off by default here, as in
    #: tftrt-serve and TF Serving: in a profile of a replica, formatting and writing it took 6% of its Python time
    access_log: bool = False

    def models(self) -> List[ModelSpec]:
        if self.model_config_file:
            return read_model_config_file(self.model_config_file)
        if not self.model_base_path:
            raise ValueError("give model_base_path (one model) or model_config_file (several)")
        return [ModelSpec(self.model_name, self.model_base_path)]

    def batching_options(self) -> Optional[BatchingOptions]:
        if self.batching == "off":
            return None
        overrides = {f.name: getattr(self, f.name) for f in dataclasses.fields(BatchingOptions)
                     if getattr(self, f.name) is not None}
        if "allowed_batch_sizes" in overrides:
            overrides["allowed_batch_sizes"] = tuple(overrides["allowed_batch_sizes"])
        return dataclasses.replace(read_batching_parameters_file(self.batching_parameters_file), **overrides)

    def replica_gpus(self) -> float:
        """num_gpus, or 1 when the Ray cluster (if connected) or else this machine has a GPU."""
        if self.num_gpus is not None:
            return self.num_gpus
        import ray

        if ray.is_initialized():
            return 1.0 if ray.cluster_resources().get("GPU", 0) > 0 else 0.0
        from tftrt_py.engine.backends import cupy

        return 1.0 if cupy.available()[0] else 0.0

    def deployment_options(self, gpus: float) -> dict:
        """Ray Serve deployment options: replica resources, replica count or autoscaling, ongoing requests."""
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) < min_replicas ({self.min_replicas})")
        options = {"ray_actor_options": {"num_cpus": self.num_cpus, **({"num_gpus": gpus} if gpus else {})},
                   "max_ongoing_requests": self.max_ongoing_requests,
                   "logging_config": {"enable_access_log": self.access_log}}
        if self.min_replicas == self.max_replicas:
            options["num_replicas"] = self.min_replicas
        else:
            options["autoscaling_config"] = {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                                             "target_ongoing_requests": self.target_ongoing_requests}
        return options


@serve.deployment
@serve.ingress()
class TftrtServing:
    """One replica: loads the models, serves them with tftrt-serve's REST app (create_app over a Service)."""

    def __init__(self, models: List[ModelSpec], batching: str, options: Optional[BatchingOptions],
                 rest_threads: int, tf_threads: int, poll_seconds: float = 0, warmup_iterations: int = 1):
        import tensorflow as tf

        from tftrt_py.serving.models import ModelManager
        from tftrt_py.serving.service import Service
        from tftrt_py.serving.warmup import warmer

        if tf_threads:
            tf.config.threading.set_intra_op_parallelism_threads(tf_threads)
        self.service = Service(ModelManager(models, warmer(warmup_iterations)), options,
                               SCHEDULERS[batching] or BatchScheduler)
        self.rest_threads = rest_threads
        try:
            self.service.manager.load()
            if poll_seconds > 0:
                self.service.manager.start_polling(poll_seconds)
        except BaseException:
            self.service.close()
            raise
        logger.info("replica serving %s (batching %s)", ", ".join(m.name for m in models), batching)

    def __serve_build_asgi_app__(self):
        from tftrt_py.serving.rest import create_app

        return create_app(self.service, self.rest_threads)

    def __del__(self):
        if hasattr(self, "service"):  # not when __init__ failed before making it
            self.service.manager.stop_polling()
            self.service.close()


def build_app(args: RayAppArgs) -> Application:
    """The Ray Serve application `args` describe (a dict is validated as RayAppArgs)."""
    if not isinstance(args, RayAppArgs):
        args = RayAppArgs.model_validate(args)
    options = args.batching_options()
    if options is not None and args.max_ongoing_requests < options.max_batch_size:
        logger.warning("max_ongoing_requests %d < max_batch_size %d: a replica's batches cannot fill",
                       args.max_ongoing_requests, options.max_batch_size)
    gpus = args.replica_gpus()
    tf_threads = 0 if gpus else max(1, int(args.num_cpus))
    return TftrtServing.options(**args.deployment_options(gpus)).bind(
        args.models(), args.batching, options, args.rest_threads, tf_threads, args.file_system_poll_wait_seconds,
        args.num_request_iterations_for_warmup)
