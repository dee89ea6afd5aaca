"""Quantization planning for the cupy program: which INT8 and FP8 layers run quantized, what each reads
(quantize steps, quantized constants), and which tensors are stored quantized between them.

INT8 layers (convolutions, matrix multiplies, attention) read their activation operands through quantize steps
(one per tensor, shared by its readers), or straight from an int8 producer when only int8 layers read the tensor,
itself or through reshape views (ops/quant.py); FP8 layers likewise with E4M3 bytes. Each quantized layer runs so
only where that is faster than FP16 (keep_faster_quantized); :func:`plan_quantization` runs these stages in order.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
from typing import Dict, List, Optional, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import triton
from tftrt_py.engine.backends.cupy.ops import FACTORIES, BuildOptions, Spec
from tftrt_py.engine.backends.cupy.ops import attention, conv_fold, fp8, int8, triton_conv
from tftrt_py.engine.backends.cupy.ops.cast import CastOp
from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom
from tftrt_py.engine.backends.cupy.ops.quant import (FOLDED, FORMATS, PAD, ROWS, TRANSPOSED, QuantizeOp,
                                                     operand_quantize, padded, quantized_shape)
from tftrt_py.engine.backends.cupy.tactics import Tuner
from tftrt_py.engine.backends.cupy.views import is_view
from tftrt_py.engine.backends.numpy_precision import cached
from tftrt_py.engine.errors import BackendError, MissingDynamicRangeError
from tftrt_py.engine.types import FLOATS

__all__ = ["QuantPlan", "plan_quantization", "quantized_layers", "quant_plan", "quant_scale", "keep_faster_quantized",
           "settle_quantized", "quantized_pools", "quantized_tensors", "normalization_duals", "quantized_residual"]

logger = logging.getLogger(__name__)

QUANT_KINDS = ("Convolution", "MatrixMultiply", "Attention")
#: A constant operand quantized for the GEMM, per format: ([.., rows, kp] codes, float32 scale per row).
_CONSTANTS = {"INT8": int8.matmul_constant, "FP8": fp8.matmul_constant}


def _constant(t) -> bool:
    return t.producer is not None and t.producer.kind == "Constant"


def _quant_format(layer, precision: str) -> Optional[str]:
    fmt = layer.precision or precision
    return fmt if fmt in FORMATS else None


def quantized_residual(layer, fmt: str) -> bool:
    """An INT8 or FP8 convolution reads its residual quantized when the residual has a range
    (numpy_precision.py's contract): stored quantized where its channels are a multiple of 4 (the quantize
    step's words), otherwise rounded to its quantized grid inside the convolution's epilogue."""
    return (fmt in FORMATS and layer.kind == "Convolution" and len(layer.inputs) > 1
            and layer.inputs[1].dynamic_range is not None)


def _stored_residual(layer, fmt: str) -> bool:
    return quantized_residual(layer, fmt) and layer.inputs[1].shape[-1] % 4 == 0


def _quantized_operands(layer, fmt: str) -> List[Tuple[int, bool]]:
    """(input index, needs a transposed copy) of each activation operand `layer` quantizes."""
    if layer.kind == "Attention":  # q, k, v
        return [(0, False), (1, False), (2, False)]
    if layer.kind == "Convolution":
        return [(0, False)] + ([(1, False)] if _stored_residual(layer, fmt) else [])
    p = layer.params
    return [(i, bool(p.get("transpose_a")) if i == 0 else not p.get("transpose_b"))
            for i in (0, 1) if not _constant(layer.inputs[i])]


def quantized_layers(net, precision: str) -> Dict[str, List[Tuple[int, bool]]]:
    """INT8 and FP8 layers that run as int8/fp8 GEMMs or convolutions here: layer name -> its quantized
    operands.

    Raises MissingDynamicRangeError naming every operand tensor without a dynamic range. Grouped
    convolutions and products of two constants run in FP16 (logged).
    """
    out, missing = {}, {}
    for layer in net.layers:
        fmt = _quant_format(layer, precision)
        if fmt is None or layer.kind not in QUANT_KINDS:
            continue
        operands = _quantized_operands(layer, fmt)
        if not operands or layer.outputs[0].dtype not in FLOATS or any(
                layer.inputs[i].dtype not in FLOATS for i, _ in operands):
            continue
        reason = attention.quantized_reason(layer) if layer.kind == "Attention" else None
        if reason is not None:
            logger.info("%s attention %r runs in FP16 on the cupy backend: %s", fmt, layer.name, reason)
            layer.precision = "FP16"
            continue
        if layer.kind == "Convolution" and int(layer.params.get("groups", 1)) != 1:
            logger.warning("%s layer %r: grouped convolutions run in FP16 on the cupy backend", fmt, layer.name)
            if fmt == "FP8":
                layer.precision = "FP16"
            continue
        for i, _ in operands:
            t = layer.inputs[i]
            if t.dynamic_range is None:
                missing.setdefault(t.name, []).append(layer.name)
        out[layer.name] = operands
    if missing:
        names = sorted(missing)
        raise MissingDynamicRangeError(
            f"engine {net.name!r}: quantized layer(s) "
            f"{', '.join(sorted({l for ls in missing.values() for l in ls}))} read tensor(s) {', '.join(names)} "
            f"without a dynamic range: set Tensor.dynamic_range (calibrate, or give the graph quantization ops) or "
            f"build those layers in FP16", tensors=names)
    return out


def quant_scale(fmt: str, dynamic_range: float) -> np.float32:
    return FORMATS[fmt].scale(dynamic_range)


def _quantized_constant(value: np.ndarray, fmt: str, role: str, transposed: bool, kp: int):
    """A constant operand quantized (int8.matmul_constant, fp8.matmul_constant) once per format and layout while
    the weights live, read-only: a build asks quant_plan for a layer's plan several times (prefetch, timing, the
    program), and quantizing BERT-base's 48 weight matrices to E4M3 each time took an FP8 build seconds."""
    quantize = _CONSTANTS[fmt]

    def make(v):
        q, s = quantize(v, role, transposed, kp)
        q.flags.writeable = s.flags.writeable = False  # shared by every plan of these weights
        return q, s

    return cached(value, make, (fmt, role, transposed, kp)) if isinstance(value, np.ndarray) else make(value)


def _folds(layer, fmt: str) -> bool:
    """Whether a quantized convolution reads its input folded by 2x2 pixel blocks (ops/conv_fold.py): a stride-2
    stem on an engine input (an image no layer writes quantized itself) of 4 channels or fewer, and for a format
    whose bytes hold NaN (E4M3) fewer than 4: a padding byte in each pixel carries its NaN flag."""
    x, y = layer.inputs[0], layer.outputs[0]
    if x.producer is not None or layer.weights["kernel"].ndim != 4 or len(x.shape) != 4:
        return False
    if FORMATS[fmt].keeps_nan and x.shape[-1] >= FORMATS[fmt].channels(x.shape[-1]):
        return False
    return conv_fold.foldable(ConvGeom.of(layer, tuple(x.shape[:-1]) + (FORMATS[fmt].channels(x.shape[-1]),),
                                          y.shape))


def quant_plan(layer, fmt: str) -> Tuple[List[Tuple[int, Tuple[int, ...], int, str]], dict]:
    """What a quantized layer reads: (input index, tensor shape, padded last dim, layout: ops/quant.ROWS,
    TRANSPOSED or FOLDED) per activation operand, and the spec's ``quant`` dict (see ops/base.Spec)."""
    f = FORMATS[fmt]
    if layer.kind == "Attention":  # q, k, v (often windows of one tensor), each at its scale
        qkv = layer.inputs[:3]
        return ([(i, tuple(t.shape), t.shape[-1], ROWS) for i, t in enumerate(qkv)],
                {"format": fmt, "scales": [float(quant_scale(fmt, t.dynamic_range)) for t in qkv]})
    if layer.kind == "Convolution":
        x = layer.inputs[0]
        folded = _folds(layer, fmt)
        operands = [(0, tuple(x.shape), f.channels(x.shape[-1]), FOLDED if folded else ROWS)]
        quant = {"format": fmt, "in_scale": float(quant_scale(fmt, x.dynamic_range)), "folded": folded}
        if quantized_residual(layer, fmt):
            r = layer.inputs[1]
            quant["res_scale"] = float(quant_scale(fmt, r.dynamic_range))
            if _stored_residual(layer, fmt):
                operands.append((1, tuple(r.shape), r.shape[-1], ROWS))
        return operands, quant
    p = layer.params
    a = layer.inputs[0]
    k = a.shape[-2] if p.get("transpose_a") else a.shape[-1]
    quant, operands, scales = {"format": fmt, "kp": padded(k)}, [], {}
    for role, i, transposed in (("a", 0, bool(p.get("transpose_a"))), ("b", 1, bool(p.get("transpose_b")))):
        t = layer.inputs[i]
        if _constant(t):  # weights: one scale per output row (a) or column (b)
            q, s = _quantized_constant(t.producer.weights["value"], fmt, role, transposed, quant["kp"])
            quant[role], scales[role] = {"const": q}, s
        else:
            operands.append((i, tuple(t.shape), quant["kp"],
                             TRANSPOSED if transposed == (role == "a") else ROWS))
            quant[role], scales[role] = {"const": None}, quant_scale(fmt, t.dynamic_range)
    m, n = layer.outputs[0].shape[-2:]
    sa, sb = np.asarray(scales["a"], np.float32), np.asarray(scales["b"], np.float32)
    quant["dq"] = (sa[:, None] * np.broadcast_to(sb, (n,))[None, :] if sa.ndim else
                   np.broadcast_to(sa * sb, (n,)).copy())  # [M, N] or [N]
    return operands, quant


@dataclasses.dataclass
class _Costs:
    """A quantized layer's measured times (ms): its quantized kernel (reading quantized operands, writing its
    output quantized where layers of its format alone would read it), the quantize step of each operand, and its
    fp16 kernel."""

    quantized: float
    steps: Dict[int, float]
    fp16: float


def _quantize_steps(layer, fmt: str, sole_reader: set) -> Dict[int, Tuple[QuantizeOp, tuple, str, tuple]]:
    """Operand index -> (the quantize step it needs, its shape, its float dtype, its quantized shape): one step per
    tensor (an Attention's q, k, v of one projection share theirs). `sole_reader`: names of float32 engine inputs
    only this layer reads (quantized from float32 directly)."""
    operands, _ = quant_plan(layer, fmt)
    steps, stepped = {}, set()
    for i, shape, last, layout in operands:
        if (layer.inputs[i].name, layout) in stepped:
            continue
        stepped.add((layer.inputs[i].name, layout))
        src = "float32" if layer.inputs[i].name in sole_reader else "float16"
        step = operand_quantize(shape, src, quant_scale(fmt, layer.inputs[i].dynamic_range), last, layout,
                                FORMATS[fmt])
        steps[i] = (step, shape, src, quantized_shape(shape, last, layout))
    return steps


def _measure(layer, fmt: str, quantized_out: bool, steps, sole_reader: set, tuner: Tuner,
             options: BuildOptions) -> _Costs:
    """`steps`: the layer's quantize steps (:func:`_quantize_steps`); `sole_reader`: names of float32 engine inputs
    only this layer reads (the fp16 kernel then pays their cast, which the quantize step replaces)."""
    factory = FACTORIES[layer.kind]
    q, fp16 = _specs(layer, fmt, quantized_out, options)
    try:
        q_ms = tuner.fastest_ms(q, factory)
    except BackendError as exc:  # no quantized kernel for these shapes
        logger.warning("%s layer %s runs in FP16: %s", fmt, layer.name, exc)
        return _Costs(float("inf"), {}, 0.0)
    step_ms = {i: tuner.op_ms(step, [shape], [src], [qshape], [FORMATS[fmt].storage])
               for i, (step, shape, src, qshape) in steps.items()}
    casts = sum(tuner.op_ms(CastOp("float32", "float16"), [t.shape], ["float32"], [t.shape], ["float16"])
                for t in layer.inputs if t.name in sole_reader)
    return _Costs(q_ms, step_ms, tuner.fastest_ms(fp16, factory) + casts)


def _specs(layer, fmt: str, quantized_out: bool, options: BuildOptions) -> Tuple[Spec, Spec]:
    """The specs `layer` is timed with: quantized (operands of `fmt`, its output too where `quantized_out`), and
    in fp16."""
    out = [layer.outputs[0].shape]
    operands, quant = quant_plan(layer, fmt)
    qshapes = {i: quantized_shape(shape, last, layout) for i, shape, last, layout in operands}
    reads = [i for i in range(len(layer.inputs)) if i in qshapes or layer.kind != "MatrixMultiply"]
    q = Spec(layer, [qshapes.get(i, layer.inputs[i].shape) for i in reads],
             [FORMATS[fmt].storage if i in qshapes else _fp16_dtype(layer.inputs[i]) for i in reads], out,
             [FORMATS[fmt].storage if quantized_out else "float16"], "float16", options, quant=quant)
    fp16 = Spec(layer, [t.shape for t in layer.inputs], [_fp16_dtype(t) for t in layer.inputs], out, ["float16"],
                "float16", options)
    return q, fp16


def _fp16_dtype(t) -> str:
    """How an FP16 layer stores input `t`: float16 for floats, else the tensor's dtype (an attention mask)."""
    return "float16" if t.dtype in FLOATS else t.dtype


def settle_quantized(costs: Dict[str, "_Costs"], fixed: set, writers: Dict[str, Dict[int, Optional[str]]]) -> set:
    """The measured layers (`costs`) to run quantized, beside `fixed` (layers that write their outputs quantized
    whatever is chosen here: recorded quantized layers, max pools, LayerNorms read quantized): the choice of
    least total time, where a quantized layer also pays the quantize step of each operand no quantized layer
    writes (`writers`: operand index -> the layer that could write it quantized, None where a step is always
    needed). Exact: the total is a submodular function of the binary choices (a step costs only when the
    reader is quantized and the writer is not), so a minimum s-t cut finds its minimum (Kolmogorov and Zabih,
    2004): layer v is cut from the source (quantized) at its quantized time, from the sink at its fp16 time,
    and from its reader at the step the reader then pays."""
    source, sink = "<fp16>", "<quantized>"
    cap: Dict[str, Dict[str, float]] = collections.defaultdict(lambda: collections.defaultdict(float))
    for name, c in costs.items():
        unary = c.quantized
        for i, ms in c.steps.items():
            w = writers[name].get(i)
            if w in costs:
                cap[w][name] += ms  # cut when w runs fp16 and `name` quantized
            elif w not in fixed:
                unary += ms
        cap[source][name] += unary
        cap[name][sink] += c.fp16
        cap[name].setdefault(source, 0.0)
        cap[sink].setdefault(name, 0.0)
    for u in list(cap):  # residual arcs both ways
        for v in list(cap[u]):
            cap[v].setdefault(u, 0.0)
    while True:  # Edmonds-Karp: shortest augmenting paths
        parent, frontier = {source: None}, collections.deque([source])
        while frontier and sink not in parent:
            u = frontier.popleft()
            for v, r in cap[u].items():
                if r > 1e-12 and v not in parent:
                    parent[v] = u
                    frontier.append(v)
        if sink not in parent:
            break
        path, v = [], sink
        while parent[v] is not None:
            path.append((parent[v], v))
            v = parent[v]
        flow = min(cap[u][v] for u, v in path)
        for u, v in path:
            cap[u][v] -= flow
            cap[v][u] += flow
    return set(costs).difference(parent) | set(fixed)  # the source's side runs fp16


def keep_faster_quantized(net, layers: Dict[str, List[Tuple[int, bool]]], precision: str, tuner: Tuner,
                          options: BuildOptions, prefer: Dict[str, dict]
                          ) -> Tuple[Dict[str, List[Tuple[int, bool]]], Dict[str, Tuple[str, bool]]]:
    """The quantized layers worth running int8/fp8 on this GPU, and the choice made for each.

    TensorRT's INT8 (and FP8) mode lets a layer run in fp16 when that is faster, unless precisions are strict,
    counting the reformats at precision boundaries: each quantized convolution and matrix multiply is timed
    quantized (quantized operands in, quantized out where only layers of its format would read it) and in fp16,
    and so is each quantize step its operands would need; :func:`settle_quantized` then picks the precisions of
    least total time. An operand costs no step where its producer runs quantized and writes it so
    (quantized_tensors), or is a LayerNorm, which writes it quantized beside its output (normalization_duals: the
    extra bytes, not a pass of their own, are not counted). So a chain of int8 (FP8) layers pays the reformat
    once, at its start, where a layer-by-layer choice would charge each layer for it (and keep none). A layer left
    in fp16 becomes an FP16 layer (``layer.precision``, so the plan and the numpy backend say what runs). A tactic
    recorded on this GPU (``int8`` or ``fp8`` in it) decides without timing. Choice: layer name -> (key,
    quantized or not).
    """
    if options.strict_types:  # quantized, or the build fails where no quantized kernel exists
        return dict(layers), {}
    by_name = {layer.name: layer for layer in net.layers}
    pools = quantized_pools(net, precision)
    direct, dual = _quantized_if_all_kept(net, layers, precision)
    costs: Dict[str, _Costs] = {}
    recorded: Dict[str, bool] = {}
    readers = net.consumers()
    measured = [layer for layer in net.layers if layer.name in layers
                and (prefer.get(layer.name) or {}).get(_quant_format(layer, precision).lower()) is None]
    tuner.prebuild([(spec, FACTORIES[layer.kind]) for layer in measured
                    for spec in _specs(layer, _quant_format(layer, precision), layer.outputs[0].name in direct,
                                       options)])
    sole = {layer.name: {t.name for t in layer.inputs if t.producer is None and t.dtype == "float32"
                         and len(readers.get(t.name, [])) == 1} for layer in measured}
    # made before any timing, so that their kernels compile with the candidates' (Tuner._timer)
    steps = {layer.name: _quantize_steps(layer, _quant_format(layer, precision), sole[layer.name])
             for layer in measured}
    for layer in net.layers:
        if layer.name not in layers:
            continue
        fmt = _quant_format(layer, precision)
        choice = (prefer.get(layer.name) or {}).get(fmt.lower())
        if choice is not None:
            recorded[layer.name] = bool(choice)
        else:
            costs[layer.name] = _measure(layer, fmt, layer.outputs[0].name in direct, steps[layer.name],
                                         sole[layer.name], tuner, options)
    normalized = normalization_duals(net, layers, precision)
    writers = {}
    for name in costs:
        fmt, inputs = _quant_format(by_name[name], precision), by_name[name].inputs
        writers[name] = {}
        for i, transposed in layers[name]:
            t = _view_base(inputs[i], direct)
            kept = t.name in direct | dual and _member_format(t.producer, precision) == fmt
            writers[name][i] = None if transposed else normalized.get(inputs[i].name,
                                                                      t.producer.name if kept else None)
    fixed = {name for name, low in recorded.items() if low} | set(pools) | set(normalized.values())
    keep = settle_quantized(costs, fixed, writers)
    chosen = {}
    for name in layers:
        chosen[name] = (_quant_format(by_name[name], precision).lower(), name in keep)
        if name in costs:
            logger.debug("%s: %s %.4f ms + quantize steps %s, fp16 %.4f ms -> %s", name, chosen[name][0],
                         costs[name].quantized, costs[name].steps, costs[name].fp16, "kept" if name in keep else "fp16")
        if name not in keep:
            by_name[name].precision = "FP16"
    demoted = [name for name in layers if name not in keep]
    if demoted:
        logger.info("engine %s: %d of %d quantized layers run in FP16, faster on this GPU", net.name,
                    len(demoted), len(layers))
    return {name: layers[name] for name in layers if name in keep}, chosen  # (pools are not quantized layers)


def _view_base(t, direct: set):
    """The tensor that `t` views, where `t` is a view of a quantized layer's direct output (quantized_tensors), or
    `t`."""
    while t.name in direct and t.producer is not None and t.producer.kind in ("Identity", "Shuffle") \
            and t.producer.inputs[0].name in direct:
        t = t.producer.inputs[0]
    return t


def quantized_pools(net, precision: str) -> Dict[str, List[Tuple[int, bool]]]:
    """Max pools an INT8 or FP8 engine may run on quantized values, as quantized layers with one operand: their
    output has their input's range (builder/precision.py), so the max of the quantized values is the pooled tensor
    quantized."""
    if precision not in FORMATS:
        return {}
    return {layer.name: [(0, False)] for layer in net.layers
            if layer.kind == "Pooling" and layer.params.get("type") == "max" and layer.outputs[0].dtype in FLOATS
            and layer.inputs[0].dynamic_range is not None and layer.inputs[0].shape[-1] % PAD == 0
            and layer.outputs[0].dynamic_range == layer.inputs[0].dynamic_range}


def _quantized_if_all_kept(net, layers: Dict[str, List[Tuple[int, bool]]], precision: str) -> Tuple[set, set]:
    """quantized_tensors of the candidates `layers` (and the max pools), as if every candidate stayed
    quantized."""
    return quantized_tensors(net, {**quantized_pools(net, precision), **layers}, precision)


def _triton_job(layer, fmt: str, direct: set, dual: set) -> Optional[Tuple[str, tuple]]:
    """("conv" or "gemm", the job triton_conv.prefetch_requests takes) of a quantized layer the Triton kernel may run,
    its output stored as the program stores it: quantized where `direct` holds it, else fp16, with a quantized copy
    beside it where `dual` does; None for layers the kernel does not run (attention compiles its own)."""
    f = FORMATS[fmt]
    x, y = layer.inputs[0], layer.outputs[0]
    quantized = y.name in direct or y.name in dual
    out, scale = (f.storage if y.name in direct else "float16"), (quant_scale(fmt, y.dynamic_range) if quantized
                                                                  else None)
    if layer.kind == "MatrixMultiply":
        found = triton_conv.gemm_operands(quant_plan(layer, fmt)[1], layer.params, y.shape)
        if found is None:
            return None
        return "gemm", (fmt, triton_conv.gemm_geom(*found[:3]), "bias" in layer.weights,
                        layer.params.get("activation"), None, False, out, scale, y.name in dual)
    if layer.kind != "Convolution" or layer.weights["kernel"].ndim != 4:
        return None
    geom = ConvGeom.of(layer, tuple(x.shape[:-1]) + (f.channels(x.shape[-1]),), y.shape)
    if _folds(layer, fmt):
        geom = conv_fold.fold(geom)
    residual = None
    if len(layer.inputs) > 1:
        residual = (layer.inputs[1].shape[0], f.storage if _stored_residual(layer, fmt) else "float16")
    return "conv", (fmt, geom, "bias" in layer.weights, layer.params.get("activation"), residual,
                    quantized_residual(layer, fmt), out, scale, y.name in dual)


def _prefetch_triton_kernels(net, layers: Dict[str, List[Tuple[int, bool]]], precision: str,
                             prefer: Dict[str, dict], tuner: Tuner, options: BuildOptions) -> None:
    """Start compiling the Triton kernels quantized convolutions and matrix multiplies are timed with
    (ops/triton_conv.py), all at once; not for layers whose tactic the plan or the timing cache holds: those build
    the one kernel they need (from Triton's own cache when it was compiled before)."""
    direct, _ = _quantized_if_all_kept(net, layers, precision)
    jobs = {"conv": [], "gemm": []}
    for layer in net.layers:
        if layer.name not in layers or prefer.get(layer.name):
            continue
        fmt = _quant_format(layer, precision)
        if tuner.knows(_specs(layer, fmt, layer.outputs[0].name in direct, options)[0]):
            continue
        job = _triton_job(layer, fmt, direct, set())
        if job is not None:
            jobs[job[0]].append(job[1])
    triton.prefetch(triton_conv.prefetch_requests(jobs["conv"], options.triton_tiles)
                    + triton_conv.prefetch_requests(jobs["gemm"], len(triton_conv.GEMM_TILES), triton_conv.GEMM_TILES))


def _prefetch_program_kernels(net, plan: "QuantPlan", precision: str, tuner: Tuner) -> None:
    """Start compiling, in threads here, the kernels the program will run that its layers' timing did not compile:
    a layer timed writing its output quantized (as if every reader stayed quantized) writes fp16 in the program,
    or a quantized copy beside it, where a reader then runs in FP16; the tile that won stays its tactic
    (Tuner._of_this_layer), in the kernel of that output. Compiled as the program is laid out, each held it up
    1-2 s in a fresh ResNet-50 INT8 conversion on an H200 machine (one or two such kernels); Triton releases the GIL
    for most of a compile (4 kernels: 1.7 s in 4 threads, 3.7 s one after another)."""
    requests = []
    for layer in net.layers:
        record = tuner.tactic_of(layer.name, quantized=True) if layer.name in plan.layers else None
        if not record or not str(record.get("op", "")).startswith("triton_") or "tile" not in record:
            continue
        job = _triton_job(layer, _quant_format(layer, precision), plan.direct, plan.dual)
        if job is not None:
            requests += triton_conv.prefetch_requests([job[1]], 1, [tuple(record["tile"][:5])])
    triton.prefetch(requests, threads=True)


def normalization_duals(net, layers: Dict[str, List[Tuple[int, bool]]], precision: str) -> Dict[str, str]:
    """Tensors that quantized layers of `layers` read as untransposed, unpadded operands of the engine's format and
    that are a LayerNorm's output or a view of it at its range (a reshape: a Dense layer of a converted model
    reads its [batch, tokens, width] input as rows): tensor name -> the Normalization layer, which writes its
    output quantized too (a second output of its kernel, ops/reduce.py), so those readers need no quantize step of
    their own (a view reads those bytes through an alias)."""
    if precision not in FORMATS:
        return {}
    consumers = net.consumers()
    found = {}
    for layer in net.layers:
        t = layer.outputs[0] if layer.kind == "Normalization" else None
        if t is None or t.dynamic_range is None or t.dtype not in FLOATS or t.rank < 2 or t.shape[-1] % PAD:
            continue
        for read in _range_keeping_views(t, consumers):
            if any(u.inputs[i] is read and not transposed for u in consumers.get(read.name, [])
                   if _member_format(u, precision) == precision for i, transposed in layers.get(u.name, [])):
                found[read.name] = layer.name
    return found


def _range_keeping_views(t, consumers) -> List:
    """t and the tensors that view its memory (Identity layers, order-keeping reshapes; chained) at its range, their
    last dimension a multiple of PAD."""
    views, todo = [], [t]
    while todo:
        u = todo.pop()
        views.append(u)
        todo += [c.outputs[0] for c in consumers.get(u.name, []) if c.kind in ("Identity", "Shuffle")
                 and c.inputs[0] is u and is_view(c, u.dtype, c.outputs[0].dtype) and c.outputs[0].rank >= 2
                 and c.outputs[0].dynamic_range == t.dynamic_range and c.outputs[0].shape[-1] % PAD == 0]
    return views


def _member_format(layer, precision: str) -> Optional[str]:
    """The format a layer of quantized_tensors' `layers` runs in: its own, the engine's for the max pools."""
    return precision if layer.kind == "Pooling" else _quant_format(layer, precision)


def quantized_tensors(net, layers: Dict[str, List[Tuple[int, bool]]], precision: str) -> Tuple[set, set]:
    """(direct, dual): outputs of quantized layers that layers of the same format (INT8 or FP8) read as
    quantized operands, untransposed and unpadded. Direct: only they read it, itself or through views at its
    range (a reshape: a converted Dense layer reads rows), so it is stored quantized alone, and so are those views
    (direct too); dual (convolution outputs): other layers read it too (a residual sum), so its producer writes a
    quantized copy beside the fp16 tensor."""
    consumers = net.consumers()
    outputs = {t.name for t in net.outputs}
    direct, dual = set(), set()
    for layer in net.layers:
        if layer.name not in layers:
            continue
        t = layer.outputs[0]
        if t.dynamic_range is None or t.rank < 2 or t.shape[-1] % PAD:
            continue

        fmt = _member_format(layer, precision)

        def quantized_reads(user, read) -> List[bool]:
            """Per use of `read` (t or a view of it) by `user`: is it an untransposed operand of the same format?"""
            ops = layers.get(user.name, []) if _member_format(user, precision) == fmt else []
            return [any(i == j and not transposed for j, transposed in ops)
                    for i, u in enumerate(user.inputs) if u is read]

        views = _range_keeping_views(t, consumers)
        seen = {v.name for v in views}
        reads = [r for v in views for u in consumers.get(v.name, []) if u.outputs[0].name not in seen
                 for r in quantized_reads(u, v)]
        if reads and all(reads) and not seen & outputs:
            direct.update(seen)
        elif layer.kind == "Convolution" and any(r for u in consumers.get(t.name, []) for r in quantized_reads(u, t)):
            dual.add(t.name)
    return direct, dual


@dataclasses.dataclass
class QuantPlan:
    """What a program runs quantized: layer name -> quantized operands of the layers kept INT8/FP8 (`layers`) and
    of the max pools run on quantized values (`pools`); keep_faster_quantized's choice per layer (`choice`);
    tensors stored quantized alone (`direct`) or beside their float value (`dual`); the LayerNorms that also write
    their output quantized (`dual_writers`)."""

    layers: Dict[str, List[Tuple[int, bool]]]
    choice: Dict[str, Tuple[str, bool]]
    pools: Dict[str, List[Tuple[int, bool]]]
    direct: set
    dual: set
    dual_writers: set


def anticipate(net, precision: str, tuner: Tuner, options: BuildOptions) -> None:
    """Start what a later build of `net` at `precision` spends its time on, while calibration gives `net` its
    ranges (here stand-ins): the Triton kernels its quantized layers are timed with start compiling (the prefetch
    of plan_quantization: a kernel depends on a range only through whether it clamps in fp16, so nearly all of
    them are the build's own; the build compiles any other it needs), then the cuDNN plans of the specs those
    layers are timed with, quantized and in fp16 (Tuner.warm: a plan depends on shapes, not on ranges)."""
    if precision not in FORMATS:
        return
    layers = quantized_layers(net, precision)
    _prefetch_triton_kernels(net, layers, precision, {}, tuner, options)
    direct, _ = _quantized_if_all_kept(net, layers, precision)
    tuner.warm([spec for layer in net.layers if layer.name in layers
                for spec in _specs(layer, _quant_format(layer, precision), layer.outputs[0].name in direct, options)])


def plan_quantization(net, precision: str, tuner: Tuner, options: BuildOptions,
                      prefer: Dict[str, dict]) -> QuantPlan:
    """The candidates (quantized_layers), their Triton kernels prefetched, the choice by timing
    (keep_faster_quantized), then the max pools whose output only quantized layers read, and the tensors stored
    quantized (quantized_tensors, normalization_duals)."""
    candidates = quantized_layers(net, precision)
    _prefetch_triton_kernels(net, candidates, precision, prefer, tuner, options)
    layers, choice = keep_faster_quantized(net, candidates, precision, tuner, options, prefer)
    pools = quantized_pools(net, precision)
    direct, _ = quantized_tensors(net, {**layers, **pools}, precision)
    pooled = {l.name: l.outputs[0].name for l in net.layers if l.name in pools}
    pools = {name: ops for name, ops in pools.items() if pooled[name] in direct}  # quantized layers alone read it
    direct, dual = quantized_tensors(net, {**layers, **pools}, precision)
    dual_writers = set(normalization_duals(net, layers, precision).values())
    plan = QuantPlan(layers, choice, pools, direct, dual, dual_writers)
    _prefetch_program_kernels(net, plan, precision, tuner)
    return plan
