"""Helpers for the fusion tests: small networks built layer by layer, and a check that the builder's
engine computes what the unoptimized network computes."""
import numpy as np

from tftrt_py.engine import Builder, BuilderConfig, Engine, Network

RNG = [np.random.default_rng(7)]


def rand(*shape, positive=False):
    x = RNG[0].standard_normal(shape).astype("float32")
    return np.abs(x) + 0.1 if positive else x


def add(net, kind, inputs, name, weights=None, **params):
    """Add a layer; returns its (first) output tensor."""
    return net.add_layer(kind, inputs, params, weights, name=name).outputs[0]


def const(net, value, name):
    return net.add_constant(np.asarray(value, "float32"), name=name)


def conv(net, x, cout, name, k=3, stride=1, pad=None, bias=False, **params):
    """A 'same'-padded (by default) k x k convolution of x [N, H, W, C]."""
    pad = k // 2 if pad is None else pad
    weights = {"kernel": rand(k, k, x.shape[-1], cout)}
    if bias:
        weights["bias"] = rand(cout)
    return add(net, "Convolution", [x], name, weights, strides=[stride] * 2, dilations=[1, 1], pre_padding=[pad] * 2,
               post_padding=[pad] * 2, groups=1, **params)


def matmul(net, a, n, name, transpose_b=False, **params):
    """a [M, K] times a constant [K, n] (stored [n, K] when transpose_b)."""
    k = a.shape[-1]
    b = const(net, rand(*((n, k) if transpose_b else (k, n))), f"{name}/b")
    return add(net, "MatrixMultiply", [a, b], name, transpose_b=transpose_b, **params)


def network(*shapes):
    """A Network with float32 inputs of `shapes`; returns (net, input tensors)."""
    net = Network("fusion_test")
    return net, [net.add_input(f"x{i}", "float32", s) for i, s in enumerate(shapes)]


def build_and_compare(make, inputs, rtol=1e-5, atol=1e-5):
    """The builder's engine for make(); its outputs match those of make()'s network run as defined.

    Both networks get the same random weights: the generator restarts before each make().
    """
    RNG[0] = np.random.default_rng(11)
    engine = Builder(BuilderConfig(lint=True)).build_engine(make())
    RNG[0] = np.random.default_rng(11)
    reference = Engine(make())
    got = engine.create_execution_context().execute(dict(zip([t.name for t in engine.inputs], inputs)))
    want = reference.create_execution_context().execute(dict(zip([t.name for t in reference.inputs], inputs)))
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].shape == value.shape and got[name].dtype == value.dtype
        np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol)
    return engine


def layer_names(engine):
    """Names of the engine's layers, Constants left out."""
    return [l.name for l in engine.network.layers if l.kind != "Constant"]


def layer(engine, name):
    return next(l for l in engine.network.layers if l.name == name)
