"""Which nodes may join a segment: a converter accepts them and nothing denies them."""
from __future__ import annotations

import logging
from typing import AbstractSet, Dict, FrozenSet, List, Optional

from tftrt_py import settings
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView, NodeView, tensor_ref
from tftrt_py.convert.ops import find_converter
from tftrt_py.segmenter.control_flow import control_flow_reasons

__all__ = ["OP_DENYLIST_ENV", "UNSUPPORTED_DTYPES", "op_denylist", "classify"]

logger = logging.getLogger(__name__)

#: Comma-separated op types that never convert, read at each segmentation.
OP_DENYLIST_ENV = settings.OP_DENYLIST.name

#: Tensors of these dtypes never enter an engine.
UNSUPPORTED_DTYPES = ("resource", "variant", "string")


def op_denylist() -> FrozenSet[str]:
    """The op types named in TF_TRT_OP_DENYLIST now."""
    return settings.OP_DENYLIST.get()


def classify(view: GraphView, order: List[NodeView], nodes_denylist: AbstractSet[str],
             precision: str = "FP32") -> Dict[str, Optional[str]]:
    """Every node but Consts -> None when it is a candidate, else the reason it stays native (control flow
    first: tf.while_loop and tf.cond nodes, segmenter/control_flow.py).

    Nodes are judged in topological order, and the context learns which producers stay native,
    so a value computed from a native node is not taken as known when building. `precision` is the
    conversion's precision mode (quantization ops convert only in INT8).
    """
    native: set = set()
    ctx, denied_ops = ValidationContext(view, native, precision), op_denylist()
    control_flow = control_flow_reasons(view, order)
    reasons: Dict[str, Optional[str]] = {}
    for node in order:
        if node.op == "Const":
            continue
        try:
            reasons[node.name] = control_flow.get(node.name) or _reason(node, view, ctx, nodes_denylist, denied_ops)
        except Exception as exc:  # a converter (or an odd node) that cannot be judged keeps the node native
            logger.debug("judging %s (%s) raised", node.name, node.op, exc_info=True)
            reasons[node.name] = f"check raised {type(exc).__name__}: {exc}"
        if reasons[node.name] is not None:
            native.add(node.name)
    return reasons


def _reason(node, view, ctx, nodes_denylist, denied_ops) -> Optional[str]:
    if node.op == "Placeholder":
        return "graph input"
    if node.name in nodes_denylist:
        return "in nodes_denylist"
    if node.op in denied_ops:
        return f"op type in {OP_DENYLIST_ENV}"
    converter = find_converter(node.op)
    if converter is None:
        return f"no converter for op {node.op}"
    dtype = _unsupported_dtype(node, view)
    if dtype is not None:
        return f"uses a {dtype} tensor"
    return converter.check(node, ctx)


def _unsupported_dtype(node, view) -> Optional[str]:
    refs = node.inputs + [tensor_ref(node.name, port) for port in range(view.num_outputs(node.name))]
    return next((d for d in map(view.dtype, refs) if d in UNSUPPORTED_DTYPES), None)
