"""Segment GraphDef -> engine Network -> Engine.

A segment GraphDef holds Placeholders ``TensorRTInputPH_<i>`` (the engine inputs), the
segment's nodes (Consts copied in), and Identity nodes ``TensorRTOutputPH_<i>`` (the
engine outputs). The same GraphDef is the body of the native segment function.
"""
from __future__ import annotations

import logging
from typing import Sequence, Tuple

from tftrt_py.convert.context import ConversionContext
from tftrt_py.convert.errors import ConversionError
from tftrt_py.convert.graph import GraphView, tensor_ref
from tftrt_py.convert.ops import get_converter
from tftrt_py.engine import Builder, BuilderConfig, EngineError, Network

__all__ = ["INPUT_PREFIX", "OUTPUT_PREFIX", "network_from_segment", "build_engine", "segment_io"]

logger = logging.getLogger(__name__)

INPUT_PREFIX = "TensorRTInputPH_"
OUTPUT_PREFIX = "TensorRTOutputPH_"


def segment_io(view: GraphView) -> Tuple[list, list]:
    """The segment's input Placeholders and output Identity nodes, each in index order."""
    def index(node):
        return int(node.name.rsplit("_", 1)[1])

    inputs = sorted((n for n in view.nodes.values() if n.name.startswith(INPUT_PREFIX)), key=index)
    outputs = sorted((n for n in view.nodes.values() if n.name.startswith(OUTPUT_PREFIX)), key=index)
    return inputs, outputs


def network_from_segment(graph_def, input_shapes: Sequence[Sequence[int]], name: str = "engine",
                         precision: str = "FP32") -> Network:
    """Define the engine network of a segment for concrete `input_shapes` (one per engine input)."""
    view = GraphView(graph_def)
    inputs, outputs = segment_io(view)
    if len(input_shapes) != len(inputs):
        raise ConversionError(f"segment {name!r} has {len(inputs)} inputs, got {len(input_shapes)} shapes")
    network = Network(name)
    ctx = ConversionContext(network, precision)
    shapes = {n.name: tuple(s) for n, s in zip(inputs, input_shapes)}
    for node in view.topological_order():
        if node.name in shapes:
            ctx.set_outputs(node, [network.add_input(node.name, node.attr("dtype"), shapes[node.name])])
            continue
        if node.name.startswith(OUTPUT_PREFIX):
            continue
        try:
            get_converter(node.op)(node, ctx)
        except ConversionError:
            raise
        except EngineError as exc:
            raise ConversionError(str(exc), node) from exc
    for node in outputs:
        value = ctx.values[node.inputs[0]]
        network.mark_output(ctx.as_tensor(value), name=node.name)
    return network


def build_engine(graph_def, input_shapes, name: str = "engine", config: BuilderConfig = None):
    """Convert and build one engine for `input_shapes`."""
    config = config or BuilderConfig()
    network = network_from_segment(graph_def, input_shapes, name=name, precision=config.precision)
    return Builder(config).build_engine(network)
