"""Loops whose trip count is known when converting, unrolled into copies of their body.

A functional ``While`` stays one native node through segmentation: TensorFlow runs its body op by op at every
iteration, and the engines around it end at the loop (two engine calls and a native loop for a Keras LSTM text
classifier). A Keras RNN layer (LSTM, GRU, SimpleRNN) exported with a fixed sequence length is a loop whose
condition compares counters that start at constants and grow by constants, so how often it runs is known before it
runs. Such a loop is replaced by that many copies of its body, which then convert like any other ops: the
recurrence joins the engines around it. TensorLists become the tensors they hold: ``TensorListGetItem`` at a known
index of a list made by ``TensorListFromTensor`` is a slice of that tensor, ``TensorListSetItem`` at a known index
fills one slot of a list made by ``TensorListReserve``, and ``TensorListStack`` of such a list after the loop is a
``Pack`` of its slots. Counters are computed here, not in the graph.

A loop stays as it is, for TensorFlow to run, when any of this fails: its condition is decided by constants at every
iteration; it runs at most MAX_ITERATIONS times and its copies hold at most MAX_NODES nodes; its body holds no
stateful op, loop, conditional or function call; its TensorLists are used only as above (a known index, every slot
of a stacked list set, nothing but ``TensorListStack`` reading a list after the loop); nothing waits on the loop by
a control edge and no fetch is one of its outputs.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import operator
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.python.framework import function_def_to_graph, op_def_registry

from tftrt_py.convert.graph import GraphView, split_ref

__all__ = ["unroll_loops", "MAX_ITERATIONS", "MAX_NODES"]

logger = logging.getLogger(__name__)

#: Loops that would run more often stay loops (each iteration's copy is compiled into the engine).
MAX_ITERATIONS = 512
#: Loops whose copies would hold more nodes stay loops (conversion time grows with the nodes).
MAX_NODES = 20_000

WHILE_OPS = frozenset({"While", "StatelessWhile"})
#: Ops a body may not hold: their effect is not the same op run once per copy.
REFUSED_OPS = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
                         "PartitionedCall", "StatefulPartitionedCall"})

#: Ops computed here when every input is known (loop counters and their conditions).
EVALUATED: Dict[str, Callable] = {
    "AddV2": operator.add, "Add": operator.add, "Sub": operator.sub, "Mul": operator.mul,
    "Maximum": np.maximum, "Minimum": np.minimum, "FloorMod": np.mod, "FloorDiv": np.floor_divide,
    "Less": np.less, "LessEqual": np.less_equal, "Greater": np.greater, "GreaterEqual": np.greater_equal,
    "Equal": np.equal, "NotEqual": np.not_equal, "LogicalAnd": np.logical_and, "LogicalOr": np.logical_or,
    "LogicalNot": np.logical_not, "Identity": lambda x: x,
}
#: dtypes a known value may have (counters, bounds and conditions).
KNOWN_DTYPES = (tf.int32.as_datatype_enum, tf.int64.as_datatype_enum, tf.bool.as_datatype_enum)


class _Refused(Exception):
    """Why a loop stays a loop."""


@dataclasses.dataclass(frozen=True)
class _Known:
    """An int or bool value computed here: a counter, a bound, a condition, an index or shape constant."""
    value: np.ndarray


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """A tensor of the graph: "node:index"."""
    ref: str


@dataclasses.dataclass(frozen=True)
class _Unstacked:
    """A TensorList made by TensorListFromTensor: the rows of tensor `ref`."""
    ref: str


@dataclasses.dataclass(frozen=True)
class _Slots:
    """A TensorList made by TensorListReserve: what each slot holds so far (None: unset)."""
    items: tuple


_Value = Union[_Known, _Tensor, _Unstacked, _Slots]


def unroll_loops(graph_def, fetches: Sequence[str] = ()) -> int:
    """Unroll every loop of `graph_def` that qualifies (see the module's docstring), in place (nodes are not copied:
    they may hold weights); how many were."""
    names = [n.name for n in graph_def.node if n.op in WHILE_OPS]
    library = {f.signature.name: f for f in graph_def.library.function}
    unrolled = 0
    for name in names:
        try:
            iterations = _Unroller(graph_def, name, library, {split_ref(f)[0] for f in fetches}).apply()
        except _Refused as why:
            logger.info("loop %s stays a loop: %s", name, why)
            continue
        except Exception as exc:  # a structure this module does not know: the loop stays, as TensorFlow runs it
            logger.warning("loop %s stays a loop: unrolling it failed: %s: %s", name, type(exc).__name__, exc)
            continue
        logger.info("loop %s unrolled (%d iterations)", name, iterations)
        unrolled += 1
    return unrolled


class _Unroller:
    """One loop of a graph, unrolled in place by apply() (or _Refused, the graph unchanged)."""

    def __init__(self, graph_def, name: str, library, fetch_nodes):
        self.nodes = {n.name: n for n in graph_def.node}
        self.source, self.loop, self.library = graph_def, self.nodes[name], library
        self.fetch_nodes = fetch_nodes
        if name in fetch_nodes:
            raise _Refused("one of its outputs is fetched")
        if any(ref.startswith("^") for ref in self.loop.input):
            raise _Refused("it waits on control inputs")
        self.emitted: List[node_def_pb2.NodeDef] = []
        self.taken = set(self.nodes)
        self.body = self._function("body")
        self.cond = self._function("cond")

    def _function(self, attr: str):
        fdef = self.library.get(self.loop.attr[attr].func.name)
        if fdef is None:
            raise _Refused(f"its {attr} function is not in the graph's library")
        graph, flat = function_def_to_graph.function_def_to_graph_def(fdef)
        for node in graph.node:
            if node.op in REFUSED_OPS or node.op in self.library:
                raise _Refused(f"its {attr} calls {node.op} ({node.name})")
            op_def = op_def_registry.get(node.op)
            if op_def is None or (op_def.is_stateful and node.op != "Placeholder"):
                raise _Refused(f"its {attr} holds the stateful op {node.op} ({node.name})")
        args = [a.name for a in fdef.signature.input_arg]
        rets = [_ref(flat[fdef.ret[a.name]]) for a in fdef.signature.output_arg]
        return _Function(graph, args, rets)

    # -- the unrolled graph -------------------------------------------------------------------------------
    def apply(self) -> int:
        """Unroll the loop into the graph; how many iterations it had. Nothing changes where it is refused."""
        values = [self._initial(ref) for ref in self.loop.input]
        size = sum(n.op != "Placeholder" for n in self.body.graph.node)
        limit = min(MAX_ITERATIONS, MAX_NODES // max(1, size))
        iteration = 0
        while self._condition(values):
            if iteration == limit:
                raise _Refused(f"it runs more than {limit} times ({size} nodes a body)")
            values = self._iterate(values, iteration)
            iteration += 1
        self._rewire(values)
        return iteration

    def _initial(self, ref: str) -> _Value:
        """The value a loop input starts with."""
        name, index = split_ref(ref)
        node = self.nodes[name]
        if node.op == "Const" and node.attr["dtype"].type in KNOWN_DTYPES and \
                not node.attr["value"].tensor.tensor_shape.dim:
            return _Known(tf.make_ndarray(node.attr["value"].tensor))
        if node.op == "TensorListFromTensor":
            return _Unstacked(_ref(node.input[0]))
        if node.op == "TensorListReserve":
            count = self.nodes.get(split_ref(node.input[1])[0])
            if count is None or count.op != "Const":
                raise _Refused(f"its list {name} reserves a number of slots not known before it runs")
            return _Slots((None,) * int(tf.make_ndarray(count.attr["value"].tensor)))
        if node.op.startswith(("TensorList", "EmptyTensorList")):
            raise _Refused(f"its input {name} is a {node.op}")
        return _Tensor(_ref(ref, index))

    def _condition(self, values: List[_Value]) -> bool:
        env = dict(zip(self.cond.args, values))
        found = self._known(self.cond, self.cond.rets[0], env, {})
        if found is None:
            raise _Refused("its condition depends on values known only when it runs")
        return bool(found.value)

    def _known(self, function, ref: str, args, memo) -> Optional[_Known]:
        """The known value of `ref` in `function` (its args bound to `args`), or None."""
        name, index = split_ref(ref)
        if name in args:
            value = args[name]
            return value if isinstance(value, _Known) else None
        if ref in memo:
            return memo[ref]
        node = function.node(name)
        if node.op == "Const":
            found = _Known(tf.make_ndarray(node.attr["value"].tensor)) \
                if node.attr["dtype"].type in KNOWN_DTYPES else None
        elif node.op in EVALUATED and index == 0:
            inputs = [self._known(function, _ref(r), args, memo) for r in node.input if not r.startswith("^")]
            found = None if None in inputs else _Known(np.asarray(EVALUATED[node.op](*[v.value for v in inputs])))
        else:
            found = None
        memo[ref] = found
        return found

    def _iterate(self, values: List[_Value], iteration: int) -> List[_Value]:
        """One copy of the body on `values`; the loop's values after it."""
        env: Dict[str, _Value] = {}  # body tensor ref -> its value in this copy
        for arg, value in zip(self.body.args, values):
            env[f"{arg}:0"] = value
        prefix = self._prefix(iteration)
        for node in self.body.ordered:
            if node.op in ("Placeholder", "NoOp"):
                continue
            inputs = [env[_ref(r)] for r in node.input if not r.startswith("^")]
            if node.op.startswith("TensorList"):
                env[f"{node.name}:0"] = self._list_op(node, inputs, prefix)
            elif node.op == "Identity":
                env[f"{node.name}:0"] = inputs[0]
            elif node.op == "Const" and node.attr["dtype"].type in KNOWN_DTYPES:
                env[f"{node.name}:0"] = _Known(tf.make_ndarray(node.attr["value"].tensor))
            elif node.op in EVALUATED and inputs and all(isinstance(v, _Known) for v in inputs):
                env[f"{node.name}:0"] = _Known(np.asarray(EVALUATED[node.op](*[v.value for v in inputs])))
            else:
                copy = self._emit(node, prefix + node.name,
                                  [self._tensor(v, f"{prefix}{node.name}/input_{k}") for k, v in enumerate(inputs)])
                for i in range(_output_count(node)):
                    env[f"{node.name}:{i}"] = _Tensor(f"{copy}:{i}")
        return [env[ref] for ref in self.body.rets]

    def _list_op(self, node, inputs: List[_Value], prefix: str) -> _Value:
        """A TensorList op of the body on known lists and indices."""
        if node.op == "TensorListGetItem" and isinstance(inputs[0], _Unstacked) and isinstance(inputs[1], _Known):
            i = int(inputs[1].value)
            dtype = node.attr["element_dtype"]
            consts = [self._const(np.asarray([v], np.int32), f"{prefix}{node.name}/{part}")
                      for part, v in (("begin", i), ("end", i + 1), ("strides", 1))]
            sliced = node_def_pb2.NodeDef(op="StridedSlice")
            sliced.attr["T"].CopyFrom(dtype)
            sliced.attr["Index"].type = tf.int32.as_datatype_enum
            sliced.attr["shrink_axis_mask"].i = 1  # the other masks: 0, their default
            return _Tensor(f"{self._emit(sliced, prefix + node.name, [inputs[0].ref] + consts)}:0")
        if node.op == "TensorListSetItem" and isinstance(inputs[0], _Slots) and isinstance(inputs[1], _Known):
            i, items = int(inputs[1].value), list(inputs[0].items)
            if not 0 <= i < len(items):
                raise _Refused(f"{node.name} sets slot {i} of a list of {len(items)}")
            items[i] = self._tensor(inputs[2], f"{prefix}{node.name}/item")
            return _Slots(tuple(items))
        raise _Refused(f"{node.name} ({node.op}) uses a list or an index not known before the loop runs")

    def _rewire(self, values: List[_Value]) -> None:
        """The loop's readers read `values` (its final values) and the loop goes; refused before any change."""
        finals: Dict[str, str] = {}
        replaced: Dict[str, node_def_pb2.NodeDef] = {}
        for node in self.source.node:
            for ref in node.input:
                if ref == "^" + self.loop.name:
                    raise _Refused(f"{node.name} waits on it by a control edge")
                name, index = split_ref(ref)
                if name != self.loop.name:
                    continue
                value = values[index]
                if isinstance(value, _Slots) and node.op == "TensorListStack" and ref == node.input[0]:
                    replaced[node.name] = self._stacked(node, value)
                elif isinstance(value, (_Slots, _Unstacked)):
                    raise _Refused(f"{node.name} ({node.op}) reads one of its lists")
                else:
                    finals[ref] = self._tensor(value, f"{self.loop.name}/final_{index}")
        candidates = {n.name for n in self.emitted} | _producers(self.source, self.loop) | \
            {split_ref(r.lstrip("^"))[0] for name in replaced for r in self.nodes[name].input}
        for i in reversed(range(len(self.source.node))):
            node = self.source.node[i]
            if node.name == self.loop.name:
                del self.source.node[i]
            elif node.name in replaced:
                node.CopyFrom(replaced[node.name])
            elif any(ref in finals for ref in node.input):
                node.input[:] = [finals.get(ref, ref) for ref in node.input]
        self.source.node.extend(self.emitted)
        _remove_dead(self.source, candidates, self.fetch_nodes)

    def _stacked(self, stack, value: _Slots):
        """A Pack of the slots in place of `stack` (a TensorListStack of the loop's list)."""
        if not value.items or None in value.items:
            raise _Refused(f"{stack.name} stacks a list whose slots are not all set")
        pack = node_def_pb2.NodeDef(name=stack.name, op="Pack", device=stack.device)
        pack.input.extend(value.items)
        pack.input.extend(r for r in stack.input if r.startswith("^"))
        pack.attr["T"].CopyFrom(stack.attr["element_dtype"])
        pack.attr["N"].i = len(value.items)  # axis: 0, its default
        return pack

    # -- emitting nodes ---------------------------------------------------------------------------------------
    def _prefix(self, iteration: int) -> str:
        return f"{self.loop.name}/unrolled_{iteration}/"

    def _emit(self, node, name: str, inputs: List[str]) -> str:
        """A copy of `node` named `name` (or a free variant) reading `inputs`, without control inputs."""
        while name in self.taken:
            name += "_"
        self.taken.add(name)
        new = node_def_pb2.NodeDef(name=name, op=node.op, device=self.loop.device)
        new.input.extend(inputs)
        for key, value in node.attr.items():
            if key != "_output_shapes":
                new.attr[key].CopyFrom(value)
        self.emitted.append(new)
        return name

    def _const(self, value: np.ndarray, name: str) -> str:
        const = node_def_pb2.NodeDef(op="Const")
        const.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
        const.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
        return f"{self._emit(const, name, [])}:0"

    def _tensor(self, value: _Value, name: str) -> str:
        """A graph tensor holding `value` (a known one: a Const named `name`)."""
        if isinstance(value, _Tensor):
            return value.ref
        if isinstance(value, _Known):
            return self._const(value.value, name)
        raise _Refused("a list is read as a tensor")


@dataclasses.dataclass
class _Function:
    """A loop's cond or body as a graph: its args' Placeholders and its results' refs."""
    graph: graph_pb2.GraphDef
    args: List[str]
    rets: List[str]

    def node(self, name: str):
        return next(n for n in self.graph.node if n.name == name)

    @functools.cached_property
    def ordered(self) -> List[node_def_pb2.NodeDef]:
        """The nodes, each after its inputs."""
        return [view.def_ for view in GraphView(self.graph).topological_order()]


def _ref(ref: str, index: Optional[int] = None) -> str:
    """`ref` as "node:index"."""
    name, port = split_ref(ref)
    return f"{name}:{port if index is None else index}"


def _output_count(node) -> int:
    """How many outputs `node` has (its op's output args, list-typed ones by their attrs)."""
    op_def = op_def_registry.get(node.op)
    count = 0
    for arg in op_def.output_arg:
        if arg.number_attr:
            count += node.attr[arg.number_attr].i
        elif arg.type_list_attr:
            count += len(node.attr[arg.type_list_attr].list.type)
        else:
            count += 1
    return count


def _producers(graph_def, loop) -> set:
    """The nodes the loop reads from, transitively."""
    nodes = {n.name: n for n in graph_def.node}
    seen, queue = set(), [split_ref(r.lstrip("^"))[0] for r in loop.input]
    while queue:
        name = queue.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        queue.extend(split_ref(r.lstrip("^"))[0] for r in nodes[name].input)
    return seen


def _remove_dead(graph_def, candidates: set, keep: set) -> None:
    """Remove from `graph_def` the `candidates` nothing reads (repeatedly), but those in `keep`, stateful ops and
    placeholders."""
    nodes = {n.name: n for n in graph_def.node}
    readers: Dict[str, int] = dict.fromkeys(nodes, 0)
    for node in graph_def.node:
        for ref in node.input:
            source = split_ref(ref.lstrip("^"))[0]
            readers[source] = readers.get(source, 0) + 1
    dead, queue = set(), [n for n in candidates if n in nodes]
    while queue:
        name = queue.pop()
        node = nodes[name]
        op_def = op_def_registry.get(node.op)
        if name in dead or name in keep or readers[name] or node.op == "Placeholder" or op_def is None or \
                op_def.is_stateful:
            continue
        dead.add(name)
        for ref in node.input:
            source = split_ref(ref.lstrip("^"))[0]
            if source in nodes:
                readers[source] -= 1
                if source in candidates:
                    queue.append(source)
    for i in reversed(range(len(graph_def.node))):
        if graph_def.node[i].name in dead:
            del graph_def.node[i]
