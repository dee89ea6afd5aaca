"""Values sized by the batch and constant along it (zeros_like(ids), tf.zeros([tf.shape(x)[0], S]), position ids,
a class token or causal mask broadcast to the batch) keep engines row-wise: built for batch 8, one engine serves
batches 8, 3 and 1, equal to TF. A batch mixed into other positions still pins the engine to its batch."""
import numpy as np
import pytest
import tensorflow as tf

from support import RNG, random_array, segment_graph_def
from tftrt_py.convert.build import build_engine

S, H = 5, 4
TOKENS = tf.constant(random_array((10, H)))
TYPES = tf.constant(random_array((2, H)))
POSITIONS = tf.constant(random_array((S, H)))
CLS = tf.constant(random_array((1, 1, H)))


def ids(batch):
    return RNG.integers(0, 10, (batch, S)).astype("int32")


def embeddings(batch):
    return random_array((batch, S, H))


def token_types(t):
    return tf.gather(TOKENS, t) + tf.gather(TYPES, tf.zeros_like(t))


def zeros_of_the_batch(x):
    return x + tf.zeros([tf.shape(x)[0], tf.shape(x)[1], H]) + tf.fill([tf.shape(x)[0], 1, 1], 0.5)


def position_ids(t):
    s = tf.shape(t)[1]
    positions = tf.broadcast_to(tf.range(s), [tf.shape(t)[0], s])
    return tf.gather(TOKENS, t) + tf.gather(POSITIONS, positions), positions + t


def class_token(x):
    cls = tf.broadcast_to(CLS, [tf.shape(x)[0], 1, H])
    return tf.concat([cls, x], axis=1) * 2.0


def tiled_class_token(x):
    return tf.concat([tf.tile(CLS, [tf.shape(x)[0], 1, 1]), x], axis=1)


def causal_mask(x):
    s = tf.shape(x)[1]
    mask = tf.linalg.band_part(tf.ones([s, s]), -1, 0)
    scores = tf.matmul(x, x, transpose_b=True)
    return tf.where(tf.broadcast_to(mask, [tf.shape(x)[0], s, s]) > 0, scores, -1e9)


def ones_like(x):
    return tf.ones_like(x) * 2.0 + x, tf.zeros_like(x, tf.int32) + tf.shape(x)[1]


PATTERNS = {
    "token types": (token_types, ids),
    "zeros of the batch": (zeros_of_the_batch, embeddings),
    "position ids": (position_ids, ids),
    "class token": (class_token, embeddings),
    "tiled class token": (tiled_class_token, embeddings),
    "causal mask": (causal_mask, embeddings),
    "ones like": (ones_like, embeddings),
}


def engine_for(fn, x):
    """An engine built for `x` from `fn` traced with an unknown batch (tf.shape stays a Shape op)."""
    return build_engine(segment_graph_def(fn, [tf.TensorSpec((None,) + x.shape[1:], x.dtype)]), [x.shape])


def assert_matches_tf(engine, fn, x):
    got = engine.create_execution_context().execute_v2([x])
    want = [np.asarray(w) for w in tf.nest.flatten(fn(tf.constant(x)))]
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6 if w.dtype.kind == "f" else 0)


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_values_repeated_along_the_batch_keep_the_engine_row_wise(name):
    fn, make = PATTERNS[name]
    engine = engine_for(fn, make(8))
    assert engine.rowwise and engine.can_serve([(3,) + make(3).shape[1:]])
    for batch in (8, 3, 1):
        assert_matches_tf(engine, fn, make(batch))


PINNED = {
    "a fill of twice the batch": lambda x: tf.reshape(
        tf.reshape(x, [-1, H // 2]) + tf.fill([tf.shape(x)[0] * S * 2, H // 2], 1.0), [-1, S, H]),
    "the batch as a fill value": lambda x: x * tf.fill([tf.shape(x)[0], 1, 1], tf.cast(tf.shape(x)[0], tf.float32)),
    "a range over the batch": lambda x: x * tf.cast(tf.range(tf.shape(x)[0]), tf.float32)[:, None, None],
    "a tile by the batch along another axis": lambda x: x * tf.reduce_sum(tf.tile(CLS, [1, tf.shape(x)[0], 1])),
}


@pytest.mark.parametrize("name", sorted(PINNED))
def test_a_batch_mixed_into_other_positions_pins_the_engine(name):
    """The engine built for 8 serves only 8; batch 3 gets its own engine, equal to TF."""
    fn = PINNED[name]
    engine = engine_for(fn, embeddings(8))
    assert not engine.rowwise and not engine.can_serve([(3, S, H)])
    assert_matches_tf(engine, fn, embeddings(8))
    assert_matches_tf(engine_for(fn, embeddings(3)), fn, embeddings(3))
