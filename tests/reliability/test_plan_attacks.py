"""Crafted plans (a real plan's header fields mutated, checksum recomputed): every one is a PlanError at load,
before any value reaches numpy; none crashes or allocates much."""
import hashlib
import json
import struct
import tracemalloc

import numpy as np
import pytest

from tftrt_py.engine import Network, PlanError, Runtime
from tftrt_py.engine import plan as plan_lib
from tftrt_py.engine.runtime import Engine


def padded_net():
    rng = np.random.default_rng(0)
    net = Network("attacks")
    x = net.add_input("x", "float32", (2, 6, 6, 3))
    pad = net.add_layer("Padding", [x], dict(pre=[0, 1, 1, 0], post=[0, 1, 1, 0], mode="constant", value=0.0),
                        name="pad")
    conv = net.add_layer("Convolution", pad.outputs, dict(strides=[1, 1], dilations=[1, 1], pre_padding=[0, 0],
                                                          post_padding=[0, 0], groups=1),
                         {"kernel": rng.standard_normal((3, 3, 3, 4)).astype("float32")}, name="conv")
    mean = net.add_layer("Reduce", conv.outputs, dict(op="mean", axes=[1, 2], keep_dims=False), name="mean")
    top = net.add_layer("TopK", mean.outputs, dict(k=2, axis=-1), name="topk")
    net.mark_output(top.outputs[0], name="y")
    return net


@pytest.fixture(scope="module")
def plan():
    return Engine(padded_net()).serialize()  # unoptimized: the Padding stays a layer of its own


def with_header(data, edit):
    header = plan_lib.read_header(data)
    start = header.pop("_blob_start")
    blobs = data[start:-32]
    edit(header)
    head = json.dumps(header).encode()
    body = struct.pack("<8sIQ", plan_lib.MAGIC, plan_lib.FORMAT_VERSION, len(head)) + head
    body += b"\0" * ((-len(body)) % 64) + blobs
    return body + hashlib.sha256(body).digest()


def layer(name):
    return lambda h: next(l for l in h["layers"] if l["name"] == name)


def params(name, **values):
    return lambda h: layer(name)(h)["params"].update(values)


ATTACKS = {
    "padding mode empty (uninitialized memory)": (params("pad", mode="empty"), r"param mode is 'empty'"),
    "padding mode wrap": (params("pad", mode="wrap"), r"param mode"),
    "padding negative": (params("pad", pre=[0, -1, 1, 0]), r"param pre\[1\] is -1"),
    "padding huge": (params("pad", post=[0, 2 ** 40, 1, 0]), r"param post\[1\]"),
    "padding too few entries": (params("pad", pre=[0, 1]), r"param pre is"),
    "padding value a string": (params("pad", value="0"), r"param value"),
    "padding value NaN": (params("pad", value=float("nan")), r"param value"),
    "padding unknown param": (params("pad", allow_pickle=True), r"unknown param\(s\) \['allow_pickle'\]"),
    "conv stride zero": (params("conv", strides=[0, 1]), r"param strides\[0\] is 0"),
    "conv stride negative": (params("conv", strides=[-1, 1]), r"param strides\[0\] is -1"),
    "conv dilation float": (params("conv", dilations=[1.5, 1]), r"param dilations\[0\]"),
    "conv groups bool": (params("conv", groups=True), r"param groups is True"),
    "conv activation unknown": (params("conv", activation={"type": "os.system"}), r"param activation.type"),
    "conv activation extra key": (params("conv", activation={"type": "relu", "code": 1}), r"unknown key"),
    "conv missing strides": (lambda h: layer("conv")(h)["params"].pop("strides"), r"needs param 'strides'"),
    "reduce op unknown": (params("mean", op="median"), r"param op is 'median'"),
    "reduce axis out of range": (params("mean", axes=[1, 7]), r"param axes\[1\] is 7"),
    "reduce axes repeated": (params("mean", axes=[1, 1]), r"distinct axes"),
    "reduce axes not a list": (params("mean", axes="12"), r"param axes is '12'"),
    "reduce bad perm": (params("mean", first_perm=[0, 0, 1, 2]), r"permutation"),
    "topk k negative": (params("topk", k=-1), r"param k is -1"),
    "topk axis out of range": (params("topk", axis=3), r"param axis is 3"),
    "params not an object": (lambda h: layer("topk")(h).update(params=[1]), r"params is"),
    "memory understated": (lambda h: h.update(memory_bytes=1), r"memory_bytes is 1, but"),
    "workspace absurd": (lambda h: h["build_config"].update(max_workspace_size=1 << 62), r"max_workspace_size"),
    "binding not a digest": (lambda h: h.update(binding="../../etc"), r"binding is"),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_crafted_plan_is_refused_at_load(plan, name):
    edit, match = ATTACKS[name]
    data = with_header(plan, edit)
    tracemalloc.start()
    try:
        with pytest.raises(PlanError, match=match):
            Runtime().deserialize_cuda_engine(data)
        assert tracemalloc.get_traced_memory()[1] < 64 << 20
    finally:
        tracemalloc.stop()


def test_a_plan_claiming_more_memory_than_allowed_is_refused(plan, monkeypatch):
    def grow(h):  # shapes that add up (and a memory_bytes that matches them) past the limit
        h["inputs"][0]["shape"] = [2 ** 20, 6, 6, 3]
        h["memory_bytes"] = 10 << 40
    monkeypatch.setenv(plan_lib.MAX_ENGINE_BYTES_ENV, "1024")
    with pytest.raises(PlanError, match="more than the limit of 1024 bytes"):
        Runtime().deserialize_cuda_engine(plan)  # its tensors alone take 2 KiB
    monkeypatch.setenv(plan_lib.MAX_ENGINE_BYTES_ENV, str(1 << 30))
    with pytest.raises(PlanError, match="memory_bytes"):
        Runtime().deserialize_cuda_engine(with_header(plan, grow))


def test_the_untouched_plan_loads_and_runs(plan):
    engine = Runtime().deserialize_cuda_engine(plan)
    x = np.random.default_rng(1).standard_normal((2, 6, 6, 3)).astype("float32")
    (y,) = engine.create_execution_context().execute_v2([x])
    assert y.shape == (2, 2) and np.isfinite(y).all()


def test_every_layer_kind_declares_its_params():
    from tftrt_py.engine import layers

    no_params = {"Constant", "Select"}
    assert [k for k in layers.kinds() if not layers.get(k).params and k not in no_params] == []
