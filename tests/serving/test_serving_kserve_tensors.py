"""The Open Inference Protocol's tensors to and from arrays: every datatype round-trips through raw bytes, JSON
data (flattened or nested) and typed gRPC contents; raw numbers are read in place; malformed tensors are
INVALID_ARGUMENT with a message naming the input and what to send."""
import ml_dtypes
import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from support import random_array
from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.kserve_tensors import (DATATYPES, datatype, from_contents, from_json, from_raw, to_json,
                                             to_raw)

ARRAYS = {"BOOL": random_array((2, 3), "bool"), "UINT8": random_array((4,), "uint8"),
          "UINT16": random_array((2, 2), "uint16"), "UINT32": random_array((3,), "uint32"),
          "UINT64": np.array([2 ** 40 + 5, 1], np.uint64), "INT8": -random_array((2, 2), "int8"),
          "INT16": random_array((3, 1), "int16"), "INT32": -random_array((2, 3), "int32"),
          "INT64": np.array([[-2 ** 40, 7]], np.int64), "FP16": random_array((2, 2), "float16"),
          "BF16": random_array((3,)).astype(ml_dtypes.bfloat16), "FP32": random_array((2, 3, 2)),
          "FP64": random_array((0, 4), "float64"), "BYTES": np.array([[b"ab", b""], [b"\xff\x00", b"x" * 300]],
                                                                     dtype=object)}


def test_every_datatype_has_an_example():
    assert set(ARRAYS) == set(DATATYPES)


@pytest.mark.parametrize("name", list(ARRAYS))
def test_raw_bytes_round_trip_as_tritonclient_writes_them(name):
    array = ARRAYS[name]
    assert datatype(array.dtype) == name
    raw = to_raw(array)
    if name == "BYTES":  # each element: its 4-byte little-endian length, then its bytes
        assert raw == serialize_byte_tensor(array).item()
        np.testing.assert_array_equal(deserialize_bytes_tensor(raw).reshape(array.shape), array)
    decoded = from_raw("x", name, list(array.shape), memoryview(raw))
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


def test_raw_numbers_are_read_in_place():
    raw = bytearray(random_array((2, 4)).tobytes())
    decoded = from_raw("x", "FP32", [2, 4], memoryview(raw)[:])
    assert np.shares_memory(decoded, np.frombuffer(raw, np.uint8))


@pytest.mark.parametrize("name", [n for n in ARRAYS if DATATYPES[n].json])
def test_json_data_round_trips_flattened_or_nested(name):
    array = ARRAYS[name]
    if name == "BYTES":
        array = np.array([[b"ab", b""], ["é".encode(), b"x"]], dtype=object)
    data = to_json("y", array)
    assert data == [v.decode() if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]
    for sent in (data, np.reshape(np.array(data, dtype=object), array.shape).tolist()):
        decoded = from_json("x", name, list(array.shape), sent)
        assert decoded.dtype == array.dtype and decoded.shape == array.shape
        np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("name", [n for n in ARRAYS if DATATYPES[n].contents])
def test_typed_contents_round_trip(name):
    array = ARRAYS[name]
    contents = service_pb2.InferTensorContents()
    getattr(contents, DATATYPES[name].contents).extend(array.reshape(-1).tolist())
    decoded = from_contents("x", name, list(array.shape), contents)
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


@pytest.mark.parametrize("decode, message", [
    (lambda: from_raw("x", "FP32", [2, 2], b"\0" * 12), "input 'x': 12 bytes of raw data, but shape [2, 2] of FP32 "
                                                         "takes 16"),
    (lambda: from_raw("x", "FLOAT", [1], b"\0" * 4), "unknown datatype 'FLOAT': use one of BOOL"),
    (lambda: from_raw("x", "FP32", [-1], b""), "shape must be a list of whole numbers >= 0"),
    (lambda: from_raw("x", "FP32", "2", b""), "shape must be a list"),
    (lambda: from_raw("x", "BYTES", [2], b"\1\0\0\0a"), "raw BYTES data ends before its element 1"),
    (lambda: from_raw("x", "BYTES", [1], b"\5\0\0\0a"), "element 0 is 5 bytes long, but only 1 bytes follow"),
    (lambda: from_raw("x", "BYTES", [1], b"\1\0\0\0ab"), "1 bytes after its 1 elements"),
    (lambda: from_json("x", "FP32", [3], [1.0, 2.0]), "shape [3] holds 3 values, its data 2"),
    (lambda: from_json("x", "INT32", [2], [1.5, 2.0]), "got JSON values of type float64"),
    (lambda: from_json("x", "FP32", [2, 2], [[1.0], [2.0, 3.0]]), "not a rectangular array"),
    (lambda: from_json("x", "BF16", [1], [1.0]), "BF16 values travel as binary data only"),
    (lambda: from_contents("x", "FP16", [1], service_pb2.InferTensorContents()), "raw_input_contents only"),
    (lambda: to_json("y", np.array([b"\xff"], dtype=object)), "output 'y' holds bytes that are not UTF-8"),
])
def test_malformed_tensors_are_invalid_arguments(decode, message):
    with pytest.raises(ServingError) as info:
        decode()
    assert info.value.code is Code.INVALID_ARGUMENT and message in info.value.message


def test_a_dtype_without_a_datatype_is_unimplemented():
    with pytest.raises(ServingError) as info:
        datatype(np.dtype(np.complex64))
    assert info.value.code is Code.UNIMPLEMENTED and "complex64 tensors have no" in info.value.message
