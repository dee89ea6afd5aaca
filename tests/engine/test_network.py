"""The network IR: unique names, inferred shapes, safe editing, lint."""
import numpy as np
import pytest

from tftrt_py.engine import Network, NetworkError


def test_layers_get_unique_names_and_inferred_shapes():
    net = Network()
    x = net.add_input("x", "float32", (2, 3))
    a = net.add_layer("Activation", [x], {"type": "relu"}, name="act")
    b = net.add_layer("Activation", a.outputs, {"type": "relu"}, name="act")
    assert (a.name, b.name) == ("act", "act_1")
    assert b.outputs[0].shape == (2, 3) and b.outputs[0].dtype == "float32"


def test_bad_shapes_are_rejected_with_the_layer_name():
    net = Network()
    a = net.add_input("a", "float32", (2, 3))
    b = net.add_input("b", "float32", (4, 3))
    with pytest.raises(NetworkError, match="do not broadcast"):
        net.add_layer("ElementWise", [a, b], {"op": "sum"}, name="add")


def test_unknown_dims_and_kinds_are_rejected():
    net = Network()
    with pytest.raises(NetworkError, match="unknown dims"):
        net.add_input("x", "float32", (-1, 3))
    x = net.add_input("x", "float32", (1, 3))
    with pytest.raises(NetworkError, match="unknown layer kind"):
        net.add_layer("Frobnicate", [x])


def test_erase_refuses_while_users_remain():
    net = Network()
    x = net.add_input("x", "float32", (2,))
    a = net.add_layer("Unary", [x], {"op": "exp"})
    b = net.add_layer("Unary", a.outputs, {"op": "log"})
    net.mark_output(b.outputs[0])
    with pytest.raises(NetworkError, match="still has users"):
        net.erase(a)


def test_mark_output_renames_or_copies():
    net = Network()
    x = net.add_input("x", "float32", (2,))
    out = net.mark_output(x, name="y")  # an input keeps its name: an Identity binds the output
    assert out.name == "y" and net.layers[-1].kind == "Identity"
    twice = net.mark_output(out, name="z")
    assert twice.name == "z" and len(net.outputs) == 2


def test_lint_finds_use_before_definition():
    net = Network()
    x = net.add_input("x", "float32", (2,))
    a = net.add_layer("Unary", [x], {"op": "exp"})
    b = net.add_layer("Unary", a.outputs, {"op": "log"})
    net.layers.reverse()
    with pytest.raises(NetworkError, match="before it is produced"):
        net.lint()
    assert np.dtype(b.outputs[0].dtype) == np.float32
