"""Compile an engine's network into a program for the GPU: tensors placed in memory, steps (one op
per layer or fused pointwise group, plus casts), tactics chosen by timing on this GPU.

Inside the engine every float tensor is stored in its layer's compute dtype (float16 for FP16/INT8
layers); bindings keep their network dtype and casts are inserted where they meet. INT8 layers (convolutions,
matrix multiplies, attention) read their activation operands through quantize steps (one per tensor, shared by
its readers), or straight from an int8 producer when only int8 layers read the tensor, itself or through reshape
views (ops/quant.py); FP8 layers likewise with E4M3 bytes. Each quantized layer runs so only where
that is faster than FP16 (keep_faster_quantized). Tensors that are a view of another (reshapes, order-keeping
transposes, same-dtype identities) take no memory. Activations share one arena per execution context, laid out
by lifetime.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.memory import Ledger
from tftrt_py.engine.backends.cupy.ops import FACTORIES, POINTWISE_KINDS, BuildOptions, Op, PointwiseOp, Spec
from tftrt_py.engine.backends.cupy.ops import attention, fp8, int8, triton_conv
from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom
from tftrt_py.engine.backends.cupy.ops.base import align
from tftrt_py.engine.backends.cupy.ops.quant import FORMATS, PAD, QuantizeOp, padded, quantized_shape
from tftrt_py.engine.backends.cupy.tactics import Tuner
from tftrt_py.engine.backends.numpy_precision import cached
from tftrt_py.engine.errors import BackendError, MissingDynamicRangeError

__all__ = ["Program", "Slot", "Step", "compile_program"]

logger = logging.getLogger(__name__)

FLOATS = ("float32", "float16")
LOW = ("FP16", "INT8", "FP8")


@dataclasses.dataclass
class Slot:
    """Where a tensor lives: an engine input/output buffer, the arena, a constant, or a view of `base`."""

    name: str
    shape: Tuple[int, ...]
    dtype: str
    place: str  # input | output | arena | const | alias
    base: Optional[str] = None
    offset: int = 0
    array: object = None  # const arrays (shared by all contexts)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclasses.dataclass
class Step:
    op: Op
    inputs: List[str]
    outputs: List[str]
    layer: str


_CAST4 = r"""
struct alignas(4 * sizeof(TI)) In4 { TI v[4]; };
struct alignas(4 * sizeof(TO)) Out4 { TO v[4]; };
extern "C" __global__ void tt_cast4(const TI* __restrict__ x, TO* __restrict__ y, long long n) {
  long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; 4 * i < n; i += step) {
    if (4 * i + 3 < n) {
      In4 a = reinterpret_cast<const In4*>(x)[i];
      Out4 b;
      for (int j = 0; j < 4; ++j) b.v[j] = st<TO>(ld(a.v[j]));
      reinterpret_cast<Out4*>(y)[i] = b;
    } else {
      for (long long j = 4 * i; j < n; ++j) y[j] = st<TO>(ld(x[j]));
    }
  }
}
"""


class CastOp(Op):
    """Copy with dtype conversion (bindings <-> the engine's storage dtypes). Between float32 and float16 a
    kernel of ours converts 4 values a thread (16- and 8-byte accesses) where both arrays are aligned for it:
    cupy's copy takes one a thread, and ResNet-50's fp32 image at batch 128 took 0.101 ms to cast on an H100."""

    def __init__(self, src: str, dst: str):
        self.tactic = {"op": "cast", "from": src, "to": dst}
        self.vector = None
        if {src, dst} <= set(FLOATS):
            head = f"#define TI {kernels.raw_type(src)}\n#define TO {kernels.raw_type(dst)}\n"
            self.vector = kernels.raw_kernel(head + _CAST4, "tt_cast4")
            self.align = 4 * max(np.dtype(src).itemsize, np.dtype(dst).itemsize)

    def run(self, rc, ins, outs):
        x, y = ins[0], outs[0]
        if (self.vector is not None and x.flags.c_contiguous and y.flags.c_contiguous
                and not (x.data.ptr % self.align or y.data.ptr % self.align)):
            kernels.launch(self.vector, -(-x.size // 4), (x, y, kernels.i64(x.size)))
        else:
            _device.require().copyto(y, x, casting="unsafe")


class Program:
    """The compiled engine: shared by every execution context of one engine."""

    def __init__(self):
        self.slots: Dict[str, Slot] = {}
        self.steps: List[Step] = []
        self.inputs: List[Tuple[str, str]] = []   # (binding, slot)
        self.outputs: List[Tuple[str, str]] = []  # (binding, slot)
        self.arena_bytes = 0
        self.workspace_bytes = 0
        self.tactics: Dict[str, dict] = {}
        self.weight_bytes = 0
        self.ledger: Optional[Ledger] = None
        self.capture = True
        #: With TFTRT_PY_CHECK_TACTICS=1: each candidate's error against the numpy backend.
        self.tuning_report: List[dict] = []

    @property
    def needs_cudnn(self) -> bool:
        return any(s.op.uses_cudnn for s in self.steps)

    def root(self, name: str) -> Slot:
        slot = self.slots[name]
        while slot.place == "alias":
            slot = self.slots[slot.base]
        return slot


# -- dtype policy -------------------------------------------------------------------------------------
def _low(layer, precision: str) -> bool:
    return (layer.precision or precision) in LOW


def compute_dtype(layer, precision: str) -> str:
    if layer.kind == "Bitcast":  # reinterprets float32 bits: never stored as float16
        return "float32"
    if _low(layer, precision) or any(t.dtype == "float16" for t in layer.outputs):
        return "float16"
    return "float32"


def storage_dtype(tensor, layer, precision: str) -> str:
    return compute_dtype(layer, precision) if tensor.dtype in FLOATS else tensor.dtype


# -- int8 and fp8 ---------------------------------------------------------------------------------------
QUANT_KINDS = ("Convolution", "MatrixMultiply", "Attention")


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
    quantize = fp8.matmul_constant if fmt == "FP8" else int8.matmul_constant

    def make(v):
        q, s = quantize(v, role, transposed, kp)
        q.flags.writeable = s.flags.writeable = False  # shared by every plan of these weights
        return q, s

    return cached(value, make, (fmt, role, transposed, kp)) if isinstance(value, np.ndarray) else make(value)


def quant_plan(layer, fmt: str) -> Tuple[List[Tuple[int, Tuple[int, ...], int, bool]], dict]:
    """What a quantized layer reads: (input index, tensor shape, padded last dim, transposed) per activation
    operand, and the spec's ``quant`` dict (see ops/int8.py, ops/fp8.py)."""
    f = FORMATS[fmt]
    if layer.kind == "Attention":  # q, k, v (often windows of one tensor), each at its scale
        qkv = layer.inputs[:3]
        return ([(i, tuple(t.shape), t.shape[-1], False) for i, t in enumerate(qkv)],
                {"format": fmt, "scales": [float(quant_scale(fmt, t.dynamic_range)) for t in qkv]})
    if layer.kind == "Convolution":
        x = layer.inputs[0]
        operands = [(0, tuple(x.shape), f.channels(x.shape[-1]), False)]
        quant = {"format": fmt, "in_scale": float(quant_scale(fmt, x.dynamic_range))}
        if quantized_residual(layer, fmt):
            r = layer.inputs[1]
            quant["res_scale"] = float(quant_scale(fmt, r.dynamic_range))
            if _stored_residual(layer, fmt):
                operands.append((1, tuple(r.shape), r.shape[-1], False))
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
            operands.append((i, tuple(t.shape), quant["kp"], transposed if role == "a" else not transposed))
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


def _measure(layer, fmt: str, quantized_out: bool, sole_reader: set, tuner: Tuner, options: BuildOptions) -> _Costs:
    """`sole_reader`: names of float32 engine inputs only this layer reads (the fp16 kernel then pays their cast,
    which the quantize step replaces)."""
    factory = FACTORIES[layer.kind]
    out = [layer.outputs[0].shape]
    operands, quant = quant_plan(layer, fmt)
    qshapes = {i: quantized_shape(shape, last, tr) for i, shape, last, tr in operands}
    reads = [i for i in range(len(layer.inputs)) if i in qshapes or layer.kind != "MatrixMultiply"]
    q = Spec(layer, [qshapes.get(i, layer.inputs[i].shape) for i in reads],
             [FORMATS[fmt].storage if i in qshapes else _fp16_dtype(layer.inputs[i]) for i in reads], out,
             [FORMATS[fmt].storage if quantized_out else "float16"], "float16", options, quant=quant)
    try:
        q_ms = tuner.fastest_ms(q, factory)
    except BackendError as exc:  # no quantized kernel for these shapes
        logger.warning("%s layer %s runs in FP16: %s", fmt, layer.name, exc)
        return _Costs(float("inf"), {}, 0.0)
    steps, stepped = {}, set()
    for i, shape, last, tr in operands:
        if (layer.inputs[i].name, tr) in stepped:  # one step per tensor (an Attention's q, k, v of one projection)
            continue
        stepped.add((layer.inputs[i].name, tr))
        src = "float32" if layer.inputs[i].name in sole_reader else "float16"
        step = QuantizeOp(shape, src, quant_scale(fmt, layer.inputs[i].dynamic_range), last, tr, FORMATS[fmt].qfunc)
        steps[i] = tuner.op_ms(step, [shape], [src], [qshapes[i]], [FORMATS[fmt].storage])
    fp16 = Spec(layer, [t.shape for t in layer.inputs], [_fp16_dtype(t) for t in layer.inputs], out, ["float16"],
                "float16", options)
    casts = sum(tuner.op_ms(CastOp("float32", "float16"), [t.shape], ["float32"], [t.shape], ["float16"])
                for t in layer.inputs if t.name in sole_reader)
    return _Costs(q_ms, steps, tuner.fastest_ms(fp16, factory) + casts)


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
    for layer in net.layers:
        if layer.name not in layers:
            continue
        fmt = _quant_format(layer, precision)
        choice = (prefer.get(layer.name) or {}).get(fmt.lower())
        if choice is not None:
            recorded[layer.name] = bool(choice)
        else:
            sole = {t.name for t in layer.inputs if t.producer is None and t.dtype == "float32"
                    and len(readers.get(t.name, [])) == 1}
            costs[layer.name] = _measure(layer, fmt, layer.outputs[0].name in direct, sole, tuner, options)
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


def _prefetch_triton_kernels(net, layers: Dict[str, List[Tuple[int, bool]]], precision: str,
                             prefer: Dict[str, dict]) -> None:
    """Start compiling the Triton kernels quantized convolutions and matrix multiplies are timed with
    (ops/triton_conv.py), all at once (not for layers whose tactic was recorded: those build the one kernel they
    need)."""
    direct, _ = _quantized_if_all_kept(net, layers, precision)
    convolutions, gemms = [], []
    for layer in net.layers:
        if layer.name not in layers or prefer.get(layer.name):
            continue
        fmt = _quant_format(layer, precision)
        f = FORMATS[fmt]
        x, y = layer.inputs[0], layer.outputs[0]
        out, scale = (f.storage, quant_scale(fmt, y.dynamic_range)) if y.name in direct else ("float16", None)
        if layer.kind == "MatrixMultiply":
            found = triton_conv.gemm_operands(quant_plan(layer, fmt)[1], layer.params, y.shape)
            if found is not None:
                gemms.append((fmt, triton_conv.gemm_geom(*found[:3]), "bias" in layer.weights,
                              layer.params.get("activation"), None, False, out, scale))
            continue
        if layer.kind != "Convolution" or layer.weights["kernel"].ndim != 4:  # (attention compiles its own)
            continue
        geom = ConvGeom.of(layer, tuple(x.shape[:-1]) + (f.channels(x.shape[-1]),), y.shape)
        residual = None
        if len(layer.inputs) > 1:
            residual = (layer.inputs[1].shape[0], f.storage if _stored_residual(layer, fmt) else "float16")
        convolutions.append((fmt, geom, "bias" in layer.weights, layer.params.get("activation"), residual,
                             quantized_residual(layer, fmt), out, scale))
    triton_conv.prefetch(convolutions)
    triton_conv.prefetch(gemms, triton_conv.GEMM_TILES)


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


# -- views ---------------------------------------------------------------------------------------------
def _keeps_order(shape, perm) -> bool:
    moved = [p for p in perm if shape[p] != 1]
    return moved == sorted(moved)


def is_view(layer, in_dtype: str, out_dtype: str) -> bool:
    """The layer's output is its input's memory reinterpreted (no kernel needed)."""
    if layer.kind == "Identity":
        return in_dtype == out_dtype
    if layer.kind != "Shuffle" or in_dtype != out_dtype:
        return False
    from tftrt_py.engine import layers as layer_kinds

    p = layer.params
    shape = layer.inputs[0].shape
    if p.get("first_perm") is not None and not _keeps_order(shape, p["first_perm"]):
        return False
    if p.get("second_perm") is not None:
        mid = layer_kinds.shuffle_shapes(shape, {"first_perm": p.get("first_perm"), "reshape": p.get("reshape")})
        if not _keeps_order(mid, p["second_perm"]):
            return False
    return True


# -- pointwise fusion ------------------------------------------------------------------------------------
def pointwise_groups(network, views: set) -> Dict[str, List]:
    """root layer name -> the pointwise layers it computes in one kernel (network order)."""
    consumers = network.consumers()
    outputs = {t.name for t in network.outputs}
    index = {l.name: i for i, l in enumerate(network.layers)}
    groups: Dict[str, List] = {}
    for layer in network.layers:
        if layer.kind not in POINTWISE_KINDS or layer.name in views:
            continue
        members = [layer]
        for t in layer.inputs:
            p = t.producer
            if (p is not None and p.name in groups and t.name not in outputs
                    and len(consumers.get(t.name, [])) == 1 and len(p.outputs) == 1):
                members = groups.pop(p.name) + members
        seen, ordered = set(), []
        for m in sorted(members, key=lambda l: index[l.name]):
            if m.name not in seen:
                seen.add(m.name)
                ordered.append(m)
        groups[layer.name] = ordered
    return groups


# -- compile -----------------------------------------------------------------------------------------------
def compile_program(engine, options: BuildOptions, prefer: Dict[str, dict], ledger: Ledger,
                    tuner_ctx) -> Program:
    """Program for `engine`; `prefer` holds tactics recorded by an earlier build on this GPU."""
    cupy = _device.require()
    net, precision = engine.network, engine.precision
    fp8.check_device(net.name, precision, cupy.cuda.Device().compute_capability, _device.device_name())
    prog = Program()
    prog.ledger = ledger
    tuner = Tuner(tuner_ctx, options, check=os.environ.get("TFTRT_PY_CHECK_TACTICS") == "1")
    sd: Dict[str, str] = {}
    casts: Dict[Tuple[str, str], str] = {}
    weights: List = []

    def add_slot(name, shape, dtype, place, **kw) -> Slot:
        slot = Slot(name, tuple(int(d) for d in shape), dtype, place, **kw)
        prog.slots[name] = slot
        sd[name] = dtype
        return slot

    def need(tensor_name: str, dtype: str, layer_name: str) -> str:
        """A slot holding `tensor_name` in `dtype` (inserting a cast step once)."""
        if sd[tensor_name] == dtype:
            return tensor_name
        key = (tensor_name, dtype)
        if key not in casts:
            name = f"{tensor_name}@{dtype}"
            add_slot(name, prog.slots[tensor_name].shape, dtype, "arena")
            prog.steps.append(Step(CastOp(sd[tensor_name], dtype), [tensor_name], [name], f"{layer_name} (cast)"))
            casts[key] = name
        return casts[key]

    for t in net.inputs:
        add_slot(t.name, t.shape, t.dtype, "input")
        prog.inputs.append((t.name, t.name))

    tensors = {t.name: t for t in net.inputs}
    tensors.update({t.name: t for l in net.layers for t in l.outputs})
    candidates = quantized_layers(net, precision)
    _prefetch_triton_kernels(net, candidates, precision, prefer)
    quantized_ops, choice = keep_faster_quantized(net, candidates, precision, tuner, options, prefer)
    pools = quantized_pools(net, precision)
    direct, _ = quantized_tensors(net, {**quantized_ops, **pools}, precision)
    pooled = {l.name: l.outputs[0].name for l in net.layers if l.name in pools}
    pools = {name: ops for name, ops in pools.items() if pooled[name] in direct}  # quantized layers alone read it
    direct, dual = quantized_tensors(net, {**quantized_ops, **pools}, precision)
    dual_writers = set(normalization_duals(net, quantized_ops, precision).values())
    quantized: Dict[Tuple[str, str, int, bool], str] = {}

    def need_q(tensor_name: str, fmt: str, last: int, transpose: bool, layer_name: str) -> str:
        """A slot holding `tensor_name` quantized (int8 or E4M3 bytes), its last dim padded to `last` (after
        the optional transpose of the last two dims); one quantize step per tensor, format and layout, none for a
        view of a tensor quantized already at its scale (an alias of those bytes)."""
        slot = prog.slots[tensor_name]
        f = FORMATS[fmt]
        if sd[tensor_name] == f.storage:
            if transpose or slot.shape[-1] != last:
                raise BackendError(f"{fmt} tensor {tensor_name!r} cannot be read transposed or padded")
            return tensor_name
        key = (tensor_name, fmt, last, transpose)
        base = prog.root(tensor_name)
        if key not in quantized and base.name != tensor_name and not transpose and last == slot.shape[-1]:
            found = quantized.get((base.name, fmt, base.shape[-1], False))  # what it views, quantized unpadded
            if found is not None and (quant_scale(fmt, tensors[tensor_name].dynamic_range)
                                      == quant_scale(fmt, tensors[base.name].dynamic_range)):
                quantized[key] = f"{tensor_name}@{fmt.lower()}"  # a view of those bytes
                add_slot(quantized[key], slot.shape, f.storage, "alias", base=found)
        if key not in quantized:
            name = f"{tensor_name}@{fmt.lower()}{'T' if transpose else ''}"
            add_slot(name, quantized_shape(slot.shape, last, transpose), f.storage, "arena")
            op = QuantizeOp(slot.shape, sd[tensor_name], quant_scale(fmt, tensors[tensor_name].dynamic_range), last,
                            transpose, f.qfunc)
            prog.steps.append(Step(op, [tensor_name], [name], f"{layer_name} (quantize)"))
            quantized[key] = name
        return quantized[key]

    def quantized_inputs(layer, cdt: str):
        """(input slots, quant dict) of an int8 or fp8 layer."""
        fmt = _quant_format(layer, precision)
        operands, quant = quant_plan(layer, fmt)
        ins = {i: need_q(layer.inputs[i].name, fmt, last, tr, layer.name) for i, _, last, tr in operands}
        if layer.kind != "MatrixMultiply":  # a convolution's residual, an attention's mask
            ins.update({i: need(t.name, cdt if t.dtype in FLOATS else t.dtype, layer.name)
                        for i, t in enumerate(layer.inputs) if i not in ins})
        return [ins[i] for i in sorted(ins)], quant

    views = set()
    groups: Optional[Dict[str, List]] = None
    in_group: Dict[str, str] = {}

    start = time.perf_counter()
    for layer in net.layers:
        out_dtypes = [storage_dtype(t, layer, precision) for t in layer.outputs]
        if layer.kind == "Constant":
            value = layer.weights["value"].astype(out_dtypes[0])
            arr = cupy.asarray(np.ascontiguousarray(value))
            weights.append(arr)
            add_slot(layer.outputs[0].name, layer.outputs[0].shape, out_dtypes[0], "const", array=arr)
            continue
        if layer.kind in ("Identity", "Shuffle") and layer.outputs[0].name in direct:  # a view of a tensor stored
            out_dtypes = [sd[layer.inputs[0].name]]  # quantized alone (quantized_tensors)
        if layer.kind in ("Identity", "Shuffle") and is_view(layer, sd[layer.inputs[0].name], out_dtypes[0]):
            views.add(layer.name)
            add_slot(layer.outputs[0].name, layer.outputs[0].shape, out_dtypes[0], "alias", base=layer.inputs[0].name)
            continue
        if layer.kind in POINTWISE_KINDS:
            if groups is None:
                groups = _groups_after_views(net, precision, sd)
                in_group = {m.name: root for root, members in groups.items() for m in members}
            root = in_group.get(layer.name)
            if root is None:  # a view decided late: treat as its own group
                groups[layer.name] = [layer]
                root = layer.name
            if root != layer.name:
                add_slot(layer.outputs[0].name, layer.outputs[0].shape, out_dtypes[0], "fused")
                continue
            members = groups[root]
            op = PointwiseOp(members, lambda n: sd[n], out_dtypes[0], cupy.asarray)
            add_slot(layer.outputs[0].name, layer.outputs[0].shape, out_dtypes[0], "arena")
            prog.steps.append(Step(op, list(op.tensor_inputs), [layer.outputs[0].name], layer.name))
            prog.tactics[layer.name] = dict(op.tactic, fused=[m.name for m in members])
            weights.append(op)
            continue
        factory = FACTORIES.get(layer.kind)
        if factory is None:
            raise BackendError(f"layer kind {layer.kind!r} ({layer.name}) is not supported by the cupy backend")
        cdt = compute_dtype(layer, precision)
        host = layer.kind == "NMS"
        quant, extra = None, []  # extra: (slot, shape, format) of a second, quantized output (dual tensors)
        if layer.name in pools:
            x = layer.inputs[0]
            inputs = [need_q(x.name, precision, x.shape[-1], False, layer.name)]
            out_dtypes = [FORMATS[precision].storage]
        elif layer.name in quantized_ops:
            inputs, quant = quantized_inputs(layer, cdt)
            t, fmt = layer.outputs[0], _quant_format(layer, precision)
            out_dtypes = [FORMATS[fmt].storage if t.name in direct else cdt]
            if t.name in dual:
                quant["dual_scale"] = float(quant_scale(fmt, t.dynamic_range))
                extra = [(f"{t.name}@{fmt.lower()}", tuple(t.shape), fmt)]
        else:
            inputs = []
            for t in layer.inputs:
                want = sd[t.name] if host else (cdt if t.dtype in FLOATS else t.dtype)
                inputs.append(need(t.name, want, layer.name))
            t = layer.outputs[0] if layer.outputs else None
            if t is not None and layer.name in dual_writers:
                quant = {"format": precision, "dual_scale": float(quant_scale(precision, t.dynamic_range))}
                extra = [(f"{t.name}@{precision.lower()}", tuple(t.shape), precision)]
        spec = Spec(layer, [prog.slots[n].shape for n in inputs], [sd[n] for n in inputs],
                    [t.shape for t in layer.outputs] + [shape for _, shape, _ in extra],
                    out_dtypes + [FORMATS[fmt].storage for _, _, fmt in extra], cdt, options, prefer.get(layer.name),
                    quant=quant)
        op, record = tuner.choose(spec, factory)
        for t, dtype in zip(layer.outputs, out_dtypes):
            add_slot(t.name, t.shape, dtype, "arena")
        for name, shape, fmt in extra:
            add_slot(name, shape, FORMATS[fmt].storage, "arena")
            quantized[(layer.outputs[0].name, fmt, shape[-1], False)] = name
        prog.steps.append(Step(op, inputs, [t.name for t in layer.outputs] + [n for n, _, _ in extra], layer.name))
        if layer.name in choice:
            record = dict(record, **dict([choice[layer.name]]))
        prog.tactics[layer.name] = record
        weights.append(op)
    tuner.release()
    prog.tuning_report = tuner.report

    _bind_outputs(prog, net, sd)
    _plan_arena(prog)
    prog.workspace_bytes = max([align(s.op.workspace) for s in prog.steps] + [0])
    prog.weight_bytes = sum(int(getattr(w, "nbytes", 0)) if not isinstance(w, Op) else w.device_bytes
                            for w in weights)
    ledger.charge("weights", prog.weight_bytes)
    prog.capture = os.environ.get("TFTRT_PY_CUDA_GRAPHS", "1") != "0"
    logger.info("cupy program for %s: %d steps, arena %.1f MiB, workspace %.1f MiB, weights %.1f MiB, "
                "tactics in %.2f s", net.name, len(prog.steps), prog.arena_bytes / 2**20,
                prog.workspace_bytes / 2**20, prog.weight_bytes / 2**20, time.perf_counter() - start)
    return prog


def _groups_after_views(net, precision, sd) -> Dict[str, List]:
    """Pointwise groups, leaving out layers that are views (same-dtype identities)."""
    views = set()
    for layer in net.layers:
        if layer.kind == "Identity":
            out = storage_dtype(layer.outputs[0], layer, precision)
            src = layer.inputs[0]
            in_dtype = sd.get(src.name) or (storage_dtype(src, src.producer, precision) if src.producer else src.dtype)
            if in_dtype == out:
                views.add(layer.name)
    return pointwise_groups(net, views)


def _bind_outputs(prog: Program, net, sd) -> None:
    """Give each network output a binding buffer: the producing step writes it directly when it can (also
    through a reshape: the binding is then that view of the buffer)."""
    producer = {}
    for i, step in enumerate(prog.steps):
        for name in step.outputs:
            producer[name] = i
    taken = set()
    for t in net.outputs:
        slot, root = prog.slots[t.name], prog.root(t.name)  # a view (a reshape) binds the buffer it views
        if root.place == "arena" and root.name in producer and root.dtype == t.dtype and root.name not in taken:
            root.place = "output"
            taken.add(root.name)
            prog.outputs.append((t.name, t.name))
            continue
        name = f"{t.name}@binding{len(prog.outputs)}"
        prog.slots[name] = Slot(name, tuple(t.shape), t.dtype, "output")
        prog.steps.append(Step(CastOp(slot.dtype, t.dtype), [t.name], [name], f"{t.name} (output)"))
        prog.outputs.append((t.name, name))


def _plan_arena(prog: Program) -> None:
    """Offsets in one arena for every arena slot: greedy by size over lifetimes."""
    first, last = {}, {}
    for i, step in enumerate(prog.steps):
        for name in step.inputs:
            root = prog.root(name).name
            last[root] = i
        for name in step.outputs:
            first.setdefault(name, i)
            last[name] = max(last.get(name, i), i)
    arena = [s for s in prog.slots.values() if s.place == "arena"]
    placed: List[Tuple[int, int, int, int]] = []  # (offset, end, first, last)
    for slot in sorted(arena, key=lambda s: -s.nbytes):
        size = align(max(slot.nbytes, 1))
        a, b = first.get(slot.name, 0), last.get(slot.name, len(prog.steps))
        busy = sorted((o, e) for o, e, f, l in placed if not (l < a or f > b))
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        slot.offset = offset
        placed.append((offset, offset + size, a, b))
    prog.arena_bytes = max([e for _, e, _, _ in placed] + [0])
