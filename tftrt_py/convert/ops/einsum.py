"""Two-operand Einsum as a MatrixMultiply between two Shuffles per operand side.

Each index is a batch index (in both operands and the output), a contracted index (in both
operands only), or a free index of one operand (in it and the output). The operands are
transposed and reshaped to [*batch, M, K] and [*batch, K, N] (a transpose flag instead of a
transpose where the operand is already [*batch, K, M] or [*batch, N, K]), multiplied, and the
[*batch, M, N] result is reshaped and transposed to the output's order:

    "bij,bjk->bik" (batched matmul)   "abc,cd->abd" (dense on the last axis)
    "BTNH,BSNH->BNTS" / "BNTS,BSNH->BTNH" (Keras MultiHeadAttention scores and context)
"""
from __future__ import annotations

import dataclasses
from typing import Tuple, Union

import numpy as np

from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["EinsumConverter", "EinsumPlan", "plan_einsum"]


@dataclasses.dataclass(frozen=True)
class EinsumPlan:
    """The index groups of a supported equation (each a string of index letters)."""

    a: str
    b: str
    out: str
    batch: str
    contract: str
    free_a: str
    free_b: str


def plan_einsum(equation: str) -> Union[EinsumPlan, str]:
    """The plan of a two-operand `equation`, or the reason it does not map to a MatrixMultiply."""
    eq = equation.replace(" ", "")
    if "." in eq:
        return "ellipses (...) are not supported"
    lhs, arrow, out = eq.partition("->")
    operands = lhs.split(",")
    if len(operands) != 2:
        return f"{len(operands)} operands (only 2 are supported)"
    a, b = operands
    if not all(c.isalpha() for c in a + b + out):
        return f"equation {equation!r} is malformed"
    if not arrow:  # implicit output: the indices used once, in alphabetical order
        out = "".join(sorted(c for c in set(a + b) if (a + b).count(c) == 1))
    for name, labels in (("first operand", a), ("second operand", b), ("output", out)):
        if len(set(labels)) != len(labels):
            return f"repeated index in the {name} (diagonals) is not supported"
    if set(out) - set(a + b):
        return f"output index {sorted(set(out) - set(a + b))} is in no operand"
    summed = (set(a) ^ set(b)) - set(out)
    if summed:
        return f"index {sorted(summed)} is summed over one operand only (not a matrix product)"
    contract = "".join(c for c in a if c in b and c not in out)
    return EinsumPlan(a, b, out, batch="".join(c for c in out if c in a and c in b), contract=contract,
                      free_a="".join(c for c in out if c in a and c not in b),
                      free_b="".join(c for c in out if c in b and c not in a))


def _sizes(labels, shape):
    return dict(zip(labels, shape))


@register("Einsum")
class EinsumConverter(OpConverter):
    """Two operands, no ellipsis or repeated index, every non-output index in both operands."""

    needs_rank = True

    def validate(self, node, ctx):
        equation = node.attr("equation", b"").decode()
        plan = plan_einsum(equation)
        if isinstance(plan, str):
            return f"Einsum {equation!r}: {plan}"
        a, b = (info.shape for info in ctx.input_infos(node))
        if len(a) != len(plan.a) or len(b) != len(plan.b):
            return f"Einsum {equation!r} does not match operand ranks {len(a)} and {len(b)}"
        sa, sb = _sizes(plan.a, a), _sizes(plan.b, b)
        for c in plan.batch + plan.contract:
            if None not in (sa[c], sb[c]) and sa[c] != sb[c]:
                return f"Einsum {equation!r}: index {c!r} has sizes {sa[c]} and {sb[c]} (no broadcasting)"
        return None

    def convert(self, node, ctx):
        plan = plan_einsum(node.attr("equation").decode())
        a, b = ctx.inputs(node)  # validate has checked the ranks and the shared sizes (concrete now)
        sizes = {**_sizes(plan.a, a.shape), **_sizes(plan.b, b.shape)}
        a, ta = self._operand(ctx, node, a, plan.a, plan.batch, plan.free_a, plan.contract, sizes, "/lhs")
        b, tb = self._operand(ctx, node, b, plan.b, plan.batch, plan.contract, plan.free_b, sizes, "/rhs")
        y = ctx.add_layer("MatrixMultiply", [a, b], {"transpose_a": ta, "transpose_b": tb}, node=node,
                          suffix="/matmul")[0]
        grouped = plan.batch + plan.free_a + plan.free_b
        params = {"reshape": [sizes[c] for c in grouped]}
        perm = [grouped.index(c) for c in plan.out]
        if perm != sorted(perm):
            params["second_perm"] = perm
        ctx.set_outputs(node, [self._shuffle(ctx, node, y, params, "")])

    def _operand(self, ctx, node, x, labels, batch, rows, cols, sizes, suffix) -> Tuple[object, bool]:
        """`x` as [*batch, rows, cols] (or [*batch, cols, rows] and True, when that needs no transpose)."""
        transposed = labels != batch + rows + cols and labels == batch + cols + rows
        order = batch + (cols + rows if transposed else rows + cols)
        perm = [labels.index(c) for c in order]
        first, second = (cols, rows) if transposed else (rows, cols)
        params = {"reshape": [sizes[c] for c in batch] + [_prod(first, sizes), _prod(second, sizes)]}
        if perm != sorted(perm):
            params["first_perm"] = perm
        return self._shuffle(ctx, node, x, params, suffix), transposed

    @staticmethod
    def _shuffle(ctx, node, x, params, suffix):
        if "first_perm" not in params and "second_perm" not in params and list(params["reshape"]) == list(x.shape):
            return x
        return ctx.add_layer("Shuffle", [x], params, node=node, suffix=suffix)[0]


def _prod(labels, sizes) -> int:
    return int(np.prod([sizes[c] for c in labels], dtype=np.int64))
