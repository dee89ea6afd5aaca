"""The plan file: an engine serialized without any executable content.

Layout (little endian)::

    b"TFTRTPLN" | u32 format version | u64 header length | JSON header | zero pad to 64
    | weight blobs, each 64-byte aligned | 32-byte SHA-256 of everything before it

The header holds the network (bindings, layers, params, where each weight lies), the
precision, tactics, build config and target device. Loading parses JSON and reads raw
arrays with ``np.frombuffer``: no pickle, no eval.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Dict, List

import numpy as np

from tftrt_py.engine.errors import NetworkError, PlanError
from tftrt_py.engine.network import DTYPES, Layer, Network, Tensor

__all__ = ["MAGIC", "FORMAT_VERSION", "serialize", "deserialize", "read_header"]

MAGIC = b"TFTRTPLN"
FORMAT_VERSION = 1
ALIGN = 64
_PREFIX = struct.Struct("<8sIQ")
_DIGEST = 32


def _pad(n: int) -> int:
    return (-n) % ALIGN


def serialize(engine) -> bytes:
    """Plan bytes for `engine` (an :class:`~tftrt_py.engine.runtime.Engine`)."""
    net = engine.network
    blobs: List[bytes] = []
    offset = 0

    def put(array: np.ndarray) -> dict:
        nonlocal offset
        data = np.ascontiguousarray(array).tobytes()
        ref = {"offset": offset, "nbytes": len(data), "dtype": array.dtype.name, "shape": list(array.shape)}
        blobs.append(data + b"\0" * _pad(len(data)))
        offset += len(data) + _pad(len(data))
        return ref

    def tensor(t: Tensor) -> dict:
        return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "dynamic_range": t.dynamic_range}

    header = {
        "name": net.name,
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
    header["blob_bytes"] = offset
    head = json.dumps(header, separators=(",", ":")).encode()
    body = _PREFIX.pack(MAGIC, FORMAT_VERSION, len(head)) + head
    body += b"\0" * _pad(len(body)) + b"".join(blobs)
    return body + hashlib.sha256(body).digest()


def read_header(data: bytes) -> dict:
    """Validate framing and checksum; return the JSON header (with ``_blob_start``)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise PlanError(f"a plan is bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _PREFIX.size + _DIGEST:
        raise PlanError(f"plan is truncated: {len(data)} bytes is shorter than any plan")
    magic, version, head_len = _PREFIX.unpack_from(data)
    if magic != MAGIC:
        raise PlanError(f"not a tftrt_py plan (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise PlanError(f"plan format version {version} is not supported by this tftrt_py (reads version "
                        f"{FORMAT_VERSION}); rebuild the engine with this version")
    if hashlib.sha256(data[:-_DIGEST]).digest() != data[-_DIGEST:]:
        head_end = _PREFIX.size + head_len
        what = "truncated" if head_end > len(data) - _DIGEST else "corrupted"
        raise PlanError(f"plan checksum mismatch: the file is {what}; re-export it from the converted model")
    try:
        header = json.loads(data[_PREFIX.size:_PREFIX.size + head_len].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"plan header is not valid JSON: {exc}") from None
    start = _PREFIX.size + head_len
    header["_blob_start"] = start + _pad(start)
    if header["_blob_start"] + header.get("blob_bytes", -1) != len(data) - _DIGEST:
        raise PlanError("plan is truncated: weight data is shorter than its header says")
    return header


def deserialize(data: bytes):
    """Engine from plan bytes; raises PlanError naming what is wrong."""
    from tftrt_py.engine.runtime import Engine

    header = read_header(data)
    data = bytes(data)
    base = header["_blob_start"]

    def weight(ref: dict) -> np.ndarray:
        if ref["dtype"] not in DTYPES and ref["dtype"] != "float64":
            raise PlanError(f"plan weight has unsupported dtype {ref['dtype']!r}")
        arr = np.frombuffer(data, dtype=ref["dtype"], count=int(np.prod(ref["shape"], dtype=np.int64)),
                            offset=base + ref["offset"])
        return arr.reshape(ref["shape"])

    try:
        net = Network(header["name"])
        tensors: Dict[str, Tensor] = {}
        for t in header["inputs"]:
            tensor = Tensor(t["name"], t["dtype"], tuple(t["shape"]), dynamic_range=t.get("dynamic_range"))
            net.inputs.append(tensor)
            tensors[t["name"]] = tensor
        for spec in header["layers"]:
            layer = Layer(spec["name"], spec["kind"], [tensors[n] for n in spec["inputs"]], [], spec["params"],
                          {k: weight(v) for k, v in spec["weights"].items()}, spec.get("precision"))
            for t in spec["outputs"]:
                tensor = Tensor(t["name"], t["dtype"], tuple(t["shape"]), producer=layer,
                                dynamic_range=t.get("dynamic_range"))
                layer.outputs.append(tensor)
                tensors[t["name"]] = tensor
            net.layers.append(layer)
        net.outputs = [tensors[n] for n in header["outputs"]]
        net.lint()
    except PlanError:
        raise
    except (KeyError, TypeError, ValueError, NetworkError) as exc:
        raise PlanError(f"plan header is inconsistent ({type(exc).__name__}: {exc})") from None
    return Engine(net, precision=header["precision"], backend=header.get("backend", "numpy"),
                  build_config=header.get("build_config"), tactics=header.get("tactics"), device=header.get("device"))
