"""Masked Attention on onnxruntime computes what the numpy backend computes: a bool mask broadcast to the scores,
the causal triangle, both, packed heads with windows of a fused QKV tensor, fully masked rows (uniform softmax);
packed heads run ONNX Runtime's MultiHeadAttention where it computes the same."""
import numpy as np
import pytest

from ort_helpers import ORT, compare
from tftrt_py.engine import Network
from tftrt_py.engine.backends.onnxruntime.graph import prune
from tftrt_py.engine.backends.onnxruntime.lowering import lower

pytestmark = ORT

B, S, H, D = 3, 7, 2, 8
BIG = -2.372671e38


def build(mask_shape, causal, packed, dtype="float32", mask_value=BIG):
    def make():
        net = Network("masked_attention")
        if packed:
            qkv = net.add_input("qkv", dtype, (B, S, 3 * H * D))
            inputs = [qkv] * 3
            params = {"heads": H, "columns": [[0, H * D], [H * D, H * D], [2 * H * D, H * D]]}
        else:
            inputs = [net.add_input(n, dtype, (B, H, S, D)) for n in "qkv"]
            params = {"heads": None}
        if mask_shape:
            inputs.append(net.add_input("mask", "bool", mask_shape))
        masked = bool(mask_shape) or causal
        params.update({"scale": 0.35}, **({"causal": causal, "mask_value": mask_value} if masked else {}))
        net.mark_output(net.add_layer("Attention", inputs, params, name="attention").outputs[0])
        return net
    return make


def feed(mask_shape, packed, dtype="float32"):
    def make(rng):
        shapes = {"qkv": (B, S, 3 * H * D)} if packed else {n: (B, H, S, D) for n in "qkv"}
        inputs = {n: rng.standard_normal(s).astype(dtype) for n, s in shapes.items()}
        if mask_shape:
            keep = rng.random(mask_shape) > 0.4
            keep[0] = False  # fully masked rows
            inputs["mask"] = keep
        return inputs
    return make


@pytest.mark.parametrize("mask_shape", [None, (B, 1, 1, S), (B, 1, S, S), (1, H, S, S)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_masked_attention(mask_shape, causal, packed):
    compare(build(mask_shape, causal, packed), feed(mask_shape, packed))


def test_masked_attention_in_fp16():
    compare(build((B, 1, 1, S), True, True, "float16"), feed((B, 1, 1, S), True, "float16"), "FP16")


@pytest.mark.parametrize("mask_shape, causal, mask_value, fused", [
    ((B, 1, 1, S), False, -1e9, True),  # Keras's padding mask and mask value: keys masked per sequence
    ((B, 1, S, S), False, -np.inf, True),  # per query (fully masked rows: NaN, as numpy's softmax gives)
    ((1, 1, 1, S), False, -1e9, True),  # broadcast over the batch
    (None, False, None, True),
    ((1, H, S, S), False, -1e9, False),  # per head: no such MultiHeadAttention mask
    ((B, 1, 1, S), True, -1e9, False),  # causal
    ((B, 1, 1, S), False, -3e4, False),  # Keras's fp16 mask value: added, it would not hide scores the same way
])
def test_packed_attention_is_fused_where_the_kernel_computes_the_same(mask_shape, causal, mask_value, fused):
    engine = compare(build(mask_shape, causal, True, mask_value=mask_value), feed(mask_shape, True))
    ops = [n.op_type for n in prune(lower(engine.network)).graph.node]
    assert ("MultiHeadAttention" in ops) == fused and ("Softmax" in ops) != fused
