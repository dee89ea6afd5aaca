"""Masked attention: Keras's masked Softmax (Select(mask, scores, large negative)) fuses into the Attention layer
as its mask input and ``mask_value``; an all-true constant in the mask is dropped and a constant causal triangle
becomes ``causal``. Converted Keras MultiHeadAttention and keras-hub BERT / GPT-2 backbones keep one Attention per
layer with its mask and compute what TF computes, fully masked rows (a uniform softmax) included."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from fusion_nets import add, build_and_compare, network, rand
from support import run_engine, segment_graph_def
from tftrt_py.convert.build import build_engine
from tftrt_py.engine import BuilderConfig
from tftrt_py.engine import Runtime
from tftrt_py.engine.builder.fusions.match import fusion_counts
from tftrt_py.engine.layer_geometry import causal_keep

B, H, S, D = 2, 3, 5, 4
BIG = -2.372671e38  # Keras's large negative for float32


def masked_attention(net, q, k, v, mask):
    scores = add(net, "MatrixMultiply", [q, k], "scores", transpose_b=True)
    scaled = add(net, "ElementWise", [scores, net.add_constant(np.float32(0.5), name="half")], "scaled", op="prod")
    masked = add(net, "Select", [mask, scaled, net.add_constant(np.float32(BIG), name="big")], "masked")
    return add(net, "MatrixMultiply", [add(net, "Softmax", [masked], "softmax", axis=-1), v], "context")


def padding_mask(rng, fully_masked_row=True):
    keep = rng.random((B, 1, 1, S)) > 0.4
    if fully_masked_row:
        keep[0] = False
    return keep


def build(mask_of):
    """Attention over [B, H, S, D] heads with the bool mask mask_of(net, mask input) before its Softmax."""
    def make():
        net, (q, k, v) = network((B, H, S, D), (B, H, S, D), (B, H, S, D))
        mask = net.add_input("mask", "bool", (B, 1, 1, S))
        net.mark_output(masked_attention(net, q, k, v, mask_of(net, mask)))
        return net
    return make


def feed(rng):
    return [rand(B, H, S, D), rand(B, H, S, D), rand(B, H, S, D), padding_mask(rng)]


def attention_layer(engine):
    layer, = [l for l in engine.network.layers if l.kind == "Attention"]
    return layer


def test_a_padding_mask_becomes_the_attention_mask_input():
    engine = build_and_compare(build(lambda net, m: m), feed(np.random.default_rng(0)))
    layer = attention_layer(engine)
    assert layer.params == {"scale": 0.5, "heads": None, "causal": False, "mask_value": pytest.approx(BIG)}
    assert layer.inputs[3].name == "mask" and fusion_counts(engine.network) == {"attention": 1}
    inputs = dict(zip([t.name for t in engine.inputs], feed(np.random.default_rng(5))))
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    assert attention_layer(loaded).params == layer.params
    run = lambda e: list(e.create_execution_context().execute(inputs).values())[0]
    np.testing.assert_array_equal(run(loaded), run(engine))  # the plan keeps the mask and its params


def test_an_and_with_all_true_is_dropped_and_one_with_the_causal_triangle_becomes_causal():
    def mask_of(net, m):
        ones = net.add_constant(np.ones((B, H, S, S), bool), name="ones")
        tril = net.add_constant(np.broadcast_to(causal_keep(S, S), (1, 1, S, S)).copy(), name="tril")
        return add(net, "ElementWise", [tril, add(net, "ElementWise", [ones, m], "all", op="and")], "causal", op="and")

    layer = attention_layer(build_and_compare(build(mask_of), feed(np.random.default_rng(1))))
    assert layer.params["causal"] is True and layer.inputs[3].name == "mask"


def test_a_constant_causal_mask_alone_leaves_no_mask_input():
    tril = lambda net, m: net.add_constant(np.broadcast_to(causal_keep(S, S), (B, H, S, S)).copy(), name="tril")
    layer = attention_layer(build_and_compare(build(tril), feed(np.random.default_rng(2))))
    assert len(layer.inputs) == 3 and layer.params["causal"] is True


def test_a_constant_mask_of_another_pattern_stays_an_input():
    upper = lambda net, m: net.add_constant(~causal_keep(S, S)[None, None], name="upper")
    layer = attention_layer(build_and_compare(build(upper), feed(np.random.default_rng(3))))
    assert len(layer.inputs) == 4 and layer.params["causal"] is False


# -- converted from TensorFlow ------------------------------------------------------------------------------------
def assert_matches_tf(fn, inputs, masks):
    """`fn` converted: one Attention per entry of `masks` ((shape of its mask input or None, causal)), TF's output."""
    engine, outs = run_engine(fn, inputs)
    layers = [l for l in engine.network.layers if l.kind == "Attention"]
    assert [(tuple(l.inputs[3].shape) if len(l.inputs) > 3 else None, l.params.get("causal")) for l in layers] == masks
    want = tf.nest.flatten(fn(*[tf.constant(x) for x in inputs]))
    assert len(outs) == len(want)
    for got, expected in zip(outs, want):
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)


def tokens(rng, batch=3, seq=8, vocab=50):
    """Token ids and a padding mask with one row fully masked and one partly."""
    mask = np.ones((batch, seq), np.int32)
    mask[0] = 0
    mask[1, seq // 2:] = 0
    return rng.integers(1, vocab, (batch, seq)).astype(np.int32), mask


def test_keras_multi_head_attention_with_an_attention_mask():
    keras.utils.set_random_seed(4)
    mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 6, 16)).astype(np.float32)
    keep = rng.random((3, 6, 6)) > 0.3
    keep[0] = False  # every query of the first row sees no key
    assert_matches_tf(lambda x, m: mha(x, x, attention_mask=m), [x, keep], [((3, 1, 6, 6), False)])


def test_keras_multi_head_attention_causal_only():
    keras.utils.set_random_seed(6)
    mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=8)
    x = np.random.default_rng(7).standard_normal((2, 6, 16)).astype(np.float32)
    assert_matches_tf(lambda x: mha(x, x, use_causal_mask=True), [x], [(None, True)])


@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_keras_hub_backbones(name):
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(8)
    cls = {"bert": keras_hub.models.BertBackbone, "gpt2": keras_hub.models.GPT2Backbone}[name]
    model = cls(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16, intermediate_dim=32, dropout=0.0,
                max_sequence_length=8)
    ids, mask = tokens(np.random.default_rng(9))
    feed = {"token_ids": ids, "padding_mask": mask}
    if name == "bert":
        feed["segment_ids"] = (np.arange(8)[None] >= 4).repeat(3, 0).astype(np.int32)
    order = list(feed)
    fn = lambda *a: model(dict(zip(order, a)))
    # BERT's padding mask reaches the kernel as [B, 1, 1, S]; GPT-2's min(padding, causal) stays one [B, 1, S, S]
    # mask (its int min is not causal-and-padding for negative mask values)
    shape = (3, 1, 1, 8) if name == "bert" else (3, 1, 8, 8)
    assert_matches_tf(fn, [feed[k] for k in order], [(shape, False)] * 2)


@pytest.mark.parametrize("mask, params, message", [
    (("float32", (B, 1, 1, S)), {"causal": False, "mask_value": BIG}, "must be bool"),
    (("bool", (B, 1, 2, S)), {"causal": False, "mask_value": BIG}, "broadcast"),
    (("bool", (B, 1, S)), {"causal": False, "mask_value": BIG}, "broadcast"),
    (("bool", (B, 1, 1, S)), {}, "mask_value exactly"),
    (None, {"causal": True}, "mask_value exactly"),
    (None, {"causal": False, "mask_value": BIG}, "mask_value exactly"),
])
def test_malformed_masks_are_refused(mask, params, message):
    from tftrt_py.engine.errors import NetworkError

    net, (q, k, v) = network((B, H, S, D), (B, H, S, D), (B, H, S, D))
    inputs = [q, k, v] + ([net.add_input("mask", *mask)] if mask else [])
    with pytest.raises(NetworkError, match=message):
        net.add_layer("Attention", inputs, {"scale": 0.5, "heads": None, **params}, name="attention")


def test_keras_hub_bert_traced_with_dynamic_shapes():
    """A SavedModel's signature has [None, None] inputs: its all-true mask (ones shaped by the batch) becomes a
    row-wise constant that reads a network input, not the scores, so the attention still fuses."""
    keras_hub = pytest.importorskip("keras_hub")
    keras.utils.set_random_seed(10)
    model = keras_hub.models.BertBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=16,
                                          intermediate_dim=32, dropout=0.0, max_sequence_length=8)
    ids, mask = tokens(np.random.default_rng(11))
    segments = (np.arange(8)[None] >= 4).repeat(3, 0).astype(np.int32)
    fn = lambda i, s, m: model({"token_ids": i, "segment_ids": s, "padding_mask": m})
    specs = [tf.TensorSpec([None, None], tf.int32)] * 3
    engine = build_engine(segment_graph_def(fn, specs), [ids.shape] * 3, config=BuilderConfig(precision="FP32"))
    layers = [l for l in engine.network.layers if l.kind == "Attention"]
    assert [(tuple(l.inputs[3].shape), l.params["causal"]) for l in layers] == [((3, 1, 1, 8), False)] * 2
    outs = engine.create_execution_context().execute_v2([ids, segments, mask])
    for got, want in zip(outs, tf.nest.flatten(fn(tf.constant(ids), tf.constant(segments), tf.constant(mask)))):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)
