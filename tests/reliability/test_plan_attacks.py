"""Crafted plans (a real plan's header fields mutated, checksum recomputed, or tiny networks asking for more
than the machine has): every one is a PlanError at load, before any value reaches numpy; none crashes or
allocates much."""
import hashlib
import json
import resource
import struct
import time
import tracemalloc

import numpy as np
import pytest

from tftrt_py.engine import Network, PlanError, Runtime, budget
from tftrt_py.engine import plan as plan_lib
from tftrt_py.engine.runtime import Engine

MiB, GiB = 1 << 20, 1 << 30


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
    monkeypatch.setenv(budget.MAX_ENGINE_BYTES_ENV, "1024")
    with pytest.raises(PlanError, match="more than the 1024 bytes one engine may take here"):
        Runtime().deserialize_cuda_engine(plan)  # its tensors alone take 2 KiB
    monkeypatch.setenv(budget.MAX_ENGINE_BYTES_ENV, str(1 << 30))
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


# -- tiny plans asking for more than the machine has ----------------------------------------------------------
def single(kind, shapes, params, name="layer"):
    """A network of one `kind` layer on float32 inputs of `shapes`, its outputs the network's."""
    net = Network(kind.lower())
    inputs = [net.add_input(f"x{i}", "float32", s) for i, s in enumerate(shapes)]
    layer = net.add_layer(kind, inputs, params, name=name)
    for i, t in enumerate(layer.outputs):
        net.mark_output(t, name=f"y{i}")
    return net


def huge_padding():
    """[1, 8, 8, 1] padded to [1, 46008, 46008, 1]: 7.9 GiB, and as much again for the caller's copy."""
    return single("Padding", [(1, 8, 8, 1)], dict(pre=[0, 0, 0, 0], post=[0, 46000, 46000, 0]))


def huge_batch():
    """A row-wise engine for 2**29 - 1 rows of 4 (8 GiB): a one-row request would be padded to all of them."""
    net = single("Activation", [(2 ** 29 - 1, 4)], dict(type="relu"))
    engine = Engine(net)
    assert engine.rowwise and engine.can_serve([(1, 4)])
    return net


def huge_resize():
    """[1, 2, 2, 1] resized to [1, 46000, 46000, 1]: 7.9 GiB."""
    return single("Resize", [(1, 2, 2, 1)], dict(mode="nearest", sizes=[46000, 46000]))


def many_outputs():
    """24 outputs of 512 MiB each, padded from one [1, 1] input: 12 GiB, and as much again for their copies."""
    net = Network("outputs")
    x = net.add_input("x", "float32", (1, 1))
    for i in range(24):
        y = net.add_layer("Padding", [x], dict(pre=[0, 0], post=[0, 2 ** 27 - 1]), name=f"pad{i}").outputs[0]
        net.mark_output(y, name=f"y{i}")
    return net


def long_attention():
    """32,768 queries over 32,768 keys: a 4 GiB float32 score matrix, held three times over by the softmax."""
    return single("Attention", [(1, 32768, 64)] * 3, dict(scale=0.125))


def long_pooling():
    """A 1024 x 1024 max window over 1537 x 1537 outputs: 2.5e12 window visits, hours at the 1.5e8-1e9 a second
    CPU pooling kernels run (25 MiB of input, 9 MiB of output)."""
    return single("Pooling", [(1, 2560, 2560, 1)], dict(type="max", window=[1024, 1024], strides=[1, 1],
                                                           pre_padding=[0, 0], post_padding=[0, 0]))


_TOO_BIG = (r"more than the 12.0 GiB one engine may take here \(50% of this host's 24.0 GiB\); set "
            r"TFTRT_PY_MAX_ENGINE_BYTES")
CRAFTED = {
    "padding to a huge volume": (huge_padding, rf"needs 15.8 GiB at once \(at the end: 7.9 GiB .*{_TOO_BIG}"),
    "row-wise engine of a huge batch": (huge_batch, rf"needs 16.0 GiB at once \(at layer 'layer' .*{_TOO_BIG}"),
    "resize to a huge output": (huge_resize, rf"needs 15.8 GiB at once \(at the end: .*{_TOO_BIG}"),
    "24 outputs of 512 MiB": (many_outputs, rf"needs 24.0 GiB at once \(at the end: 12.0 GiB of live tensors, 12.0 "
                                            rf"GiB of the caller's copies .*{_TOO_BIG}"),
    "attention over 32,768 keys": (long_attention, rf"needs 12.1 GiB at once \(at layer 'layer' \(Attention\): 32.0 "
                                                   rf"MiB of live tensors, 12.0 GiB of scratch .*{_TOO_BIG}"),
    "pooling of hours": (long_pooling, r"declares 6.34e\+14 multiply-adds of work \(layer 'layer' \(Pooling\): "
                                      r"6.34e\+14\), more than the 1.41e\+14 one engine may declare \(the default\); "
                                      r"set TFTRT_PY_MAX_ENGINE_WORK"),
}


@pytest.fixture
def host_24_gib(monkeypatch):
    """A 24 GiB host (one engine may take 12 GiB) with no limit set in the environment."""
    monkeypatch.setattr(budget, "host_memory", lambda: 24 * GiB)
    monkeypatch.delenv(budget.MAX_ENGINE_BYTES_ENV, raising=False)
    monkeypatch.delenv(budget.MAX_ENGINE_WORK_ENV, raising=False)


@pytest.mark.parametrize("name", list(CRAFTED))
def test_a_tiny_plan_asking_for_more_than_the_machine_is_refused_at_load_quickly_and_cheaply(host_24_gib, name):
    make, match = CRAFTED[name]
    plan = Engine(make()).serialize()
    assert len(plan) < 8192
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(PlanError, match=match):
            Runtime().deserialize_cuda_engine(plan)
        seconds, traced = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 1 and traced < 64 * MiB
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 * 1024


@pytest.mark.parametrize("name", list(CRAFTED))
def test_with_the_limits_raised_the_same_plan_loads(host_24_gib, monkeypatch, name):
    """Loading allocates nothing the plan asks for: only the limits refuse it."""
    monkeypatch.setenv(budget.MAX_ENGINE_BYTES_ENV, str(64 * GiB))
    monkeypatch.setenv(budget.MAX_ENGINE_WORK_ENV, str(10 ** 15))
    make, _ = CRAFTED[name]
    engine = Runtime().deserialize_cuda_engine(Engine(make()).serialize())
    assert [t.shape for t in engine.outputs] == [t.shape for t in make().outputs]


def test_the_backend_that_runs_a_plan_sets_its_memory_limit(host_24_gib, monkeypatch):
    """A plan run by cupy is held to the GPU's free memory (here 1 GiB), one run on the CPU to the host's share."""
    monkeypatch.setattr(budget, "_device_free", lambda: GiB)
    plan = Engine(single("Padding", [(1, 1)], dict(pre=[0, 0], post=[0, 2 ** 28 - 1]))).serialize()  # 2 GiB
    assert Runtime().deserialize_cuda_engine(plan).outputs[0].shape == (1, 2 ** 28)
    with pytest.raises(PlanError, match=r"needs 2.0 GiB .* more than the 1.0 GiB one engine may take here \(the "
                                        r"GPU's free memory\)"):
        Runtime(backend="cupy").deserialize_cuda_engine(plan)
