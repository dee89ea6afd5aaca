"""What the server serves and how it batches: models (name, base path, version policy, labels) and TF Serving's
text-proto files (ModelServerConfig, BatchingParameters), parsed by protobuf's text format, never evaluated."""
from __future__ import annotations

import dataclasses
import os
from typing import Iterable, List, Optional, Tuple

__all__ = ["VersionPolicy", "ModelSpec", "BatchingOptions", "parse_model_config", "parse_batching_parameters",
           "read_model_config_file", "read_batching_parameters_file"]


@dataclasses.dataclass(frozen=True)
class VersionPolicy:
    """Which versions under a base path are served: TF Serving's latest {num_versions} (default 1), all {},
    specific {versions}."""

    kind: str = "latest"
    num_versions: int = 1
    versions: Tuple[int, ...] = ()

    def select(self, available: Iterable[int]) -> List[int]:
        available = sorted(available)
        if self.kind == "all":
            return available
        if self.kind == "specific":
            return [v for v in available if v in self.versions]
        return available[-self.num_versions:] if self.num_versions > 0 else []


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One served model: versions live in numbered folders `<base_path>/<version>/`."""

    name: str
    base_path: str
    version_policy: VersionPolicy = VersionPolicy()
    version_labels: Tuple[Tuple[str, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class BatchingOptions:
    """TF Serving's BatchingParameters, with its scheduler's defaults."""

    max_batch_size: int = 1000
    batch_timeout_micros: int = 0
    max_enqueued_batches: int = 10
    num_batch_threads: int = dataclasses.field(default_factory=lambda: len(os.sched_getaffinity(0)))
    allowed_batch_sizes: Tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"batching parameter {name} must be >= 1, got {getattr(self, name)}")
        if self.batch_timeout_micros < 0:
            raise ValueError(f"batching parameter batch_timeout_micros must be >= 0, got {self.batch_timeout_micros}")
        sizes = self.allowed_batch_sizes
        if sizes and (any(b <= a for a, b in zip(sizes, sizes[1:])) or sizes[0] < 1):
            raise ValueError(f"allowed_batch_sizes must be positive and increasing, got {list(sizes)}")
        if sizes and sizes[-1] != self.max_batch_size:
            raise ValueError(f"the last entry of allowed_batch_sizes ({sizes[-1]}) must equal max_batch_size "
                             f"({self.max_batch_size})")

    def padded_size(self, size: int) -> int:
        """The smallest allowed batch size holding `size` rows (`size` itself when none are given)."""
        return next((s for s in self.allowed_batch_sizes if s >= size), size)


def _policy(config) -> VersionPolicy:
    which = config.model_version_policy.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy("all")
    if which == "specific":
        versions = tuple(config.model_version_policy.specific.versions)
        if not versions:
            raise ValueError(f"model {config.name!r}: model_version_policy specific {{}} lists no versions")
        return VersionPolicy("specific", versions=versions)
    if which == "latest" and config.model_version_policy.latest.num_versions:
        return VersionPolicy("latest", num_versions=config.model_version_policy.latest.num_versions)
    return VersionPolicy()


def parse_model_config(text: str) -> List[ModelSpec]:
    """The models of a text-proto ModelServerConfig (`model_config_list { config { ... } }`); base paths are
    taken as written (relative ones from the working directory, as TF Serving does)."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    try:
        config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    except text_format.ParseError as exc:
        raise ValueError(f"model config is not a text-proto ModelServerConfig: {exc}") from None
    if config.WhichOneof("config") is None:
        raise ValueError("model config lists no models")
    if config.WhichOneof("config") != "model_config_list":
        raise ValueError("model config: only model_config_list is supported (custom_model_config is not)")
    specs, names = [], set()
    for model in config.model_config_list.config:
        if not model.name or not model.base_path:
            raise ValueError(f"model config: every config needs a name and a base_path (got {model.name!r}, "
                             f"{model.base_path!r})")
        if model.name in names:
            raise ValueError(f"model config: model {model.name!r} is listed twice")
        if model.model_platform not in ("", "tensorflow"):
            raise ValueError(f"model {model.name!r}: model_platform {model.model_platform!r} is not served "
                             f"(only 'tensorflow')")
        names.add(model.name)
        specs.append(ModelSpec(model.name, model.base_path, _policy(model),
                               tuple(sorted(model.version_labels.items()))))
    if not specs:
        raise ValueError("model config lists no models")
    return specs


def read_model_config_file(path: str) -> List[ModelSpec]:
    with open(path) as f:
        return parse_model_config(f.read())


_BATCHING_PARAMETERS = None


def _batching_parameters_class():
    """BatchingParameters of TF Serving's session_bundle_config.proto (the tensorflow-serving-api package does not
    ship it): built from a descriptor with the proto's field names, numbers and types."""
    global _BATCHING_PARAMETERS
    if _BATCHING_PARAMETERS is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2

        F = descriptor_pb2.FieldDescriptorProto
        file = descriptor_pb2.FileDescriptorProto(
            name="tftrt_py/serving/session_bundle_config.proto", package="tensorflow.serving", syntax="proto3",
            dependency=["google/protobuf/wrappers.proto"])
        message = file.message_type.add(name="BatchingParameters")
        fields = [("max_batch_size", F.TYPE_MESSAGE, ".google.protobuf.Int64Value", F.LABEL_OPTIONAL),
                  ("batch_timeout_micros", F.TYPE_MESSAGE, ".google.protobuf.Int64Value", F.LABEL_OPTIONAL),
                  ("max_enqueued_batches", F.TYPE_MESSAGE, ".google.protobuf.Int64Value", F.LABEL_OPTIONAL),
                  ("num_batch_threads", F.TYPE_MESSAGE, ".google.protobuf.Int64Value", F.LABEL_OPTIONAL),
                  ("thread_pool_name", F.TYPE_MESSAGE, ".google.protobuf.StringValue", F.LABEL_OPTIONAL),
                  ("allowed_batch_sizes", F.TYPE_INT64, None, F.LABEL_REPEATED),
                  ("pad_variable_length_inputs", F.TYPE_BOOL, None, F.LABEL_OPTIONAL)]
        for number, (name, type_, type_name, label) in enumerate(fields, 1):
            message.field.add(name=name, number=number, type=type_, label=label, json_name=name,
                              **({"type_name": type_name} if type_name else {}))
        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
        pool.AddSerializedFile(file.SerializeToString())
        _BATCHING_PARAMETERS = message_factory.GetMessageClass(
            pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters"))
    return _BATCHING_PARAMETERS


def parse_batching_parameters(text: str) -> BatchingOptions:
    """BatchingOptions from a text-proto BatchingParameters (`max_batch_size { value: 32 }` ...)."""
    from google.protobuf import text_format

    try:
        params = text_format.Parse(text, _batching_parameters_class()())
    except text_format.ParseError as exc:
        raise ValueError(f"batching parameters are not a text-proto BatchingParameters: {exc}") from None
    if params.pad_variable_length_inputs:
        raise ValueError("pad_variable_length_inputs is not supported: requests merge only when their non-batch "
                         "dimensions are equal; remove it from the batching parameters")
    values = {name: getattr(params, name).value for name in
              ("max_batch_size", "batch_timeout_micros", "max_enqueued_batches", "num_batch_threads")
              if params.HasField(name)}
    return BatchingOptions(allowed_batch_sizes=tuple(params.allowed_batch_sizes), **values)


def read_batching_parameters_file(path: Optional[str]) -> BatchingOptions:
    """The batching parameters in `path`, or TF Serving's defaults when there is none."""
    if path is None:
        return BatchingOptions()
    with open(path) as f:
        return parse_batching_parameters(f.read())
