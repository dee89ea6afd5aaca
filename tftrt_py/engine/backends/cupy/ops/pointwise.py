"""Pointwise layers (ElementWise, Unary, Activation, Scale, Select, Identity casts) as generated
cupy ElementwiseKernels. A chain of pointwise layers is fused into one kernel: each layer becomes
a C expression over its inputs, computed in float (int/bool where the tensor is), stored once.
GEMMs and convolutions apply bias, residual and activation with :class:`Epilogue`, a raw kernel of the same
expressions.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import kernels
from tftrt_py.engine.backends.cupy.ops.base import Op

__all__ = ["POINTWISE_KINDS", "PointwiseOp", "activation_expr", "Val", "epilogue_op", "C_TYPE", "PREAMBLE"]

POINTWISE_KINDS = ("ElementWise", "Unary", "Activation", "Scale", "Select", "Identity")

PREAMBLE = r"""
__device__ __forceinline__ float tt_max(float a, float b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ float tt_min(float a, float b) { return (a != a || a < b) ? a : b; }
__device__ __forceinline__ float tt_floordiv(float a, float b) { return floorf(a / b); }
__device__ __forceinline__ float tt_mod(float a, float b) {
  float r = fmodf(a, b); if (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) r += b; return r; }
__device__ __forceinline__ float tt_sign(float x) { return x != x ? x : (float)((x > 0.0f) - (x < 0.0f)); }
__device__ __forceinline__ float tt_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float tt_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))); }
// x rounded to the nearest half (PTX cvt: cupy declares a half type only for kernels with half arguments)
__device__ __forceinline__ float tt_half(float x) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h));
  return x; }
// float to integer as on x86 (numpy, TF on the CPU): NaN and values out of range give the integer's minimum
__device__ __forceinline__ int tt_f2i(float x) {
  return (x >= -2147483648.0f && x < 2147483648.0f) ? (int)x : (-2147483647 - 1); }
__device__ __forceinline__ long long tt_f2l(float x) {
  return (x >= -9223372036854775808.0f && x < 9223372036854775808.0f) ? (long long)x : (-9223372036854775807LL - 1); }
// integers (int, long long): wrapping as numpy does; division by zero gives 0
template <typename I> __device__ __forceinline__ I tt_max(I a, I b) { return a > b ? a : b; }
template <typename I> __device__ __forceinline__ I tt_min(I a, I b) { return a < b ? a : b; }
template <typename I> __device__ __forceinline__ I tt_floordiv(I a, I b) {
  if (b == 0) return 0; I q = a / b; if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; return q; }
template <typename I> __device__ __forceinline__ I tt_mod(I a, I b) {
  if (b == 0) return 0; I r = a % b; if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
template <typename I> __device__ __forceinline__ I tt_div(I a, I b) { return b == 0 ? 0 : (I)((double)a / (double)b); }
template <typename I> __device__ __forceinline__ I tt_pow(I a, I b) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  I r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r; }
template <typename I> __device__ __forceinline__ I tt_sign(I x) { return (x > 0) - (x < 0); }
template <typename I> __device__ __forceinline__ I tt_abs(I x) { return x < 0 ? (I)(0 - (unsigned long long)x) : x; }
"""

#: C value kinds: float, int, long (int64), bool.
_KIND = {"float32": "f", "float16": "f", "int32": "i", "int64": "l", "int8": "i", "bool": "b"}
_CTYPE = {"f": "float", "i": "int", "l": "long long", "b": "bool"}
#: C type of each storage dtype inside cupy Elementwise/Reduction kernels.
C_TYPE = {"float32": "float", "float16": "float16", "int32": "int", "int64": "long long", "int8": "signed char",
          "bool": "bool"}


class Val:
    """A C expression and its value kind ('f', 'i', 'l' or 'b')."""

    def __init__(self, expr: str, kind: str):
        self.expr, self.kind = expr, kind

    def f(self) -> str:
        return self.as_kind("f")

    def b(self) -> str:
        return self.expr if self.kind == "b" else f"(({self.expr}) != 0)"

    def as_kind(self, kind: str) -> str:
        if kind == "b":
            return self.b()
        if self.kind == kind:
            return self.expr
        if self.kind == "f" and kind in "il":
            return f"tt_f2{kind}({self.expr})"
        return f"(({_CTYPE[kind]})({self.expr}))"


def _int_kind(*vals: Val) -> str:
    """The integer kind integer operands compute in: long when one is int64."""
    return "l" if any(v.kind == "l" for v in vals) else "i"


lit = kernels.flit

_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772, 1.0507009873554805

def _hard_sigmoid(x: str, alpha) -> str:
    """relu6(x + 3) / 6, or * alpha: TF's steps in TF's order (no add follows a product: nothing contracts to fma)."""
    scale = "/ 6.0f" if alpha is None else f"* {lit(alpha)}"
    return f"(tt_min(tt_max(({x}) + 3.0f, 0.0f), 6.0f) {scale})"


_ACTIVATIONS: Dict[str, Callable[[str, float, float], str]] = {
    "relu": lambda x, a, b: f"tt_max({x}, 0.0f)",
    "relu6": lambda x, a, b: f"tt_min(tt_max({x}, 0.0f), 6.0f)",
    "clip": lambda x, a, b: f"tt_min(tt_max({x}, {lit(a)}), {lit(b)})",
    "leaky_relu": lambda x, a, b: f"(({x}) >= 0.0f ? ({x}) : ({x}) * {lit(a)})",
    "elu": lambda x, a, b: f"(({x}) > 0.0f ? ({x}) : {lit(a)} * expm1f(tt_min({x}, 0.0f)))",
    "selu": lambda x, a, b: (f"({lit(_SELU_SCALE)} * (({x}) > 0.0f ? ({x}) : "
                             f"{lit(_SELU_ALPHA)} * expm1f(tt_min({x}, 0.0f))))"),
    "sigmoid": lambda x, a, b: f"tt_sigmoid({x})",
    "tanh": lambda x, a, b: f"tanhf({x})",
    "softplus": lambda x, a, b: f"tt_softplus({x})",
    "softsign": lambda x, a, b: f"(({x}) / (1.0f + fabsf({x})))",
    "gelu_erf": lambda x, a, b: f"(0.5f * ({x}) * (1.0f + erff(({x}) / 1.41421356f)))",
    "gelu_tanh": lambda x, a, b: (f"(0.5f * ({x}) * (1.0f + tanhf({lit(np.float32(np.sqrt(2.0 / np.pi)))} * "
                                  f"(({x}) + 0.044715f * ({x}) * ({x}) * ({x})))))"),
    "swish": lambda x, a, b: f"(({x}) * tt_sigmoid({x}))",
    "hard_sigmoid": lambda x, a, b: _hard_sigmoid(x, a),
    "hard_swish": lambda x, a, b: f"(({x}) * {_hard_sigmoid(x, a)})",
}


def activation_expr(x: str, activation: Optional[dict]) -> str:
    """C float expression applying `activation` (a layer's activation dict) to float expression `x`."""
    if not activation:
        return x
    fn = _ACTIVATIONS[activation["type"]]
    return f"({fn(f'({x})', activation.get('alpha'), activation.get('beta'))})"


def _elementwise(op: str, a: Val, b: Val, out_kind: str) -> Val:
    if op in ("and", "or"):
        return Val(f"({a.b()} {'&&' if op == 'and' else '||'} {b.b()})", "b")
    if op == "bitwise_and":
        k = _int_kind(a, b)
        return Val(f"(({a.as_kind(k)}) & ({b.as_kind(k)}))", k)
    k = "f" if "f" in (a.kind, b.kind) else _int_kind(a, b)
    x, y = a.as_kind(k), b.as_kind(k)
    comparisons = {"equal": "==", "greater": ">", "greater_equal": ">=", "less": "<", "less_equal": "<=",
                   "not_equal": "!="}
    if op in comparisons:
        return Val(f"(({x}) {comparisons[op]} ({y}))", "b")
    if op == "div":
        return Val(f"(({x}) / ({y}))" if k == "f" else f"tt_div({x}, {y})", k)
    exprs = {"sum": f"(({x}) + ({y}))", "sub": f"(({x}) - ({y}))", "prod": f"(({x}) * ({y}))",
             "max": f"tt_max({x}, {y})", "min": f"tt_min({x}, {y})",
             "pow": f"powf({x}, {y})" if k == "f" else f"tt_pow({x}, {y})",
             "floor_div": f"tt_floordiv({x}, {y})", "floor_mod": f"tt_mod({x}, {y})",
             "squared_difference": f"((({x}) - ({y})) * (({x}) - ({y})))"}
    return Val(exprs[op], k)


_UNARY_F = {"exp": "expf({})", "log": "logf({})", "sqrt": "sqrtf({})", "rsqrt": "(1.0f / sqrtf({}))",
            "recip": "(1.0f / ({}))", "abs": "fabsf({})", "neg": "(-({}))", "sin": "sinf({})", "cos": "cosf({})",
            "tan": "tanf({})", "sinh": "sinhf({})", "cosh": "coshf({})", "asin": "asinf({})", "acos": "acosf({})",
            "atan": "atanf({})", "asinh": "asinhf({})", "acosh": "acoshf({})", "atanh": "atanhf({})",
            "ceil": "ceilf({})", "floor": "floorf({})", "round": "rintf({})", "sign": "tt_sign({})",
            "erf": "erff({})", "erfc": "erfcf({})", "square": "(({0}) * ({0}))"}
_UNARY_I = {"abs": "tt_abs({})", "neg": "(-({}))", "square": "(({0}) * ({0}))", "sign": "tt_sign({})"}


def _unary(op: str, x: Val) -> Val:
    if op == "not":
        return Val(f"(!{x.b()})", "b")
    if x.kind != "f" and op in _UNARY_I:
        k = _int_kind(x)
        return Val(_UNARY_I[op].format(x.as_kind(k)), k)
    return Val(_UNARY_F[op].format(x.f()), "f")


def layer_expr(layer, args: List[Val], weight_vals: Dict[str, Val]) -> Val:
    """The C expression of one pointwise layer over its input values."""
    out_kind = _KIND[layer.outputs[0].dtype]
    kind, p = layer.kind, layer.params
    if kind == "ElementWise":
        v = _elementwise(p["op"], args[0], args[1], out_kind)
    elif kind == "Unary":
        v = _unary(p["op"], args[0])
    elif kind == "Activation":
        v = Val(activation_expr(args[0].f(), p), "f")
    elif kind == "Scale":
        e = args[0].f()
        if "scale" in weight_vals:
            e = f"(({e}) * {weight_vals['scale'].f()})"
        if "shift" in weight_vals:
            e = f"(({e}) + {weight_vals['shift'].f()})"
        if "power" in weight_vals:
            e = f"powf({e}, {weight_vals['power'].f()})"
        v = Val(activation_expr(e, p.get("activation")), "f")
    elif kind == "Select":
        k = out_kind
        v = Val(f"({args[0].b()} ? ({args[1].as_kind(k)}) : ({args[2].as_kind(k)}))", k)
    elif kind == "Identity":
        v = args[0]
    else:
        raise ValueError(f"{kind} is not a pointwise layer")
    if layer.outputs[0].dtype == "float16":  # the model computes this value in half: round it as TF does, also
        return Val(f"tt_half({v.f()})", "f")  # where the fused kernel keeps it in a register
    return Val(v.as_kind(out_kind), out_kind)


def scale_weight_shape(layer, key: str) -> Tuple[int, ...]:
    """How a Scale weight broadcasts against the layer's input."""
    rank = layer.inputs[0].rank
    w = layer.weights[key]
    if w.size == 1:
        return ()
    axis = layer.params.get("channel_axis", -1) % rank
    return tuple(-1 if i == axis else 1 for i in range(rank))


class PointwiseOp(Op):
    """One ElementwiseKernel computing a fused group of pointwise layers (network order, the last is
    the root whose output is stored). Its arguments: the group's external input tensors in
    ``tensor_inputs`` order, then Scale weights held by the op, then the output."""

    def __init__(self, layers: Sequence, dtype_of: Callable[[str], str], out_dtype: str, upload):
        self.layers = list(layers)
        produced = {t.name: i for i, l in enumerate(self.layers) for t in l.outputs}
        params, loads, values = [], [], {}
        self.consts = []
        tensor_inputs = []
        for layer in self.layers:
            for t in layer.inputs:
                if t.name in produced or t.name in values:
                    continue
                j = len(params)
                dtype = dtype_of(t.name)
                tensor_inputs.append(t.name)
                params.append(f"{dtype} x{j}")
                kind = _KIND[dtype]
                loads.append(f"{_CTYPE[kind]} v{j} = ({_CTYPE[kind]})x{j};")
                values[t.name] = Val(f"v{j}", kind)
        self.tensor_inputs = tensor_inputs
        body = list(loads)
        for n, layer in enumerate(self.layers):
            wvals = {}
            if layer.kind == "Scale":
                for key in ("scale", "shift", "power"):
                    if key in layer.weights:
                        j = len(params)
                        arr = upload(layer.weights[key].astype(np.float32).reshape(scale_weight_shape(layer, key)))
                        self.consts.append(arr)
                        params.append(f"float32 x{j}")
                        body.append(f"float v{j} = x{j};")
                        wvals[key] = Val(f"v{j}", "f")
            v = layer_expr(layer, [values[t.name] for t in layer.inputs], wvals)
            body.append(f"{_CTYPE[v.kind]} t{n} = {v.expr};")
            values[layer.outputs[0].name] = Val(f"t{n}", v.kind)
        root = values[self.layers[-1].outputs[0].name]
        body.append(f"y = ({C_TYPE[out_dtype]})({root.f() if out_dtype == 'float16' else root.expr});")
        name = "tt_pointwise_" + "_".join(l.kind.lower() for l in self.layers[:4])
        self.kernel = kernels.elementwise(", ".join(params), f"{out_dtype} y", "\n".join(body), name, PREAMBLE)
        self.device_bytes = sum(int(a.nbytes) for a in self.consts)
        self.tactic = {"op": "pointwise", "layers": len(self.layers)}

    def run(self, rc, ins, outs):
        self.kernel(*ins, *self.consts, outs[0])


_EPILOGUE = kernels.source("epilogue.cu")


class Epilogue:
    """y = act(y + bias + residual), in place, as one generated kernel: bias [N] along y's last dim; the residual
    y's shape or a batch of 1 of it. Call as epilogue(*[bias][, residual], y). The kernel is specialised to
    y's last dim and sizes (constant divisors, 32-bit indices where they fit) and moves 16 bytes per access
    where the last dim, the residual's size and the addresses allow."""

    def __init__(self, dtype: str, has_bias: bool, has_residual: bool, activation):
        self.dtype, self.has_bias, self.has_residual = dtype, has_bias, has_residual
        self.act = activation_expr("v", activation)
        self.vec = 16 // np.dtype(dtype).itemsize
        self._kernels: Dict[tuple, object] = {}

    def _kernel(self, n: int, res_total: int, total: int, vec: int):
        key = (n, res_total, total < 2 ** 31, vec)
        if key not in self._kernels:
            head = (f"#define T {kernels.raw_type(self.dtype)}\n#define IDX {'int' if key[2] else 'long long'}\n"
                    f"#define N {n}\n#define RES_TOTAL {res_total}\n#define HAS_BIAS {int(self.has_bias)}\n"
                    f"#define HAS_RES {int(self.has_residual)}\n#define ACT {self.act}\n#define VEC {vec}\n")
            self._kernels[key] = kernels.raw_kernel(PREAMBLE + head + _EPILOGUE, "tt_epilogue")
        return self._kernels[key]

    def _variant(self, n: int, res_total: int, total: int, aligned: bool):
        """(kernel, elements a thread moves) for a y of `total` elements whose last dim is `n`, a residual of
        `res_total`; `aligned`: y is C-contiguous and both start on 16 bytes."""
        vec = self.vec if (aligned and n % self.vec == 0 and res_total % self.vec == 0) else 1
        return self._kernel(n, res_total, total, vec), vec

    def expect(self, y_shape, residual_shape=None) -> "Epilogue":
        """Make now the kernel of calls on a C-contiguous, aligned y of `y_shape` (and residual), so that it compiles
        beside the op's other kernels (kernels.compile_pending) rather than alone at the first call."""
        total = int(np.prod(y_shape))
        res_total = int(np.prod(residual_shape)) if self.has_residual and residual_shape is not None else total
        self._variant(int(y_shape[-1]), res_total, total, True)
        return self

    def __call__(self, *args) -> None:
        y = args[-1]
        bias = args[0] if self.has_bias else y
        res = args[int(self.has_bias)] if self.has_residual else y
        total, n, res_total = int(y.size), int(y.shape[-1]), int(res.size)
        kernel, vec = self._variant(n, res_total, total, y.data.ptr % 16 == 0 and res.data.ptr % 16 == 0
                                    and y.flags.c_contiguous)
        index = kernels.i32 if total < 2 ** 31 else kernels.i64
        kernels.launch(kernel, total // vec, (bias, res, y, index(total // vec)))


def epilogue_op(dtype: str, has_bias: bool, has_residual: bool, activation, y_shape=None,
                residual_shape=None) -> Epilogue:
    """The in-place epilogue y = act(y + bias + residual); call as epilogue(*[bias][, residual], y). With `y_shape`
    (and `residual_shape`), the kernel for those shapes is made now (Epilogue.expect)."""
    epilogue = Epilogue(dtype, has_bias, has_residual, activation)
    return epilogue if y_shape is None else epilogue.expect(y_shape, residual_shape)
