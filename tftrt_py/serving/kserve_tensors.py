"""The Open Inference Protocol's (KServe v2) tensors: its datatypes as numpy dtypes, and tensors to and from numpy
arrays in its three encodings: raw bytes (REST's binary tensor data extension, gRPC's raw_input_contents and
raw_output_contents), JSON `data` (flattened or nested, in row-major order) and gRPC's typed InferTensorContents.
Raw BYTES tensors hold each element as a 4-byte little-endian length, then its bytes."""
from __future__ import annotations

import math
import struct
from typing import Any, List, NamedTuple, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

from tftrt_py.serving.errors import Code, ServingError, invalid
from tftrt_py.serving.models import TensorSpec
from tftrt_py.serving.tensors import json_array

__all__ = ["DATATYPES", "datatype", "from_raw", "from_json", "from_contents", "to_raw", "to_json"]


class Datatype(NamedTuple):
    dtype: np.dtype
    contents: Optional[str]  # the InferTensorContents field carrying its values (None: raw bytes only)
    json: bool = True  # JSON `data` may carry its values (BF16: raw bytes only, as tritonclient sends it)


#: the protocol's datatypes (its tensor data types table) and how they travel
DATATYPES = {
    "BOOL": Datatype(np.dtype(bool), "bool_contents"),
    "UINT8": Datatype(np.dtype("uint8"), "uint_contents"),
    "UINT16": Datatype(np.dtype("uint16"), "uint_contents"),
    "UINT32": Datatype(np.dtype("uint32"), "uint_contents"),
    "UINT64": Datatype(np.dtype("uint64"), "uint64_contents"),
    "INT8": Datatype(np.dtype("int8"), "int_contents"),
    "INT16": Datatype(np.dtype("int16"), "int_contents"),
    "INT32": Datatype(np.dtype("int32"), "int_contents"),
    "INT64": Datatype(np.dtype("int64"), "int64_contents"),
    "FP16": Datatype(np.dtype("float16"), None),
    "BF16": Datatype(np.dtype(ml_dtypes.bfloat16), None, json=False),
    "FP32": Datatype(np.dtype("float32"), "fp32_contents"),
    "FP64": Datatype(np.dtype("float64"), "fp64_contents"),
    "BYTES": Datatype(np.dtype(object), "bytes_contents"),
}
NAMES = {d.dtype: name for name, d in DATATYPES.items()}
LENGTH = struct.Struct("<I")



def datatype(dtype: np.dtype) -> str:
    """The protocol's name for numpy `dtype` (object: BYTES); UNIMPLEMENTED for dtypes it has none for."""
    name = NAMES.get(dtype)
    if name is None:
        raise ServingError(Code.UNIMPLEMENTED, f"{dtype.name} tensors have no Open Inference Protocol datatype: "
                                               f"serve a signature of {', '.join(DATATYPES)} tensors")
    return name


def _datatype(name: str, text: Any) -> Datatype:
    found = DATATYPES.get(text) if isinstance(text, str) else None
    if found is None:
        raise invalid(f"input {name!r}: unknown datatype {text!r}: use one of {', '.join(DATATYPES)}")
    return found


def _shape(name: str, shape: Any) -> Tuple[int, ...]:
    if not isinstance(shape, Sequence) or isinstance(shape, (str, bytes)) or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
        raise invalid(f"input {name!r}: shape must be a list of whole numbers >= 0, got {shape!r}")
    return tuple(shape)


def _reshaped(name: str, array: np.ndarray, shape: Tuple[int, ...]) -> np.ndarray:
    if array.size != math.prod(shape):
        raise invalid(f"input {name!r}: shape {list(shape)} holds {math.prod(shape)} values, its data "
                       f"{array.size}: send the shape of the data")
    return array.reshape(shape)


def _split_bytes(name: str, buffer, count: int) -> np.ndarray:
    """The `count` length-prefixed elements of a raw BYTES tensor as an object array of bytes."""
    view, values, offset = memoryview(buffer), [], 0
    for _ in range(count):
        if offset + LENGTH.size > len(view):
            raise invalid(f"input {name!r}: raw BYTES data ends before its element {len(values)}: each element "
                           f"is a 4-byte little-endian length, then that many bytes")
        (length,), offset = LENGTH.unpack_from(view, offset), offset + LENGTH.size
        if offset + length > len(view):
            raise invalid(f"input {name!r}: raw BYTES element {len(values)} is {length} bytes long, but only "
                           f"{len(view) - offset} bytes follow its length")
        values.append(bytes(view[offset:offset + length]))
        offset += length
    if offset != len(view):
        raise invalid(f"input {name!r}: raw BYTES data holds {len(view) - offset} bytes after its {count} "
                       f"elements: send as many elements as the shape holds")
    array = np.empty(count, dtype=object)
    array[:] = values
    return array


def from_raw(name: str, datatype_name: Any, shape: Any, buffer) -> np.ndarray:
    """An input's raw bytes (bytes or a memoryview) as an array: numbers are read in place (np.frombuffer,
    read-only), BYTES elements split by their lengths."""
    found, shape = _datatype(name, datatype_name), _shape(name, shape)
    count = math.prod(shape)
    if found.dtype == object:
        return _split_bytes(name, buffer, count).reshape(shape)
    size = memoryview(buffer).nbytes
    if size != count * found.dtype.itemsize:
        raise invalid(f"input {name!r}: {size} bytes of raw data, but shape {list(shape)} of {datatype_name} "
                       f"takes {count * found.dtype.itemsize}")
    return np.frombuffer(buffer, found.dtype).reshape(shape)


def from_json(name: str, datatype_name: Any, shape: Any, data: Any) -> np.ndarray:
    """An input's JSON `data` (flattened or nested; strings for BYTES) as an array of its datatype."""
    found, shape = _datatype(name, datatype_name), _shape(name, shape)
    if not found.json:
        raise invalid(f"input {name!r}: {datatype_name} values travel as binary data only: send them so "
                       f"(parameters binary_data_size)")
    return _reshaped(name, json_array(name, data, TensorSpec(found.dtype, shape)), shape)


def from_contents(name: str, datatype_name: Any, shape: Any, contents) -> np.ndarray:
    """An input's typed gRPC InferTensorContents as an array of its datatype."""
    found, shape = _datatype(name, datatype_name), _shape(name, shape)
    if found.contents is None:
        raise invalid(f"input {name!r}: {datatype_name} values travel in raw_input_contents only: send them so")
    values = getattr(contents, found.contents)
    if found.dtype == object:
        array = np.empty(len(values), dtype=object)
        array[:] = list(values)
    else:
        array = np.array(values, dtype=found.dtype)
    return _reshaped(name, array, shape)


def to_raw(array: np.ndarray) -> bytes:
    """`array`'s raw bytes in row-major order (BYTES: each element's length, then the element)."""
    if array.dtype != object:
        return array.tobytes()
    return b"".join(LENGTH.pack(len(v)) + v for v in map(_bytes, array.reshape(-1)))


def _bytes(value) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def to_json(name: str, array: np.ndarray) -> List[Any]:
    """`array`'s values as JSON `data`, flattened in row-major order; BYTES as strings, which must be UTF-8."""
    if not DATATYPES[datatype(array.dtype)].json:
        raise invalid(f"output {name!r}: {NAMES[array.dtype]} values travel as binary data only: ask for them so "
                       f"(parameters binary_data: true)")
    values = array.reshape(-1).tolist()
    if array.dtype != object:
        return values
    try:
        return [_bytes(v).decode() for v in values]
    except UnicodeDecodeError:
        raise invalid(f"output {name!r} holds bytes that are not UTF-8 text: ask for it as binary data "
                       f"(parameters binary_data: true)") from None
