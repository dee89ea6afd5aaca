"""budget: the memory a network holds at once, the work it declares, and the limits this machine sets."""
import logging
import os
import tracemalloc

import numpy as np
import pytest

from tftrt_py.engine import Engine, Network, PlanError, Runtime, budget, layer_costs
from tftrt_py.engine.backends.cupy import _device

import gpu_bert
import gpu_resnet50

GiB = 1 << 30


@pytest.fixture
def no_settings(monkeypatch):
    monkeypatch.delenv(budget.MAX_ENGINE_BYTES_ENV, raising=False)
    monkeypatch.delenv(budget.MAX_ENGINE_WORK_ENV, raising=False)


def chain_net():
    """x [4, 1024] -> relu a -> pad b [4, 1040] -> sum c = b + b; outputs c and a."""
    net = Network("chain")
    x = net.add_input("x", "float32", (4, 1024))
    a = net.add_layer("Activation", [x], dict(type="relu"), name="relu").outputs[0]
    b = net.add_layer("Padding", [a], dict(pre=[0, 8], post=[0, 8]), name="pad").outputs[0]
    c = net.add_layer("ElementWise", [b, b], dict(op="sum"), name="sum").outputs[0]
    net.mark_output(c, name="c")
    net.mark_output(a, name="a")
    return net


def test_tensors_live_from_their_layer_to_their_last_reader_and_outputs_are_copied_at_the_end():
    a = 4 * 1024 * 4
    b = c = 4 * 1040 * 4
    peak = budget.peak_memory(chain_net())
    # at "sum": a (an output), b and c (x went after "relu"); at the end: a, c and the caller's copies of both
    assert (peak.where, peak.live, peak.extra, peak.weights) == ("the end", a + c, a + c, 0)
    assert peak.total == 2 * (a + c) > a + b + c


def test_a_tensor_nobody_reads_stays_live_to_the_end():
    net = Network("unread")
    x = net.add_input("x", "float32", (1, 4))
    net.add_layer("Padding", [x], dict(pre=[0, 0], post=[0, 1020]), name="unread")
    y = net.add_layer("Padding", [x], dict(pre=[0, 1020], post=[0, 0]), name="y").outputs[0]
    net.mark_output(y, name="y")
    assert budget.peak_memory(net) == (3 * 4096, 0, 2 * 4096, 4096, "the end")  # unread, y and y's copy


def attention_net(b=2, s=1024, d=16):
    net = Network("attention")
    q, k, v = (net.add_input(n, "float32", (b, s, d)) for n in "qkv")
    y = net.add_layer("Attention", [q, k, v], dict(scale=0.25), name="attention").outputs[0]
    net.mark_output(y, name="y")
    return net


def test_attention_holds_three_float32_score_matrices_and_float32_copies_of_its_operands():
    peak = budget.peak_memory(attention_net())
    scores, operands = 2 * 1024 * 1024 * 4, 3 * 2 * 1024 * 16 * 4
    assert (peak.where, peak.extra) == ("layer 'attention' (Attention)", 3 * scores + operands)
    assert peak.live == operands + 2 * 1024 * 16 * 4  # q, k, v and y


def nms_net(n=512):
    net = Network("nms")
    boxes = net.add_input("boxes", "float32", (1, n, 1, 4))
    scores = net.add_input("scores", "float32", (1, n, 3))
    nms = net.add_layer("NMS", [boxes, scores], dict(max_output_size_per_class=8, max_total_size=16,
                                                     iou_threshold=0.5, score_threshold=-1.0), name="nms")
    for i, t in enumerate(nms.outputs):
        net.mark_output(t, name=f"out{i}")
    return net


def nms_inputs(rng, n=512):
    lo = rng.uniform(0, 0.9, (1, n, 1, 2)).astype("float32")
    return {"boxes": np.concatenate([lo, lo + 0.1], axis=-1), "scores": rng.uniform(0, 1, (1, n, 3)).astype("float32")}


@pytest.mark.parametrize("make, feed", [
    (attention_net, lambda rng: {n: rng.standard_normal((2, 1024, 16)).astype("float32") for n in "qkv"}),
    (nms_net, nms_inputs)], ids=["attention", "nms"])
def test_the_numpy_backend_allocates_no_more_than_the_peak_says(make, feed):
    """What the reference backend allocates running the layer, outputs into the caller's buffers, is the peak less
    the inputs (allocated before counting), within 5% (small arrays and Python objects aside)."""
    net = make()
    inputs = feed(np.random.default_rng(0))
    ctx = Engine(net, backend="numpy").create_execution_context()
    ctx.execute(inputs, lambda i, shape: np.empty(shape, net.outputs[i].dtype))
    tracemalloc.start()
    try:
        ctx.execute(inputs, lambda i, shape: np.empty(shape, net.outputs[i].dtype))
        allocated = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    bound = budget.peak_memory(net).total - sum(a.nbytes for a in inputs.values())
    assert 0.95 * bound < allocated < 1.05 * bound


def pool_net(size, window, stride=1):
    net = Network("pool")
    x = net.add_input("x", "float32", (1, size, size, 2))
    y = net.add_layer("Pooling", [x], dict(type="max", window=[window] * 2, strides=[stride] * 2, pre_padding=[0, 0],
                                           post_padding=[0, 0]), name="pool").outputs[0]
    net.mark_output(y, name="y")
    return net


def test_work_counts_multiply_adds_and_element_visits():
    rng = np.random.default_rng(0)
    net = Network("work")
    x = net.add_input("x", "float32", (2, 10, 10, 3))
    conv = net.add_layer("Convolution", [x], dict(strides=[1, 1], dilations=[1, 1], pre_padding=[0, 0],
                                                  post_padding=[0, 0]),
                         {"kernel": rng.standard_normal((3, 3, 3, 4)).astype("float32")}, name="conv").outputs[0]
    rows = net.add_layer("Shuffle", [conv], dict(reshape=[2, 256]), name="rows").outputs[0]
    w = net.add_constant(rng.standard_normal((256, 5)).astype("float32"), name="w")
    y = net.add_layer("MatrixMultiply", [rows, w], {}, name="fc").outputs[0]
    net.mark_output(y, name="y")
    e = layer_costs.ELEMENT_COST
    conv = 512 * (3 * 3 * 3) + e * (600 + 512)  # 512 outputs of 27 products; x and the output visited
    rows = e * (512 + 512)
    const = e * 256 * 5
    fc = 10 * 256 + e * (512 + 1280 + 10)  # 10 outputs of 256 products
    assert budget.declared_work(net) == (conv + rows + const + fc, "layer 'fc' (MatrixMultiply)", fc)


def test_pooling_counts_every_window_element_of_every_output():
    work = budget.declared_work(pool_net(64, 16)).total
    assert work == (layer_costs.WINDOW_COST * (49 * 49 * 2) * 256
                    + layer_costs.ELEMENT_COST * (64 * 64 * 2 + 49 * 49 * 2))


def test_large_models_declare_a_fraction_of_the_default_work_and_fit_half_a_24_gib_host():
    """ResNet-50 at batch 512 and a 24-layer BERT-large at batch 64, sequence 512 (fp32, scores, softmax and
    layer norms as separate layers: the most they can hold). BERT's layers are alike: one is built, its work and
    weights counted 24 times."""
    resnet = gpu_resnet50.network(512, 224)
    work, peak = budget.declared_work(resnet).total, budget.peak_memory(resnet).total
    assert gpu_resnet50.flops(512) / 2 < work < budget.DEFAULT_MAX_WORK / 40 and peak < 4 * GiB

    layer = gpu_bert.network(64, 512, gpu_bert.spec(1024, 16, 4096), dtype="float32")
    weights = sum(w.nbytes for lay in layer.layers for w in lay.weights.values())
    work = 24 * budget.declared_work(layer).total
    peak = budget.peak_memory(layer).total + 23 * weights
    assert gpu_bert.flops(64, 512, gpu_bert.spec(1024, 16, 4096), 24) / 2 < work < budget.DEFAULT_MAX_WORK / 10
    assert peak < 4 * GiB <= 12 * GiB / 3


# -- limits -----------------------------------------------------------------------
def test_host_memory_is_physical_memory_or_a_smaller_cgroup_limit(tmp_path, monkeypatch):
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    unlimited, limited, text = tmp_path / "unlimited", tmp_path / "limited", tmp_path / "max"
    unlimited.write_text("9223372036854771712\n")
    limited.write_text(f"{3 * GiB}\n")
    text.write_text("max\n")
    monkeypatch.setattr(budget, "_CGROUP_LIMITS", (str(text), str(unlimited), str(tmp_path / "missing")))
    assert budget.host_memory() == physical
    monkeypatch.setattr(budget, "_CGROUP_LIMITS", (str(text), str(limited)))
    assert budget.host_memory() == min(physical, 3 * GiB)


def test_the_default_memory_limit_is_half_the_host(no_settings, monkeypatch):
    assert budget.engine_bytes_limit() == (budget.host_memory() // 2, f"50% of this host's "
                                           f"{budget.size(budget.host_memory())}")
    monkeypatch.setattr(budget, "host_memory", lambda: 24 * GiB)
    assert budget.engine_bytes_limit("onnxruntime") == (12 * GiB, "50% of this host's 24.0 GiB")


def test_cupy_engines_may_take_the_gpus_free_memory(no_settings, monkeypatch):
    monkeypatch.setattr(budget, "host_memory", lambda: 24 * GiB)
    monkeypatch.setattr(budget, "_device_free", lambda: 70 * GiB)
    assert budget.engine_bytes_limit("cupy") == (70 * GiB, "the GPU's free memory")
    assert budget.max_engine_bytes("numpy") == 12 * GiB
    monkeypatch.setattr(budget, "_device_free", lambda: None)  # no cupy or no GPU: the host's
    assert budget.max_engine_bytes("cupy") == 12 * GiB


@pytest.mark.skipif(_device.probe()[0], reason="checks a machine without a GPU")
def test_without_a_gpu_cupy_plans_get_the_host_limit(no_settings):
    assert budget.engine_bytes_limit("cupy") == budget.engine_bytes_limit("numpy")


def test_the_environment_overrides_both_limits(monkeypatch):
    monkeypatch.setenv(budget.MAX_ENGINE_BYTES_ENV, " 4096 ")
    monkeypatch.setenv(budget.MAX_ENGINE_WORK_ENV, "1000")
    monkeypatch.setattr(budget, "_device_free", lambda: 70 * GiB)
    assert budget.engine_bytes_limit("cupy") == (4096, f"{budget.MAX_ENGINE_BYTES_ENV}=4096")
    assert budget.engine_work_limit() == (1000, f"{budget.MAX_ENGINE_WORK_ENV}=1000")


@pytest.mark.parametrize("text", ["lots", "-5", "4GiB", "1e9"])
def test_a_malformed_setting_is_logged_and_the_default_used(no_settings, monkeypatch, caplog, text):
    monkeypatch.setenv(budget.MAX_ENGINE_BYTES_ENV, text)
    monkeypatch.setenv(budget.MAX_ENGINE_WORK_ENV, text)
    with caplog.at_level(logging.WARNING, logger=budget.__name__):
        assert budget.max_engine_bytes() == budget.host_memory() // 2
        assert budget.max_engine_work() == budget.DEFAULT_MAX_WORK
    said = [r.getMessage() for r in caplog.records]
    assert any(budget.MAX_ENGINE_BYTES_ENV in m and "not a number of bytes" in m for m in said)
    assert any(budget.MAX_ENGINE_WORK_ENV in m and "not a number of multiply-adds" in m for m in said)


# -- on the GPU ----------------------------------------------------------------------
def outputs_net(count, elements):
    """`count` outputs of `elements` float32 each, padded from one [1, 1] input."""
    net = Network("outputs")
    x = net.add_input("x", "float32", (1, 1))
    for i in range(count):
        y = net.add_layer("Padding", [x], dict(pre=[0, 0], post=[0, elements - 1]), name=f"pad{i}").outputs[0]
        net.mark_output(y, name=f"y{i}")
    return net


@pytest.mark.gpu
@pytest.mark.skipif(not _device.probe()[0], reason="needs an NVIDIA GPU with cupy")
def test_cupy_plans_are_held_to_the_gpus_free_memory(no_settings):
    cupy = _device.require()
    free, total = cupy.cuda.runtime.memGetInfo()
    limit = budget.engine_bytes_limit("cupy")
    print(f"{_device.device_name()}: free {budget.size(free)} of {budget.size(total)}; cupy engines may take "
          f"{budget.size(limit.value)} ({limit.source}), numpy engines {budget.size(budget.max_engine_bytes())}")
    assert free <= limit.value <= total
    plan = Engine(outputs_net(24, 2 ** 30)).serialize()  # 96 GiB of outputs and as much again for their copies
    with pytest.raises(PlanError, match="the GPU's free memory"):
        Runtime(backend="cupy").deserialize_cuda_engine(plan)
    small = Runtime(backend="cupy").deserialize_cuda_engine(Engine(outputs_net(2, 1024)).serialize())
    (y0, _) = small.create_execution_context().execute_v2([np.ones((1, 1), np.float32)])
    assert cupy.asnumpy(y0)[0, 0] == 1
