"""Two-operand Einsum maps to Shuffles around one MatrixMultiply and matches TensorFlow."""
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, random_array
from tftrt_py.convert.ops.einsum import plan_einsum

#: equation -> operand shapes (batch first where there is one)
EQUATIONS = {
    "bij,bjk->bik": ((2, 3, 4), (2, 4, 5)),
    "abc,cd->abd": ((2, 3, 4), (4, 5)),
    "bhqd,bhkd->bhqk": ((2, 3, 4, 5), (2, 3, 6, 5)),
    "bhqk,bhkd->bhqd": ((2, 3, 4, 6), (2, 3, 6, 5)),
    "BTNH,BSNH->BNTS": ((2, 4, 3, 5), (2, 6, 3, 5)),  # Keras MultiHeadAttention: scores
    "BNTS,BSNH->BTNH": ((2, 3, 4, 6), (2, 6, 3, 5)),  # Keras MultiHeadAttention: context
    "abc,cde->abde": ((2, 3, 4), (4, 5, 6)),  # EinsumDense projections
    "abcd,cde->abe": ((2, 3, 4, 5), (4, 5, 6)),
    "ij,jk->ki": ((3, 4), (4, 5)),
    "bij,bkj->bik": ((2, 3, 4), (2, 5, 4)),  # transpose_b, no Shuffle
    "bji,bjk->bik": ((2, 4, 3), (2, 4, 5)),  # transpose_a, no Shuffle
    "ij,j->i": ((3, 4), (4,)),
    "i,j->ij": ((3,), (4,)),
    "bi,bi->b": ((3, 4), (3, 4)),
    "ij,jk": ((3, 4), (4, 5)),  # implicit output: ik
}


@pytest.mark.parametrize("equation", sorted(EQUATIONS))
def test_einsum(equation):
    shapes = EQUATIONS[equation]
    assert check(lambda a, b: tf.einsum(equation, a, b), [tf.TensorSpec(s) for s in shapes], "Einsum") is None
    assert_converts(lambda a, b: tf.einsum(equation, a, b), [random_array(s) for s in shapes],
                    expect_kinds=["MatrixMultiply"])


@pytest.mark.parametrize("batch", [1, 3])
def test_attention_with_a_constant_projection(batch):
    w = random_array((8, 2, 4))
    fn = lambda x: tf.einsum("bhqk,bkhd->bqhd", tf.nn.softmax(tf.einsum("bqhd,bkhd->bhqk", x, x)), x) + \
        tf.einsum("abc,cde->abde", tf.reshape(x, [batch, 5, 8]), w)
    assert_converts(fn, [random_array((batch, 5, 2, 4))], rtol=1e-4, atol=1e-5)


def test_transposed_operands_need_no_shuffle():
    engine = assert_converts(lambda a, b: tf.einsum("bji,bkj->bik", a, b), [random_array((2, 4, 3)),
                                                                             random_array((2, 5, 4))])
    assert [layer.kind for layer in engine.network.layers] == ["MatrixMultiply"]


@pytest.mark.parametrize("equation,reason", [
    ("bii,bij->bj", "repeated index"),
    ("...ij,...jk->...ik", "ellipses"),
    ("ij,jk,kl->il", "3 operands"),
    ("ijk,jl->il", "summed over one operand"),
])
def test_unsupported_equations_are_refused(equation, reason):
    plan = plan_einsum(equation)
    assert isinstance(plan, str) and reason in plan


def test_refusal_reaches_the_segmenter():
    specs = [tf.TensorSpec((2, 3, 4)), tf.TensorSpec((4, 5))]
    assert "summed over one operand" in check(lambda a, b: tf.einsum("abc,cd->ad", a, b), specs, "Einsum")


def test_unknown_rank_is_refused():
    specs = [tf.TensorSpec(None), tf.TensorSpec((4, 5))]
    assert "unknown rank" in check(lambda a, b: tf.einsum("abc,cd->abd", a, b), specs, "Einsum")


def test_int32_einsum_is_refused():
    specs = [tf.TensorSpec((2, 3), tf.int32), tf.TensorSpec((3, 4), tf.int32)]
    assert "int32" in check(lambda a, b: tf.einsum("ij,jk->ik", a, b), specs, "Einsum")
