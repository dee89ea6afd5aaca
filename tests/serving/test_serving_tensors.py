"""gRPC TensorProtos to and from arrays: numbers in tensor_content are read in place, other encodings as TF's
MakeNdarray reads them, malformed content is INVALID_ARGUMENT; answers are written as tf.make_tensor_proto writes
them."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2

from support import random_array
from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.tensors import fill_tensor_proto, from_tensor_proto

ARRAYS = [random_array((3, 4)), random_array((2, 3), "int64"), random_array((4,), "float16"),
          random_array((2, 2), "bool"), random_array((5,), "uint16"), random_array((2, 3), "float64"),
          np.array([[1 + 2j, -3j]], np.complex64), np.array([[b"ab", b"\xff"]], dtype=object),
          np.float32(1.25), random_array((0, 3))]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype.name}{list(a.shape)}")
def test_decoding_matches_make_ndarray_for_every_encoding(array):
    proto = tf.make_tensor_proto(array)
    encodings = [proto]
    if array.dtype != object:  # the same values as raw tensor_content, as TF Serving clients often send them
        encodings.append(tensor_pb2.TensorProto(dtype=proto.dtype, tensor_shape=proto.tensor_shape,
                                                tensor_content=np.ascontiguousarray(array).tobytes()))
    for encoded in encodings:
        decoded = from_tensor_proto("x", encoded)
        assert decoded.dtype == array.dtype and decoded.shape == array.shape
        np.testing.assert_array_equal(decoded, array)


def test_tensor_content_is_read_without_a_copy():
    x = random_array((2, 8, 8, 3))
    proto = tf.make_tensor_proto(x)
    decoded = from_tensor_proto("image", proto)
    assert not decoded.flags.writeable and not decoded.flags.owndata  # a view over the message's bytes
    np.testing.assert_array_equal(decoded, x)


@pytest.mark.parametrize("dims, content", [([4, 4], 48), ([3, -1], 48), ([3, 4], 44)])
def test_tensor_content_of_the_wrong_size_is_invalid_argument(dims, content):
    proto = tensor_pb2.TensorProto(dtype=tf.float32.as_datatype_enum,
                                   tensor_content=random_array((12,)).tobytes()[:content])
    for d in dims:
        proto.tensor_shape.dim.add(size=d)
    with pytest.raises(ServingError) as info:
        from_tensor_proto("x", proto)
    assert info.value.code is Code.INVALID_ARGUMENT and "'x'" in info.value.message


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype.name}{list(a.shape)}")
def test_answers_are_written_as_make_tensor_proto_writes_them(array):
    proto = tensor_pb2.TensorProto()
    fill_tensor_proto(proto, array)
    assert proto == tf.make_tensor_proto(array)
