"""Served models: versions found under each base path, loaded with tf.saved_model.load (engine op registered
first), their signatures as the SavedModel declares them, status and lookup by version or label."""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
import threading
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.serving.config import ModelSpec
from tftrt_py.serving.errors import Code, ServingError

logger = logging.getLogger(__name__)

__all__ = ["TensorSpec", "Signature", "Servable", "VersionStatus", "ModelManager", "SERVE_TAG"]

SERVE_TAG = "serve"
INIT_OP_SIGNATURE = "__saved_model_init_op"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A signature input: numpy dtype (object for strings) and shape (None: unknown dim; shape None: any rank)."""

    dtype: np.dtype
    shape: Optional[Tuple[Optional[int], ...]]

    def describe(self) -> str:
        dims = "?" if self.shape is None else "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"
        return f"{self.dtype.name if self.dtype != object else 'string'}{dims}"


class Signature:
    """One SignatureDef of a servable: checks request tensors against its inputs, runs its function."""

    def __init__(self, name: str, signature_def, function):
        from tensorflow import dtypes

        def spec(info):
            dtype = dtypes.as_dtype(info.dtype)
            shape = None if info.tensor_shape.unknown_rank else tuple(
                None if d.size < 0 else d.size for d in info.tensor_shape.dim)
            return TensorSpec(np.dtype(object) if dtype == dtypes.string else np.dtype(dtype.as_numpy_dtype), shape)

        self.name = name
        self.inputs: Dict[str, TensorSpec] = {k: spec(v) for k, v in sorted(signature_def.inputs.items())}
        self.outputs: List[str] = sorted(signature_def.outputs)
        self._function = function

    def check_names(self, names) -> None:
        """INVALID_ARGUMENT unless `names` are exactly this signature's input names."""
        missing = sorted(set(self.inputs) - set(names))
        extra = sorted(set(names) - set(self.inputs))
        if missing or extra:
            what = f"input tensor alias not found in signature: {', '.join(extra)}" if extra else \
                f"missing input(s) {', '.join(missing)}"
            raise ServingError(Code.INVALID_ARGUMENT, f"{what}. Inputs expected to be in the set "
                                                      f"{{{', '.join(self.inputs)}}}.")

    def check(self, arrays: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """`arrays` if they are exactly this signature's inputs with its dtypes and shapes, else INVALID_ARGUMENT."""
        self.check_names(arrays)
        for name, array in arrays.items():
            spec = self.inputs[name]
            if array.dtype != spec.dtype:
                raise ServingError(Code.INVALID_ARGUMENT, f"input {name!r}: expects {spec.describe()}, got "
                                                          f"{array.dtype.name} {list(array.shape)}")
            if spec.shape is not None and (array.ndim != len(spec.shape) or any(
                    d is not None and d != n for d, n in zip(spec.shape, array.shape))):
                raise ServingError(Code.INVALID_ARGUMENT, f"input {name!r}: expects shape {spec.describe()}, got "
                                                          f"{list(array.shape)}")
        return dict(arrays)

    def output_names(self, output_filter: Sequence[str] = ()) -> List[str]:
        unknown = sorted(set(output_filter) - set(self.outputs))
        if unknown:
            raise ServingError(Code.INVALID_ARGUMENT, f"output tensor alias not found in signature: "
                                                      f"{', '.join(unknown)}. Outputs expected to be in the set "
                                                      f"{{{', '.join(self.outputs)}}}.")
        return [n for n in self.outputs if n in output_filter] if output_filter else list(self.outputs)

    def run(self, arrays: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """The signature's outputs for checked inputs; a failure of the model is INVALID_ARGUMENT, as TF
        Serving reports a Session::Run error."""
        import tensorflow as tf

        try:
            outputs = self._function(**{k: tf.constant(v) for k, v in arrays.items()})
        except (tf.errors.OpError, ValueError, TypeError) as exc:
            raise ServingError(Code.INVALID_ARGUMENT, getattr(exc, "message", None) or str(exc)) from None
        return {k: v.numpy() for k, v in outputs.items()}


class Servable:
    """One loaded version of a model."""

    def __init__(self, name: str, version: int, path: str):
        import tensorflow as tf
        from tensorflow.python.saved_model import loader_impl

        import tftrt_py.trt_convert  # noqa: F401  registers TRTEngineOp before loading

        self.name, self.version, self.path = name, version, path
        saved_model = loader_impl.parse_saved_model(path)
        graph = next((m for m in saved_model.meta_graphs if SERVE_TAG in m.meta_info_def.tags), None)
        if graph is None:
            raise ValueError(f"{path} has no meta graph tagged {SERVE_TAG!r}")
        self.signature_defs = graph.signature_def  # what metadata answers
        self._loaded = tf.saved_model.load(path, tags=[SERVE_TAG])
        self.signatures = {k: Signature(k, v, self._loaded.signatures[k])
                           for k, v in graph.signature_def.items() if k != INIT_OP_SIGNATURE}

    def signature(self, name: str) -> Signature:
        found = self.signatures.get(name or "serving_default")
        if found is None:
            raise ServingError(Code.INVALID_ARGUMENT, f'Serving signature name: "{name or "serving_default"}" not '
                                                      f"found in signature def")
        return found


@dataclasses.dataclass
class VersionStatus:
    """TF Serving's ModelVersionStatus: state START/LOADING/AVAILABLE/END, with the load error if any."""

    version: int
    state: str = "START"
    error: str = ""


def _versions(base_path: str) -> List[int]:
    """Numbered folders holding a SavedModel under `base_path`."""
    if not os.path.isdir(base_path):
        return []
    return sorted(int(d) for d in os.listdir(base_path) if d.isdigit()
                  and os.path.isfile(os.path.join(base_path, d, "saved_model.pb")))


class ModelManager:
    """Loads the versions each ModelSpec's policy selects and resolves requests to servables."""

    def __init__(self, specs: Sequence[ModelSpec]):
        self.specs = {s.name: s for s in specs}
        self._servables: Dict[str, Dict[int, Servable]] = {s.name: {} for s in specs}
        self._status: Dict[str, Dict[int, VersionStatus]] = {s.name: {} for s in specs}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load every selected version; a model none of whose versions loads is an error (ValueError). Then
        freeze what is alive (gc.freeze): TF and the loaded models are ~340k objects, and a full garbage
        collection over them stops every request for ~180 ms (batched gRPC load runs: p99 ~200 ms, frozen ~32 ms)."""
        for spec in self.specs.values():
            versions = spec.version_policy.select(_versions(spec.base_path))
            if not versions:
                raise ValueError(f"model {spec.name!r}: no version to serve under {spec.base_path!r} (expected "
                                 f"numbered folders <base_path>/<version>/saved_model.pb)")
            for version in versions:
                self._load(spec.name, version, os.path.join(spec.base_path, str(version)))
            if not self._servables[spec.name]:
                raise ValueError(f"model {spec.name!r}: no version loaded: " + "; ".join(
                    f"{s.version}: {s.error}" for s in self._status[spec.name].values()))
        gc.collect()
        gc.freeze()

    def _load(self, name: str, version: int, path: str) -> None:
        status = self._status[name][version] = VersionStatus(version, "LOADING")
        try:
            servable = Servable(name, version, path)
        except Exception as exc:  # a broken version is reported in its status, the others still serve
            logger.error("model %s version %d failed to load from %s: %s", name, version, path, exc)
            status.state, status.error = "END", f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self._servables[name][version] = servable
        status.state = "AVAILABLE"
        logger.info("model %s version %d loaded from %s", name, version, path)

    @property
    def ready(self) -> bool:
        return all(self._servables.values())

    def _version_for(self, name: str, version: Optional[int], label: Optional[str]) -> Optional[int]:
        if name not in self.specs:
            raise ServingError(Code.NOT_FOUND, f"Servable not found for request: Latest({name})")
        if label is not None:
            labels = dict(self.specs[name].version_labels)
            if label not in labels:
                raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")
            return labels[label]
        return version

    def servable(self, name: str, version: Optional[int] = None, label: Optional[str] = None) -> Servable:
        """The servable of `name` at `version` (or the version `label` names; else the latest loaded)."""
        version = self._version_for(name, version, label)
        with self._lock:
            loaded = self._servables.get(name, {})
            if version is None and loaded:
                return loaded[max(loaded)]
            if version in loaded:
                return loaded[version]
        request = f"Latest({name})" if version is None else f"Specific({name}, {version})"
        raise ServingError(Code.NOT_FOUND, f"Servable not found for request: {request}")

    def status(self, name: str, version: Optional[int] = None, label: Optional[str] = None) -> List[VersionStatus]:
        """Every version's status, or the one asked for (NOT_FOUND when it was never selected)."""
        version = self._version_for(name, version, label)
        statuses = self._status[name]
        if version is None:
            return [statuses[v] for v in sorted(statuses)]
        if version not in statuses:
            raise ServingError(Code.NOT_FOUND, f"Could not find version {version} of model {name}")
        return [statuses[version]]

    def servables(self) -> List[Servable]:
        with self._lock:
            return [s for versions in self._servables.values() for s in versions.values()]
