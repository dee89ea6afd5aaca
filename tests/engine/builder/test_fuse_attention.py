"""Attention fusion: q k^T, a scalar scaling, Softmax over the last axis and the product with v become one
Attention layer; packed (heads side by side, no transposes) when Shuffles split and merge the heads."""
import numpy as np
import pytest

from fusion_nets import add, build_and_compare, const, network, rand
from tftrt_py.engine.builder.fusions.match import fusion_counts

B, S, T, H, D = 2, 5, 6, 3, 4  # batch, query and key lengths, heads, head width


def attention(net, q, k, v, scaling="scale", transpose_b=True, axis=-1, mask=None, bias=None):
    """softmax(q k^T * 0.5, `axis`) v; `scaling` is "scale" (a Scale layer), "mul", "div" or None."""
    params = {"transpose_b": True} if transpose_b else {}
    weights = {"bias": rand(k.shape[-2 if transpose_b else -1])} if bias else None
    scores = add(net, "MatrixMultiply", [q, k], "scores", weights, **params)
    if scaling == "scale":
        scores = add(net, "Scale", [scores], "scaled", {"scale": np.array([0.5], "float32")})
    elif scaling:
        c = const(net, 0.5 if scaling == "mul" else 2.0, "c")
        scores = add(net, "ElementWise", [c, scores] if scaling == "mul" else [scores, c], "scaled",
                     op="prod" if scaling == "mul" else "div")
    if mask is not None:
        scores = add(net, "ElementWise", [scores, mask], "masked", op="sum")
    probs = add(net, "Softmax", [scores], "softmax", axis=axis)
    return add(net, "MatrixMultiply", [probs, v], "context")


def plain(scaling="scale", **kw):
    def make():
        net, (q, k, v) = network((B, H, S, D), (B, H, T, D), (B, H, T, D + 1))
        net.mark_output(attention(net, q, k, v, scaling, **kw))
        return net
    return make


def kinds(engine):
    return [l.kind for l in engine.network.layers if l.kind != "Constant"]


def inputs(*shapes):
    return [rand(*s) for s in shapes]


@pytest.mark.parametrize("scaling, scale", [("scale", 0.5), ("mul", 0.5), ("div", 0.5), (None, 1.0)])
def test_attention_fuses(scaling, scale):
    engine = build_and_compare(plain(scaling), inputs((B, H, S, D), (B, H, T, D), (B, H, T, D + 1)))
    attention, = engine.network.layers
    assert attention.kind == "Attention" and attention.params == {"scale": scale, "heads": None}
    assert fusion_counts(engine.network) == {"attention": 1}


def test_keys_given_transposed_are_transposed_for_it():
    def make():
        net, (q, kt, v) = network((B, S, D), (B, D, T), (B, T, D))
        net.mark_output(attention(net, q, kt, v, transpose_b=False))
        return net

    engine = build_and_compare(make, inputs((B, S, D), (B, D, T), (B, T, D)))
    assert kinds(engine) == ["Shuffle", "Attention"]
    assert engine.network.layers[0].params == {"first_perm": [0, 2, 1]}


def test_the_tensors_attention_reads_through_new_shuffles_keep_their_ranges():
    """A transposed k, packed [B*S, H*D] rows viewed as [B, S, H*D]: the same values, the same ranges (an INT8
    Attention quantizes them)."""
    def transposed():
        net, (q, kt, v) = network((B, S, D), (B, D, T), (B, T, D))
        kt.dynamic_range = 2.0
        net.mark_output(attention(net, q, kt, v, transpose_b=False))
        return net

    def rows():
        net, (q, k, v) = network((B * S, H * D), (B * T, H * D), (B * T, H * 2))
        for t, r in zip((q, k, v), (1.0, 2.0, 3.0)):
            t.dynamic_range = r
        net.mark_output(merge(net, attention(net, split(net, q, "q", S), split(net, k, "k", T),
                                             split(net, v, "v", T)), [B * S, H * 2]))
        return net

    engine = build_and_compare(transposed, inputs((B, S, D), (B, D, T), (B, T, D)))
    assert [t.dynamic_range for t in engine.network.layers[1].inputs] == [None, 2.0, None]
    engine = build_and_compare(rows, inputs((B * S, H * D), (B * T, H * D), (B * T, H * 2)))
    attention_layer = next(l for l in engine.network.layers if l.kind == "Attention")
    assert [t.dynamic_range for t in attention_layer.inputs] == [1.0, 2.0, 3.0]


def split(net, t, name, rows, perm=(0, 2, 1, 3)):
    """[B, rows, H*D] (or [B*rows, H*D]) -> [B, H, rows, D] (perm (0, 2, 3, 1): [B, H, D, rows])."""
    return add(net, "Shuffle", [t], name, reshape=[B, rows, H, -1], second_perm=list(perm))


def merge(net, t, shape):
    return add(net, "Shuffle", [t], "merge", first_perm=[0, 2, 1, 3], reshape=list(shape))


@pytest.mark.parametrize("rows_2d", [False, True])
def test_split_and_merged_heads_give_packed_attention(rows_2d):
    shapes = [(B * S, H * D), (B * T, H * D), (B * T, H * 2)] if rows_2d else [(B, S, H * D), (B, T, H * D),
                                                                               (B, T, H * 2)]

    def make():
        net, (q, k, v) = network(*shapes)
        ctx = attention(net, split(net, q, "q", S), split(net, k, "k", T), split(net, v, "v", T))
        net.mark_output(merge(net, ctx, [B * S, H * 2] if rows_2d else [B, S, H * 2]))
        return net

    engine = build_and_compare(make, inputs(*shapes))
    assert kinds(engine) == ["Shuffle"] * 3 + ["Attention", "Shuffle"] if rows_2d else ["Attention"]
    attention_layer = next(l for l in engine.network.layers if l.kind == "Attention")
    assert attention_layer.params == {"scale": 0.5, "heads": H}
    assert [t.shape for t in attention_layer.inputs] == [(B, S, H * D), (B, T, H * D), (B, T, H * 2)]


def test_repeated_head_layouts_all_pack_and_a_layout_with_their_shapes_alone_does_not():
    """Layers repeating one head split all pack (the check over index arrays is answered once for them); a split that
    reshapes [B, S, H*D] straight to [B, H, S, D] has the same shapes but other elements per head, so it does not."""
    shapes = [(B, S, H * D), (B, T, H * D), (B, T, H * 2)]

    def make():
        net, (q, k, v) = network(*shapes)
        for i in range(3):
            ctx = attention(net, split(net, q, f"q{i}", S), split(net, k, f"k{i}", T), split(net, v, f"v{i}", T))
            net.mark_output(merge(net, ctx, [B, S, H * 2]), name=f"out{i}")
        flat = add(net, "Shuffle", [q], "q_flat", reshape=[B, H, S, D])
        ctx = attention(net, flat, split(net, k, "k3", T), split(net, v, "v3", T))
        net.mark_output(merge(net, ctx, [B, S, H * 2]), name="out3")
        return net

    engine = build_and_compare(make, inputs(*shapes))
    heads = [l.params["heads"] for l in engine.network.layers if l.kind == "Attention"]
    assert sorted(heads, key=str) == [H, H, H, None]


def test_keras_head_layout_gives_packed_attention():
    """Keras MultiHeadAttention as converted: reshape to [B, S, H, D], then transposes (k to [B, H, D, T]), the
    context transposed back and reshaped in two Shuffles."""
    def make():
        net, (q, k, v) = network((B, S, H * D), (B, T, H * D), (B, T, H * D))

        def heads(t, name, perm, shape):
            t = add(net, "Shuffle", [t], f"{name}/reshape", reshape=[B, t.shape[1], H, D])
            return add(net, "Shuffle", [t], f"{name}/perm", first_perm=list(perm), reshape=list(shape))

        ctx = attention(net, heads(q, "q", (0, 2, 1, 3), (B, H, S, D)), heads(k, "k", (0, 2, 3, 1), (B, H, D, T)),
                        heads(v, "v", (0, 2, 1, 3), (B, H, T, D)), scaling="mul", transpose_b=False)
        ctx = add(net, "Shuffle", [ctx], "ctx/perm", reshape=[B, H, S, D], second_perm=[0, 2, 1, 3])
        net.mark_output(add(net, "Shuffle", [ctx], "ctx/reshape", reshape=[B, S, H * D]))
        return net

    engine = build_and_compare(make, inputs((B, S, H * D), (B, T, H * D), (B, T, H * D)))
    assert kinds(engine) == ["Attention"] and engine.network.layers[0].params["heads"] == H


def test_split_read_elsewhere_stays_and_context_read_elsewhere_keeps_heads_unpacked():
    def make():
        net, (q, k, v) = network((B, S, H * D), (B, T, H * D), (B, T, H * D))
        qh = split(net, q, "q", S)
        ctx = attention(net, qh, split(net, k, "k", T), split(net, v, "v", T))
        net.mark_output(add(net, "Unary", [qh], "q_elsewhere", op="abs"))
        net.mark_output(merge(net, ctx, [B, S, H * D]))
        return net

    engine = build_and_compare(make, inputs((B, S, H * D), (B, T, H * D), (B, T, H * D)))
    assert kinds(engine) == ["Shuffle", "Unary", "Attention"]  # the q split stays for its other reader
    assert engine.network.layers[-1].params["heads"] == H

    def make_merge_read_elsewhere():
        net = make()
        net.mark_output(next(l for l in net.layers if l.name == "merge").inputs[0], name="context")
        return net

    engine = build_and_compare(make_merge_read_elsewhere, inputs((B, S, H * D), (B, T, H * D), (B, T, H * D)))
    attention_layer = next(l for l in engine.network.layers if l.kind == "Attention")
    assert attention_layer.params["heads"] is None and "merge" in [l.name for l in engine.network.layers]


def test_near_misses_do_not_fuse():
    def make():
        net, (q, k, v, m) = network((B, S, D), (B, T, D), (B, T, D), (B, S, T))
        net.mark_output(attention(net, q, k, v, mask=m))  # a mask added between scaling and softmax
        net.mark_output(attention(net, q, k, v, axis=1))  # softmax over the query axis
        net.mark_output(attention(net, q, k, v, bias=True))  # a bias on the scores
        ctx = attention(net, q, k, v)
        net.mark_output(ctx)
        net.mark_output(next(l for l in net.layers if l.outputs[0] is ctx).inputs[0])  # probabilities read too
        net.mark_output(attention(net, q, k, v, scaling=None))  # fuses
        return net

    engine = build_and_compare(make, inputs((B, S, D), (B, T, D), (B, T, D), (B, S, T)))
    assert [l.kind for l in engine.network.layers].count("Attention") == 1  # only the last one
    assert sum(l.kind == "Softmax" for l in engine.network.layers) == 4


def test_unbatched_attention_does_not_fuse():
    def make():
        net, (q, k, v) = network((S, D), (T, D), (T, D))
        net.mark_output(attention(net, q, k, v))
        return net

    engine = build_and_compare(make, inputs((S, D), (T, D), (T, D)))
    assert "Attention" not in kinds(engine)
