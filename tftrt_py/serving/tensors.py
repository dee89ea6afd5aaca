"""Request and response tensors: TF Serving's REST JSON (row `instances` / columnar `inputs`, {"b64": ...} for
binary strings) and gRPC TensorProtos, to and from numpy arrays checked against a signature's dtypes."""
from __future__ import annotations

import base64
from typing import Any, Dict, Mapping, Tuple

import numpy as np

from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.models import Signature, TensorSpec

__all__ = ["rest_inputs", "rest_outputs", "from_tensor_proto", "to_tensor_proto"]

#: JSON value kinds (numpy dtype kinds of np.asarray(value)) each input dtype kind accepts
ACCEPTS = {"f": "biuf", "c": "biufc", "i": "biu", "u": "biu", "b": "b"}


def _invalid(message: str) -> ServingError:
    return ServingError(Code.INVALID_ARGUMENT, message)


def _is_b64(value) -> bool:
    return isinstance(value, dict) and list(value) == ["b64"]


def _string_leaves(value):
    if isinstance(value, list):
        return [_string_leaves(v) for v in value]
    if _is_b64(value):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except (ValueError, TypeError):
            raise _invalid("a 'b64' value is not valid base64") from None
    if isinstance(value, str):
        return value.encode()
    raise _invalid(f"expected a string or {{'b64': ...}}, got {type(value).__name__}")


def _array(name: str, value: Any, spec: TensorSpec) -> np.ndarray:
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
        raise _invalid(f"input {name!r}: the value is not a rectangular array (lists of unequal lengths)") from None
    if array.dtype.kind not in ACCEPTS.get(spec.dtype.kind, "") and array.size:
        raise _invalid(f"input {name!r}: expects {spec.describe()} values, got JSON values of type "
                       f"{'string/object' if array.dtype.kind in 'OUS' else array.dtype.name}")
    return array.astype(spec.dtype)


def _named(value, names, where: str) -> Dict[str, Any]:
    """`value` as {input name: value}: an object keyed by input names, or the value of a single input."""
    if isinstance(value, dict) and not _is_b64(value):
        return value
    if len(names) != 1:
        raise _invalid(f"{where}: the signature has inputs {{{', '.join(names)}}}: give an object keyed by them")
    return {names[0]: value}


def rest_inputs(body: Any, signature: Signature) -> Tuple[Dict[str, np.ndarray], bool]:
    """(input arrays, row format?) of a parsed predict request body."""
    if not isinstance(body, dict):
        raise _invalid("the request body must be a JSON object")
    if ("instances" in body) == ("inputs" in body):
        raise _invalid("the request must have exactly one of 'instances' (row format) and 'inputs' (columnar)")
    names = list(signature.inputs)
    if "inputs" in body:
        values = _named(body["inputs"], names, "'inputs'")
    else:
        instances = body["instances"]
        if not isinstance(instances, list) or not instances:
            raise _invalid("'instances' must be a non-empty list")
        rows = [_named(row, names, "'instances'") for row in instances]
        keys = set(rows[0])
        if any(set(row) != keys for row in rows):
            raise _invalid("every element of 'instances' must name the same inputs")
        values = {k: [row[k] for row in rows] for k in keys}
    signature.check_names(values)
    return {k: _array(k, v, signature.inputs[k]) for k, v in values.items()}, "instances" in body


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
        raise _invalid("the outputs have different (or no) batch sizes: ask for the columnar format ('inputs')")
    columns = {k: _json_value(k, v) for k, v in outputs.items()}
    if len(columns) == 1:
        return {"predictions": next(iter(columns.values()))}
    return {"predictions": [dict(zip(columns, row)) for row in zip(*columns.values())]}


def from_tensor_proto(name: str, proto) -> np.ndarray:
    from tensorflow.python.framework import tensor_util

    try:
        return tensor_util.MakeNdarray(proto)
    except Exception as exc:  # a malformed TensorProto (content size, dtype) is the client's error
        raise _invalid(f"input {name!r}: not a valid TensorProto: {exc}") from None


def to_tensor_proto(array: np.ndarray):
    from tensorflow.python.framework import tensor_util

    return tensor_util.make_tensor_proto(array)
