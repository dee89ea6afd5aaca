"""segment_graph: candidates -> clusters -> segments, plus the report of what stays native."""
from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, List, Set, Union

from tensorflow.core.framework import graph_pb2

from tftrt_py.convert.graph import GraphView, split_ref, tensor_ref
from tftrt_py.convert.ops.identity import PASS_THROUGH
from tftrt_py.segmenter.candidates import classify
from tftrt_py.segmenter.clustering import cluster_candidates
from tftrt_py.segmenter.report import NonConversionReport
from tftrt_py.segmenter.segment import Segment, build_segment, copied_nodes

__all__ = ["SegmentationResult", "segment_graph"]

logger = logging.getLogger(__name__)

CONST_KEPT = "constant read outside the engines (copied into the segments that read it)"
STATIC_KEPT = "known when building, read outside the engines (copied into the segments that read it)"
WAITING_FETCH = "fetched pass-through waiting on native nodes (control edges): kept outside so no engine waits"


@dataclasses.dataclass
class SegmentationResult:
    segments: List[Segment]
    report: NonConversionReport
    view: GraphView


def segment_graph(graph_def: Union[graph_pb2.GraphDef, GraphView], minimum_segment_size: int = 3,
                  nodes_denylist: Iterable[str] = (), fetches: Iterable[str] = (),
                  precision_mode: str = "FP32") -> SegmentationResult:
    """Split `graph_def` into convertible segments (see the package docstring for the rules)."""
    view = graph_def if isinstance(graph_def, GraphView) else GraphView(graph_def)
    order = view.topological_order()
    fetches = list(fetches)
    reasons = classify(view, order, frozenset(nodes_denylist), precision_mode)
    reasons.update(dict.fromkeys(_waiting_fetches(view, reasons, fetches), WAITING_FETCH))
    candidates = {name for name, reason in reasons.items() if reason is None}
    copied = copied_nodes(view, order, candidates)
    segments: List[Segment] = []
    clusters = cluster_candidates(view, order, candidates | copied) if minimum_segment_size >= 0 else []
    if minimum_segment_size < 0:
        reasons.update(dict.fromkeys(candidates, f"minimum_segment_size={minimum_segment_size} disables conversion"))
    fetch_refs = {tensor_ref(*split_ref(ref)) for ref in fetches}
    for cluster in clusters:
        segment = build_segment(view, len(segments), cluster, copied, fetch_refs)
        if not segment.nodes:  # only copies: they go where they are read
            continue
        reason = _refusal(view, segment, minimum_segment_size)
        if reason is None:
            segments.append(segment)
        else:
            reasons.update(dict.fromkeys((name for name in cluster if name in candidates), reason))
    converted = {name for segment in segments for name in segment.nodes}
    waited = {name for segment in segments for name in segment.control_inputs}
    kept = _kept_copies(view, order, copied, converted, waited | {split_ref(ref)[0] for ref in fetches})
    for name in copied:  # a copy stays native where it stays in the graph (a refused segment's reason first)
        if name not in kept:
            reasons.pop(name, None)
        elif reasons.get(name) is None:
            reasons[name] = CONST_KEPT if view.nodes[name].op == "Const" else STATIC_KEPT
    report = _report(view, order, reasons, len(segments))
    logger.info("Segmentation:\n%s", report.format())
    return SegmentationResult(segments, report, view)


def _waiting_fetches(view, reasons, fetches) -> List[str]:
    """Fetched pass-through candidates that wait on native nodes through control edges (a tf.function's outputs
    wait on its variable writes). Inside an engine such a node would make the engine wait on those nodes, and
    where they read an engine's output (a BatchNormalization updating its moving statistics) the engines around
    them could not merge; outside, only the fetch waits."""
    names = dict.fromkeys(split_ref(ref)[0] for ref in fetches)
    return [name for name in names if name in view.nodes and reasons.get(name) is None
            and view.nodes[name].op in PASS_THROUGH
            and any(reasons.get(dep) is not None for dep in view.nodes[name].control_inputs)]


def _refusal(view, segment, minimum_segment_size):
    """Why `segment` does not become an engine, or None."""
    if segment.size < minimum_segment_size:
        return f"segment of {segment.size} nodes is smaller than minimum_segment_size={minimum_segment_size}"
    if not segment.inputs:  # TF would constant-fold the engine op itself
        return "segment has no inputs (a constant subgraph)"
    missing = segment.static_inputs_outside(view)
    if missing:  # the copies should prevent it: a segmenter bug, kept native rather than failing at serving
        logger.warning("segment %d: %s must be known when building but are computed outside it",
                       segment.name_index, ", ".join(missing))
        return f"inputs {', '.join(missing)} must be known when building but are computed outside the segment"
    return None


def _kept_copies(view, order, copied, converted, needed) -> Set[str]:
    """The copied nodes that stay in the graph: `needed` (fetched, or an engine waits for them), unused, or
    read by a node that stays."""
    kept: Set[str] = set()
    for node in reversed(order):
        users = view.consumers[node.name]
        if node.name in copied and (node.name in needed or not users or any(
                user in kept or (user not in converted and user not in copied) for user in users)):
            kept.add(node.name)
    return kept


def _report(view, order, reasons, num_segments) -> NonConversionReport:
    native = {}
    for node in order:
        reason = reasons.get(node.name)
        if reason is not None:
            native[node.name] = (node.op, reason)
            logger.info("%s (%s) stays native: %s", node.name, node.op, reason)
    return NonConversionReport(len(order), len(order) - len(native), num_segments, native)
