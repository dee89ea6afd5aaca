"""Our Attention layer against PyTorch's scaled_dot_product_attention at BERT-base / GPT-2 shapes (batch x 12
heads, sequence 128, head 64, fp16; ours reads q, k, v as column windows of one packed QKV tensor), per mask
kind: none, a padding mask [B, 1, 1, S], causal, and causal with padding as one mask with a row per query
[B, 1, S, S] (what a converted keras-hub GPT-2 hands the kernel). Microseconds per run, each side timed
back-to-back with events; ours the fastest tactic the builder timed; PyTorch with the backend it picks and with
cuDNN's fused attention alone (which torch.compile ran for the BERT layer). GPU machine only; a table last.

    python benchmarks/probes/attention_masks.py [--batch 32] [--seq 128]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

HEADS, D = 12, 64
#: the masked scores' value in a converted Keras model (Keras's -0.7 x float32 max): masked keys weigh nothing
BIG = -2.372671e38


def network(b: int, s: int, mask_shape, causal: bool):
    from tftrt_py.engine import Network

    net = Network("attention")
    w = HEADS * D
    qkv = net.add_input("qkv", "float16", (b, s, 3 * w))
    inputs = [qkv] * 3
    params = {"heads": HEADS, "columns": [[0, w], [w, w], [2 * w, w]], "scale": D ** -0.5}
    if mask_shape:
        inputs.append(net.add_input("mask", "bool", mask_shape))
    if mask_shape or causal:
        params.update(causal=causal, mask_value=BIG)
    net.mark_output(net.add_layer("Attention", inputs, params, name="attention").outputs[0], name="y")
    return net


def torch_us(torch, b: int, s: int, mask, causal: bool, backend=None) -> float:
    """SDPA's time with the backend PyTorch picks, or with `backend` (an SDPBackend name) alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    F = torch.nn.functional
    if backend is not None:
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return torch_us(torch, b, s, mask, causal)
    q, k, v = (torch.randn(b, HEADS, s, D, device="cuda", dtype=torch.float16) for _ in range(3))
    m = None if mask is None else torch.from_numpy(mask).cuda()
    if m is not None and causal:
        m = m & torch.ones(s, s, dtype=torch.bool, device="cuda").tril()

    def call():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal and m is None)

    for _ in range(5):
        call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(100):
        call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 10


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    args = p.parse_args(argv)
    import torch

    from tftrt_py.engine import Builder, BuilderConfig

    b, s = args.batch, args.seq
    rng = np.random.default_rng(0)
    lengths = rng.integers(s // 2, s + 1, b)
    padding = np.arange(s)[None, :] < lengths[:, None]
    cases = {"none": (None, False), "padding [B,1,1,S]": (padding[:, None, None, :], False),
             "causal": (None, True),
             "causal + padding [B,1,S,S]": (np.broadcast_to(padding[:, None, None, :] & np.tri(s, dtype=bool),
                                                           (b, 1, s, s)).copy(), False)}
    rows = []
    for name, (mask, causal) in cases.items():
        engine = Builder(BuilderConfig(precision="FP16", backend="cupy")).build_engine(
            network(b, s, None if mask is None else mask.shape, causal))
        tactic = engine.tactics["attention"]
        ours = tactic.get("ms", float("nan")) * 1e3
        theirs = torch_us(torch, b, s, mask, causal)
        try:  # cuDNN's fused attention: what torch.compile ran for BERT here
            cudnn = torch_us(torch, b, s, mask, causal, "CUDNN_ATTENTION")
        except RuntimeError as exc:
            cudnn = float("nan")
            print(f"{name}: torch SDPA on cuDNN refused: {str(exc).splitlines()[0][:120]}", flush=True)
        rows.append((name, tactic.get("op"), tactic.get("warps"), ours, theirs, cudnn))
        print(f"{name}: ours {ours:.1f} us ({tactic}), torch SDPA {theirs:.1f} us, on cuDNN {cudnn:.1f} us", flush=True)
    print(f"\n{'mask':<28} {'ours op':<16} {'warps':>5} {'ours us':>8} {'torch us':>9} {'cuDNN us':>9} "
          f"{'torch/ours':>10} {'cuDNN/ours':>10}")
    for name, op, warps, ours, theirs, cudnn in rows:
        print(f"{name:<28} {op:<16} {warps!s:>5} {ours:>8.1f} {theirs:>9.1f} {cudnn:>9.1f} {theirs / ours:>10.2f} "
              f"{cudnn / ours:>10.2f}")


if __name__ == "__main__":
    main()
