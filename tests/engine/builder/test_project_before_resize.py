"""A pointwise projection (1x1 Convolution) reading an upsampling Resize runs before it, at the input's
resolution, where that costs less; it computes what the network as written computes."""
import pytest

from fusion_nets import add, build_and_compare, conv, network, rand

X = (2, 5, 4, 8)


def upsample_then_project(mode="linear", sizes=(10, 12), cout=3, k=1, extra_reader=False, **params):
    """x -> Resize(mode, sizes) -> k x k Convolution to `cout` channels (with a bias) -> y."""
    def make():
        net, (x,) = network(X)
        up = add(net, "Resize", [x], "resize", mode=mode, sizes=list(sizes), half_pixel_centers=mode == "linear")
        net.mark_output(conv(net, up, cout, "projection", k=k, bias=True, **params), "y")
        if extra_reader:
            net.mark_output(add(net, "Unary", [up], "other", op="abs"))
        return net
    return make


def kinds(engine):
    return [l.kind for l in engine.network.layers if l.kind != "Constant"]


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_a_projection_after_an_upsampling_runs_before_it(mode):
    engine = build_and_compare(upsample_then_project(mode), [rand(*X)])
    assert kinds(engine) == ["Convolution", "Resize"]
    projection, resize = [l for l in engine.network.layers if l.kind != "Constant"]
    assert projection.outputs[0].shape == (2, 5, 4, 3) and resize.outputs[0].shape == (2, 10, 12, 3)
    assert [t.name for t in engine.outputs] == ["y"]


@pytest.mark.parametrize("case", [
    dict(k=3),  # mixes neighbouring pixels
    dict(activation={"type": "relu"}),  # relu(projection) does not commute with interpolation
    dict(sizes=(3, 2)),  # a downsampling: the projection costs less after it
    dict(sizes=(5, 4), cout=32),  # no upsampling and more channels out than in: the Resize costs more after it
    dict(extra_reader=True),  # the upsampled values are read elsewhere too
])
def test_the_order_stays_where_moving_changes_values_or_costs_more(case):
    engine = build_and_compare(upsample_then_project(**case), [rand(*X)])
    assert kinds(engine) == ["Resize", "Convolution"] + (["Unary"] if case.get("extra_reader") else [])


def test_int8_ranges_keep_the_order_they_were_measured_on():
    def make():
        net = upsample_then_project()()
        for t in [net.inputs[0]] + [l.outputs[0] for l in net.layers]:
            t.dynamic_range = 4.0
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert kinds(engine) == ["Resize", "Convolution"]
