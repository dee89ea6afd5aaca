"""Shared test helpers: segment GraphDefs from tf.functions, engines built from them, comparisons."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.python.framework import convert_to_constants

from tftrt_py.convert.build import INPUT_PREFIX, OUTPUT_PREFIX, build_engine
from tftrt_py.engine import BuilderConfig

RNG = np.random.default_rng(1234)


def random_array(shape, dtype="float32", high=2.0, positive=False):
    """Fresh random values, never zeros (magnitudes in [0.1, high])."""
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(1, 10, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return RNG.random(size=shape) > 0.5
    mag = RNG.uniform(0.1, high, size=shape)
    sign = 1.0 if positive else RNG.choice([-1.0, 1.0], size=shape)
    return (mag * sign).astype(dtype)


def frozen_graph_def(fn, specs):
    """(GraphDef, input names, output refs) of `fn` traced with `specs`, variables frozen."""
    concrete = tf.function(fn).get_concrete_function(*specs)
    frozen = convert_to_constants.convert_variables_to_constants_v2(concrete)
    graph_def = frozen.graph.as_graph_def()
    inputs = [t.name.split(":")[0] for t in frozen.inputs]
    outputs = [t.name for t in frozen.outputs]
    return graph_def, inputs, outputs


def segment_graph_def(fn, specs):
    """A segment GraphDef (TensorRTInputPH_i / TensorRTOutputPH_i) made of everything `fn` computes."""
    graph_def, inputs, outputs = frozen_graph_def(fn, specs)
    renames = {name: f"{INPUT_PREFIX}{i}" for i, name in enumerate(inputs)}
    out = graph_pb2.GraphDef()
    for node in graph_def.node:
        new = out.node.add()
        new.CopyFrom(node)
        new.name = renames.get(node.name, node.name)
        del new.input[:]
        for ref in node.input:
            ctrl = ref.startswith("^")
            name, sep, port = ref.lstrip("^").partition(":")
            new.input.append(("^" if ctrl else "") + renames.get(name, name) + sep + port)
    for i, ref in enumerate(outputs):
        name, port = ref.split(":")
        node = out.node.add(name=f"{OUTPUT_PREFIX}{i}", op="Identity", input=[f"{renames.get(name, name)}:{port}"])
        node.attr["T"].type = graph_def_dtype(graph_def, name, int(port))
    return out


def saved_module(module, signature, tmp_path_factory, name: str) -> str:
    """The directory of a SavedModel of `module` serving `signature` (its tf.function), in a new folder `name`."""
    path = str(tmp_path_factory.mktemp(name) / "model")
    tf.saved_model.save(module, path, signatures=signature)
    return path


def graph_def_dtype(graph_def, name, port):
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return g.get_tensor_by_name(f"{name}:{port}").dtype.as_datatype_enum


def run_engine(fn, inputs, precision="FP32"):
    """Build an engine from `fn` for the shapes of `inputs`; returns (engine, outputs list)."""
    specs = [tf.TensorSpec(np.shape(x), tf.as_dtype(np.asarray(x).dtype)) for x in inputs]
    engine = build_engine(segment_graph_def(fn, specs), [np.shape(x) for x in inputs],
                          config=BuilderConfig(precision=precision))
    outs = engine.create_execution_context().execute_v2([np.asarray(x) for x in inputs])
    return engine, outs


def assert_converts(fn, inputs, rtol=1e-5, atol=1e-5, expect_kinds=(), expected=None):
    """`fn` built into an engine gives what TensorFlow gives, within rtol/atol; returns the engine.

    `expected`: the reference outputs, computed another way, where TF cannot run `fn` itself on every host."""
    engine, outs = run_engine(fn, inputs)
    if expected is None:
        expected = fn(*[tf.constant(x) for x in inputs])
    expected = [np.asarray(e) for e in tf.nest.flatten(expected)]
    assert len(outs) == len(expected)
    for got, want in zip(outs, expected):
        assert got.shape == want.shape, (got.shape, want.shape)
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    kinds = {layer.kind for layer in engine.network.layers}
    for kind in expect_kinds:
        assert kind in kinds, f"expected a {kind} layer, engine has {sorted(kinds)}"
    return engine


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def subprocess_env(**extra):
    """This environment with the repository first on PYTHONPATH (keeping what was there) and TF quiet."""
    path = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL="3", **extra)


def run_json_process(code, payload, **env):
    """Run `code` in a fresh Python with `payload` as JSON on stdin; returns the JSON its last line prints."""
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps(payload), capture_output=True, text=True,
                          env=subprocess_env(**env), check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- references every host computes ------------------------------------------------------------------
# TF's default CPU kernels (oneDNN off: AMD hosts, TF_ENABLE_ONEDNN_OPTS=0) reject depthwise convolutions with
# unequal strides or any dilation, dilated Conv3D and dilated backprop-input convolutions. These references
# use only undilated kernels (and stride 1 for the forward ones), so every host computes them the same way.
def dilate_filter(w, dilations):
    """`w` ([*spatial, in, out]) with dilation - 1 zeros between taps: the undilated equivalent filter."""
    w = np.asarray(w)
    k = w.shape[:len(dilations)]
    out = np.zeros(tuple(d * (n - 1) + 1 for n, d in zip(k, dilations)) + w.shape[len(dilations):], w.dtype)
    out[tuple(slice(None, None, d) for d in dilations)] = w
    return out


def conv_pads(spatial, kernel, strides, padding, explicit_paddings=()):
    """(before, after) per spatial dim of a channels-last convolution; `kernel` already dilated."""
    if padding == "EXPLICIT":
        return [tuple(explicit_paddings[2 * i:2 * i + 2]) for i in range(1, len(spatial) + 1)]
    if padding == "VALID":
        return [(0, 0)] * len(spatial)
    pads = []
    for n, k, s in zip(spatial, kernel, strides):
        total = max((-(-n // s) - 1) * s + k - n, 0)
        pads.append((total // 2, total - total // 2))
    return pads


def reference_conv(x, w, strides, dilations, padding, explicit_paddings=(), depthwise=False):
    """Channels-last Conv2D, Conv3D or (`depthwise`) DepthwiseConv2dNative with per-spatial-dim `strides` and
    `dilations`, as TF defines it: a stride-1 undilated VALID convolution of the padded input with the dilated
    filter, then every stride-th output."""
    x, w = np.asarray(x), dilate_filter(w, dilations)
    rank = len(strides)
    pads = conv_pads(x.shape[1:-1], w.shape[:rank], strides, padding, explicit_paddings)
    x = np.pad(x, [(0, 0), *pads, (0, 0)])
    op = tf.raw_ops.DepthwiseConv2dNative if depthwise else {2: tf.raw_ops.Conv2D, 3: tf.raw_ops.Conv3D}[rank]
    y = op(input=x, filter=w, strides=[1] * (rank + 2), padding="VALID").numpy()
    return y[(slice(None), *(slice(None, None, s) for s in strides))]


def reference_conv_transpose(dy, input_sizes, w, strides, dilations, padding, explicit_paddings=()):
    """Channels-last Conv2DBackpropInput or Conv3DBackpropInputV2 (by the rank of `w`) with per-spatial-dim
    `strides` and `dilations`, computed undilated on the dilated filter."""
    w = dilate_filter(w, dilations)
    rank = len(strides)
    attrs = dict(input_sizes=list(input_sizes), filter=w, out_backprop=tf.constant(dy), strides=[1, *strides, 1],
                 padding=padding)
    if rank == 2:
        return tf.raw_ops.Conv2DBackpropInput(explicit_paddings=list(explicit_paddings), **attrs).numpy()
    return tf.raw_ops.Conv3DBackpropInputV2(**attrs).numpy()
