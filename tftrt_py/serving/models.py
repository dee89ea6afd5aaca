"""Served models: versions found under each base path, loaded with tf.saved_model.load (engine op registered
first), their signatures as the SavedModel declares them, status and lookup by version or label; versions load and
unload as the base path's folders come and go."""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
import threading
import weakref
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from tftrt_py.serving.batch_buffers import ALIGN
from tftrt_py.serving.config import ModelSpec
from tftrt_py.serving.errors import Code, ServingError

logger = logging.getLogger(__name__)

__all__ = ["TensorSpec", "SignatureSpec", "Signature", "ServableSpec", "Servable", "VersionStatus", "VersionTable",
           "ModelManager", "SERVE_TAG", "eager_tensor"]

SERVE_TAG = "serve"
INIT_OP_SIGNATURE = "__saved_model_init_op"
#: Refreshes that collect garbage again while an unloaded version is still referenced (requests in flight).
UNLOAD_COLLECTIONS = 10


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A signature tensor: numpy dtype (object for strings) and shape (None: unknown dim; shape None: any rank)."""

    dtype: np.dtype
    shape: Optional[Tuple[Optional[int], ...]]

    def describe(self) -> str:
        dims = "?" if self.shape is None else "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"
        return f"{self.dtype.name if self.dtype != object else 'string'}{dims}"


class SignatureSpec:
    """A signature's name and tensors, and the checks of request tensors against them: what a front end needs,
    without the function (picklable: front-end worker processes hold these)."""

    def __init__(self, name: str, inputs: Mapping[str, TensorSpec], outputs: Mapping[str, TensorSpec]):
        self.name = name
        self.inputs: Dict[str, TensorSpec] = dict(inputs)
        self.outputs: Dict[str, TensorSpec] = dict(outputs)

    def spec(self) -> "SignatureSpec":
        """This signature without its function."""
        return SignatureSpec(self.name, self.inputs, self.outputs)

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


class Signature(SignatureSpec):
    """One SignatureDef of a servable: checks request tensors against its inputs, runs its function."""

    def __init__(self, name: str, signature_def, function):
        from tensorflow import dtypes

        def spec(info):
            dtype = dtypes.as_dtype(info.dtype)
            shape = None if info.tensor_shape.unknown_rank else tuple(
                None if d.size < 0 else d.size for d in info.tensor_shape.dim)
            return TensorSpec(np.dtype(object) if dtype == dtypes.string else np.dtype(dtype.as_numpy_dtype), shape)

        super().__init__(name, {k: spec(v) for k, v in sorted(signature_def.inputs.items())},
                         {k: spec(v) for k, v in sorted(signature_def.outputs.items())})
        self._function = function

    def run(self, arrays: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
        """The signature's outputs for checked inputs; a failure of the model is INVALID_ARGUMENT, as TF
        Serving reports a Session::Run error."""
        import tensorflow as tf

        try:
            outputs = self._function(**{k: eager_tensor(v) for k, v in arrays.items()})
        except (tf.errors.OpError, ValueError, TypeError) as exc:
            raise ServingError(Code.INVALID_ARGUMENT, getattr(exc, "message", None) or str(exc)) from None
        return {k: v.numpy() for k, v in outputs.items()}


def eager_tensor(array: np.ndarray):
    """`array` as an eager tensor, reading the array's own memory (DLPack: no copy of a 19 MB batch) where
    TensorFlow can (C-contiguous, on ALIGN bytes, a numeric or bool dtype) and the array is writable (read-only
    views are of memory that another process may still write: a request arena's), else a copy."""
    import tensorflow as tf

    if array.flags.c_contiguous and array.flags.writeable and array.ctypes.data % ALIGN == 0 and \
            array.dtype.isnative and array.dtype.kind in "biufc":
        return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
    return tf.constant(array)


class ServableSpec:
    """A loaded version as front ends see it: its SignatureDefs (what metadata answers) and its signatures'
    specs; picklable, as front-end worker processes hold it."""

    def __init__(self, name: str, version: int, signature_defs: Mapping, signatures: Mapping[str, SignatureSpec]):
        self.name, self.version = name, version
        self.signature_defs = signature_defs
        self.signatures = dict(signatures)

    def signature(self, name: str) -> SignatureSpec:
        found = self.signatures.get(name or "serving_default")
        if found is None:
            raise ServingError(Code.INVALID_ARGUMENT, f'Serving signature name: "{name or "serving_default"}" not '
                                                      f"found in signature def")
        return found

    def spec(self) -> "ServableSpec":
        """This version without its model: SignatureDefs and signature specs."""
        return ServableSpec(self.name, self.version, dict(self.signature_defs),
                            {k: v.spec() for k, v in self.signatures.items()})


class Servable(ServableSpec):
    """One loaded version of a model."""

    def __init__(self, name: str, version: int, path: str):
        import tensorflow as tf
        from tensorflow.python.saved_model import loader_impl

        import tftrt_py.trt_convert  # noqa: F401  registers TRTEngineOp before loading

        self.path = path
        saved_model = loader_impl.parse_saved_model(path)
        graph = next((m for m in saved_model.meta_graphs if SERVE_TAG in m.meta_info_def.tags), None)
        if graph is None:
            raise ValueError(f"{path} has no meta graph tagged {SERVE_TAG!r}")
        self._loaded = tf.saved_model.load(path, tags=[SERVE_TAG])
        super().__init__(name, version, graph.signature_def, {
            k: Signature(k, v, self._loaded.signatures[k])
            for k, v in graph.signature_def.items() if k != INIT_OP_SIGNATURE})


@dataclasses.dataclass(frozen=True)
class VersionStatus:
    """TF Serving's ModelVersionStatus: state START/LOADING/AVAILABLE/UNLOADING/END, with the load error if any."""

    version: int
    state: str = "START"
    error: str = ""


def _versions(base_path: str) -> List[int]:
    """Numbered folders holding a SavedModel under `base_path` (OSError when it cannot be listed)."""
    return sorted(int(d) for d in os.listdir(base_path) if d.isdigit()
                  and os.path.isfile(os.path.join(base_path, d, "saved_model.pb")))


def _collect_and_freeze() -> None:
    """One full collection over every object, frozen ones included, then freeze the survivors again.

    Frozen objects (gc.freeze) are never examined by the cyclic collector: it keeps the collections that run on
    the request path small (TF and the loaded models are ~340k objects; a full collection over them stops every
    request for ~180 ms: batched gRPC p99 ~200 ms, frozen ~32 ms). But TF's function objects hold reference
    cycles, so an unloaded version left frozen would never be freed, nor garbage its loading made. Unfreezing
    for one collection after a load or an unload frees both (requests pause once, ~0.2-0.35 s on a 2-core CPU
    host); freezing again restores the small collections.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class VersionTable:
    """The served versions of each model and every selected version's status: lookup by version or label, as
    requests resolve them. ModelManager keeps one up to date; a front-end worker process holds a copy
    (VersionTable.copy of the manager's `snapshot()`), replaced whenever the manager's changes."""

    def __init__(self, specs: Sequence[ModelSpec]):
        self.specs = {s.name: s for s in specs}
        self._servables: Dict[str, Dict[int, ServableSpec]] = {s.name: {} for s in specs}
        self._status: Dict[str, Dict[int, VersionStatus]] = {s.name: {} for s in specs}
        self._lock = threading.Lock()  # guards _servables and _status

    @classmethod
    def copy(cls, specs: Sequence[ModelSpec], snapshot) -> "VersionTable":
        """A table of `snapshot()`'s content."""
        table = cls(specs)
        servables, status = snapshot
        table._servables.update(servables)
        table._status.update(status)
        return table

    def snapshot(self):
        """(servable specs, statuses) by model and version: what a copy holds (picklable)."""
        with self._lock:
            return ({name: {v: s.spec() for v, s in versions.items()} for name, versions in self._servables.items()},
                    {name: dict(versions) for name, versions in self._status.items()})

    def state(self) -> tuple:
        """What a copy must be refreshed on when it changes: the statuses of every version (hashable)."""
        with self._lock:
            return tuple((name, tuple(sorted(versions.items()))) for name, versions in sorted(self._status.items()))

    @property
    def ready(self) -> bool:
        with self._lock:
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

    def servable(self, name: str, version: Optional[int] = None,
                 label: Optional[str] = None) -> ServableSpec:
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
        """Every version's status, or the one asked for (NOT_FOUND when it was never selected); an unloaded
        version stays END."""
        version = self._version_for(name, version, label)
        with self._lock:
            statuses = dict(self._status[name])
        if version is None:
            return [statuses[v] for v in sorted(statuses)]
        if version not in statuses:
            raise ServingError(Code.NOT_FOUND, f"Could not find version {version} of model {name}")
        return [statuses[version]]

    def servables(self) -> List[ServableSpec]:
        with self._lock:
            return [s for versions in self._servables.values() for s in versions.values()]

class ModelManager(VersionTable):
    """Serves the versions each ModelSpec's policy selects among the numbered folders of its base path.

    `load()` loads them once; `refresh()` looks again, loads the versions newly selected, then unloads those no
    longer selected (folder gone, or a newer one takes their place), as TF Serving's availability-preserving
    policy does: while a model has selected versions but none of them is AVAILABLE (its load failed), its newest
    unselected version keeps serving. `start_polling(seconds)` refreshes every `seconds` on a thread of
    its own, off the request path. A version that failed to load is tried again only once it has left the
    selection and come back. `warm_up(servable)`, when given, runs on each version loaded before it is AVAILABLE
    (serving.warmup replays its warm-up requests); an exception from it fails the version's load.
    """

    def __init__(self, specs: Sequence[ModelSpec], warm_up: Optional[Callable[[Servable], object]] = None):
        super().__init__(specs)
        self._warm_up = warm_up
        self._failed: Dict[str, Set[int]] = {s.name: set() for s in specs}
        self._unlisted: Set[str] = set()  # models whose base path could not be listed at the last refresh
        #: unloaded versions not freed yet (a request in flight held them at the last collection) -> weak references
        #: to the servable and its signatures (none once they went: one collection more), and the refreshes that
        #: collected since: each refresh collects again until they go, at most UNLOAD_COLLECTIONS times
        self._dropped: Dict[Tuple[str, int], Tuple[List[weakref.ref], int]] = {}
        self._refreshing = threading.Lock()
        self._stop = threading.Event()
        self._poller: Optional[threading.Thread] = None

    def load(self) -> None:
        """Load every selected version; a model none of whose versions loads is an error (ValueError)."""
        self.refresh()
        for spec in self.specs.values():
            if spec.name in self._unlisted or not self._status[spec.name]:
                raise ValueError(f"model {spec.name!r}: no version to serve under {spec.base_path!r} (expected "
                                 f"numbered folders <base_path>/<version>/saved_model.pb)")
            if not self._servables[spec.name]:
                raise ValueError(f"model {spec.name!r}: no version loaded: " + "; ".join(
                    f"{s.version}: {s.error}" for s in self._status[spec.name].values()))

    def refresh(self) -> bool:
        """Load the versions the policies newly select, then unload the versions no longer selected; True when
        a version was loaded or unloaded. Requests are served meanwhile."""
        with self._refreshing:
            unloaded: List[Tuple[str, int]] = []
            loaded = False
            for spec in self.specs.values():
                selected = self._selected(spec)
                if selected is None:
                    continue
                loaded |= self._load_new(spec, selected)
                unloaded += [(spec.name, v) for v in self._unload_unselected(spec.name, selected)]
            if loaded or unloaded or self._dropped:
                _collect_and_freeze()
            for key, (refs, collections) in list(self._dropped.items()):
                if not refs:  # freed before the last collection, which took what their finalizers left
                    del self._dropped[key]
                elif all(ref() is None for ref in refs):
                    # one collection more before they are forgotten: the finalizers of what this one freed (TF's
                    # functions, releasing their kernels and engine ops) can leave garbage of their own, which a
                    # frozen heap would keep
                    self._dropped[key] = ([], collections + 1)
                elif collections + 1 >= UNLOAD_COLLECTIONS:
                    logger.warning("model %s version %d is still referenced after %d collections", *key,
                                   UNLOAD_COLLECTIONS)
                    del self._dropped[key]
                else:
                    self._dropped[key] = (refs, collections + 1)
            with self._lock:
                for name, version in unloaded:
                    self._status[name][version] = VersionStatus(version, "END")
            for name, version in unloaded:
                logger.info("model %s version %d unloaded", name, version)
            return loaded or bool(unloaded)

    def _selected(self, spec: ModelSpec) -> Optional[Set[int]]:
        """The versions `spec`'s policy selects now; None when its base path cannot be listed (TF Serving
        keeps what it serves then)."""
        try:
            found = _versions(spec.base_path)
        except OSError as exc:
            if spec.name not in self._unlisted:
                logger.warning("model %s: cannot list %s (%s): its versions stay as they are", spec.name,
                               spec.base_path, exc)
            self._unlisted.add(spec.name)
            return None
        self._unlisted.discard(spec.name)
        return set(spec.version_policy.select(found))

    def _load_new(self, spec: ModelSpec, selected: Set[int]) -> bool:
        """Load the selected versions not loaded yet (newest first, as TF Serving); True when one loaded."""
        failed = self._failed[spec.name]
        failed &= selected  # a failed version that left the selection is tried again when it comes back
        with self._lock:
            new = selected - set(self._servables[spec.name]) - failed
        loaded = False
        for version in sorted(new, reverse=True):
            if self._stop.is_set():
                break
            if self._load(spec.name, version, os.path.join(spec.base_path, str(version))):
                loaded = True
            else:
                failed.add(version)
        return loaded

    def _load(self, name: str, version: int, path: str) -> bool:
        with self._lock:
            self._status[name][version] = VersionStatus(version, "LOADING")
        try:
            servable = Servable(name, version, path)
            if self._warm_up is not None:
                self._warm_up(servable)
        except Exception as exc:  # a broken version is reported in its status, the others still serve
            logger.error("model %s version %d failed to load from %s: %s", name, version, path, exc)
            with self._lock:
                self._status[name][version] = VersionStatus(version, "END", f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            self._servables[name][version] = servable
            self._status[name][version] = VersionStatus(version, "AVAILABLE")
        logger.info("model %s version %d loaded from %s", name, version, path)
        return True

    def _unload_unselected(self, name: str, selected: Set[int]) -> List[int]:
        """Stop serving the loaded versions `selected` lacks (but the newest of them while selected versions
        exist and none is AVAILABLE); the versions unloaded. Requests resolve them no more; what the server
        held of them goes with the references dropped here, once requests in flight finish."""
        with self._lock:
            loaded = self._servables[name]
            going = sorted(set(loaded) - selected)
            if going and selected and not selected & set(loaded):
                going.pop()  # availability: the newest unselected version serves until a selected one can
            for version in going:
                servable = loaded.pop(version)
                self._status[name][version] = VersionStatus(version, "UNLOADING")
                self._dropped[(name, version)] = (
                    [weakref.ref(servable)] + [weakref.ref(s) for s in servable.signatures.values()], 0)
        return going

    def start_polling(self, seconds: float) -> None:
        """Refresh every `seconds` on a daemon thread until stop_polling()."""
        if seconds <= 0:
            raise ValueError(f"poll interval must be > 0 seconds, got {seconds}")
        self._stop.clear()
        self._poller = threading.Thread(target=self._poll, args=(seconds,), name="tftrt-serve-poll", daemon=True)
        self._poller.start()

    def stop_polling(self) -> None:
        """Stop the poll thread (a load in progress finishes first; versions not yet started are left)."""
        if self._poller is not None:
            self._stop.set()
            self._poller.join()
            self._poller = None
            self._stop.clear()

    def _poll(self, seconds: float) -> None:
        while not self._stop.wait(seconds):
            try:
                self.refresh()
            except Exception:  # a bug here must not end the polling: the next poll tries again
                logger.exception("refreshing the served model versions failed")
