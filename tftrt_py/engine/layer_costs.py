"""What running one layer costs, per kind: bounds on what a plan may ask for (see :mod:`budget`).

``work(layer) -> int`` counts multiply-add equivalents (default :func:`elements`); ``scratch(layer) -> int`` the
bytes a layer holds besides its inputs and outputs while it runs (default :func:`no_scratch`). :mod:`layers`
registers them with their kinds.
"""
from __future__ import annotations

from tftrt_py.engine.layer_geometry import attention_columns, attention_scores_shape, volume

__all__ = ["ELEMENT_COST", "WINDOW_COST", "elements", "no_scratch", "conv_work", "deconv_work", "matmul_work",
           "mlp_work", "pool_work", "attention_work", "attention_scratch", "topk_work", "nms_work", "nms_scratch"]

#: Multiply-adds one element read or written outside a matrix product counts as: CPU kernels over elements
#: (element-wise, data movement, reductions) run 2e9-9e9 elements a second where BLAS runs 1.3e11 multiply-adds
#: (numpy and ONNX Runtime on 2 AVX-512 cores).
ELEMENT_COST = 32
#: Multiply-adds one element of a pooling window counts as: pooling kernels visit 1.5e8-1e9 window elements a
#: second on the same cores.
WINDOW_COST = 256


def elements(layer) -> int:
    """Work of reading every input and writing every output once (ELEMENT_COST each)."""
    return ELEMENT_COST * sum(volume(t.shape) for t in (*layer.inputs, *layer.outputs))


def no_scratch(layer) -> int:
    return 0


def conv_work(layer) -> int:
    """Each output element sums kernel volume x in-channels / groups products (kernel [*K, C/groups, Cout])."""
    return volume(layer.outputs[0].shape) * volume(layer.weights["kernel"].shape[:-1]) + elements(layer)


def deconv_work(layer) -> int:
    """Each input element scatters kernel volume x out-channels products (kernel [*K, Cout, Cin])."""
    return volume(layer.inputs[0].shape) * volume(layer.weights["kernel"].shape[:-1]) + elements(layer)


def matmul_work(layer) -> int:
    """Each output element sums the inner dim's products."""
    a = layer.inputs[0]
    inner = a.shape[-2] if layer.params.get("transpose_a") else a.shape[-1]
    return volume(layer.outputs[0].shape) * inner + elements(layer)


def mlp_work(layer) -> int:
    """Each row multiplies through every weight matrix."""
    return layer.inputs[0].shape[0] * sum(w.size for k, w in layer.weights.items() if k.startswith("w")) \
        + elements(layer)


def pool_work(layer) -> int:
    """Each output element visits its whole window (WINDOW_COST each)."""
    return WINDOW_COST * volume(layer.outputs[0].shape) * volume(layer.params["window"]) + elements(layer)


def attention_work(layer) -> int:
    """Each score sums D products and weighs Dv values (per head), and passes through the softmax."""
    scores = volume(attention_scores_shape(layer))
    (_, dq), _, (_, dv) = attention_columns(layer)
    return scores * (dq + dv) // (layer.params.get("heads") or 1) + ELEMENT_COST * scores + elements(layer)


def attention_scratch(layer) -> int:
    """The float32 scores, their shifted exponentials and the probabilities (three score matrices at once, as
    the reference kernel holds them), and float32 copies of q, k and v."""
    qkv = sum(volume(t.shape[:-1]) * w for t, (_, w) in zip(layer.inputs[:3], attention_columns(layer)))
    return 4 * (3 * volume(attention_scores_shape(layer)) + qkv)


def topk_work(layer) -> int:
    """Sorting along ``axis``: n log2 n comparisons per row."""
    x = layer.inputs[0]
    n = x.shape[layer.params["axis"] % x.rank]
    return ELEMENT_COST * volume(x.shape) * max(1, n.bit_length()) + elements(layer)


def nms_work(layer) -> int:
    """Every class of every row compares each pair of its N boxes."""
    b, n, c = layer.inputs[1].shape
    return ELEMENT_COST * b * c * n * n + elements(layer)


def nms_scratch(layer) -> int:
    """One class's pairwise overlaps: [N, N, 2] float32, two at a time (the reference kernel's IoU)."""
    n = layer.inputs[1].shape[1]
    return 2 * 8 * n * n
