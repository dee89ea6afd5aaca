"""The segmenter: groups convertible nodes of a frozen GraphDef into segments (future engines).

A node is a candidate when its converter's ``check`` accepts it and nothing denies it
(:mod:`.candidates`). Clusters grow as TF-TRT's do, from the outputs towards the inputs, over data
edges, unless joining would close a cycle through outside nodes (:mod:`.clustering`). Consts and
shape computations (candidates whose values are known when building: Shape -> StridedSlice -> Pack)
take part in clustering but are no members: each is copied into every segment that reads it, so a
converter input declared STATIC never crosses a segment border; a copied Shape reads its tensor
inside the segment or as a segment input, whose shape is known when building. A cluster becomes a
:class:`Segment` when it counts at least ``minimum_segment_size`` nodes, itself and its copies but
Identity, Snapshot and StopGradient (TF-TRT's count). A fetched pass-through (a function's output Identity)
that waits on native nodes through control edges stays native, so that no engine waits on them. The
:class:`NonConversionReport` says which op types stay native and why; a copy read outside the engines stays in
the graph too.
"""
from tftrt_py.segmenter.report import NonConversionReport
from tftrt_py.segmenter.segment import Segment
from tftrt_py.segmenter.segmentation import SegmentationResult, segment_graph

__all__ = ["segment_graph", "Segment", "SegmentationResult", "NonConversionReport"]
