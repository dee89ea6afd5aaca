"""Request and response tensors: TF Serving's REST JSON (row `instances` / columnar `inputs`, {"b64": ...} for
binary strings) and gRPC TensorProtos, to and from numpy arrays checked against a signature's dtypes."""
from __future__ import annotations

import base64
import functools
import math
from typing import Any, Dict, Mapping, Optional, Tuple

import numpy as np

from tftrt_py.serving.errors import invalid
from tftrt_py.serving.models import Signature, TensorSpec

__all__ = ["rest_inputs", "rest_outputs", "json_array", "from_tensor_proto", "fill_tensor_proto"]

#: numpy dtypes tf.make_tensor_proto writes as tensor_content bytes (its _TENSOR_CONTENT_TYPES)
CONTENT_DTYPES = frozenset(map(np.dtype, ("float16", "float32", "float64", "int8", "int16", "int32", "int64",
                                          "uint8", "uint32", "uint64")))
#: JSON value kinds (numpy dtype kinds of np.asarray(value)) each input dtype kind accepts
ACCEPTS = {"f": "biuf", "c": "biufc", "i": "biu", "u": "biu", "b": "b"}



def _is_b64(value) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"]


def _string_leaves(value):
    if isinstance(value, list):
        return [_string_leaves(v) for v in value]
    if _is_b64(value):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError):
            raise invalid("a 'b64' value is not valid base64") from None
    if isinstance(value, str):
        return value.encode()
    raise invalid(f"expected a string or {{'b64': ...}}, got {type(value).__name__}")


def json_array(name: str, value: Any, spec: TensorSpec) -> np.ndarray:
    """A JSON value as an array of the input's dtype; values of another kind (a float for an int, a string for a
    number) or ragged lists are INVALID_ARGUMENT."""
    try:
        if spec.dtype == object:
            array = np.array(_string_leaves(value), dtype=object)
            if any(not isinstance(v, bytes) for v in array.reshape(-1)):
                raise ValueError("ragged")
            return array
        array = np.asarray(value)
    except ValueError:
        raise invalid(f"input {name!r}: the value is not a rectangular array (lists of unequal lengths)") from None
    if array.dtype.kind not in ACCEPTS.get(spec.dtype.kind, "") and array.size:
        raise invalid(f"input {name!r}: expects {spec.describe()} values, got JSON values of type "
                       f"{'string/object' if array.dtype.kind in 'OUS' else array.dtype.name}")
    return array.astype(spec.dtype)


def _named(value, names, where: str) -> Dict[str, Any]:
    """`value` as {input name: value}: an object keyed by input names, or the value of a single input."""
    if isinstance(value, dict) and not _is_b64(value):
        return value
    if len(names) != 1:
        raise invalid(f"{where}: the signature has inputs {{{', '.join(names)}}}: give an object keyed by them")
    return {names[0]: value}


def rest_inputs(body: Any, signature: Signature) -> Tuple[Dict[str, np.ndarray], bool]:
    """(input arrays, row format?) of a parsed predict request body."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    if ("instances" in body) == ("inputs" in body):
        raise invalid("the request must have exactly one of 'instances' (row format) and 'inputs' (columnar)")
    names = list(signature.inputs)
    if "inputs" in body:
        values = _named(body["inputs"], names, "'inputs'")
    else:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise invalid("'instances' must be a non-empty list")
        rows = [_named(row, names, "'instances'") for row in instances]
        keys = set(rows[0])
        if any(set(row) != keys for row in rows):
            raise invalid("every element of 'instances' must name the same inputs")
        values = {k: [row[k] for row in rows] for k in keys}
    signature.check_names(values)
    return {k: json_array(k, v, signature.inputs[k]) for k, v in values.items()}, "instances" in body


def _json_value(name: str, array: np.ndarray):
    if array.dtype != object:
        return array.tolist()
    as_b64 = name.endswith("_bytes")

    def leaf(v):
        if isinstance(v, list):
            return [leaf(x) for x in v]
        if not as_b64:
            try:
                return v.decode()
            except UnicodeDecodeError:
                pass
        return {"b64": base64.b64encode(v).decode()}

    return leaf(array.tolist())


def rest_outputs(outputs: Mapping[str, np.ndarray], row_format: bool) -> Dict[str, Any]:
    """{"predictions": [...]} (row format: one entry per row) or {"outputs": ...} (columnar), as TF Serving writes
    them: a single output as its value, several as an object by name (per row in row format)."""
    if not row_format:
        if len(outputs) == 1:
            (name, value), = outputs.items()
            return {"outputs": _json_value(name, value)}
        return {"outputs": {k: _json_value(k, v) for k, v in outputs.items()}}
    sizes = {v.shape[0] if v.ndim else None for v in outputs.values()}
    if len(sizes) != 1 or None in sizes:
        raise invalid("the outputs have different (or no) batch sizes: ask for the columnar format ('inputs')")
    columns = {k: _json_value(k, v) for k, v in outputs.items()}
    if len(columns) == 1:
        return {"predictions": next(iter(columns.values()))}
    return {"predictions": [dict(zip(columns, row)) for row in zip(*columns.values())]}


@functools.lru_cache(maxsize=None)
def _content_dtype(datatype: int) -> Optional[np.dtype]:
    """The numpy dtype a TensorProto's tensor_content holds for DataType `datatype`; None where MakeNdarray
    must decode it (strings, quantized and bfloat16 types)."""
    from tensorflow import dtypes

    try:
        dtype = np.dtype(dtypes.as_dtype(datatype).as_numpy_dtype)
    except TypeError:  # DT_INVALID, resource, variant
        return None
    return dtype if dtype.kind in "biufc" else None


@functools.lru_cache(maxsize=None)
def _datatype(dtype: np.dtype) -> int:
    from tensorflow import dtypes

    return dtypes.as_dtype(dtype).as_datatype_enum


def from_tensor_proto(name: str, proto) -> np.ndarray:
    """A request TensorProto as an array: numbers in tensor_content are read in place (np.frombuffer over the
    bytes, read-only: one copy, the field's read), anything else by TF's MakeNdarray."""
    content = proto.tensor_content  # each read of a bytes field copies it
    dtype = _content_dtype(proto.dtype) if content else None
    if dtype is None:
        return _make_ndarray(name, proto)
    shape = [d.size for d in proto.tensor_shape.dim]
    if proto.tensor_shape.unknown_rank or any(d < 0 for d in shape) or \
            len(content) != math.prod(shape) * dtype.itemsize:
        raise invalid(f"input {name!r}: not a valid TensorProto: tensor_content holds {len(content)} bytes, "
                       f"not the {dtype.name} values of shape {shape}")
    return np.frombuffer(content, dtype).reshape(shape)


def _make_ndarray(name: str, proto) -> np.ndarray:
    from tensorflow.python.framework import tensor_util

    try:
        return tensor_util.MakeNdarray(proto)
    except Exception as exc:  # a malformed TensorProto (content size, dtype) is the client's error
        raise invalid(f"input {name!r}: not a valid TensorProto: {exc}") from None


def fill_tensor_proto(proto, array: np.ndarray) -> None:
    """Write `array` into the (empty) TensorProto `proto` as tf.make_tensor_proto writes it: CONTENT_DTYPES of
    more than one value as tensor_content bytes (one copy), anything else through make_tensor_proto."""
    if array.dtype not in CONTENT_DTYPES or array.size <= 1:
        from tensorflow.python.framework import tensor_util

        proto.CopyFrom(tensor_util.make_tensor_proto(array))
        return
    proto.dtype = _datatype(array.dtype)
    for size in array.shape:
        proto.tensor_shape.dim.add(size=size)
    proto.tensor_content = array.tobytes()
