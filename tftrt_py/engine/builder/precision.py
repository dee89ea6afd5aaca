"""The precision pass: the precision each layer of an optimized network runs in.

Run once after the fusion passes have settled (a layer's kind and inputs decide its precision):

* FP32: every layer in fp32.
* FP16: float layers in fp16 (weights saturated to the fp16 range and stored as fp16, as are constants only
  fp16 layers read; activations rounded to fp16, fp32 accumulation), except those
  ``fp32_reason`` names: large or overflow-prone reductions, softmax sums, exp/log/pow, normalization
  statistics, casts. Attention and Normalization layers run in fp16: their kernels keep the softmax and the
  statistics in fp32.
* INT8: Convolution and MatrixMultiply layers in int8 (activations quantized with their tensors' dynamic
  ranges, weights per output channel; a max pool's output takes its input's range); the other layers as in
  FP16, since TF-TRT's INT8 mode enables FP16 too, and so does a MatrixMultiply holding a residual sum
  (fusions/gemm.py: its quantized kernels take none). An int8 layer reading a tensor without a range is an
  error naming those tensors (:class:`MissingDynamicRangeError`) unless no tensor of the network has a range
  at all: then the network builds without int8 layers, with a warning. Attention layers run on int8 q, k and v
  (TensorRT's INT8 BERT) where each of them has a range, else in FP16 without an error (QAT graphs give ranges
  to the GEMMs' inputs only).
* FP8 (our extension): as INT8, the same layers and ranges, quantized to E4M3 (scale = range / 448)
  instead of int8.

Tensors keep their dtypes, so engine bindings keep the graph's dtypes; backends cast where a tensor
meets a layer of another precision (the numpy backend rounds on read, the cupy backend stores fp16).
"""
from __future__ import annotations

import collections
import logging
import re
from typing import Callable, Dict, List, Optional

import numpy as np

from tftrt_py.engine.backends.threads import map_arrays
from tftrt_py.engine.builder.fusions.match import gemm_residual
from tftrt_py.engine.errors import MissingDynamicRangeError
from tftrt_py.engine.network import Layer, Network, Tensor
from tftrt_py.engine.types import FLOATS, QUANTIZED

__all__ = ["assign_precisions", "fp32_reason", "int8_inputs", "INT8_KINDS", "RANGED_ONLY_KINDS",
           "LARGE_REDUCTION", "display_name"]

logger = logging.getLogger(__name__)

#: Layer kinds with int8 (and fp8) kernels (TensorRT's int8 convolution, GEMM and attention).
INT8_KINDS = ("Convolution", "MatrixMultiply", "Attention")

#: Of INT8_KINDS, those that run as in FP16 where one of their int8 inputs lacks a range (no error).
RANGED_ONLY_KINDS = ("Attention",)

#: Sum-like reductions over more elements than this keep fp32 (fp16 sums lose precision and overflow).
LARGE_REDUCTION = 256

#: Reduce ops that keep fp32 whatever their size: products and squares overflow fp16, log-sums exponentiate.
FP32_REDUCE_OPS = {"prod": "product reduction", "sum_squares": "normalization statistics",
                   "l2": "normalization statistics", "log_sum": "log of a sum", "log_sum_exp": "exp/log"}
SUM_LIKE_REDUCE_OPS = ("sum", "mean", "l1")
FP32_UNARY_OPS = {"exp": "exp/log", "log": "exp/log", "sqrt": "normalization statistics",
                  "rsqrt": "normalization statistics"}
FP32_ELEMENTWISE_OPS = {"pow": "pow", "squared_difference": "normalization statistics"}


def _reduce_reason(layer: Layer) -> Optional[str]:
    op = layer.params["op"]
    if op in FP32_REDUCE_OPS:
        return FP32_REDUCE_OPS[op]
    x = layer.inputs[0]
    reduced = 1
    for a in layer.params["axes"]:
        reduced *= (x.shape if layer.params.get("first_perm") is None
                    else [x.shape[i] for i in layer.params["first_perm"]])[a % x.rank]
    if op in SUM_LIKE_REDUCE_OPS and reduced > LARGE_REDUCTION:
        return f"large reduction ({reduced} elements)"
    return None


def _cast_reason(layer: Layer) -> Optional[str]:
    dtype = layer.params.get("dtype")
    return "cast" if dtype is not None and dtype != layer.inputs[0].dtype else None


def _scale_reason(layer: Layer) -> Optional[str]:
    power = layer.weights.get("power")
    return "pow" if power is not None and (power != 1).any() else None


#: layer kind -> why a layer of that kind keeps fp32 (None: it may run in fp16)
FP32_RULES: Dict[str, Callable[[Layer], Optional[str]]] = {
    "Softmax": lambda layer: "softmax sums",
    "Reduce": _reduce_reason,
    "Unary": lambda layer: FP32_UNARY_OPS.get(layer.params["op"]),
    "ElementWise": lambda layer: FP32_ELEMENTWISE_OPS.get(layer.params["op"]),
    "Scale": _scale_reason,
    "Identity": _cast_reason,
    "NMS": lambda layer: "score and overlap comparisons",
    # fp16 rounding makes near-ties equal, and their indices differ from TF's (TensorRT keeps these fp32 too)
    "TopK": lambda layer: "indices of near-ties",
    "ArgReduce": lambda layer: "indices of near-ties",
    "Bitcast": lambda layer: "bit patterns",
}


def _floats(layer: Layer) -> bool:
    return any(t.dtype in FLOATS for t in layer.inputs + layer.outputs)


def fp32_reason(layer: Layer) -> Optional[str]:
    """Why `layer` keeps fp32 in a reduced-precision engine, or None when it may run in fp16."""
    if not _floats(layer):
        return "no float data"
    rule = FP32_RULES.get(layer.kind)
    return rule(layer) if rule is not None else None


def _is_constant(t: Tensor) -> bool:
    return t.producer is not None and t.producer.kind == "Constant"


def _distinct(tensors: List[Tensor]) -> List[Tensor]:
    """`tensors` without repeats (by identity), in order."""
    return [t for i, t in enumerate(tensors) if all(t is not u for u in tensors[:i])]


#: layer kind -> the activation inputs its layers quantize when they run in int8 (constant operands are weights)
INT8_INPUTS: Dict[str, Callable[[Layer], List[Tensor]]] = {
    "Convolution": lambda layer: [layer.inputs[0]],
    "MatrixMultiply": lambda layer: [t for t in layer.inputs[:2] if not _is_constant(t)],
    "Attention": lambda layer: _distinct(layer.inputs[:3]),  # q, k, v: one tensor when windows of a fused QKV
}


def int8_inputs(layer: Layer) -> List[Tensor]:
    """The activation inputs `layer` quantizes when it runs in int8 (constant operands are weights)."""
    inputs = INT8_INPUTS.get(layer.kind)
    return inputs(layer) if inputs is not None else []


def display_name(tensor: Tensor) -> str:
    """A tensor's name as the graph knows it: a fused layer's output is its last layer's output."""
    return re.sub(r" \([^)]*\)", "", tensor.name.split(" + ")[-1])


def _all_tensors(network: Network) -> List[Tensor]:
    return network.inputs + [t for layer in network.layers for t in layer.outputs]


def _int8_candidates(network: Network) -> List[Layer]:
    return [l for l in network.layers if l.kind in INT8_KINDS and l.outputs[0].dtype in FLOATS
            and fp32_reason(l) is None and gemm_residual(l) is None]


def _ranged(layer: Layer) -> bool:
    """Whether every int8 input of `layer` is a float tensor with a dynamic range."""
    return all(t.dtype in FLOATS and t.dynamic_range is not None for t in int8_inputs(layer))


def _check_ranges(network: Network, candidates: List[Layer], precision: str) -> bool:
    """True when the candidates can run quantized; raises when some of their inputs lack a range."""
    if not candidates:
        return False
    if all(t.dynamic_range is None for t in _all_tensors(network)):
        logger.warning("%s engine %r: no tensor has a dynamic range (no calibration table and no quantization "
                       "ops in the graph), so it builds without %s layers (FP16)", precision, network.name,
                       precision.lower())
        return False
    missing: Dict[str, List[str]] = {}
    for layer in candidates:
        for t in int8_inputs(layer):
            if t.dynamic_range is None:
                missing.setdefault(display_name(t), []).append(layer.name)
    if missing:
        names = sorted(missing)
        raise MissingDynamicRangeError(
            f"{precision} engine {network.name!r}: no quantization range for tensor(s) {', '.join(names)} (read by "
            f"{precision.lower()} "
            f"layer(s) {', '.join(sorted({l for ls in missing.values() for l in ls}))}); give each a range with a "
            f"QuantizeAndDequantizeV2/V3 or FakeQuantWithMinMaxVars/Args op on it, or calibrate "
            f"(use_calibration=True)", tensors=names)
    return True


def _quantized_layers(network: Network, precision: str) -> List[Layer]:
    """The layers that run quantized: the candidates needing ranges when all have them (else an error, or none
    where the network has no range at all), and those of RANGED_ONLY_KINDS whose inputs all have ranges."""
    candidates = _int8_candidates(network)
    needing = [l for l in candidates if l.kind not in RANGED_ONLY_KINDS]
    ranged_only = [l for l in candidates if l.kind in RANGED_ONLY_KINDS and _ranged(l)]
    return (needing if _check_ranges(network, needing, precision) else []) + ranged_only


#: The largest finite fp16 value: weights beyond it saturate there, as TensorRT clamps them.
FP16_MAX = float(np.finfo(np.float16).max)


def _saturate(value: np.ndarray) -> np.ndarray:
    """Finite float32 values clamped to the fp16 range (an additive -1e9 mask stays finite, so 0 x mask is
    0, not NaN); infinities and NaN stay as they are. Values already inside the range (most weights) are
    returned as they are, without a copy."""
    if value.size and -FP16_MAX <= value.min() and value.max() <= FP16_MAX:  # false for NaN too
        return value
    return np.where(np.isfinite(value), np.clip(value, -FP16_MAX, FP16_MAX), value).astype(value.dtype)


def _half(weights: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """An FP16 layer's weights as it computes with them: float32 ones saturated, then rounded to (and stored
    as) float16."""
    return {k: _saturate(v).astype(np.float16) if v.dtype == np.float32 else v for k, v in weights.items()}


def _halve(layers: List[Layer]) -> None:
    """Give each FP16 layer of `layers` its weights as _half makes them (in threads where they are large)."""
    size = sum(v.nbytes for layer in layers for v in layer.weights.values() if v.dtype == np.float32)
    for layer, weights in zip(layers, map_arrays(lambda l: _half(l.weights), layers, size, "tftrt-fp16-weights")):
        layer.weights = weights


def _saturate_fp16_constants(network: Network) -> None:
    """Constants read only by reduced-precision layers hold values inside the fp16 range (scanned in threads where
    they are large)."""
    users = network.consumers()

    def saturated(layer) -> bool:
        value = layer.weights.get("value") if layer.kind == "Constant" else None
        readers = users.get(layer.outputs[0].name, []) if value is not None else []
        return (value is not None and value.dtype == np.float32 and bool(readers)
                and not network.is_output(layer.outputs[0])
                and all(r.precision in ("FP16",) + QUANTIZED for r in readers))

    layers = [layer for layer in network.layers if saturated(layer)]
    values = map_arrays(lambda layer: _saturate(layer.weights["value"]), layers,
                        sum(layer.weights["value"].nbytes for layer in layers), "tftrt-fp16-constants")
    for layer, value in zip(layers, values):
        layer.weights["value"] = value


def _share_max_pool_ranges(network: Network) -> None:
    """A max pool's output takes its input's range (TensorRT's int8 pooling keeps the scale): the pooled values
    are input values, so quantizing them with the input's scale gives the max of the quantized input (rounding
    to int8 or E4M3 keeps order), and a backend may pool quantized values exactly."""
    for layer in network.layers:
        if layer.kind != "Pooling" or layer.params.get("type") != "max" or layer.inputs[0].dynamic_range is None:
            continue
        x, y = layer.inputs[0], layer.outputs[0]
        if y.dynamic_range != x.dynamic_range:
            logger.debug("%s: max pool %r takes its input's range %g (was %s)", network.name, layer.name,
                         x.dynamic_range, y.dynamic_range)
        y.dynamic_range = x.dynamic_range


def assign_precisions(network: Network, precision: str) -> Dict[str, int]:
    """Set ``layer.precision`` of every layer (None for constants) for builder precision `precision`.

    Logs a summary (INFO) and each layer's choice (DEBUG); returns how many layers got each precision.
    """
    precision = precision.upper()
    quantized = set()
    if precision in QUANTIZED:
        _share_max_pool_ranges(network)
        quantized = {id(l) for l in _quantized_layers(network, precision)}
    counts: collections.Counter = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    halved = []
    for layer in network.layers:
        if layer.kind == "Constant":
            layer.precision = None
            continue
        reason = None
        if precision == "FP32":
            layer.precision = "FP32"
        elif id(layer) in quantized:
            layer.precision = precision
        else:
            reason = fp32_reason(layer)
            layer.precision = "FP32" if reason else "FP16"
            if reason:
                reasons[reason] += 1
            else:
                halved.append(layer)
        counts[layer.precision] += 1
        logger.debug("%s: layer %r (%s) runs in %s%s", network.name, layer.name, layer.kind, layer.precision,
                     f" ({reason})" if reason else "")
    _halve(halved)
    if precision != "FP32":
        _saturate_fp16_constants(network)
        logger.info("precision of %s (%s): %s%s", network.name, precision,
                    ", ".join(f"{n} {p}" for p, n in sorted(counts.items())),
                    "; fp32 for " + ", ".join(f"{r} x{n}" for r, n in sorted(reasons.items())) if reasons else "")
    return dict(counts)
