"""Masked Attention on onnxruntime computes what the numpy backend computes: a bool mask broadcast to the scores,
the causal triangle, both, packed heads with windows of a fused QKV tensor, fully masked rows (uniform softmax)."""
import numpy as np
import pytest

from ort_helpers import ORT, compare
from tftrt_py.engine import Network

pytestmark = ORT

B, S, H, D = 3, 7, 2, 8
BIG = -2.372671e38


def build(mask_shape, causal, packed, dtype="float32"):
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
        params.update({"scale": 0.35}, **({"causal": causal, "mask_value": BIG} if masked else {}))
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
