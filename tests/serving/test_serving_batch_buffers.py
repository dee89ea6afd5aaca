"""Batch input buffers: aligned as TensorFlow's allocator aligns tensors, reused by batch key (the last few given
back), rows copied in at their place and padding rows copies of row 0; and what TensorFlow reads in place."""
import ml_dtypes
import numpy as np
import pytest

from support import random_array
from tftrt_py.serving.batch_buffers import ALIGN, BufferPool, aligned_empty, copy_rows, pad_rows
from tftrt_py.serving.batching import batch_key
from tftrt_py.serving.models import eager_tensor


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(32, 224, 224, 3), (3, 5), (7,)])
def test_a_buffer_is_c_contiguous_and_starts_on_an_aligned_address(dtype, shape):
    for _ in range(5):  # whatever the allocator hands out
        buffer = aligned_empty(shape, dtype)
        assert buffer.shape == shape and buffer.dtype == dtype and buffer.flags.c_contiguous
        assert buffer.flags.writeable and buffer.ctypes.data % ALIGN == 0


def test_an_object_buffer_holds_references():
    buffer = aligned_empty((2, 3), object)
    buffer[1, 2] = b"text"
    assert buffer.dtype == object and buffer[1, 2] == b"text"


def requests(*rows):
    return {"x": random_array((rows[0], 4)), "k": np.arange(rows[0] * 2, dtype=np.int64).reshape(rows[0], 2)}


def test_a_pool_hands_back_a_set_given_back_under_the_same_key_and_new_ones_otherwise():
    pool = BufferPool(rows=8, keep=2)
    like = requests(1)
    taken = pool.take(batch_key(like), like)
    assert {k: (v.shape, v.dtype) for k, v in taken.items()} == {"x": ((8, 4), np.float32), "k": ((8, 2), np.int64)}
    pool.give_back(batch_key(like), taken)
    other = {"x": random_array((1, 5))}
    assert pool.take(batch_key(other), other)["x"].shape == (8, 5)  # another key: a new set
    again = pool.take(batch_key(like), like)
    assert all(again[k] is taken[k] for k in taken)
    assert pool.take(batch_key(like), like)["x"] is not taken["x"]  # taken already: a new set


def test_a_pool_keeps_only_the_sets_given_back_last():
    pool = BufferPool(rows=4, keep=2)
    like = requests(1)
    key = batch_key(like)
    sets = [pool.take(key, like) for _ in range(3)]
    for buffers in sets:
        pool.give_back(key, buffers)
    reused = [pool.take(key, like)["x"] for _ in range(3)]
    assert {id(x) for x in reused[:2]} == {id(sets[1]["x"]), id(sets[2]["x"])}
    assert all(reused[2] is not s["x"] for s in sets)


def test_a_pool_keeps_no_object_buffers():
    """They would hold the strings of requests long answered."""
    pool = BufferPool(rows=4, keep=2)
    like = {"s": np.array([b"a"], dtype=object)}
    taken = pool.take(batch_key(like), like)
    pool.give_back(batch_key(like), taken)
    assert pool.take(batch_key(like), like)["s"] is not taken["s"]


def test_rows_go_to_their_place_and_padding_repeats_the_first_row():
    buffers = {"x": aligned_empty((8, 4), np.float32)}
    a, b = random_array((2, 4)), random_array((3, 4))
    copy_rows(buffers, {"x": a}, 0)
    copy_rows(buffers, {"x": b}, 2)
    batch = pad_rows(buffers, 5, 8)
    assert batch["x"].shape == (8, 4) and np.shares_memory(batch["x"], buffers["x"])
    np.testing.assert_array_equal(batch["x"], np.concatenate([a, b, np.repeat(a[:1], 3, axis=0)]))
    assert pad_rows(buffers, 5, 5)["x"].shape == (5, 4)


def test_tensorflow_reads_an_aligned_writable_array_in_place():
    buffer = aligned_empty((4, 6), np.float32)
    buffer[...] = random_array((4, 6))
    tensor = eager_tensor(buffer)
    np.testing.assert_array_equal(tensor.numpy(), buffer)
    buffer[0, 0] += 1  # the tensor is the buffer's memory
    assert tensor.numpy()[0, 0] == buffer[0, 0]


@pytest.mark.parametrize("what", ["read-only", "unaligned", "strided", "bfloat16", "strings"])
def test_tensorflow_gets_a_copy_of_any_other_array(what):
    """Read-only views are of memory another process may write while the model reads it (a request arena)."""
    buffer = aligned_empty((4, 7), np.float32)
    buffer[...] = random_array((4, 7))
    array = {"read-only": buffer.view(), "unaligned": buffer.reshape(-1)[1:], "strided": buffer[:, ::2],
             "bfloat16": buffer.astype(ml_dtypes.bfloat16), "strings": np.array([b"a", b"bc"], dtype=object)}[what]
    if what == "read-only":
        array.flags.writeable = False
    tensor = eager_tensor(array)
    expected = array.copy()
    if array.dtype != object:
        array.flags.writeable = True
        array[...] = 0  # after the conversion: a copy keeps the values it had
    np.testing.assert_array_equal(tensor.numpy(), expected)
