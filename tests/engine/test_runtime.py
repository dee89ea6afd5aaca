"""Execution contexts check bindings and serve smaller batches of row-wise engines."""
import numpy as np
import pytest

from tftrt_py.engine import Builder, Network, Profiler, RuntimeExecutionError



def test_smaller_batch_is_served_and_matches(conv_engine):
    x = np.random.default_rng(2).standard_normal((4, 8, 8, 3)).astype("float32")
    ctx = conv_engine.create_execution_context()
    full = ctx.execute_v2([x])[0]
    part = ctx.execute_v2([x[:3]])[0]
    assert conv_engine.rowwise and part.shape == (3, 5)
    np.testing.assert_allclose(part, full[:3], rtol=1e-6)


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
