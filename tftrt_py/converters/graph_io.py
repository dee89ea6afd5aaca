"""Graph I/O: load a SavedModel signature, freeze it, inline its function calls, run grappler, rebuild a
function from a GraphDef."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import logging
import os
import types
import weakref
from typing import AbstractSet, Dict, Iterator, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.core.protobuf import config_pb2, fingerprint_pb2, meta_graph_pb2
from tensorflow.core.function.polymorphism import function_type as function_type_lib
from tensorflow.python.eager import context, wrap_function
from tensorflow.python.eager.polymorphic_function import atomic_function
from tensorflow.python.framework import convert_to_constants, function_def_to_graph
from tensorflow.python.grappler import tf_optimizer
from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting
from tensorflow.python.training import saver
from tensorflow.python.util import nest

from tftrt_py.convert import segment_weights
from tftrt_py.convert.graph import (LARGE_CONST_BYTES, const_nbytes, function_without_weights, restore_weights,
                                    without_weights)
from tftrt_py.convert.rewrite import ENGINE_OP
from tftrt_py.converters import restore, unroll

__all__ = ["load_signature", "freeze", "frozen_graph_def", "signature_of", "Signature", "inline_calls", "optimize",
           "optimize_and_unroll", "function_from_graph_def", "grappler_off", "prune_library", "SavedModelError"]

logger = logging.getLogger(__name__)

#: Grappler passes run before segmentation (no layout or remapper: they create ops engines don't know).
GRAPPLER_OPTIMIZERS = ("pruning", "debug_stripper", "constfold", "dependency", "common_subgraph_elimination")
#: The passes left under TF-TRT's test switch ``_test_only_disable_non_trt_optimizers``: no folding, no merging of
#: equal computations (the pruner still tidies what inlining leaves).
PRUNING_ONLY = ("pruning",)

#: Ops calling the library function named in their "f" attr.
CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")

#: Deeper nesting than this is taken for a recursive function.
MAX_CALL_DEPTH = 64

#: The longest cause a SavedModelError quotes (TensorFlow's loader errors can run to pages).
MAX_CAUSE_CHARS = 300


class SavedModelError(ValueError):
    """The input SavedModel is missing, malformed, or lacks the requested tags or signature."""


def load_signature(saved_model_dir: str, tags: Sequence[str], signature_key: str):
    """(loaded object, signature function); clear errors for a missing dir, tags or signature."""
    if not saved_model_dir:
        raise SavedModelError("input_saved_model_dir is required")
    if not os.path.isdir(saved_model_dir):
        raise SavedModelError(f"SavedModel directory {saved_model_dir!r} does not exist")
    if not any(os.path.exists(os.path.join(saved_model_dir, f)) for f in ("saved_model.pb", "saved_model.pbtxt")):
        raise SavedModelError(f"{saved_model_dir!r} holds no saved_model.pb: it is not a SavedModel directory")
    try:
        loaded = restore.load_for_signature(saved_model_dir, list(tags), signature_key)
    except Exception as exc:  # the loader meets a malformed saved_model.pb with any error type (KeyError...)
        raise SavedModelError(f"cannot load SavedModel {saved_model_dir!r} with tags {list(tags)}: {_cause(exc)}"
                              f"{_damage(saved_model_dir)}") from exc
    signatures = getattr(loaded, "signatures", {})
    if signature_key not in signatures:
        raise SavedModelError(f"SavedModel {saved_model_dir!r} has no signature {signature_key!r}; "
                              f"available: {sorted(signatures)}")
    return loaded, signatures[signature_key]


def _cause(exc: Exception) -> str:
    """`exc` as one line of at most MAX_CAUSE_CHARS; an error type the loader does not raise on purpose (a
    KeyError, an IndexError...) is said to come from a malformed saved_model.pb."""
    text = " ".join(str(exc).split())
    if len(text) > MAX_CAUSE_CHARS:
        text = text[:MAX_CAUSE_CHARS - 3] + "..."
    if isinstance(exc, (tf.errors.OpError, ValueError, RuntimeError, OSError)):
        return text
    return f"its saved_model.pb is malformed ({type(exc).__name__}: {text})"


def _damage(saved_model_dir: str) -> str:
    """"; saved_model.pb does not match ..." when the checksum TensorFlow saved in fingerprint.pb says the file
    changed since it was written; '' when it matches or cannot be compared."""
    if not os.path.exists(os.path.join(saved_model_dir, "fingerprint.pb")):
        return ""
    try:
        saved = tf.saved_model.experimental.read_fingerprint(saved_model_dir).saved_model_checksum
        now = fingerprint_pb2.FingerprintDef.FromString(fingerprinting.CreateFingerprintDef(saved_model_dir))
    except Exception:  # unparsable: the loader's error already says so
        return ""
    if now.saved_model_checksum == saved:
        return ""
    return ("; saved_model.pb does not match the checksum in its fingerprint.pb, so the file is damaged: restore "
            "or re-export the SavedModel")


def freeze(func):
    """The function with its variables turned into constants.

    Control flow is not lowered: a tf.while_loop stays one While node (a tf.cond one If node) whose
    body functions stay in the library, so the loop stays native as one node while the ops around
    it convert (lowered Enter/Merge/Switch/NextIteration frames would put a cycle in the graph).
    """
    return convert_to_constants.convert_variables_to_constants_v2(func, lower_control_flow=False)


def frozen_graph_def(func, keep: AbstractSet[str] = frozenset()):
    """(GraphDef of `func` with its variables as constants, names of its input tensors), as :func:`freeze` gives,
    without importing the GraphDef into another function, its control flow lowered when TensorFlow runs it
    (:func:`keep_runtime_lowering`). The variables captured by the Placeholders named in `keep` stay captured
    variables (neither constants nor inputs)."""
    original = func.graph.as_graph_def()
    data = convert_to_constants._FunctionConverterDataInEager(  # pylint: disable=protected-access
        func=func, lower_control_flow=False, aggressive_inlining=False, variable_names_denylist=set(keep) or None)
    graph_def, converted = convert_to_constants._replace_variables_by_constants(  # pylint: disable=protected-access
        converter_data=data)
    keep_runtime_lowering(graph_def, original)
    captured = {id(func.graph.internal_captures[i]) for i in converted}
    return graph_def, [t.name for t in func.inputs if id(t) not in captured and t.op.name not in keep]


#: The functional control flow ops freezing without lowering marks not to be lowered when run.
CONTROL_FLOW_OPS = convert_to_constants._CONTROL_FLOW_OPS  # pylint: disable=protected-access
LOWERING_ATTR = "_lower_using_switch_merge"


def _control_flow_nodes(graph_def):
    """(function name or "", node) of every functional control flow op of `graph_def` and its library."""
    yield from (("", n) for n in graph_def.node if n.op in CONTROL_FLOW_OPS)
    for f in graph_def.library.function:
        yield from ((f.signature.name, n) for n in f.node_def if n.op in CONTROL_FLOW_OPS)


def keep_runtime_lowering(frozen, original) -> int:
    """Mark the control flow ops of `frozen` to be lowered to Switch/Merge frames when TensorFlow runs the graph
    (its LowerFunctionalOpsPass), as the original graph's were: freezing without lowering turned that off, and a
    While run as a function call per iteration costs about 90 us an iteration (a Keras LSTM over 128 steps at batch
    1: 15.3 ms frozen that way against 3.5 ms). Ops the original kept functional (XLA clusters) stay so, found by
    (function, node) name; where the original kept some functional, an op it does not name keeps the mark freezing
    gave it. How many were marked."""
    functional = {(fn, n.name) for fn, n in _control_flow_nodes(original)
                  if LOWERING_ATTR in n.attr and not n.attr[LOWERING_ATTR].b}
    lowered = {(fn, n.name) for fn, n in _control_flow_nodes(original) if n.attr[LOWERING_ATTR].b}
    marked = 0
    for fn, node in _control_flow_nodes(frozen):
        if (fn, node.name) in functional or LOWERING_ATTR not in node.attr or node.attr[LOWERING_ATTR].b:
            continue
        if (fn, node.name) in lowered or not functional:
            node.attr[LOWERING_ATTR].b = True
            marked += 1
    return marked


def signature_of(func):
    """What :func:`function_from_graph_def` reads of `func` (input signature, output structure), holding
    none of its graph, captures or variables."""
    return Signature(func.structured_input_signature, nest.map_structure(lambda _: None, func.structured_outputs))


@dataclasses.dataclass(frozen=True)
class Signature:
    """A function's input signature and output nesting (leaves None)."""

    structured_input_signature: tuple
    structured_outputs: object


def inline_calls(graph_def, keep: AbstractSet[str] = frozenset()):
    """`graph_def` with every function call (but the nodes named in `keep`) replaced by the function's body.

    Grappler's "function" optimizer (and the freezing's own inlining) leave calls marked ``_noinline``
    or ``_XlaMustCompile`` alone, as Keras 3's grouped convolutions are; each such call would split the
    graph into more engines, so the calls are inlined here, nested ones too. Body nodes are named
    ``<call>/<node>``, args become Identity nodes fed by the call's inputs (and its control inputs),
    readers of ``<call>:i`` read the function's i-th result, and ``^<call>`` waits for the results'
    producers and the function's control outputs. Library functions nothing calls any more are dropped.
    """
    library = {f.signature.name: f for f in graph_def.library.function}
    if not any(_callee(n, library) and n.name not in keep for n in graph_def.node):
        return graph_def
    results: Dict[str, str] = {}  # "<call>:i" -> the tensor it now is
    waits: Dict[str, List[str]] = {}  # call name -> the nodes "^<call>" now waits for
    taken = {n.name for n in graph_def.node}
    functions = tf.Graph()  # function_def_to_graph_def looks called functions up in the default graph
    with functions.as_default():
        tf.graph_util.import_graph_def(graph_pb2.GraphDef(library=graph_def.library), name="")
        nodes = list(_inline(graph_def.node, library, keep, (results, waits, taken), depth=0))
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    for node in nodes:
        inputs = [r for ref in node.input for r in _resolve(ref, results, waits)]
        del node.input[:]
        node.input.extend([r for r in inputs if not r.startswith("^")]
                          + list(dict.fromkeys(r for r in inputs if r.startswith("^"))))
        out.node.add().CopyFrom(node)
    _keep_called(out, library, graph_def.library.gradient)
    if waits:
        logger.info("inlined %d function call(s); %d library function(s) left", len(waits), len(out.library.function))
    return out


def _callee(node, library) -> str:
    """The name of the library function `node` calls, or ''."""
    if node.op in CALL_OPS:
        return node.attr["f"].func.name
    return node.op if node.op in library else ""


def _inline(nodes, library, keep, state, depth) -> Iterator[node_def_pb2.NodeDef]:
    """`nodes` (copies) with every call expanded into its body, recursively; `state` is (results, waits,
    node names taken)."""
    for node in nodes:
        name = _callee(node, library)
        if not name or node.name in keep:
            yield node_def_pb2.NodeDef.FromString(node.SerializeToString())
            continue
        if depth >= MAX_CALL_DEPTH:
            raise ValueError(f"function calls nested deeper than {MAX_CALL_DEPTH} at {node.name} (calling "
                             f"{name}): a recursive function cannot be inlined")
        yield from _inline(_body(node, library[name], *state), library, keep, state, depth + 1)


def _body(call, fdef, results, waits, taken) -> List[node_def_pb2.NodeDef]:
    """The nodes of `fdef` in place of `call` (not yet expanded), named `<call>/<node>` (another free
    prefix if a graph node has such a name); records where its results and control output now are."""
    body, flat = function_def_to_graph.function_def_to_graph_def(fdef)
    prefix = next(p for p in (f"{call.name}{suffix}/" for suffix in
                              itertools.chain([""], (f"_inlined_{i}" for i in itertools.count())))
                  if not any(p + n.name in taken for n in body.node))
    taken.update(prefix + n.name for n in body.node)
    data = [ref for ref in call.input if not ref.startswith("^")]
    controls = [ref for ref in call.input if ref.startswith("^")]
    args = {arg.name: ref for arg, ref in zip(fdef.signature.input_arg, data, strict=True)}
    nodes = []
    for node in body.node:
        new = node_def_pb2.NodeDef(name=prefix + node.name, op=node.op)
        if node.name in args:  # an arg: an Identity of the call's input
            new.op = "Identity"
            new.input.extend([args[node.name]] + controls)
            new.attr["T"].type = node.attr["dtype"].type
        else:
            new.input.extend(("^" + prefix + ref[1:]) if ref.startswith("^") else prefix + ref
                             for ref in node.input)
            new.input.extend(controls if not node.input else ())
            for key, value in node.attr.items():
                new.attr[key].CopyFrom(value)
        nodes.append(new)
    rets = [prefix + flat[fdef.ret[arg.name]] for arg in fdef.signature.output_arg]
    for i, ref in enumerate(rets):
        results[f"{call.name}:{i}"] = ref
    done = [ref.split(":")[0] for ref in rets] + [prefix + n for n in fdef.control_ret.values()]
    waits[call.name] = list(dict.fromkeys(done)) or [prefix + name for name in args] or [c[1:] for c in controls]
    return nodes


def _resolve(ref: str, results, waits) -> List[str]:
    """An input ref of a node after inlining (a control ref may become several)."""
    if ref.startswith("^"):
        name = ref[1:]
        if name not in waits:
            return [ref]
        return [r for n in waits[name] for r in _resolve("^" + n, results, waits)]
    name, _, port = ref.partition(":")
    key = f"{name}:{port or 0}"
    return _resolve(results[key], results, waits) if key in results else [ref]


def prune_library(graph_def):
    """`graph_def` without the library functions none of its nodes calls, directly or through others."""
    library = {f.signature.name: f for f in graph_def.library.function}
    out = graph_pb2.GraphDef(versions=graph_def.versions, node=graph_def.node)
    _keep_called(out, library, graph_def.library.gradient)
    return out


def _keep_called(out, library, gradients) -> None:
    """Put into `out`'s library the functions of `library` (and their `gradients`) that its nodes call."""
    used = _called_functions(out.node, library)
    out.library.function.extend(f for name, f in library.items() if name in used)
    out.library.gradient.extend(g for g in gradients if g.function_name in used)


def _called_functions(nodes, library) -> set:
    """Names of the library functions `nodes` call (by op type or a func attr), transitively."""
    used, queue = set(), list(nodes)
    while queue:
        node = queue.pop()
        names = [node.op] + [f.name for v in node.attr.values() for f in
                             ([v.func] if v.HasField("func") else v.list.func if v.HasField("list") else [])]
        for name in names:
            if name in library and name not in used:
                used.add(name)
                queue.extend(library[name].node_def)
    return used


def optimize(graph_def, graph, fetch_names: Sequence[str], optimizers: Sequence[str] = GRAPPLER_OPTIMIZERS):
    """Run grappler's `optimizers` (constant folding and friends), keeping the fetched tensors.

    Grappler copies the graph several times over (meta graph, serialized, its own item, folded result), so the
    weights go through it as stand-ins (:func:`without_weights`) and come back afterwards. Folding stops at them
    (a Cast or Transpose of a weight stays an op; the engines fold it when they are built) and everything
    smaller folds as before. Control edges from those Consts go, as grappler drops those from the Consts it sees.
    """
    light, weights = without_weights(graph_def)
    for node in light.node:
        node.device = ""
    optimized = _grappler(light, graph, fetch_names, optimizers)
    # a control edge from a Const without inputs orders nothing; kept, it would hold the weight in the graph
    # beside the segment that copies it in
    inert = {f"^{name}" for name, node in weights.items() if not node.input}
    for node in optimized.node:
        if inert.intersection(node.input):
            kept = [r for r in node.input if r not in inert]
            del node.input[:]
            node.input.extend(kept)
    restore_weights(optimized.node, weights)
    return optimized


def optimize_and_unroll(graph_def, graph, fetch_names: Sequence[str], optimizers: Sequence[str] = GRAPPLER_OPTIMIZERS):
    """:func:`optimize`, then the loops of a trip count known before they run unrolled (converters/unroll.py) and,
    where any was, :func:`optimize` again: the copies' arithmetic on constants (a GRU's bias split) folds once."""
    graph_def = optimize(graph_def, graph, fetch_names, optimizers)
    if unroll.unroll_loops(graph_def, fetch_names):
        graph_def = optimize(graph_def, graph, fetch_names, optimizers)
    return graph_def


@contextlib.contextmanager
def grappler_off():
    """Functions first called within run without TF's graph optimizer (the process's setting, restored after)."""
    ctx = context.context()
    before = ctx.get_optimizer_experimental_options().get("disable_meta_optimizer", False)
    ctx.set_optimizer_experimental_options({"disable_meta_optimizer": True})
    try:
        yield
    finally:
        ctx.set_optimizer_experimental_options({"disable_meta_optimizer": before})


def _grappler(graph_def, graph, fetch_names: Sequence[str], optimizers: Sequence[str]):
    meta_graph = saver.export_meta_graph(graph_def=graph_def, graph=graph)
    fetches = meta_graph_pb2.CollectionDef()
    fetches.node_list.value.extend(fetch_names)
    meta_graph.collection_def["train_op"].CopyFrom(fetches)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.min_graph_nodes = -1
    rewrite.optimizers.extend(optimizers)
    return tf_optimizer.OptimizeGraph(config, meta_graph)


def function_from_graph_def(func, graph_def, input_names, output_names, captures=None):
    """A ConcreteFunction running `graph_def` with the signature of `func`.

    Input names, output names and nesting (dicts keep their key order), dtypes and shapes
    come from `func`; `input_names` are the graph's tensors fed by `func`'s flat inputs,
    `captures` maps further Placeholder names to outside tensors (captured by the function).

    The engine ops' native segment functions and the other functions holding weights go into the eager context
    once each, shared by every function made from the same definitions (see :func:`_segment_function`), rather than
    through the graph import, which would copy each several times over; the rest of the library is imported with
    the graph.
    """
    ctx = context.context()
    library = {f.signature.name: f for f in graph_def.library.function}
    segment_names = {n.attr["segment_func"].func.name for n in graph_def.node if n.op == ENGINE_OP}
    segment_names |= {name for name, f in library.items() if _holds_weights(f)}
    # with the functions they call (a loop holding weights calls its body and condition), each made after those
    # it calls: a function's graph is made where every function it calls is defined
    segment_names |= _called_functions([n for name in segment_names for n in library[name].node_def], library)
    made: Dict[str, object] = {}
    for name in _callees_first(segment_names, library):
        called = _called_functions(library[name].node_def, library)
        made[name] = _segment_function(library[name], [made[c] for c in sorted(called)])
    segments = list(made.values())
    rest = graph_pb2.GraphDef(versions=graph_def.versions, node=graph_def.node)
    rest.library.function.extend(f for f in graph_def.library.function if f.signature.name not in segment_names)
    rest.library.gradient.extend(graph_def.library.gradient)
    for f in rest.library.function:  # replace stale definitions of the same name, keep identical ones
        while ctx.has_function(f.signature.name) and ctx.get_function_def(f.signature.name) != f:
            ctx.remove_function(f.signature.name)

    def import_graph_def():
        tf.graph_util.import_graph_def(rest, name="")
        graph = tf.compat.v1.get_default_graph()
        for name, tensor in (captures or {}).items():
            graph.add_capture(tensor, graph.get_tensor_by_name(f"{name}:0"))

    names = [f.signature.name for f in rest.library.function]
    ours = [n for n in names if n in _LIBRARY_USERS or not ctx.has_function(n)]
    wrapped = wrap_function.wrap_function(import_graph_def, [])
    element = wrapped.graph.as_graph_element
    fetches = nest.pack_sequence_as(func.structured_outputs, [element(n) for n in output_names])
    pruned = wrapped.prune([element(n) for n in input_names], fetches,
                           input_signature=func.structured_input_signature)
    # the function keeps its native segments registered, and a SavedModel of it holds them (save exports children)
    pruned._inference_function._children.extend(segments)  # pylint: disable=protected-access
    ours = [n for n in ours if ctx.has_function(n)]
    defined = wrapped.graph._functions  # pylint: disable=protected-access
    for name in ours:
        _LIBRARY_USERS[name] = _LIBRARY_USERS.get(name, 0) + 1
        if name in defined:
            _LIBRARY_DEFINED.setdefault(name, []).append(weakref.ref(defined[name]))
    weakref.finalize(pruned, _release_library, ours).atexit = False
    return pruned


def _callees_first(names, library) -> List[str]:
    """`names` (library functions, closed under calls) ordered so that each comes after the functions it calls."""
    order: List[str] = []
    seen: set = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for callee in sorted(_called_functions(library[name].node_def, library) & set(names)):
            visit(callee)
        order.append(name)

    for name in sorted(names):
        visit(name)
    return order


def _holds_weights(fdef) -> bool:
    """Whether library function `fdef` holds a weight (a Const of LARGE_CONST_BYTES or more)."""
    return any(n.op == "Const" and const_nbytes(n) >= LARGE_CONST_BYTES for n in fdef.node_def)


#: Native segment function name -> (digest of its definition, or None for a fresh name; weak reference to its
#: AtomicFunction).
_SEGMENTS: Dict[str, Tuple[bytes, weakref.ref]] = {}


def _segment_function(fdef, children=()):
    """The AtomicFunction of native segment function `fdef`, registered in the eager context once per definition:
    functions made from the same definition share it, and the last of them to go takes it out of the context
    (TensorFlow counts the AtomicFunctions of each name). `children`: the AtomicFunctions of those it calls."""
    name = fdef.signature.name
    digest = None  # a name of fresh_function_name has no other definition (a 0.4 GB one takes 1.2 s to digest)
    if segment_weights.WEIGHTS_SUFFIX not in name:
        digest = hashlib.sha256(fdef.SerializeToString(deterministic=True)).digest()
    known = _SEGMENTS.get(name)
    atomic = known[1]() if known is not None and digest is not None and known[0] == digest else None
    if atomic is not None:
        return atomic
    ctx = context.context()
    while ctx.has_function(name):  # a stale definition of the same name
        ctx.remove_function(name)
    ctx.add_function_def(fdef)
    spec = lambda arg: tf.TensorSpec(None, tf.as_dtype(arg.type))  # noqa: E731
    function_type = function_type_lib.from_structured_signature(
        (tuple(spec(a) for a in fdef.signature.input_arg), {}), [spec(a) for a in fdef.signature.output_arg])
    # its FuncGraph (TF builds one to save a function that has none) from the definition without the weights: the
    # same inputs and outputs, without importing every weight into a graph
    light = types.SimpleNamespace(definition=function_without_weights(fdef)[0], function_type=function_type,
                                  children=list(children), call_options=atomic_function.CallOptions())
    atomic = atomic_function.AtomicFunction(name, ctx, function_type, children=list(children),
                                            cached_graph=atomic_function.to_func_graph(light))
    for gone in [n for n, (_, ref) in _SEGMENTS.items() if ref() is None]:  # functions dropped since
        del _SEGMENTS[gone]
    _SEGMENTS[name] = (digest, weakref.ref(atomic))
    return atomic


#: Library function name -> live functions of function_from_graph_def that added it to the eager context.
_LIBRARY_USERS: Dict[str, int] = {}
#: Library function name -> the graph functions (TF's _DefinedFunction) of those functions defining it.
_LIBRARY_DEFINED: Dict[str, List[weakref.ref]] = {}


def _release_library(names) -> None:
    """A function of function_from_graph_def went: the library functions no other such function uses leave
    the eager context (each holds its Consts, e.g. a native segment's weights)."""
    ctx = context.context()
    for name in names:
        _LIBRARY_USERS[name] -= 1
        if _LIBRARY_USERS[name]:
            continue
        del _LIBRARY_USERS[name]
        for ref in _LIBRARY_DEFINED.pop(name, ()):
            defined = ref()
            if defined is not None:  # its deleter takes back its own registration now, not after ours went
                defined._function_deleter = None  # pylint: disable=protected-access
        while ctx.has_function(name):  # the context counts each registration
            ctx.remove_function(name)
