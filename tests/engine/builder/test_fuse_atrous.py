"""A convolution wrapped in space-to-batch rearrangements (how TF writes a dilated convolution: SpaceToBatchND ->
Conv2D -> BatchToSpaceND) becomes one dilated Convolution, computing what the rearranged network computes."""
import pytest

from fusion_nets import add, build_and_compare, network, rand
from tftrt_py.engine import Builder, BuilderConfig
from tftrt_py.engine.layer_geometry import batch_to_space_layers, space_to_batch_layers


def atrous(x_shape=(2, 13, 11, 4), block=(2, 3), pads=((2, 3), (3, 4)), crops=((0, 1), (0, 2)), k=3, stride=1,
           groups=1, extra_reader=False):
    """x -> SpaceToBatch -> Convolution (VALID) -> BatchToSpace -> y (y + the rearranged input, when
    `extra_reader`: a rearrangement read twice)."""
    net, (x,) = network(x_shape)
    t = x
    for kind, params in space_to_batch_layers(x_shape, block, [p[0] for p in pads], [p[1] for p in pads]):
        t = add(net, kind, [t], f"s2b/{kind}_{len(net.layers)}", **params)
    rearranged = t
    c = x_shape[-1]
    t = add(net, "Convolution", [t], "conv", {"kernel": rand(k, k, c // groups, c), "bias": rand(c)},
            strides=[stride] * 2, dilations=[1, 1], pre_padding=[0, 0], post_padding=[0, 0], groups=groups)
    for kind, params in batch_to_space_layers(t.shape, block, [c[0] for c in crops], [c[1] for c in crops]):
        t = add(net, kind, [t], f"b2s/{kind}_{len(net.layers)}", **params)
    if extra_reader:
        net.mark_output(rearranged, "rearranged")
    net.mark_output(t, "y")
    return net


def kinds(net):
    return [l.kind for l in net.layers if l.kind != "Constant"]


@pytest.mark.parametrize("block, pads, crops", [((2, 3), ((2, 3), (3, 4)), ((0, 1), (0, 2))),
                                                ((2, 2), ((1, 2), (2, 3)), ((0, 0), (0, 0))),
                                                ((3, 1), ((1, 1), (1, 1)), ((1, 0), (0, 0)))])
@pytest.mark.parametrize("groups", [1, 4])
def test_the_rearranged_convolution_becomes_one_dilated_convolution(block, pads, crops, groups):
    x_shape = (2, 13, 11, 4)
    make = lambda: atrous(x_shape, block, pads, crops, groups=groups)
    engine = Builder(BuilderConfig(lint=True)).build_engine(make())
    (conv,) = engine.network.layers if len(engine.network.layers) == 1 else [None]
    assert conv is not None and conv.params["dilations"] == list(block), kinds(engine.network)
    assert conv.params["pre_padding"] == [p[0] - c[0] for p, c in zip(pads, crops)]
    build_and_compare(make, [rand(*x_shape)])


@pytest.mark.parametrize("case", [{"stride": 2, "pads": ((0, 1), (0, 1)), "crops": ((0, 0), (0, 0))},
                                  {"extra_reader": True}])
def test_rearrangements_stay_where_the_convolution_strides_or_their_tensors_are_read_elsewhere(case):
    make = lambda: atrous(**case)
    engine = Builder(BuilderConfig(lint=True)).build_engine(make())
    assert "Shuffle" in kinds(engine.network)
    build_and_compare(make, [rand(2, 13, 11, 4)])
