"""The segmenter: groups convertible nodes of a frozen GraphDef into segments (future engines).

A node is a candidate when its converter's ``check`` accepts it and nothing denies it
(:mod:`.candidates`). Candidates joined by data edges form clusters unless joining would
close a cycle through outside nodes (:mod:`.clustering`). Clusters with at least
``minimum_segment_size`` nodes (pass-through ops not counted) become :class:`Segment`s;
Consts are never members but are copied into each segment that reads them. The
:class:`NonConversionReport` says which op types stay native and why.
"""
from tftrt_py.segmenter.report import NonConversionReport
from tftrt_py.segmenter.segment import Segment
from tftrt_py.segmenter.segmentation import SegmentationResult, segment_graph

__all__ = ["segment_graph", "Segment", "SegmentationResult", "NonConversionReport"]
