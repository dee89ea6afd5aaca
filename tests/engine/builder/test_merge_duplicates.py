"""Duplicate merging: equal data-moving layers (Shuffle, Slice, Identity) reading the same tensors become one, so
the layers after them see one input (Keras's Tensordot reshapes a hidden state once per dense layer: q, k and v
then fuse horizontally); computing layers and equal constants merge only once fusions have settled (the late
common-subexpression pass); network outputs stay."""
import numpy as np

from fusion_nets import add, build_and_compare, matmul, network, rand


def kinds(engine):
    return [l.kind for l in engine.network.layers if l.kind != "Constant"]


def test_one_reshape_per_projection_merges_and_the_projections_fuse():
    def make():
        net, (x,) = network((2, 6, 8))
        for name in ("q", "k", "v"):
            rows = add(net, "Shuffle", [x], f"{name}/reshape", reshape=[12, 8])
            net.mark_output(matmul(net, rows, 4, name))
        return net

    engine = build_and_compare(make, [rand(2, 6, 8)])
    assert kinds(engine).count("Shuffle") == 1
    assert kinds(engine).count("MatrixMultiply") == 1  # one GEMM of the concatenated weights, then Slices


def test_layers_that_differ_or_compute_stay_apart():
    def make():
        net, (x, y) = network((4, 6), (4, 6))
        net.mark_output(add(net, "Slice", [x], "a", start=[0, 0], size=[4, 3], stride=[1, 1]))
        net.mark_output(add(net, "Slice", [x], "b", start=[0, 3], size=[4, 3], stride=[1, 1]))  # other params
        net.mark_output(add(net, "Slice", [y], "c", start=[0, 0], size=[4, 3], stride=[1, 1]))  # another input
        net.mark_output(add(net, "Unary", [x], "abs1", op="abs"))
        net.mark_output(add(net, "Unary", [x], "abs2", op="abs"))  # an output: kept
        return net

    engine = build_and_compare(make, [rand(4, 6), rand(4, 6)])
    assert kinds(engine) == ["Slice", "Slice", "Slice", "Unary", "Unary"]


def test_a_duplicate_read_by_others_merges_and_an_output_stays():
    def make():
        net, (x,) = network((3, 4))
        first = add(net, "Shuffle", [x], "first", first_perm=[1, 0])
        second = add(net, "Shuffle", [x], "second", first_perm=[1, 0])
        net.mark_output(add(net, "ElementWise", [first, second], "sum", op="sum"))
        net.mark_output(add(net, "Shuffle", [x], "output", first_perm=[1, 0]))  # a network output: kept
        return net

    x = rand(3, 4)
    engine = build_and_compare(make, [x])
    assert kinds(engine) == ["Shuffle", "ElementWise", "Shuffle"]
    out = engine.create_execution_context().execute({"x0": x})
    np.testing.assert_allclose(out[engine.outputs[0].name], 2 * x.T, rtol=1e-6)
    np.testing.assert_array_equal(out[engine.outputs[1].name], x.T)


def _block_mask(net, x, pad, i, value=1.0):
    """What a converted GPT-2 block rebuilds from the padding mask: min(padding, a constant triangle)."""
    tri = net.add_constant(np.tril(np.full((6, 6), value, "float32")), name=f"tri{i}")
    return add(net, "ElementWise", [pad, tri], f"mask{i}", op="min")


def test_equal_computations_and_constants_merge_once_fusions_settle():
    def make():
        net, (x, pad) = network((2, 6, 6), (2, 1, 6))
        y = x
        for i in range(3):
            y = add(net, "ElementWise", [y, _block_mask(net, x, pad, i)], f"apply{i}", op="prod")
        net.mark_output(y)
        return net

    engine = build_and_compare(make, [rand(2, 6, 6), rand(2, 1, 6)])
    assert kinds(engine).count("ElementWise") == 4  # one mask, three products
    masks = [l for l in engine.network.layers if l.name.startswith("mask")]
    assert [l.name for l in masks] == ["mask0"]
    assert [l for l in engine.network.layers if l.kind == "Constant"][0].name == "tri0"


def test_computations_with_other_constants_stay_apart():
    def make():
        net, (x, pad) = network((2, 6, 6), (2, 1, 6))
        y = add(net, "ElementWise", [x, _block_mask(net, x, pad, 0)], "apply0", op="prod")
        net.mark_output(add(net, "ElementWise", [y, _block_mask(net, x, pad, 1, value=2.0)], "apply1", op="prod"))
        return net

    engine = build_and_compare(make, [rand(2, 6, 6), rand(2, 1, 6)])
    assert kinds(engine).count("ElementWise") == 4


def test_empty_and_scalar_constants_are_compared_by_value_too():
    from tftrt_py.engine.builder.passes import merge_common_subexpressions
    from tftrt_py.engine import Network

    net = Network("consts")
    x = net.add_input("x", "float32", (2, 3))
    for i, value in enumerate([np.zeros((0, 3), "float32"), np.zeros((0, 3), "float32"), np.float32(2), np.float32(2),
                               np.float32(3)]):
        c = net.add_constant(np.asarray(value), name=f"c{i}")
        net.mark_output(net.add_layer("Concatenation" if c.shape == (0, 3) else "ElementWise", [x, c],
                                      {"axis": 0} if c.shape == (0, 3) else {"op": "prod"}, name=f"use{i}").outputs[0])
    assert merge_common_subexpressions(net)
    assert [l.name for l in net.layers if l.kind == "Constant"] == ["c0", "c2", "c4"]


def test_constants_alike_where_their_hash_samples_them_but_not_whole_stay_apart():
    """Constants are keyed by a hash of evenly spaced elements (passes.SAMPLED_ELEMENTS), then compared whole."""
    from tftrt_py.engine import Network
    from tftrt_py.engine.builder import passes

    size = passes.SAMPLED_ELEMENTS * 4
    same = rand(size)
    differs = same.copy()
    differs[1] += 1.0  # between the sampled elements 0 and 4
    net = Network("consts")
    x = net.add_input("x", "float32", (size,))
    for i, value in enumerate([same, same.copy(), differs]):
        c = net.add_constant(value, name=f"c{i}")
        net.mark_output(net.add_layer("ElementWise", [x, c], {"op": "sum"}, name=f"use{i}").outputs[0])
    assert passes._digest(same) == passes._digest(differs)
    assert passes.merge_common_subexpressions(net)
    assert [l.name for l in net.layers if l.kind == "Constant"] == ["c0", "c2"]
