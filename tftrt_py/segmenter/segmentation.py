"""segment_graph: candidates -> clusters -> segments, plus the report of what stays native."""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, Iterable, List, Union

from tensorflow.core.framework import graph_pb2

from tftrt_py.convert.graph import GraphView, split_ref, tensor_ref
from tftrt_py.segmenter.candidates import classify
from tftrt_py.segmenter.clustering import cluster_candidates
from tftrt_py.segmenter.report import NonConversionReport
from tftrt_py.segmenter.segment import Segment, build_segment

__all__ = ["SegmentationResult", "segment_graph"]

logger = logging.getLogger(__name__)

CONST_KEPT = "constant read outside the engines (copied into the segments that read it)"


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
    candidates = {name for name, reason in reasons.items() if reason is None}
    segments: List[Segment] = []
    if minimum_segment_size < 0:
        reasons.update(dict.fromkeys(candidates, f"minimum_segment_size={minimum_segment_size} disables conversion"))
        candidates = set()
    fetch_refs = {tensor_ref(*split_ref(ref)) for ref in fetches}
    for members in cluster_candidates(view, order, candidates):
        segment = build_segment(view, len(segments), members, fetch_refs)
        if segment.size < minimum_segment_size:
            reasons.update(dict.fromkeys(members, f"segment of {segment.size} nodes is smaller than "
                                                  f"minimum_segment_size={minimum_segment_size}"))
        elif not segment.inputs:  # TF would constant-fold the engine op itself
            reasons.update(dict.fromkeys(members, "segment has no inputs (a constant subgraph)"))
        else:
            segments.append(segment)
    converted = {name for segment in segments for name in segment.nodes}
    reasons.update(_kept_consts(view, order, converted, {split_ref(ref)[0] for ref in fetches}))
    report = _report(view, order, reasons, len(segments))
    logger.info("Segmentation:\n%s", report.format())
    return SegmentationResult(segments, report, view)


def _kept_consts(view, order, converted, fetched) -> Dict[str, str]:
    """Consts that stay in the graph -> their reason: fetched, unused, or read other than as engine data."""
    def kept(name):
        users = view.consumers[name]
        return name in fetched or not users or any(
            user not in converted or name in view.nodes[user].control_inputs for user in users)

    return {node.name: CONST_KEPT for node in order if node.op == "Const" and kept(node.name)}


def _report(view, order, reasons, num_segments) -> NonConversionReport:
    native = {}
    for node in order:
        reason = reasons.get(node.name)
        if reason is not None:
            native[node.name] = (node.op, reason)
            logger.info("%s (%s) stays native: %s", node.name, node.op, reason)
    return NonConversionReport(len(order), len(order) - len(native), num_segments, native)
