"""Control flow stays native: tf.while_loop and tf.cond, functional (While, If) or lowered (TF1 frames). (Loops of a
trip count known before they run reach the segmenter unrolled: converters/unroll.py.)

A lowered loop is a frame entered through Enter and left through Exit; a lowered conditional routes
each branch through a Switch output up to a Merge. A node inside either may receive dead tensors or run
once per iteration, which an engine cannot do, so such nodes keep TF's executor.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from tftrt_py.convert.graph import MERGE_OPS, GraphView, NodeView

__all__ = ["LOOP_REASON", "COND_REASON", "FUNCTIONAL_OPS", "control_flow_reasons"]

LOOP_REASON = "inside a tf.while_loop (loops stay native)"
COND_REASON = "inside a tf.cond branch (conditionals stay native)"

#: Functional control-flow ops -> why they stay native (their bodies are library functions).
FUNCTIONAL_OPS = {
    **dict.fromkeys(("While", "StatelessWhile"), "a tf.while_loop (loops stay native)"),
    **dict.fromkeys(("If", "StatelessIf", "Case", "StatelessCase"), "a tf.cond or tf.switch_case (conditionals "
                                                                     "stay native)"),
}

ENTER_OPS = ("Enter", "RefEnter")
EXIT_OPS = ("Exit", "RefExit")
SWITCH_OPS = ("Switch", "RefSwitch")

#: A context: the frames and branches a node runs in, outermost first, as ("loop" | "cond", node name).
Context = Tuple[Tuple[str, str], ...]


def control_flow_reasons(view: GraphView, order: List[NodeView]) -> Dict[str, str]:
    """Node name -> why it stays native, for functional control-flow ops and the nodes of lowered loops
    and conditionals (`order` is topological)."""
    reasons = {n.name: FUNCTIONAL_OPS[n.op] for n in order if n.op in FUNCTIONAL_OPS}
    outside: Dict[str, Context] = {}  # the context a node's consumers see it in
    for node in order:
        inner = max((outside.get(name, ()) for name in view.dependencies(node)), key=len, default=())
        if node.op in ENTER_OPS:
            inner += (("loop", node.name),)
        elif node.op in SWITCH_OPS:
            inner += (("cond", node.name),)
        outside[node.name] = _leave(node, inner)
        if inner:
            reasons[node.name] = LOOP_REASON if any(kind == "loop" for kind, _ in inner) else COND_REASON
    return reasons


def _leave(node: NodeView, inner: Context) -> Context:
    """The context after `node`: an Exit leaves its frame, a conditional's Merge its branch (a loop's Merge
    sees its Enter's frame last, so it leaves nothing)."""
    if node.op in EXIT_OPS:
        loops = [i for i, (kind, _) in enumerate(inner) if kind == "loop"]
        return inner[:loops[-1]] if loops else inner
    if node.op in MERGE_OPS and inner and inner[-1][0] == "cond":
        return inner[:-1]
    return inner
