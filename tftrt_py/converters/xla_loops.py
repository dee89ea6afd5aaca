"""Native loops compiled by XLA: the converters' ``compile_native_loops`` option.

A ``tf.while_loop`` whose trip count is known only when it runs (a detector's NMS, a convergence loop) stays out of
the engines and runs in TensorFlow, which executes its body op by op on every iteration. With the option, each such
loop becomes a function call that TensorFlow compiles with XLA (``_XlaMustCompile``, as ``tf.function(
jit_compile=True)`` marks one): the loop, the TensorList ops that fill and read its lists (a ``tf.map_fn``'s) and
the constants they read, outlined into one function. XLA fuses the body's element-wise work and runs the loop
without TensorFlow's executor around each op; keras-hub RetinaNet's decoding (NMS loops under a ``tf.map_fn``) at
batch 8 took 6.5 ms instead of 16-19 on a 2-vCPU Xeon, its outputs unchanged. XLA runs the iterations one after
another, though, where TensorFlow runs a tf.map_fn's independent iterations on several cores: on 16 cores the same
decoding was slower compiled at batch 8 (benchmarks/native_loops.py), which is one reason the option is a choice.

XLA compiles the function again for each new input shape (the first call at a batch size waits for it: about 1 s
for that decoding). A loop is compiled only where XLA compiles its function at conversion, with its unknown
dimensions taken as 1; otherwise it stays as it was (logged at INFO with XLA's reason). Loops reading resources
(variables kept as variables) stay native. XLA's Max and Min on the CPU ignore NaN unless told otherwise, where
TensorFlow's kernels propagate it (a loop's condition could then see a different value): loading the op library
sets XLA's flag for that (engine_op.library.NAN_MIN_MAX), and where XLA compiled before that in the process, loops
stay native. The option is off by default: a compiled loop's call fails where XLA cannot compile it for the shapes
it is given, which a loop TensorFlow runs never does.
"""
from __future__ import annotations

import itertools
import logging
from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.eager import context
from tensorflow.python.ops import gen_functional_ops

from tftrt_py.convert.graph import GraphView, split_ref
from tftrt_py.convert.rewrite import ENGINE_OP, native_segment_function, replace
from tftrt_py.converters import graph_io
from tftrt_py.engine_op.library import NAN_MIN_MAX
from tftrt_py.segmenter.segment import Segment, build_segment

__all__ = ["LOOP_OPS", "MUST_COMPILE_ATTR", "compile_loops", "loop_segments", "own_copies"]

logger = logging.getLogger(__name__)

LOOP_OPS = ("While", "StatelessWhile")
#: The attribute by which TensorFlow compiles a function call with XLA (what tf.function(jit_compile=True) sets).
MUST_COMPILE_ATTR = "_XlaMustCompile"

#: Numbers the conversions of this process, so the functions' names never collide in the eager context.
_COUNTER = itertools.count()


def loop_segments(view: GraphView, fetches: Sequence[str]) -> List[Segment]:
    """A segment per native loop of the graph: the loop and the nodes its TensorLists connect it to (through
    variant tensors, both ways), the Consts they read copied in. Loops reading a resource are left out."""
    order = view.topological_order()
    position = {node.name: i for i, node in enumerate(order)}
    consts = {node.name for node in order if node.op == "Const"}
    taken: set = set()
    segments = []
    for node in order:
        if node.op not in LOOP_OPS or node.name in taken:
            continue
        region = _variant_region(view, node.name)
        taken |= region
        names = sorted(region, key=position.__getitem__)
        if any(view.nodes[name].op in (ENGINE_OP, "Placeholder") for name in names):
            continue
        segment = build_segment(view, len(segments), names, consts, set(fetches))
        if any(view.dtype(ref) == "resource" for ref in segment.inputs):
            logger.info("loop %s stays native: it reads a resource", node.name)
            continue
        segments.append(segment)
    return segments


def _variant_region(view: GraphView, start: str) -> set:
    """`start` and the nodes joined to it by variant tensors (TensorList handles), transitively."""
    region, todo = {start}, [start]
    while todo:
        name = todo.pop()
        joined = [split_ref(ref)[0] for ref in view.nodes[name].inputs if view.dtype(ref) == "variant"]
        joined += [user for user in view.consumers[name]
                   if any(split_ref(ref)[0] == name and view.dtype(ref) == "variant"
                          for ref in view.nodes[user].inputs)]
        for other in joined:
            if other not in region:
                region.add(other)
                todo.append(other)
    return region


def compile_loops(graph_def, fetches: Sequence[str]) -> Tuple[graph_pb2.GraphDef, Dict[str, str]]:
    """The GraphDef with each native loop that XLA compiles (:func:`loop_segments`) replaced by a call of its
    function marked for XLA, and the renamed fetches."""
    view = GraphView(graph_def)
    segments = loop_segments(view, fetches)
    if segments and not _propagates_nan():
        logger.warning("loops stay native: XLA's Max and Min ignore NaN in this process, where TensorFlow's kernels "
                       "return it (XLA_FLAGS asks for that, or XLA compiled before the op library added %s to it)",
                       NAN_MIN_MAX)
        segments = []
    index = next(_COUNTER)
    replacements = []
    for segment in segments:
        name = f"XlaLoop_{index:03d}_{segment.name_index:03d}"
        function = native_segment_function(segment.graph_def(view), f"{name}_function")
        functions = [function] + own_copies(function, graph_def.library, f"{name}_")
        reason = _compile_failure(functions, segment, view)
        if reason:
            logger.info("loop %s stays native: XLA does not compile it (%s)", segment.nodes[-1], reason)
            continue
        replacements.append((segment, _call_node(name, segment, view, function.signature.name), functions))
    if not replacements:
        return graph_def, {f: f for f in fetches}
    converted, fetch_map = replace(graph_def, replacements, fetches)
    logger.info("%d native loop(s) compiled by XLA", len(replacements))
    # the loops' own bodies and conditions, now called only through the copies, go (with the weights they hold)
    return graph_io.prune_library(converted), fetch_map


def _propagates_nan() -> bool:
    """Whether XLA's Max and Min return NaN for NaN in this process, as TensorFlow's kernels do (NAN_MIN_MAX)."""
    nan = tf.constant([float("nan"), 1.0])
    probe = tf.function(lambda x: tf.stack([tf.reduce_max(x), tf.reduce_min(x), tf.maximum(x[0], 0.0),
                                            tf.minimum(x[0], 0.0)]), jit_compile=True)
    return bool(np.isnan(probe(nan).numpy()).all())


def _call_node(name: str, segment: Segment, view: GraphView, function: str) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op="PartitionedCall")
    node.input.extend(segment.inputs)
    node.input.extend(f"^{c}" for c in segment.control_inputs)
    for key, refs in (("Tin", segment.inputs), ("Tout", segment.outputs)):
        node.attr[key].list.SetInParent()
        node.attr[key].list.type.extend(tf.as_dtype(view.dtype(r)).as_datatype_enum for r in refs)
    node.attr["f"].func.name = function
    node.attr[MUST_COMPILE_ATTR].b = True
    return node


def own_copies(function, library, prefix: str) -> List[function_pb2.FunctionDef]:
    """Copies of the `library` functions `function` calls, directly or through others, named `prefix` + their name,
    the calls in `function` and in the copies renamed to match: the compiled loop owns the definitions it was
    checked with, which the eager context may hold otherwise under the same names (the SavedModel's, before
    conversion optimized them)."""
    defined = {f.signature.name: f for f in library.function}
    copies: Dict[str, function_pb2.FunctionDef] = {}

    def rename(fdef) -> None:
        for node in fdef.node_def:
            for attr in node.attr.values():
                for func in ([attr.func] if attr.HasField("func") else []) + list(attr.list.func):
                    if func.name in defined:
                        if func.name not in copies:
                            copy = copies[func.name] = function_pb2.FunctionDef()
                            copy.CopyFrom(defined[func.name])
                            copy.signature.name = prefix + func.name
                            rename(copy)
                        func.name = prefix + func.name

    rename(function)
    return list(copies.values())


def _compile_failure(functions, segment: Segment, view: GraphView) -> str:
    """Why XLA does not compile the first of `functions` (the loop's; the rest, those it calls) for its inputs'
    shapes with unknown dimensions taken as 1 and zeros as values; "" when it does. Nothing runs: the HLO is only
    made."""
    shapes = [view.shape(ref) for ref in segment.inputs]
    if any(shape is None for shape in shapes):
        return "an input of unknown rank"
    function, ctx = functions[0], context.context()
    added = [f for f in functions if not ctx.has_function(f.signature.name)]
    for f in added:
        ctx.add_function_def(f)
    try:
        args = [tf.zeros([1 if d is None else d for d in shape], view.dtype(ref))
                for ref, shape in zip(segment.inputs, shapes)]
        out_types = [tf.as_dtype(view.dtype(ref)) for ref in segment.outputs]

        @tf.function(jit_compile=True)
        def probe(*inputs):
            return gen_functional_ops.partitioned_call(args=list(inputs), Tout=out_types, f=function.signature.name)

        probe.experimental_get_compiler_ir(*args)(stage="hlo")
        return ""
    except Exception as exc:  # XLA's errors come as several types; any of them means the loop stays
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    finally:
        for f in reversed(added):
            ctx.remove_function(f.signature.name)
