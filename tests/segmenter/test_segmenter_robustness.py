"""No input graph makes segmentation crash: a converter's exception and an unknown rank become reasons,
frozen variables (Const -> Identity) count as constants, and values known when building are tracked."""
import keras
import pytest
import tensorflow as tf

from reasons import check, native_ops, segmentation
from tftrt_py.convert.ops.softmax import SoftmaxConverter

UNKNOWN = tf.TensorSpec(None)

#: functions over inputs of unknown rank; their converters must give reasons, not raise
UNKNOWN_RANK_FNS = {
    "Einsum": lambda a: tf.einsum("ij,jk->ik", a, a),
    "ResizeBilinear": lambda a: tf.raw_ops.ResizeBilinear(images=a, size=[4, 4]),
    "Select": lambda a: tf.raw_ops.Select(condition=a > 0, x=a, y=-a),
    "Tile": lambda a: tf.tile(a, [2, 2]),
    "Fill": lambda a: tf.fill(tf.shape(a), 1.0) + a,
    "Reshape": lambda a: tf.reshape(a, tf.shape(a)) * 2.0,
    "Mean": lambda a: tf.reduce_mean(a, axis=-1),
    "MaxPool": lambda a: tf.raw_ops.MaxPool(input=a, ksize=[1, 2, 2, 1], strides=[1, 2, 2, 1], padding="VALID"),
    "Squeeze": lambda a: tf.squeeze(a),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN_RANK_FNS))
def test_unknown_rank_inputs_give_reasons_not_crashes(name):
    result = segmentation(UNKNOWN_RANK_FNS[name], [UNKNOWN])
    assert result.report.total_nodes > 0


def test_unknown_rank_reason_names_the_input():
    assert check(UNKNOWN_RANK_FNS["Einsum"], [UNKNOWN], "Einsum") == "input 0 of Einsum has an unknown rank"


def test_an_exception_in_a_check_becomes_the_reason(monkeypatch):
    def broken(self, node, ctx):
        raise RuntimeError("cannot judge")

    monkeypatch.setattr(SoftmaxConverter, "validate", broken)
    reasons = native_ops(lambda t: tf.nn.softmax(t * 2.0) + 1.0, [tf.TensorSpec((2, 3))])
    assert reasons["Softmax"] == {"check raised RuntimeError: cannot judge": 1}


def test_frozen_variables_behind_an_identity_are_constants():
    """convert_variables_to_constants leaves Const -> Identity before MatMul and BiasAdd."""
    dense = keras.layers.Dense(3)
    dense.build((None, 4))
    assert native_ops(lambda t: dense(t), [tf.TensorSpec((None, 4))]) == {}


def test_known_when_building_does_not_pass_through_a_native_node(monkeypatch):
    """The Reshape target is Shape -> Mul; with Mul denied it arrives at run time, so Reshape is refused."""
    monkeypatch.setenv("TF_TRT_OP_DENYLIST", "Mul")
    fn = lambda t: tf.reshape(t, tf.shape(t) * tf.constant([1, 1])) + 1.0
    reasons = native_ops(fn, [tf.TensorSpec((None, 3))])
    assert any("known when building" in r for r in reasons["Reshape"]), reasons
