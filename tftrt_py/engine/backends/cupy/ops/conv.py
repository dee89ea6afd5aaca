"""Convolution: fused cuDNN graphs (conv + bias + residual add + activation, NHWC) with their plans
as tactics, and an im2col + cuBLAS GEMM (timed against them for 1x1 convolutions and for patch embeddings,
kernel = stride: a ViT's 16x16 patches ran 0.27 ms on cuDNN's best plan at batch 32 on an H100; used whenever
cuDNN has no plan). Channels-last throughout: x [N, *S, C], kernel [*K, C/g, Cout].
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import threading
from typing import Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, pad3, quantized_candidates, register
from tftrt_py.engine.backends.cupy.ops.pointwise import epilogue_op

__all__ = ["ConvGeom", "CudnnGraph", "CudnnConvGraph", "CudnnConvOp", "GemmConvOp", "PlanOffer", "conv_candidates",
           "offer_plan", "built_runtime_plans"]

logger = logging.getLogger(__name__)

#: Activations cuDNN applies inside a fused graph (others run in an epilogue kernel: cuDNN has no hard sigmoid or
#: hard swish mode, and its relu clip then a scale would not round as TF does).
CUDNN_ACTIVATIONS = ("relu", "relu6", "clip", "leaky_relu", "sigmoid", "tanh", "swish", "gelu_erf", "gelu_tanh")


@dataclasses.dataclass(frozen=True)
class ConvGeom:
    n: int
    spatial: Tuple[int, ...]
    c: int
    cout: int
    kernel: Tuple[int, ...]
    groups: int
    strides: Tuple[int, ...]
    dilations: Tuple[int, ...]
    pre: Tuple[int, ...]
    post: Tuple[int, ...]
    out: Tuple[int, ...]

    @classmethod
    def of(cls, layer, in_shape, out_shape) -> "ConvGeom":
        p, k = layer.params, layer.weights["kernel"]
        nsp = k.ndim - 2
        return cls(in_shape[0], tuple(in_shape[1:-1]), in_shape[-1], k.shape[-1], tuple(k.shape[:nsp]),
                   int(p.get("groups", 1)), tuple(p["strides"]), tuple(p["dilations"]), tuple(p["pre_padding"]),
                   tuple(p["post_padding"]), tuple(out_shape[1:-1]))

    @property
    def cg(self) -> int:
        return self.c // self.groups

    @property
    def ksize(self) -> int:
        return int(np.prod(self.kernel))

    @property
    def rows(self) -> int:
        return self.n * int(np.prod(self.out))

    def pointwise_gemm(self) -> bool:
        """A 1x1, stride-1, unpadded convolution is a plain GEMM over pixels."""
        return (self.ksize == 1 and all(s == 1 for s in self.strides) and not any(self.pre)
                and not any(self.post))

    def patches(self) -> bool:
        """Kernel and stride equal, unpadded, undilated (a ViT's patch embedding): im2col reads every input element
        once, and the GEMM is a large one."""
        return (self.kernel == self.strides and all(d == 1 for d in self.dilations) and not any(self.pre)
                and not any(self.post))

    def as2d(self) -> "ConvGeom":
        """cuDNN wants at least two spatial dims: a 1-d convolution gets a leading H of 1."""
        if len(self.spatial) != 1:
            return self
        return ConvGeom(self.n, (1,) + self.spatial, self.c, self.cout, (1,) + self.kernel, self.groups,
                        (1,) + self.strides, (1,) + self.dilations, (0,) + self.pre, (0,) + self.post,
                        (1,) + self.out)


def nhwc_dims(n: int, c: int, spatial) -> Tuple[List[int], List[int]]:
    """cuDNN (dims, strides) of a channels-last tensor: dims in N, C, *S order."""
    spatial = list(spatial)
    strides_sp = [c * int(np.prod(spatial[i + 1:])) for i in range(len(spatial))]
    return [n, c] + spatial, [c * int(np.prod(spatial)), 1] + strides_sp


# -- cuDNN graphs ---------------------------------------------------------------------------------
class CudnnGraph:
    """A built cuDNN frontend graph (``graph``) whose execution plans are built on demand and run under a lock.

    Subclasses set ``lock``, build the graph and hand it to :meth:`_adopt`; one graph is shared by every layer (and
    engine) of its shapes: plans depend on shapes, not weights. A runtime-compiled plan another process built and
    offered (:func:`offer_plan`) is deserialized rather than compiled again, and runs as a graph of its own.
    """

    key: Optional[str] = None  # its key in the graph cache (cudnn_graph_cache)

    def _adopt(self, graph, handle) -> None:
        self.graph, self.handle = graph, handle
        self.built: Dict[int, Tuple[str, int]] = {}  # plan index -> (name, workspace bytes)
        self.failed: Set[int] = set()
        self.loaded: Dict[int, object] = {}  # plan index -> the graph deserialized from an offer

    def plans(self, limit: int, prefer: Optional[str] = None, runtime_limit: Optional[int] = None
              ) -> List[Tuple[int, str, int]]:
        """Up to `limit` built plans (index, name, workspace) in heuristics order, at most `runtime_limit` of them
        runtime-compiled (None: any number); `prefer` (a plan name) alone when it builds."""
        g = self.graph
        count = g.get_execution_plan_count()
        with self.lock:
            if prefer is not None:
                for i in range(count):
                    try:
                        if g.get_plan_name_at_index(i) == prefer and self._build(i):
                            return [(i, *self.built[i])]
                    except Exception:
                        continue
                return []
            out, compiled = [], 0
            for i in range(count):
                if len(out) >= limit:
                    break
                runtime = self._runtime_compiled(i)
                if runtime and runtime_limit is not None and compiled >= runtime_limit:
                    continue
                if self._build(i):
                    out.append((i, *self.built[i]))
                    compiled += runtime
            return out

    def _runtime_compiled(self, i: int) -> bool:
        """Whether plan `i` is compiled at build time (cuDNN's behavior note RUNTIME_COMPILATION)."""
        note = getattr(_device.cudnn_module().behavior_note, "RUNTIME_COMPILATION", None)
        try:
            return note is not None and note in self.graph.get_behavior_notes_for_plan_at_index(i)
        except Exception:
            return False

    def _build(self, i: int) -> bool:
        if i in self.built:
            return True
        if i in self.failed:
            return False
        if self._load_offered(i):
            return True
        g = self.graph
        try:
            g.build_plan_at_index(i)
            self.built[i] = (g.get_plan_name_at_index(i), int(g.get_workspace_size_plan_at_index(i)))
            return True
        except Exception as exc:
            logger.debug("cuDNN plan %d not buildable: %s", i, exc)
            self.failed.add(i)
            return False

    def _load_offered(self, i: int) -> bool:
        """Plan `i` from an offer (see :func:`offer_plan`): deserialized when one is there and binds this graph's
        tensors by the same uids."""
        offer = _take_offer(self.key, i)
        if offer is None:
            return False
        if offer.uids != tensor_uids(self):
            logger.debug("cuDNN plan %d offered for another tensor numbering (%s, here %s)", i, offer.uids,
                         tensor_uids(self))
            return False
        try:
            g = _device.cudnn_module().pygraph(handle=self.handle)
            g.deserialize(self.handle, offer.data)
            workspace = max(offer.workspace, int(g.get_workspace_size()))
        except Exception as exc:  # a plan this library or GPU cannot load: built here instead
            logger.debug("cuDNN plan %d offered but not loaded: %s: %s", i, type(exc).__name__, exc)
            return False
        self.loaded[i] = g
        self.built[i] = (offer.name, workspace)
        return True

    def serialize(self, i: int) -> PlanOffer:
        """Built plan `i` as an offer another process can load."""
        with self.lock:
            self.graph.build_plan_at_index(i)  # built already: makes it the plan serialize() writes
            data = bytes(self.graph.serialize(as_bytes=True))
            name, workspace = self.built[i]
        return PlanOffer(name, workspace, tensor_uids(self), data)

    def execute(self, index: int, pack: dict, workspace, handle) -> None:
        with self.lock:
            loaded = self.loaded.get(index)
            if loaded is None:
                self.graph.execute_plan_at_index(pack, workspace, index=index, handle=handle)
            else:
                loaded.execute({t.get_uid(): ptr for t, ptr in pack.items()}, workspace, handle=handle)


def tensor_uids(graph: CudnnGraph) -> Dict[str, int]:
    """The uids of `graph`'s tensors by attribute (X, W, B, ...): what a variant pack binds its pointers by."""
    return {name: int(value.get_uid()) for name, value in vars(graph).items() if hasattr(value, "get_uid")}


# -- plans built in other processes ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class PlanOffer:
    """A runtime-compiled plan another process built (cudnn_warmup): its name, workspace bytes, the uids of the
    tensors it binds (tensor_uids) and cuDNN's serialization of it (which holds the compiled kernel)."""

    name: str
    workspace: int
    uids: Dict[str, int]
    data: bytes


#: Offers by (graph key, plan index), kept in this process's memory only (never on disk: a serialized plan holds
#: machine code); a graph takes its offer when it first builds that plan. At most _MAX_OFFERS, oldest dropped.
_OFFERS: "collections.OrderedDict[Tuple[str, int], PlanOffer]" = collections.OrderedDict()
_MAX_OFFERS = 1024


def offer_plan(key: str, index: int, offer: PlanOffer) -> None:
    """Offer plan `index` of the graph cached under `key` (built by this process's own worker processes)."""
    with _GRAPHS_LOCK:
        _OFFERS[(key, index)] = offer
        while len(_OFFERS) > _MAX_OFFERS:
            _OFFERS.popitem(last=False)


def _take_offer(key: Optional[str], index: int) -> Optional[PlanOffer]:
    with _GRAPHS_LOCK:
        return _OFFERS.pop((key, index), None)


def built_runtime_plans() -> List[Tuple[str, int, CudnnGraph]]:
    """(key, plan index, graph) of every cached graph's runtime-compiled plans built here (not loaded)."""
    with _GRAPHS_LOCK:
        graphs = list(_GRAPHS.items())
    return [(key, i, g) for key, g in graphs for i in list(g.built)
            if i not in g.loaded and g._runtime_compiled(i)]


class CudnnConvGraph(CudnnGraph):
    """One cuDNN graph for a convolution geometry and fusion."""

    def __init__(self, geom: ConvGeom, dtype: str, bias: bool, residual_n: Optional[int], activation,
                 fusion: str, allow_tf32: bool, max_workspace: int, handle):
        cudnn = _device.cudnn_module()
        self.lock = threading.Lock()
        self.fusion, self.dtype = fusion, dtype
        g2 = geom.as2d()
        io = cudnn.data_type.HALF if dtype == "float16" else cudnn.data_type.FLOAT
        f32 = cudnn.data_type.FLOAT
        g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
        xd, xs = nhwc_dims(g2.n, g2.c, g2.spatial)
        wd, ws = nhwc_dims(g2.cout, g2.cg, g2.kernel)
        self.X = g.tensor(name="X", dim=xd, stride=xs, data_type=io)
        self.W = g.tensor(name="W", dim=wd, stride=ws, data_type=io)
        y = g.conv_fprop(image=self.X, weight=self.W, pre_padding=list(g2.pre), post_padding=list(g2.post),
                         stride=list(g2.strides), dilation=list(g2.dilations), compute_data_type=f32, name="conv")
        self.B = self.R = None
        if bias and fusion in ("all", "bias"):
            bd, bs = nhwc_dims(1, g2.cout, [1] * len(g2.spatial))
            self.B = g.tensor(name="B", dim=bd, stride=bs, data_type=io)
            y = g.bias(input=y, bias=self.B, name="bias")
        if fusion == "all":
            if residual_n is not None:
                rd, rs = nhwc_dims(residual_n, g2.cout, g2.out)
                self.R = g.tensor(name="R", dim=rd, stride=rs, data_type=io)
                y = g.add(a=y, b=self.R, name="residual")
            if activation:
                y = _cudnn_activation(g, y, activation)
        yd, ys = nhwc_dims(g2.n, g2.cout, g2.out)
        y.set_output(True).set_data_type(io).set_dim(yd).set_stride(ys)
        self.Y = y
        g.validate()
        g.build_operation_graph()
        if dtype == "float32" and not allow_tf32:
            notes = [getattr(cudnn.numerical_note, n) for n in ("TENSOR_CORE", "DOWN_CONVERT_INPUTS")
                     if hasattr(cudnn.numerical_note, n)]
            g.deselect_numeric_notes(notes)
        g.deselect_workspace_greater_than(int(max_workspace))
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        self._adopt(g, handle)


def _cudnn_activation(g, y, act):
    t, a, b = act["type"], act.get("alpha"), act.get("beta")
    if t == "relu":
        return g.relu(input=y, name="act")
    if t == "relu6":
        return g.relu(input=y, lower_clip=0.0, upper_clip=6.0, name="act")
    if t == "clip":
        return g.relu(input=y, lower_clip=float(a), upper_clip=float(b), name="act")
    if t == "leaky_relu":
        return g.relu(input=y, negative_slope=float(a), name="act")
    if t == "swish":
        return g.swish(input=y, swish_beta=1.0, name="act")
    fn = {"sigmoid": "sigmoid", "tanh": "tanh", "gelu_erf": "gelu", "gelu_tanh": "gelu_approx_tanh"}[t]
    return getattr(g, fn)(input=y, name="act")


_GRAPHS: "collections.OrderedDict[str, CudnnGraph]" = collections.OrderedDict()
_GRAPHS_LOCK = threading.Lock()
_MAX_GRAPHS = 512


def cudnn_graph(geom, dtype, bias, residual_n, activation, fusion, options) -> CudnnConvGraph:
    key = json.dumps([dataclasses.astuple(geom), dtype, bias, residual_n, activation, fusion, options.allow_tf32,
                      options.max_workspace, _device.device_name()], sort_keys=True, default=str)
    return cudnn_graph_cache(key, lambda: CudnnConvGraph(geom, dtype, bias, residual_n, activation, fusion,
                                                         options.allow_tf32, options.max_workspace,
                                                         options.tuner.cudnn))


def cudnn_graph_cache(key: str, make) -> CudnnGraph:
    """The cached graph for `key`, else ``make()`` (cached; least recently used graphs are dropped)."""
    with _GRAPHS_LOCK:
        graph = _GRAPHS.get(key)
        if graph is not None:
            _GRAPHS.move_to_end(key)
            return graph
    graph = make()
    graph.key = key
    with _GRAPHS_LOCK:
        _GRAPHS[key] = graph
        while len(_GRAPHS) > _MAX_GRAPHS:
            _GRAPHS.popitem(last=False)
    return graph


class CudnnConvOp(Op):
    """One built cuDNN plan; residual/activation (and bias) not in the graph run as an epilogue."""

    uses_cudnn = True

    def __init__(self, graph: CudnnConvGraph, plan: Tuple[int, str, int], w, b, b32, has_residual: bool,
                 activation, pad=None):
        self.graph, (self.index, name, self.workspace) = graph, plan
        #: (kernel, pixels, padded input bytes, channels, padded channels): the input is first copied into the
        #: workspace with its channels zero-padded (narrow inputs such as RGB images get tensor-core plans that way).
        self.pad = pad
        self.plan_workspace = self.workspace
        if pad is not None:
            self.workspace = align(pad[2]) + self.plan_workspace
        self.w, self.b = w, (b if graph.B is not None else None)
        fused_rest = graph.fusion == "all"
        bias_epi = b32 if (b32 is not None and graph.B is None) else None
        res_epi = has_residual and not fused_rest
        act_epi = activation if (activation and not fused_rest) else None
        self.epilogue = None
        if bias_epi is not None or res_epi or act_epi:
            self.epilogue = (epilogue_op(graph.dtype, bias_epi is not None, res_epi, act_epi), bias_epi, res_epi)
        self.device_bytes = int(w.nbytes) + (int(b.nbytes) if b is not None else 0) + (
            int(bias_epi.nbytes) if bias_epi is not None else 0)
        self.tactic = {"op": "cudnn_conv", "fusion": graph.fusion, "plan": name, "workspace": self.workspace,
                       "pad_c": pad[4] if pad is not None else None}

    def converts_input(self, dtype: str) -> bool:
        if self.pad is None:
            return False
        _, pixels, nbytes, c, cp = self.pad
        self.pad = (pad_channels_kernel(c, cp, dtype, self.graph.dtype), pixels, nbytes, c, cp)
        return True

    def run(self, rc, ins, outs):
        g = self.graph
        x_ptr, ws_ptr = ins[0].data.ptr, rc.workspace_ptr
        if self.pad is not None:
            kernel, pixels, nbytes, _, _ = self.pad
            kernels.launch(kernel, pixels, (ins[0], rc.workspace, kernels.i64(pixels)))
            x_ptr, ws_ptr = rc.workspace_ptr, rc.workspace_ptr + align(nbytes)
        pack = {g.X: x_ptr, g.W: self.w.data.ptr, g.Y: outs[0].data.ptr}
        if g.B is not None:
            pack[g.B] = self.b.data.ptr
        if g.R is not None:
            pack[g.R] = ins[1].data.ptr
        g.execute(self.index, pack, ws_ptr if self.plan_workspace else None, rc.cudnn)
        if self.epilogue is not None:
            kernel, bias, res = self.epilogue
            args = ([bias] if bias is not None else []) + ([ins[1]] if res else [])
            kernel(*args, outs[0])


_PAD_CHANNELS = kernels.source("pad_channels.cu")


def pad_channels_kernel(c: int, cp: int, src: str, dst: str):
    """The kernel copying an image of `c` channels (dtype `src`) into `cp` >= c channels (`dst`), zeros after."""
    nbytes = cp * np.dtype(dst).itemsize
    head = (f"#define TI {kernels.raw_type(src)}\n#define TO {kernels.raw_type(dst)}\n#define C {c}\n#define CP {cp}\n"
            f"#define ALIGN {min(nbytes & -nbytes, 16)}\n")
    return kernels.raw_kernel(head + _PAD_CHANNELS, "tt_pad_channels")


# -- im2col + GEMM ------------------------------------------------------------------------------------
_IM2COL = kernels.source("im2col.cu")


def im2col_kernel(geom: ConvGeom, itemsize: int):
    s, k, o = pad3(geom.spatial, 1), pad3(geom.kernel, 1), pad3(geom.out, 1)
    st, dl, pd = pad3(geom.strides, 1), pad3(geom.dilations, 1), pad3(geom.pre, 0)
    defs = {"T": {2: "unsigned short", 4: "unsigned int", 1: "unsigned char"}[itemsize], "CG": geom.cg,
            "G": geom.groups, "C": geom.c}
    for d in range(3):
        defs.update({f"S{d}": s[d], f"K{d}": k[d], f"O{d}": o[d], f"ST{d}": st[d], f"DL{d}": dl[d], f"PD{d}": pd[d]})
    head = "".join(f"#define {name} {value}\n" for name, value in defs.items())
    return kernels.raw_kernel(head + _IM2COL, "tt_im2col")


class GemmConvOp(Op):
    """im2col (skipped for 1x1/stride-1/unpadded) + one batched cuBLAS GEMM per group + epilogue."""

    def __init__(self, geom: ConvGeom, dtype: str, w_gemm, bias32, has_residual: bool, activation, allow_tf32,
                 residual_n: Optional[int] = None):
        self.geom, self.dtype, self.w, self.allow_tf32 = geom, dtype, w_gemm, allow_tf32
        self.direct = geom.pointwise_gemm()
        self.itemsize = np.dtype(dtype).itemsize
        self.kdim = geom.ksize * geom.cg
        self.workspace = 0 if self.direct else align(geom.rows * geom.groups * self.kdim * self.itemsize)
        self.im2col = None if self.direct else im2col_kernel(geom, self.itemsize)
        self.bias = bias32
        self.has_residual = has_residual
        y_shape = (geom.n, *geom.out, geom.cout)
        self.epilogue = (epilogue_op(dtype, bias32 is not None, has_residual, activation, y_shape,
                                     (residual_n or geom.n,) + y_shape[1:])
                         if (bias32 is not None or has_residual or activation) else None)
        self.device_bytes = int(w_gemm.nbytes) + (int(bias32.nbytes) if bias32 is not None else 0)
        self.tactic = {"op": "gemm_conv", "im2col": not self.direct, "workspace": self.workspace}

    def run(self, rc, ins, outs):
        g = self.geom
        x, y = ins[0], outs[0]
        if self.direct:
            a, lda = x.data.ptr, g.c
        else:
            total = g.rows * g.groups * self.kdim
            kernels.launch(self.im2col, total, (x, rc.workspace, kernels.i64(total)))
            a, lda = rc.workspace_ptr, g.groups * self.kdim
        coutg = g.cout // g.groups
        rc.cublas.gemm(self.dtype, g.rows, coutg, self.kdim, a, lda, False, self.w.data.ptr, coutg, False,
                       y.data.ptr, g.cout, batch=g.groups, stride_a=self.kdim, stride_b=self.kdim * coutg,
                       stride_c=coutg, allow_tf32=self.allow_tf32)
        if self.epilogue is not None:
            args = ([self.bias] if self.bias is not None else []) + ([ins[1]] if self.has_residual else [])
            self.epilogue(*args, y)


def gemm_weights(kernel: np.ndarray, groups: int) -> np.ndarray:
    """[*K, Cg, Cout] -> [G, Ks*Cg, Cout/G]: group g's GEMM operand, rows in (kernel index, channel) order."""
    nsp = kernel.ndim - 2
    ks = int(np.prod(kernel.shape[:nsp]))
    cg, cout = kernel.shape[-2], kernel.shape[-1]
    k = kernel.reshape(ks, cg, groups, cout // groups).transpose(2, 0, 1, 3)
    return np.ascontiguousarray(k.reshape(groups, ks * cg, cout // groups))


# -- candidates -----------------------------------------------------------------------------------
def _fusions(bias: bool, residual: bool, activation, broadcast_residual: bool) -> List[str]:
    """cuDNN graph variants to try, most fused first. A residual broadcast over the batch stays out of
    the graph (seen on an H200, cuDNN 9.19: such plans returned wrong sums or faulted)."""
    out = []
    if (not activation or activation["type"] in CUDNN_ACTIVATIONS) and not broadcast_residual:
        out.append("all")
    if residual or activation:
        out.append("bias")
    if bias or residual or activation:
        out.append("conv")
    return out


def _cudnn_candidates(layer, geom, dtype, cp, b, bias32, has_residual, residual_n, activation, opts,
                      prefer) -> List[Op]:
    """Built plans of the most fused cuDNN graph that has any; `cp` pads the input channels to cp."""
    cupy = _device.require()
    k = layer.weights["kernel"]
    pad = None
    if cp is not None:
        k = np.concatenate([k, np.zeros(k.shape[:-2] + (cp - geom.c, k.shape[-1]), k.dtype)], axis=-2)
        pixels = geom.n * int(np.prod(geom.spatial))
        pad = (pad_channels_kernel(geom.c, cp, dtype, dtype), pixels, pixels * cp * np.dtype(dtype).itemsize, geom.c,
               cp)
        geom = dataclasses.replace(geom, c=cp)
    w = cupy.asarray(np.ascontiguousarray(np.moveaxis(k, -1, 0)).astype(dtype))  # [Cout, *K, Cg]
    for fusion in _fusions(b is not None, has_residual, activation, residual_n not in (None, geom.n)):
        if prefer.get("fusion") not in (None, fusion):
            continue
        try:
            graph = cudnn_graph(geom, dtype, b is not None, residual_n, activation, fusion, opts)
            plans = graph.plans(opts.cudnn_plans, prefer.get("plan"), opts.cudnn_runtime_plans)
        except Exception as exc:
            logger.debug("cuDNN graph (%s) for %s not supported: %s", fusion, layer.name, exc)
            continue
        if plans:
            return [CudnnConvOp(graph, plan, w, b, bias32, has_residual, activation, pad) for plan in plans]
    return []


#: More candidate factories of a float16 convolution, each (spec, geom) -> ops, timed beside cuDNN's plans:
#: our Triton kernel's (ops/triton_conv.py registers it).
FLOAT16_FACTORIES: List[Callable[[Spec, ConvGeom], List[Op]]] = []


@register("Convolution")
def conv_candidates(spec: Spec) -> List[Op]:
    if spec.quant is not None:  # an INT8 or FP8 layer
        return quantized_candidates(spec)
    layer, dtype, opts = spec.layer, spec.cdt, spec.options
    cupy = _device.require()
    geom = ConvGeom.of(layer, spec.in_shapes[0], spec.out_shapes[0])
    activation = layer.params.get("activation")
    has_residual = len(spec.in_shapes) > 1
    residual_n = spec.in_shapes[1][0] if has_residual else None
    bias = layer.weights.get("bias")
    bias32 = cupy.asarray(bias.astype(np.float32)) if bias is not None else None
    prefer = spec.prefer or {}
    cands: List[Op] = []
    cudnn = _device.cudnn_module()
    if cudnn is not None and dtype in ("float16", "float32") and prefer.get("op") in (None, "cudnn_conv"):
        b = cupy.asarray(bias.astype(dtype)) if bias is not None else None
        pads = [None]
        if dtype == "float16" and geom.groups == 1:  # RGB images: 4 channels gave ResNet-50's stem a faster plan
            pads += sorted({-(-geom.c // m) * m for m in (4, 8) if geom.c % m})
        if prefer:
            pads = [prefer.get("pad_c")]
        for cp in pads:
            cands += _cudnn_candidates(layer, geom, dtype, cp, b, bias32, has_residual, residual_n, activation,
                                       opts, prefer)
    if dtype == "float16":
        for factory in FLOAT16_FACTORIES:
            cands += factory(spec, geom)
    want_gemm = (prefer.get("op") == "gemm_conv" or (not prefer and (geom.pointwise_gemm() or geom.patches()))
                 or not cands)
    if want_gemm and dtype in ("float16", "float32"):
        w_gemm = cupy.asarray(gemm_weights(layer.weights["kernel"], geom.groups).astype(dtype))
        cands.append(GemmConvOp(geom, dtype, w_gemm, bias32, has_residual, activation, opts.allow_tf32, residual_n))
    return cands
