"""The builder folds constants and removes dead layers, to a fixed point."""
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, BuildError, Network


def test_constant_subgraphs_fold_into_one_constant():
    net = Network()
    x = net.add_input("x", "float32", (2, 3))
    c = net.add_constant(np.full((3,), 2.0, "float32"))
    c2 = net.add_layer("Unary", [c], {"op": "exp"}).outputs[0]
    y = net.add_layer("ElementWise", [x, c2], {"op": "prod"}).outputs[0]
    net.mark_output(y)
    engine = Builder().build_engine(net)
    assert [l.kind for l in engine.network.layers] == ["Constant", "ElementWise"]
    a = np.ones((2, 3), "float32")
    out = engine.create_execution_context().execute_v2([a])[0]
    np.testing.assert_allclose(out, a * np.exp(2.0), rtol=1e-6)


def test_dead_layers_are_eliminated():
    net = Network()
    x = net.add_input("x", "float32", (2,))
    net.add_layer("Unary", [x], {"op": "exp"}, name="unused")
    net.mark_output(net.add_layer("Unary", [x], {"op": "abs"}, name="used").outputs[0])
    engine = Builder().build_engine(net)
    assert [l.name for l in engine.network.layers] == ["used"]


def test_precision_is_recorded_and_validated():
    with pytest.raises(BuildError, match="unknown precision"):
        BuilderConfig(precision="FP64")
    assert BuilderConfig(precision="fp16").precision == "FP16"


def test_a_network_without_outputs_does_not_build():
    net = Network("empty")
    net.add_input("x", "float32", (1,))
    with pytest.raises(BuildError, match="no outputs"):
        Builder().build_engine(net)


def test_inspector_lists_layers(conv_engine):
    rows = conv_engine.inspect()
    assert [r["kind"] for r in rows] == ["Convolution", "Pooling", "Reduce"]
    assert rows[0]["outputs"] == [[4, 8, 8, 5]] and rows[0]["precision"] == "FP32"
