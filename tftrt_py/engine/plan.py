"""The plan file: an engine serialized without any executable content.

Layout (little endian)::

    b"TFTRTPLN" | u32 format version | u64 header length | JSON header | zero pad to 64
    | weight blobs, each 64-byte aligned | 32-byte SHA-256 of everything before it

The header holds the network (bindings, layers, params, where each weight lies), the
precision, tactics, build config, target device, the bytes its tensors take (``memory_bytes``)
and the digest of what it was built for (``binding``: see the engine op's dispatcher). Loading
parses JSON and reads raw arrays with ``np.frombuffer``: no pickle, no eval. Every header field
is checked (types, shapes, weight locations inside the weight data, each layer's params against
its kind's schema, layer outputs against its shape rule) so a damaged plan whose checksum was recomputed
still fails with a PlanError. A plan must also fit the machine: the most memory its layers hold at once and the
work they declare (see :mod:`budget`) are checked against the limits before anything runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import struct
from typing import Dict, List, Optional

import numpy as np

from tftrt_py.engine import budget
from tftrt_py.engine import layers as layer_kinds
from tftrt_py.engine import params as param_schemas
from tftrt_py.engine.errors import PlanError
from tftrt_py.engine.network import Layer, Network, Tensor
from tftrt_py.engine.profile import OptimizationProfile
from tftrt_py.engine.types import DTYPES, PRECISIONS, dtype_name

__all__ = ["MAGIC", "FORMAT_VERSION", "MAX_VOLUME", "Plan", "PlanWriter", "serialize", "deserialize", "read_header"]

MAGIC = b"TFTRTPLN"
FORMAT_VERSION = 2
ALIGN = 64
#: Most elements one tensor may hold (TensorRT's limit on a tensor's volume).
MAX_VOLUME = 2 ** 31 - 1
_PREFIX = struct.Struct("<8sIQ")
_DIGEST = 32
_WEIGHT_DTYPES = tuple(DTYPES) + ("float64",)
_DIGEST_TEXT = re.compile(r"[0-9a-f]{64}")


def _pad(n: int) -> int:
    return (-n) % ALIGN


def serialize(engine) -> bytes:
    """Plan bytes for `engine` (an :class:`~tftrt_py.engine.runtime.Engine`)."""
    out = io.BytesIO()
    PlanWriter(engine).write(out)
    return out.getvalue()


class PlanWriter:
    """The plan of one engine, written to a file as it is made: each weight goes from its array to the file
    (and into the checksum) without a copy, so a plan of any size costs no memory beyond its header.
    ``size`` is known before writing (an engine cache file records it ahead of the plan)."""

    def __init__(self, engine, binding: Optional[str] = None):
        """`binding`: the digest written in place of the engine's own (an op whose segment a save rewrote without
        changing what it computes, see convert.segment_weights)."""
        net = engine.network
        self._arrays: List[np.ndarray] = []
        offset = 0

        def put(array: np.ndarray) -> dict:
            nonlocal offset
            data = np.ascontiguousarray(array)
            ref = {"offset": offset, "nbytes": data.nbytes, "dtype": array.dtype.name, "shape": list(array.shape)}
            self._arrays.append(data)
            offset += data.nbytes + _pad(data.nbytes)
            return ref

        def tensor(t: Tensor) -> dict:
            return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "dynamic_range": t.dynamic_range}

        header = {
            "name": net.name,
            "binding": binding if binding is not None else getattr(engine, "binding", None),
            "memory_bytes": _tensor_bytes(net.inputs + [t for l in net.layers for t in l.outputs]),
            "precision": engine.precision,
            "backend": engine.backend_name,
            "device": engine.device,
            "build_config": engine.build_config,
            "tactics": engine.tactics,
            "inputs": [tensor(t) for t in net.inputs],
            "outputs": [t.name for t in net.outputs],
            "layers": [{"name": l.name, "kind": l.kind, "precision": l.precision,
                        "inputs": [t.name for t in l.inputs], "outputs": [tensor(t) for t in l.outputs],
                        "params": l.params, "weights": {k: put(v) for k, v in l.weights.items()}}
                       for l in net.layers],
        }
        if getattr(engine, "profile", None) is not None:
            header["profile"] = engine.profile.as_dict()
        header["blob_bytes"] = offset
        head = json.dumps(header, separators=(",", ":")).encode()
        head = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)) + head
        self._head = head + b"\0" * _pad(len(head))
        self.size = len(self._head) + offset + _DIGEST

    def write(self, f) -> int:
        """Write the plan to binary file `f`; the bytes written (``size``)."""
        digest = hashlib.sha256(self._head)
        f.write(self._head)
        for array in self._arrays:
            for chunk in (memoryview(array.reshape(-1)).cast("B"), b"\0" * _pad(array.nbytes)):
                digest.update(chunk)
                f.write(chunk)
        f.write(digest.digest())
        return self.size


def _tensor_bytes(tensors) -> int:
    """Bytes the tensors take: what running the network allocates at most (weights aside)."""
    return sum(int(np.prod(t.shape, dtype=object)) * np.dtype(t.dtype).itemsize for t in tensors)


def read_header(data: bytes, backend: Optional[str] = None) -> dict:
    """Validate framing, checksum and header fields; return the JSON header (with ``_blob_start``). Limits are
    those of `backend` (default: the plan's)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PlanError(f"a plan is bytes, got {type(data).__name__}")
    data = bytes(data)
    if not MAGIC.startswith(data[:len(MAGIC)]):
        raise PlanError(f"not a tftrt_py plan (magic {data[:len(MAGIC)]!r}, expected {MAGIC!r})")
    if len(data) < _PREFIX.size + _DIGEST:
        raise PlanError(f"plan is truncated: {len(data)} bytes is shorter than any plan")
    magic, version, head_len = _PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise PlanError(f"plan format version {version} is not supported by this tftrt_py (reads version "
                        f"{FORMAT_VERSION}); rebuild the engine with this version")
    head_end = _PREFIX.size + head_len
    if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        size = _claimed_size(data, head_end)
        what = "corrupted"
        if head_end > len(data) - _DIGEST or (size or 0) > len(data):
            what = "truncated" + (f" ({len(data)} bytes, its header says {size})" if size else "")
        raise PlanError(f"plan checksum mismatch: the file is {what}; re-export it from the converted model")
    if head_end > len(data) - _DIGEST:
        raise PlanError(f"plan header length {head_len} runs past the end of the plan ({len(data)} bytes)")
    try:
        header = json.loads(data[_PREFIX.size:head_end].decode())
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, an over-long integer, absurd nesting
        raise PlanError(f"plan header is not valid JSON: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise PlanError(f"plan header is a JSON {type(header).__name__}, expected an object")
    blob_bytes = _int(header.get("blob_bytes"), "blob_bytes")
    blob_start = head_end + _pad(head_end)
    if blob_start + blob_bytes != len(data) - _DIGEST:
        raise PlanError(f"plan is truncated: the header says {blob_bytes} bytes of weight data, the plan holds "
                        f"{len(data) - _DIGEST - blob_start}")
    _check_header(header, blob_bytes, backend)
    header["_blob_start"] = blob_start
    return header


def _claimed_size(data: bytes, head_end: int):
    """The plan size its (unverified) header implies, or None when that cannot be read."""
    try:
        blob_bytes = json.loads(data[_PREFIX.size:head_end].decode()).get("blob_bytes")
    except (ValueError, RecursionError, AttributeError):
        return None
    if not isinstance(blob_bytes, int):
        return None
    return head_end + _pad(head_end) + blob_bytes + _DIGEST


# -- header checks --------------------------------------------------------------
def _fail(path: str, what: str):
    raise PlanError(f"plan header field {path} {what}")


def _int(value, path: str, low: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        _fail(path, f"is {_show(value)}, expected an integer")
    if value < low:
        _fail(path, f"is {value}, expected at least {low}")
    return value


def _of(value, kind, path: str, optional: bool = False):
    if value is None and optional:
        return value
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        _fail(path, f"is {_show(value)}, expected {'an optional ' if optional else 'a '}{names}")
    return value


def _show(value) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _dtype(value, path: str, allowed) -> None:
    if not isinstance(value, str) or value not in allowed:
        _fail(path, f"is {_show(value)}, expected one of {', '.join(allowed)}")


def _shape(value, path: str) -> List[int]:
    _of(value, list, path)
    volume = 1
    for i, d in enumerate(value):
        volume *= _int(d, f"{path}[{i}]")
    if volume > MAX_VOLUME:
        _fail(path, f"is {_show(value)}: {volume} elements exceeds the limit of {MAX_VOLUME} per tensor")
    return value


def _tensor(value, path: str) -> None:
    _of(value, dict, path)
    _of(value.get("name"), str, f"{path}.name")
    _dtype(value.get("dtype"), f"{path}.dtype", DTYPES)
    _shape(value.get("shape"), f"{path}.shape")
    rng = _of(value.get("dynamic_range"), (int, float), f"{path}.dynamic_range", optional=True)
    if rng is not None and not 0 <= rng < float("inf"):
        _fail(f"{path}.dynamic_range", f"is {_show(rng)}, expected a finite number >= 0")


def _weight(ref, path: str, blob_bytes: int) -> None:
    _of(ref, dict, path)
    _dtype(ref.get("dtype"), f"{path}.dtype", _WEIGHT_DTYPES)
    shape = _shape(ref.get("shape"), f"{path}.shape")
    offset = _int(ref.get("offset"), f"{path}.offset")
    nbytes = _int(ref.get("nbytes"), f"{path}.nbytes")
    if offset % ALIGN:
        _fail(f"{path}.offset", f"is {offset}, not a multiple of {ALIGN}")
    if offset + nbytes > blob_bytes:
        _fail(path, f"lies at bytes {offset}..{offset + nbytes}, outside the weight data (0..{blob_bytes})")
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(ref["dtype"]).itemsize
    if nbytes != expected:
        _fail(f"{path}.nbytes", f"is {nbytes}, but a {ref['dtype']} array of shape {shape} takes {expected}")


def _check_header(header: dict, blob_bytes: int, backend: Optional[str] = None) -> None:
    """Types and ranges of every field deserialize() reads; PlanError names the first bad one."""
    _of(header.get("name"), str, "name")
    _dtype(header.get("precision"), "precision", PRECISIONS)
    planned = _of(header.get("backend", "numpy"), str, "backend")
    _of(header.get("device"), str, "device", optional=True)
    _of(header.get("build_config"), dict, "build_config", optional=True)
    _of(header.get("tactics"), dict, "tactics", optional=True)
    binding = _of(header.get("binding"), str, "binding", optional=True)
    if binding is not None and not _DIGEST_TEXT.fullmatch(binding):
        _fail("binding", f"is {_show(binding)}, expected a SHA-256 hex digest")
    workspace = (header.get("build_config") or {}).get("max_workspace_size", 0)
    limit = budget.engine_bytes_limit(backend or planned)
    if _int(workspace, "build_config.max_workspace_size") > limit.value:
        _fail("build_config.max_workspace_size", f"is {workspace}, more than the {limit.value} bytes one engine may "
                                                 f"take here ({limit.source}); set {budget.MAX_ENGINE_BYTES_ENV} to "
                                                 f"allow more")
    for i, t in enumerate(_of(header.get("inputs"), list, "inputs")):
        _tensor(t, f"inputs[{i}]")
    for i, name in enumerate(_of(header.get("outputs"), list, "outputs")):
        _of(name, str, f"outputs[{i}]")
    for i, spec in enumerate(_of(header.get("layers"), list, "layers")):
        path = f"layers[{i}]"
        _of(spec, dict, path)
        _of(spec.get("name"), str, f"{path}.name")
        _of(spec.get("kind"), str, f"{path}.kind")
        if spec.get("precision") is not None:
            _dtype(spec["precision"], f"{path}.precision", PRECISIONS)
        for j, name in enumerate(_of(spec.get("inputs"), list, f"{path}.inputs")):
            _of(name, str, f"{path}.inputs[{j}]")
        for j, t in enumerate(_of(spec.get("outputs"), list, f"{path}.outputs")):
            _tensor(t, f"{path}.outputs[{j}]")
        _of(spec.get("params"), dict, f"{path}.params")
        for key, ref in _of(spec.get("weights"), dict, f"{path}.weights").items():
            _weight(ref, f"{path}.weights[{key!r}]", blob_bytes)
    _profile(header.get("profile"), len(header["inputs"]))
    _memory(header)


def _memory(header: dict) -> None:
    """The header's memory_bytes is what its tensor shapes take together."""
    declared = _int(header.get("memory_bytes"), "memory_bytes")
    tensors = header["inputs"] + [t for spec in header["layers"] for t in spec["outputs"]]
    total = sum(int(np.prod(t["shape"], dtype=object)) * np.dtype(t["dtype"]).itemsize for t in tensors)
    if declared != total:
        _fail("memory_bytes", f"is {declared}, but the plan's tensor shapes take {total} bytes")


def _profile(value, n_inputs: int) -> None:
    """The optional optimization profile: min/opt/max shape lists, one shape per input, min <= opt <= max."""
    if _of(value, dict, "profile", optional=True) is None:
        return
    for part in ("min", "opt", "max"):
        shapes = _of(value.get(part), list, f"profile.{part}")
        if len(shapes) != n_inputs:
            _fail(f"profile.{part}", f"has {len(shapes)} shapes for {n_inputs} inputs")
        for i, shape in enumerate(shapes):
            _shape(shape, f"profile.{part}[{i}]")
    try:
        OptimizationProfile.from_dict(value)
    except ValueError as exc:
        _fail("profile", f"is invalid: {exc}")


# -- network -------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    """What a plan holds: the optimized network and what the engine running it needs to know."""

    network: Network
    precision: str
    backend: str
    build_config: Optional[dict]
    tactics: Optional[dict]  # None: chosen again (the plan was tuned for another backend)
    device: Optional[str]
    profile: Optional[OptimizationProfile]
    binding: Optional[str]


def deserialize(data: bytes, backend: Optional[str] = None) -> Plan:
    """The network and metadata of plan bytes, for `backend` (default: the plan's); raises PlanError naming what
    is wrong. A plan holds backend-neutral layers: another backend runs it too, re-tuning its tactics.
    """
    header = read_header(data, backend)
    data = bytes(data)
    base = header["_blob_start"]
    tensors: Dict[str, Tensor] = {}

    def weight(ref: dict) -> np.ndarray:
        count = int(np.prod(ref["shape"], dtype=np.int64))
        return np.frombuffer(data, dtype=ref["dtype"], count=count, offset=base + ref["offset"]).reshape(ref["shape"])

    def define(t: dict, producer=None) -> Tensor:
        if t["name"] in tensors:
            raise PlanError(f"plan defines tensor {t['name']!r} twice")
        tensor = tensors[t["name"]] = Tensor(t["name"], t["dtype"], tuple(t["shape"]), producer=producer,
                                             dynamic_range=t.get("dynamic_range"))
        return tensor

    net = Network(header["name"])
    net.inputs = [define(t) for t in header["inputs"]]
    for spec in header["layers"]:
        missing = [n for n in spec["inputs"] if n not in tensors]
        if missing:
            raise PlanError(f"plan layer {spec['name']!r} reads {missing}, which no earlier layer or input defines")
        layer = Layer(spec["name"], spec["kind"], [tensors[n] for n in spec["inputs"]], [], spec["params"],
                      {k: weight(v) for k, v in spec["weights"].items()}, spec.get("precision"))
        layer.outputs = [define(t, producer=layer) for t in spec["outputs"]]
        _check_layer(layer)
        net.layers.append(layer)
    missing = [n for n in header["outputs"] if n not in tensors]
    if missing:
        raise PlanError(f"plan outputs {missing} are not produced by any layer or input")
    net.outputs = [tensors[n] for n in header["outputs"]]
    planned = header.get("backend", "numpy")
    backend = backend or planned
    _check_budget(net, backend)
    try:
        net.lint()
    except Exception as exc:
        raise PlanError(f"plan header is inconsistent ({type(exc).__name__}: {exc})") from None
    profile = header.get("profile")
    return Plan(net, precision=header["precision"], backend=backend, build_config=header.get("build_config"),
                tactics=header.get("tactics") if backend == planned else None, device=header.get("device"),
                profile=profile and OptimizationProfile.from_dict(profile), binding=header.get("binding"))


def _check_budget(net: Network, backend: str) -> None:
    """The most memory the network holds at once and the work it declares are within this machine's limits."""
    peak, limit = budget.peak_memory(net), budget.engine_bytes_limit(backend)
    if peak.total > limit.value:
        raise PlanError(f"plan {net.name!r} needs {budget.size(peak.total)} at once ({peak.describe()}), more than "
                        f"the {budget.size(limit.value)} one engine may take here ({limit.source}); set "
                        f"{budget.MAX_ENGINE_BYTES_ENV} (bytes) to allow more")
    work, limit = budget.declared_work(net), budget.engine_work_limit()
    if work.total > limit.value:
        raise PlanError(f"plan {net.name!r} declares {work.total:.3g} multiply-adds of work ({work.heaviest}: "
                        f"{work.heaviest_work:.3g}), more than the {limit.value:.3g} one engine may declare "
                        f"({limit.source}); set {budget.MAX_ENGINE_WORK_ENV} to allow more")


def _check_layer(layer: Layer) -> None:
    """The layer's params fit its kind's schema; its outputs are what the kind's shape rule gives."""
    try:
        spec = layer_kinds.get(layer.kind)
        param_schemas.check(layer, spec.params)
        infos = spec.infer(layer)
        inferred = [(dtype_name(d), tuple(int(x) for x in s)) for d, s in infos]
    except Exception as exc:  # shape rules are pure: any error means params that do not fit
        raise PlanError(f"plan layer {layer.name!r} ({layer.kind}) is invalid: {type(exc).__name__}: {exc}") from None
    recorded = [(t.dtype, t.shape) for t in layer.outputs]
    if inferred != recorded:
        raise PlanError(f"plan layer {layer.name!r} ({layer.kind}) records outputs "
                        f"{[(d, list(s)) for d, s in recorded]} but its inputs and params give "
                        f"{[(d, list(s)) for d, s in inferred]}")
