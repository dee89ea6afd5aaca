"""Compile an engine's network into a program for the GPU: tensors placed in memory, steps (one op
per layer or fused pointwise group, plus casts and quantize steps), tactics chosen by timing on this GPU.

Inside the engine every float tensor is stored in its layer's compute dtype (float16 for FP16/INT8/FP8
layers); bindings keep their network dtype and casts are inserted where they meet. Which layers run quantized,
and which tensors are stored so, is quant_planning.py's plan. Tensors that are a view of another (reshapes,
order-keeping transposes, same-dtype identities) take no memory. Activations share one arena per execution
context, laid out by lifetime.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

from tftrt_py import settings
from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.memory import Ledger
from tftrt_py.engine.backends.cupy.ops import FACTORIES, POINTWISE_KINDS, BuildOptions, Op, PointwiseOp, Spec, fp8
from tftrt_py.engine.backends.cupy.ops.base import align
from tftrt_py.engine.backends.cupy.ops.cast import CastOp
from tftrt_py.engine.backends.cupy.ops.conv_chain import chain_candidates
from tftrt_py.engine.backends.cupy.ops.quant import (FOLDED, FORMATS, ROWS, TRANSPOSED, operand_quantize,
                                                     quantized_shape)
from tftrt_py.engine.backends.cupy.quant_planning import QuantPlan, plan_quantization, quant_plan, quant_scale
from tftrt_py.engine.backends.cupy.tactics import Tuner
from tftrt_py.engine.backends.cupy.views import is_view
from tftrt_py.engine.backends.threads import map_arrays
from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.types import FLOATS

__all__ = ["Program", "Slot", "Step", "compile_program"]

logger = logging.getLogger(__name__)

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


def _stored(layer, precision: str) -> np.ndarray:
    """Constant `layer`'s value as the program stores it: its storage dtype, contiguous (no copy where it is)."""
    dtype = storage_dtype(layer.outputs[0], layer, precision)
    return np.ascontiguousarray(layer.weights["value"].astype(dtype, copy=False))


def _uploaded_constants(net, precision: str) -> Dict[str, object]:
    """Each Constant layer's value on the device as the program stores it, cast and copied in threads where they
    are large, each host copy dropped once uploaded: an FP16 transformer's weights are the Constants its matrix
    multiplies read, and keras-hub BERT-base's 0.41 GB took 0.21 s to cast and 0.04 s to upload one after another
    on an H200 machine."""
    cupy = _device.require()
    layers = [layer for layer in net.layers if layer.kind == "Constant"]
    values = map_arrays(lambda layer: cupy.asarray(_stored(layer, precision)), layers,
                        sum(layer.weights["value"].nbytes for layer in layers), "tftrt-constants",
                        cupy.cuda.runtime.setDevice, (cupy.cuda.runtime.getDevice(),))
    return {layer.name: value for layer, value in zip(layers, values)}


# -- building ------------------------------------------------------------------------------------------------
#: The suffix of a quantized copy's slot name, by its layout.
_LAYOUT_SUFFIX = {ROWS: "", TRANSPOSED: "T", FOLDED: "F"}


class _Builder:
    """A program being built, layer by layer: its slots' dtypes, the cast and quantized copies made so far (one per
    tensor and dtype or layout), the device arrays and ops holding weights."""

    def __init__(self, net, precision: str, options: BuildOptions, prefer: Dict[str, dict], quant: QuantPlan,
                 tuner: Tuner):
        self.net, self.precision, self.options, self.prefer, self.quant, self.tuner = (
            net, precision, options, prefer, quant, tuner)
        self.prog = Program()
        self.dtypes: Dict[str, str] = {}
        self.casts: Dict[Tuple[str, str], str] = {}
        self.quantized: Dict[Tuple[str, str, int, str], str] = {}
        self.weights: List = []
        self.tensors = {t.name: t for t in net.inputs}
        self.tensors.update({t.name: t for l in net.layers for t in l.outputs})
        self.groups: Optional[Dict[str, List]] = None
        self.constants = _uploaded_constants(net, precision)
        self.in_group: Dict[str, str] = {}
        #: Output slot -> (step index, spec, op) of each convolution step a convolution reading it may chain onto.
        self.chain_heads: Dict[str, Tuple[int, Spec, Op]] = {}

    # -- slots -------------------------------------------------------------------------------------------------
    def add_slot(self, name, shape, dtype, place, **kw) -> Slot:
        slot = Slot(name, tuple(int(d) for d in shape), dtype, place, **kw)
        self.prog.slots[name] = slot
        self.dtypes[name] = dtype
        return slot

    def cast(self, tensor_name: str, dtype: str, layer_name: str) -> str:
        """A slot holding `tensor_name` in `dtype` (inserting a cast step once)."""
        if self.dtypes[tensor_name] == dtype:
            return tensor_name
        key = (tensor_name, dtype)
        if key not in self.casts:
            name = f"{tensor_name}@{dtype}"
            self.add_slot(name, self.prog.slots[tensor_name].shape, dtype, "arena")
            self.prog.steps.append(Step(CastOp(self.dtypes[tensor_name], dtype), [tensor_name], [name],
                                        f"{layer_name} (cast)"))
            self.casts[key] = name
        return self.casts[key]

    def quantize(self, tensor_name: str, fmt: str, last: int, layout: str, layer_name: str) -> str:
        """A slot holding `tensor_name` quantized (int8 or E4M3 bytes), its last dim padded to `last`, laid out as
        `layout` (ops/quant.ROWS, TRANSPOSED or FOLDED); one quantize step per tensor, format and layout, none for a
        view of a tensor quantized already at its scale (an alias of those bytes)."""
        prog, quantized, tensors = self.prog, self.quantized, self.tensors
        slot = prog.slots[tensor_name]
        f = FORMATS[fmt]
        if self.dtypes[tensor_name] == f.storage:
            if layout != ROWS or slot.shape[-1] != last:
                raise BackendError(f"{fmt} tensor {tensor_name!r} is stored quantized as it is: it cannot be read "
                                   f"{layout} or padded to {last}")
            return tensor_name
        key = (tensor_name, fmt, last, layout)
        base = prog.root(tensor_name)
        if key not in quantized and base.name != tensor_name and layout == ROWS and last == slot.shape[-1]:
            found = quantized.get((base.name, fmt, base.shape[-1], ROWS))  # what it views, quantized unpadded
            if found is not None and (quant_scale(fmt, tensors[tensor_name].dynamic_range)
                                      == quant_scale(fmt, tensors[base.name].dynamic_range)):
                quantized[key] = f"{tensor_name}@{fmt.lower()}"  # a view of those bytes
                self.add_slot(quantized[key], slot.shape, f.storage, "alias", base=found)
        if key not in quantized:
            name = f"{tensor_name}@{fmt.lower()}{_LAYOUT_SUFFIX[layout]}"
            self.add_slot(name, quantized_shape(slot.shape, last, layout), f.storage, "arena")
            op = operand_quantize(slot.shape, self.dtypes[tensor_name],
                                  quant_scale(fmt, tensors[tensor_name].dynamic_range), last, layout, f)
            prog.steps.append(Step(op, [tensor_name], [name], f"{layer_name} (quantize)"))
            quantized[key] = name
        return quantized[key]

    # -- stages ------------------------------------------------------------------------------------------------
    def add_inputs(self) -> None:
        for t in self.net.inputs:
            self.add_slot(t.name, t.shape, t.dtype, "input")
            self.prog.inputs.append((t.name, t.name))

    def add_layer(self, layer) -> None:
        """`layer` as a constant, a view, a member of a pointwise group or a step of its own."""
        out_dtypes = [storage_dtype(t, layer, self.precision) for t in layer.outputs]
        if layer.kind == "Constant":
            self.add_constant(layer, out_dtypes[0])
            return
        if layer.kind in ("Identity", "Shuffle") and layer.outputs[0].name in self.quant.direct:
            out_dtypes = [self.dtypes[layer.inputs[0].name]]  # a view of a tensor stored quantized alone
        if layer.kind in ("Identity", "Shuffle") and is_view(layer, self.dtypes[layer.inputs[0].name], out_dtypes[0]):
            t = layer.outputs[0]
            self.add_slot(t.name, t.shape, out_dtypes[0], "alias", base=layer.inputs[0].name)
        elif layer.kind in POINTWISE_KINDS:
            self.add_pointwise(layer, out_dtypes[0])
        else:
            self.add_step(layer, out_dtypes)

    def add_constant(self, layer, dtype: str) -> None:
        arr = self.constants.pop(layer.name)
        self.weights.append(arr)
        self.add_slot(layer.outputs[0].name, layer.outputs[0].shape, dtype, "const", array=arr)

    def add_pointwise(self, layer, dtype: str) -> None:
        """The group's kernel at its root layer; the other members' outputs live only inside it."""
        if self.groups is None:
            self.groups = _groups_after_views(self.net, self.precision, self.dtypes)
            self.in_group = {m.name: root for root, members in self.groups.items() for m in members}
        root = self.in_group.get(layer.name)
        if root is None:  # a view decided late: treat as its own group
            self.groups[layer.name] = [layer]
            root = layer.name
        t = layer.outputs[0]
        if root != layer.name:
            self.add_slot(t.name, t.shape, dtype, "fused")
            return
        members = self.groups[root]
        op = PointwiseOp(members, self.dtypes.__getitem__, dtype, _device.require().asarray)
        self.add_slot(t.name, t.shape, dtype, "arena")
        self.prog.steps.append(Step(op, list(op.tensor_inputs), [t.name], layer.name))
        self.prog.tactics[layer.name] = dict(op.tactic, fused=[m.name for m in members])
        self.weights.append(op)

    def add_step(self, layer, out_dtypes: List[str]) -> None:
        """One op for `layer`, its tactic chosen by the tuner, reading its inputs as it stores them."""
        factory = FACTORIES.get(layer.kind)
        if factory is None:
            raise BackendError(f"layer kind {layer.kind!r} ({layer.name}) is not supported by the cupy backend")
        cdt = compute_dtype(layer, self.precision)
        inputs, out_dtypes, quant, extra = self.operands(layer, cdt, out_dtypes)
        slots = self.prog.slots
        spec = Spec(layer, [slots[n].shape for n in inputs], [self.dtypes[n] for n in inputs],
                    [t.shape for t in layer.outputs] + [shape for _, shape, _ in extra],
                    out_dtypes + [FORMATS[fmt].storage for _, _, fmt in extra], cdt, self.options,
                    self.prefer.get(layer.name), quant=quant)
        op, record = self.tuner.choose(spec, factory)
        for t, dtype in zip(layer.outputs, out_dtypes):
            self.add_slot(t.name, t.shape, dtype, "arena")
        for name, shape, fmt in extra:
            self.add_slot(name, shape, FORMATS[fmt].storage, "arena")
            self.quantized[(layer.outputs[0].name, fmt, shape[-1], ROWS)] = name
        outputs = [t.name for t in layer.outputs] + [n for n, _, _ in extra]
        if layer.name in self.quant.choice:
            record = dict(record, **dict([self.quant.choice[layer.name]]))
        head = self.chain_heads.get(inputs[0]) if layer.kind == "Convolution" and len(inputs) == 1 else None
        if head is not None and self.chain(head, spec, op, record, outputs):
            del self.chain_heads[inputs[0]]  # (the head's step is the chain now)
            return
        self.prog.steps.append(Step(op, inputs, outputs, layer.name))
        self.prog.tactics[layer.name] = record
        self.weights.append(op)
        if layer.kind == "Convolution" and len(outputs) == 1:
            self.chain_heads[outputs[0]] = (len(self.prog.steps) - 1, spec, op)

    def chain(self, head, spec: Spec, op: Op, record: dict, outputs: List[str]) -> bool:
        """Run convolution `spec` and the convolution `head` whose output is its only input ((step index, spec, op))
        as one step, where the tuner finds the chained kernel faster (ops/conv_chain.py): the head's step becomes
        the chain ("<head> + <layer>", as fused layers are named), writing both outputs; the tactics record the
        chain under the head's "chain" key."""
        index, first, first_op = head
        found = self.tuner.choose_chain(first, first_op, spec, op, chain_candidates)
        if found is None:
            return False
        chain_op, chain_record = found
        prev = self.prog.steps[index]
        self.prog.steps[index] = Step(chain_op, prev.inputs, prev.outputs + outputs,
                                      f"{prev.layer} + {spec.layer.name}")
        self.prog.tactics[prev.layer] = dict(self.prog.tactics[prev.layer], chain=chain_record)
        self.prog.tactics[spec.layer.name] = dict(record, chained=prev.layer)
        self.weights[next(i for i, w in enumerate(self.weights) if w is first_op)] = chain_op
        return True

    def float_specs(self) -> List[Tuple[Spec, object]]:
        """(spec, factory) of each float layer that will be a step of its own, as add_step will make it (inputs cast
        to the compute dtype, outputs stored as storage_dtype says), for Tuner.prebuild to build their candidates
        side by side ahead. Layers whose spec is only known as the program is laid out (views, quantized layers and
        their neighbours) are left out: add_step builds theirs."""
        q, skip = self.quant, ("Identity", "Shuffle", "NMS", *POINTWISE_KINDS)
        specs = []
        for layer in self.net.layers:
            factory = FACTORIES.get(layer.kind)
            if factory is None or layer.kind in skip or any(layer.name in names for names in (
                    self.prefer, q.layers, q.pools, q.dual_writers)):
                continue
            cdt = compute_dtype(layer, self.precision)
            specs.append((Spec(layer, [t.shape for t in layer.inputs],
                               [cdt if t.dtype in FLOATS else t.dtype for t in layer.inputs],
                               [t.shape for t in layer.outputs],
                               [storage_dtype(t, layer, self.precision) for t in layer.outputs], cdt, self.options),
                          factory))
        return specs

    def operands(self, layer, cdt: str, out_dtypes: List[str]):
        """(input slots, output dtypes, the spec's quant dict, (slot, shape, format) of a second, quantized output)
        of `layer`: a max pool on quantized values, a quantized layer, or a float one (which may write a quantized
        copy of its output: a LayerNorm its quantized readers read)."""
        q, precision = self.quant, self.precision
        if layer.name in q.pools:
            x = layer.inputs[0]
            return [self.quantize(x.name, precision, x.shape[-1], ROWS, layer.name)], [FORMATS[precision].storage], \
                None, []
        t = layer.outputs[0] if layer.outputs else None
        if layer.name in q.layers:
            inputs, quant = self.quantized_inputs(layer, cdt)
            fmt = quant["format"]
            extra = []
            if t.name in q.dual:
                quant["dual_scale"] = float(quant_scale(fmt, t.dynamic_range))
                extra = [(f"{t.name}@{fmt.lower()}", tuple(t.shape), fmt)]
            return inputs, [FORMATS[fmt].storage if t.name in q.direct else cdt], quant, extra
        host = layer.kind == "NMS"
        inputs = [self.cast(i.name, self.dtypes[i.name] if host else (cdt if i.dtype in FLOATS else i.dtype),
                            layer.name) for i in layer.inputs]
        if t is not None and layer.name in q.dual_writers:
            quant = {"format": precision, "dual_scale": float(quant_scale(precision, t.dynamic_range))}
            return inputs, out_dtypes, quant, [(f"{t.name}@{precision.lower()}", tuple(t.shape), precision)]
        return inputs, out_dtypes, None, []

    def quantized_inputs(self, layer, cdt: str):
        """(input slots, quant dict) of an int8 or fp8 layer."""
        operands, quant = quant_plan(layer, layer.precision or self.precision)
        fmt = quant["format"]
        ins = {i: self.quantize(layer.inputs[i].name, fmt, last, layout, layer.name)
               for i, _, last, layout in operands}
        if layer.kind != "MatrixMultiply":  # a convolution's residual, an attention's mask
            ins.update({i: self.cast(t.name, cdt if t.dtype in FLOATS else t.dtype, layer.name)
                        for i, t in enumerate(layer.inputs) if i not in ins})
        return [ins[i] for i in sorted(ins)], quant


def compile_program(engine, options: BuildOptions, prefer: Dict[str, dict], ledger: Ledger,
                    tuner_ctx) -> Program:
    """Program for `engine`; `prefer` holds tactics recorded by an earlier build on this GPU."""
    net, precision = engine.network, engine.precision
    fp8.check_device(net.name, precision, _device.require().cuda.Device().compute_capability, _device.device_name())
    tuner = Tuner(tuner_ctx, options, check=settings.CHECK_TACTICS.get())
    build = _Builder(net, precision, options, prefer, plan_quantization(net, precision, tuner, options, prefer),
                     tuner)
    build.prog.ledger = ledger
    tuner.prebuild(build.float_specs())
    build.add_inputs()
    start = time.perf_counter()
    for layer in net.layers:
        build.add_layer(layer)
    _convert_where_copied(build.prog)
    tuner.release()
    kernels.compile_pending()  # (in parallel, before the first run would compile them one after another)
    prog = build.prog
    prog.tuning_report = tuner.report
    _bind_outputs(prog, net, build.dtypes)
    _plan_arena(prog)
    prog.workspace_bytes = max([align(s.op.workspace) for s in prog.steps] + [0])
    prog.weight_bytes = sum(int(getattr(w, "nbytes", 0)) if not isinstance(w, Op) else w.device_bytes
                            for w in build.weights)
    ledger.charge("weights", prog.weight_bytes)
    prog.capture = settings.CUDA_GRAPHS.get()
    logger.info("cupy program for %s: %d steps, arena %.1f MiB, workspace %.1f MiB, weights %.1f MiB, "
                "tactics in %.2f s", net.name, len(prog.steps), prog.arena_bytes / 2**20,
                prog.workspace_bytes / 2**20, prog.weight_bytes / 2**20, time.perf_counter() - start)
    return prog


def _convert_where_copied(prog: Program) -> None:
    """Drop each cast step whose output one step alone reads, as its first input, where that step's op copies the
    input anyway (Op.converts_input: a convolution padding an RGB image's channels for cuDNN): it reads what the cast
    read and converts as it copies. ResNet-50's fp32 image at batch 128 then crosses DRAM once, not cast first."""
    readers: Dict[str, List[Step]] = collections.defaultdict(list)
    for step in prog.steps:
        for name in step.inputs:
            readers[name].append(step)
    viewed = {slot.base for slot in prog.slots.values() if slot.place == "alias"}
    kept = []
    for step in prog.steps:
        out = step.outputs[0] if isinstance(step.op, CastOp) and step.op.tactic["from"] in FLOATS else None
        users = readers.get(out, [])
        if (out is not None and out not in viewed and len(users) == 1 and users[0].inputs.count(out) == 1
                and users[0].inputs[0] == out and users[0].op.converts_input(step.op.tactic["from"])):
            users[0].inputs[0] = step.inputs[0]
            del prog.slots[out]
            continue
        kept.append(step)
    prog.steps = kept


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
