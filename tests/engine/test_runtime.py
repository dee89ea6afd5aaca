"""Execution contexts check bindings and serve smaller batches of row-wise engines; row-wise networks
re-batch."""
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Engine, Network, NetworkError, Profiler, RuntimeExecutionError
from tftrt_py.engine.backends import onnxruntime as ort_backend
from tftrt_py.engine.runtime import rebatched

CPU_BACKENDS = ["numpy"] + (["onnxruntime"] if ort_backend.available()[0] else [])


def test_smaller_batch_is_served_and_matches(conv_engine):
    x = np.random.default_rng(2).standard_normal((4, 8, 8, 3)).astype("float32")
    ctx = conv_engine.create_execution_context()
    full = ctx.execute_v2([x])[0]
    part = ctx.execute_v2([x[:3]])[0]
    assert conv_engine.rowwise and part.shape == (3, 5)
    np.testing.assert_allclose(part, full[:3], rtol=1e-6)


def test_smaller_batches_in_turn_each_match_and_earlier_outputs_stay(conv_engine):
    """A context pads smaller batches in buffers it reuses: each call's rows are its own, and outputs already
    returned do not change when the next call writes the buffers."""
    x = np.random.default_rng(3).standard_normal((4, 8, 8, 3)).astype("float32")
    ctx = conv_engine.create_execution_context()
    full = ctx.execute_v2([x])[0].copy()
    kept = [(rows, ctx.execute_v2([x[4 - rows:]])[0]) for rows in (3, 1, 2, 3)]
    for rows, out in kept:
        np.testing.assert_allclose(out, full[4 - rows:], rtol=1e-6)
    np.testing.assert_allclose(ctx.execute_v2([x])[0], full, rtol=1e-6)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_an_input_handed_through_at_a_smaller_batch_is_not_overwritten_by_the_next_call(backend):
    net = Network("through")
    x = net.add_input("x", "float32", (4, 3))
    net.mark_output(net.add_layer("Identity", [x]).outputs[0])
    ctx = Builder(BuilderConfig(backend=backend)).build_engine(net).create_execution_context()
    first = ctx.execute_v2([np.full((2, 3), 1.0, np.float32)])[0]
    second = ctx.execute_v2([np.full((3, 3), 2.0, np.float32)])[0]
    assert first.shape == (2, 3) and (first == 1.0).all() and second.shape == (3, 3) and (second == 2.0).all()


def test_larger_batch_or_other_dims_are_refused(conv_engine):
    ctx = conv_engine.create_execution_context()
    with pytest.raises(RuntimeExecutionError, match="cannot be served"):
        ctx.execute_v2([np.ones((5, 8, 8, 3), "float32")])
    with pytest.raises(RuntimeExecutionError, match="cannot be served"):
        ctx.execute_v2([np.ones((4, 9, 8, 3), "float32")])


def test_wrong_dtype_and_missing_binding(conv_engine):
    ctx = conv_engine.create_execution_context()
    with pytest.raises(RuntimeExecutionError, match="dtype float64"):
        ctx.execute_v2([np.ones((4, 8, 8, 3))])
    with pytest.raises(RuntimeExecutionError, match="missing input"):
        ctx.execute({"nope": np.ones((4, 8, 8, 3), "float32")})


def test_engines_mixing_rows_serve_only_their_shape():
    net = Network()
    x = net.add_input("x", "float32", (4, 3))
    net.mark_output(net.add_layer("Reduce", [x], {"op": "sum", "axes": [0], "keep_dims": True}).outputs[0])
    engine = Builder().build_engine(net)
    assert not engine.rowwise and not engine.can_serve([(2, 3)]) and engine.can_serve([(4, 3)])


def test_profiler_receives_every_layer(conv_engine):
    ctx = conv_engine.create_execution_context()
    ctx.profiler = Profiler()
    ctx.execute_v2([np.ones((4, 8, 8, 3), "float32")])
    assert set(ctx.profiler.records) == {l.name for l in conv_engine.network.layers}


def test_rebatched_network_keeps_layers_and_matches_rows(conv_engine):
    net = conv_engine.network
    net.inputs[0].dynamic_range = 2.5
    one = rebatched(net, 1)
    assert [l.name for l in one.layers] == [l.name for l in net.layers]
    assert [l.precision for l in one.layers] == [l.precision for l in net.layers]
    assert one.inputs[0].shape == (1, 8, 8, 3) and one.inputs[0].dynamic_range == 2.5
    assert [t.name for t in one.outputs] == [t.name for t in net.outputs] and one.outputs[0].shape == (1, 5)
    x = np.random.default_rng(3).standard_normal((4, 8, 8, 3)).astype("float32")
    full = conv_engine.create_execution_context().execute_v2([x])[0]
    row = Engine(one).create_execution_context().execute_v2([x[2:3]])[0]
    np.testing.assert_allclose(row, full[2:3], rtol=1e-6)
    assert rebatched(net, 16).outputs[0].shape == (16, 5)


def test_networks_mixing_rows_or_fixing_the_batch_do_not_rebatch():
    mixing = Network("mixing")
    x = mixing.add_input("x", "float32", (4, 3))
    mixing.mark_output(mixing.add_layer("Reduce", [x], {"op": "sum", "axes": [0], "keep_dims": True}).outputs[0])
    with pytest.raises(NetworkError, match="mixes rows"):
        rebatched(mixing, 2)
    fixed = Network("fixed")
    x = fixed.add_input("x", "float32", (4, 3))
    fixed.mark_output(fixed.add_layer("Shuffle", [x], {"reshape": [4, 3, 1]}).outputs[0])
    with pytest.raises(NetworkError, match="fix the batch"):
        rebatched(fixed, 2)



def _flattened_dense(mix_rows: bool) -> Network:
    """x [4, 3, 5] -> reshape [12, 5] -> matmul [5, 2] (-> minus its mean over axis 0) -> reshape [4, 3, 2]."""
    net = Network()
    x = net.add_input("x", "float32", (4, 3, 5))
    flat = net.add_layer("Shuffle", [x], {"reshape": [12, 5]}).outputs[0]
    w = net.add_constant(np.random.default_rng(5).standard_normal((5, 2)).astype("float32"))
    y = net.add_layer("MatrixMultiply", [flat, w]).outputs[0]
    if mix_rows:
        mean = net.add_layer("Reduce", [y], {"op": "mean", "axes": [0], "keep_dims": True}).outputs[0]
        y = net.add_layer("ElementWise", [y, mean], {"op": "sub"}).outputs[0]
    net.mark_output(net.add_layer("Shuffle", [y], {"reshape": [4, 3, 2]}).outputs[0])
    return net


def test_a_batch_flattened_into_dim_0_and_back_stays_row_wise():
    engine = Builder().build_engine(_flattened_dense(mix_rows=False))
    assert engine.rowwise and engine.can_serve([(1, 3, 5)])
    x = np.random.default_rng(6).standard_normal((4, 3, 5)).astype("float32")
    full = engine.create_execution_context().execute_v2([x])[0]
    part = engine.create_execution_context().execute_v2([x[:3]])[0]
    np.testing.assert_allclose(part, full[:3], rtol=1e-6)


def test_rows_mixed_after_flattening_the_batch_are_not_row_wise():
    engine = Builder().build_engine(_flattened_dense(mix_rows=True))
    assert not engine.rowwise and not engine.can_serve([(3, 3, 5)])


@pytest.mark.parametrize("reshape, rowwise", [
    ([20, 3], True),      # five rows of dim 0 per batch row: rows stay apart
    ([3, 20], False),     # 3 is no multiple of the batch (4): rows would share a row of dim 0
    ([60], True),         # flat: each batch row is 15 consecutive entries
    ([5, 12], False),
])
def test_a_reshape_is_row_wise_when_dim_0_stays_a_multiple_of_the_batch(reshape, rowwise):
    net = Network()
    x = net.add_input("x", "float32", (4, 3, 5))
    y = net.add_layer("Shuffle", [x], {"reshape": reshape}).outputs[0]
    y = net.add_layer("Unary", [y], {"op": "abs"}).outputs[0]  # keeps the two reshapes apart
    net.mark_output(net.add_layer("Shuffle", [y], {"reshape": [4, 15]}).outputs[0])
    assert Builder().build_engine(net).rowwise is rowwise


def test_a_batched_operand_broadcast_into_other_axes_is_not_row_wise():
    net = Network()
    x = net.add_input("x", "float32", (4, 3))
    y = net.add_layer("Shuffle", [x], {"reshape": [4, 1, 3]}).outputs[0]
    net.mark_output(net.add_layer("ElementWise", [y, x], {"op": "sum"}).outputs[0])  # [4, 4, 3]: y[i] + x[j]
    assert not Builder().build_engine(net).rowwise



def test_an_embedding_lookup_of_batched_ids_is_row_wise():
    rng = np.random.default_rng(9)
    table = rng.standard_normal((10, 5)).astype("float32")
    net = Network()
    ids = net.add_input("ids", "int32", (4, 3))
    net.mark_output(net.add_layer("Gather", [net.add_constant(table), ids], {"axis": 0}).outputs[0])
    engine = Builder().build_engine(net)
    few = rng.integers(0, 10, (2, 3)).astype("int32")
    assert engine.rowwise and engine.can_serve([(2, 3)])
    np.testing.assert_array_equal(engine.create_execution_context().execute_v2([few])[0], table[few])
