"""The rewrite step every fusion rule shares: a sweep keeps its map of tensor readers up to date as it rewrites,
so each rule sees the network as it is without the map being recomputed after every match."""
from unittest import mock

import gpu_bert as bert
import pytest
from fusion_nets import add, const, conv, network

from tftrt_py.engine import Builder, BuilderConfig
from tftrt_py.engine.builder.fusions import match


def readers(users):
    """A consumers map as comparable data: tensor name -> sorted reader ids, tensors nobody reads left out."""
    return {name: sorted(id(l) for l in layers) for name, layers in users.items() if layers}


def bert_layer():
    return bert.network(batch=2, seq=16, model=bert.spec(hidden=64, heads=4, ffn=128), dtype="float32")


def conv_block():
    """x + 0 (erased: its readers read x), a convolution read twice, its bias, ReLU and a residual sum."""
    net, (x,) = network((1, 8, 8, 4))
    x0 = add(net, "ElementWise", [x, const(net, 0.0, "zero")], "plus_zero", op="sum")
    y = conv(net, x0, 4, "conv")
    y = add(net, "ElementWise", [y, const(net, [0.5] * 4, "b")], "bias", op="sum")
    y = add(net, "Activation", [y], "relu", type="relu")
    y = add(net, "ElementWise", [y, x0], "residual", op="sum")
    net.mark_output(add(net, "ElementWise", [y, y], "twice", op="sum"), "y")
    return net


@pytest.mark.parametrize("make, rules", [(bert_layer, {"layer normalization", "MLP"}),
                                         (conv_block, {"ElementWise erasure", "Convolution + bias"})])
def test_the_readers_a_sweep_keeps_equal_the_networks_after_every_rewrite(make, rules):
    rewrite, checked = match._rewrite, []

    def checking(network, users, found):
        name = rewrite(network, users, found)
        assert readers(users) == readers(network.consumers()), found.rule
        checked.append(found.rule)
        return name

    with mock.patch.object(match, "_rewrite", checking):
        Builder(BuilderConfig(lint=True)).build_engine(make())
    assert rules <= set(checked), checked
