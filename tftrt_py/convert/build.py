"""Segment graph -> engine Network -> Engine.

A segment is a GraphDef plus its inputs (Placeholder names, in binding order) and outputs
(tensor refs, in binding order). Segments made by the segmenter name them by convention:
Placeholders ``TensorRTInputPH_<i>`` and Identity nodes ``TensorRTOutputPH_<i>``; a native
segment FunctionDef (possibly renamed by a SavedModel round trip) gives them by its
signature. Engine bindings are always named ``TensorRTInputPH_<i>`` / ``TensorRTOutputPH_<i>``.
Inputs given in ``SegmentGraph.weights`` (variable values, see convert/variables.py) are no bindings: the
engine takes the value given as weights, and its bindings number the other inputs in order.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Dict, List, Optional, Sequence

import numpy as np

from tftrt_py.calibration.collector import CalibrationEngine
from tftrt_py.calibration.ranges import apply_ranges
from tftrt_py.convert.context import ConversionContext
from tftrt_py.convert.errors import ConversionError, MissingQuantizationRangeError
from tftrt_py.convert.graph import GraphView, tensor_ref
from tftrt_py.convert.ops import get_converter
from tftrt_py.convert.values import Weights
from tftrt_py.engine import Builder, BuilderConfig, EngineError, Network
from tftrt_py.engine.errors import MissingDynamicRangeError

__all__ = ["INPUT_PREFIX", "OUTPUT_PREFIX", "SegmentGraph", "segment_refusal", "network_from_segment",
           "build_engine", "calibration_engine"]

logger = logging.getLogger(__name__)

INPUT_PREFIX = "TensorRTInputPH_"
OUTPUT_PREFIX = "TensorRTOutputPH_"


@dataclasses.dataclass
class SegmentGraph:
    graph_def: object
    inputs: List[str]  # Placeholder node names, in binding order
    outputs: List[str]  # tensor refs, in binding order
    #: input index -> the value engines take as weights for that input (no binding)
    weights: Dict[int, np.ndarray] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_graph_def(cls, graph_def) -> "SegmentGraph":
        """By naming convention: TensorRTInputPH_<i> Placeholders, TensorRTOutputPH_<i> Identities."""
        def indexed(prefix):
            names = [n.name for n in graph_def.node if n.name.startswith(prefix)]
            return sorted(names, key=lambda name: int(name[len(prefix):]))

        return cls(graph_def, indexed(INPUT_PREFIX), [tensor_ref(n) for n in indexed(OUTPUT_PREFIX)])

    @classmethod
    def from_function_def(cls, fdef) -> "SegmentGraph":
        """From a native segment FunctionDef: arguments are inputs, results are outputs, in signature order."""
        from tensorflow.python.framework import function_def_to_graph

        refusal = segment_refusal(fdef)
        if refusal:
            raise ConversionError(refusal)
        graph_def, names = function_def_to_graph.function_def_to_graph_def(fdef)
        return cls(graph_def, [a.name for a in fdef.signature.input_arg],
                   [names[fdef.ret[a.name]] for a in fdef.signature.output_arg])


def segment_refusal(fdef, callees: Sequence = ()) -> Optional[str]:
    """Why native segment function `fdef` can back no engine op, or None: it holds a TRTEngineOp or reaches
    itself again, directly or through `callees` (the FunctionDefs it reaches), so building from it or running
    it would recurse without end (converters never make such)."""
    name = fdef.signature.name
    for function in [fdef, *callees]:
        for node in function.node_def:
            if node.op == "TRTEngineOp":
                where = "" if function is fdef else f", through {function.signature.name}"
                return f"its native segment function {name} contains a TRTEngineOp ({node.name}{where})"
            called = {node.op} | {a.func.name for a in node.attr.values()} | {
                f.name for a in node.attr.values() for f in a.list.func}
            if name in called:
                where = "" if function is fdef else f" through {function.signature.name}"
                return f"its native segment function {name} calls itself{where} ({node.name})"
    return None


def network_from_segment(segment: SegmentGraph, input_shapes: Sequence[Sequence[int]], name: str = "engine",
                         precision: str = "FP32") -> Network:
    """Define the engine network of a segment for concrete `input_shapes` (one per input that is not weights)."""
    view = GraphView(segment.graph_def)
    bound = [i for i in range(len(segment.inputs)) if i not in segment.weights]
    if len(input_shapes) != len(bound):
        raise ConversionError(f"segment {name!r} has {len(bound)} inputs, got {len(input_shapes)} shapes")
    network = Network(name)
    ctx = ConversionContext(network, precision)
    for i, node_name in enumerate(segment.inputs):
        node = view.nodes[node_name]
        if i in segment.weights:
            ctx.set_outputs(node, [_weights(segment, i, node)])
        else:
            k = len(network.inputs)
            ctx.set_outputs(node, [network.add_input(f"{INPUT_PREFIX}{k}", node.attr("dtype"), input_shapes[k])])
    needed = _needed_nodes(view, segment)
    for node in view.topological_order():
        if node.name in needed and node.name not in segment.inputs:
            try:
                get_converter(node.op)(node, ctx)
            except EngineError as exc:
                raise ConversionError(str(exc), node) from exc
    for i, ref in enumerate(segment.outputs):
        network.mark_output(ctx.as_tensor(ctx.values[tensor_ref(*ref.split(":"))]), name=f"{OUTPUT_PREFIX}{i}")
    return network


def _weights(segment: SegmentGraph, index: int, node) -> Weights:
    """The value of weight input `index` (Placeholder `node`), checked against the dtype and shape it declares."""
    value, dtype, shape = segment.weights[index], node.attr("dtype"), node.attr("shape")
    known = shape is not None and None not in shape
    if value.dtype.name != dtype or (known and value.shape != shape):
        raise ConversionError(f"weight input {index} holds {value.dtype.name}{list(value.shape)}, but the segment "
                              f"takes {dtype}{list(shape) if known else ''}")
    return Weights(value)


def _needed_nodes(view: GraphView, segment: SegmentGraph) -> set:
    """Nodes the outputs depend on through data edges (identity outputs of a renamed function drop out)."""
    needed, stack = set(), [ref.split(":")[0] for ref in segment.outputs]
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack.extend(r.split(":")[0] for r in view.nodes[name].inputs)
    return needed


def build_engine(segment, input_shapes, name: str = "engine", config: BuilderConfig = None, ranges=None):
    """Convert and build one engine for `input_shapes`; `segment` is a SegmentGraph or a conventional GraphDef.

    INT8: `ranges` (a calibration table's, by tensor name) give the tensors the graph's quantization ops do
    not; an int8 layer reading a tensor with no range raises MissingQuantizationRangeError.
    """
    if not isinstance(segment, SegmentGraph):
        segment = SegmentGraph.from_graph_def(segment)
    config = config or BuilderConfig()
    _await_anticipation(name, input_shapes)
    network = network_from_segment(segment, input_shapes, name=name, precision=config.precision)
    if ranges:
        apply_ranges(network, ranges)
    try:
        return Builder(config).build_engine(network)
    except MissingDynamicRangeError as exc:
        raise MissingQuantizationRangeError(str(exc), exc.tensors) from exc


def calibration_engine(segment: SegmentGraph, input_shapes, name: str = "engine",
                       config: Optional[BuilderConfig] = None):
    """The FP32 engine an INT8 op runs while it calibrates, recording its tensors (see calibration.collector): on
    the device of `config`'s backend where that backend calibrates there, else on the host.

    Converters see INT8 (so quantization ops convert, as they will in the INT8 engines); nothing is fused. With
    `config` (the build that follows calibration), that build is anticipated meanwhile (Builder.anticipate).
    """
    if config is not None and Builder(config).anticipates:  # first: its kernels compile while this engine is made
        key = (name, _shapes_key(input_shapes))
        thread = threading.Thread(target=_anticipate, args=(segment, list(input_shapes), name, config),
                                  daemon=True, name=f"anticipate-{name}")
        with _ANTICIPATING_LOCK:
            _ANTICIPATING[key] = thread
        thread.start()
    return CalibrationEngine(network_from_segment(segment, input_shapes, name=name, precision="INT8"),
                             backend=config.backend if config is not None else None)


#: (engine name, input shapes) -> the thread anticipating that build (calibration_engine); build_engine waits for
#: it, so that the two never compile the same kernels side by side.
_ANTICIPATING: Dict[tuple, threading.Thread] = {}
_ANTICIPATING_LOCK = threading.Lock()
#: Seconds build_engine waits for an anticipation still running.
ANTICIPATION_WAIT_S = 60


def _shapes_key(input_shapes) -> tuple:
    return tuple(tuple(int(d) for d in shape) for shape in input_shapes)


def _anticipate(segment: SegmentGraph, input_shapes, name: str, config: BuilderConfig) -> None:
    """Builder.anticipate on a network of its own; what fails here is only logged (the build does the work)."""
    try:
        Builder(config).anticipate(network_from_segment(segment, input_shapes, name=name,
                                                        precision=config.precision))
    except Exception as exc:
        logger.debug("could not anticipate the build of %s: %s: %s", name, type(exc).__name__, exc)


def _await_anticipation(name: str, input_shapes) -> None:
    with _ANTICIPATING_LOCK:
        thread = _ANTICIPATING.pop((name, _shapes_key(input_shapes)), None)
    if thread is not None:
        thread.join(ANTICIPATION_WAIT_S)
