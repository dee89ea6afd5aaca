"""What converters see: a ValidationContext while segmenting, a ConversionContext while building.

Both answer ``input_infos(node)`` (dtype, shape, constant value per data input, and whether
the value is known when building) so one ``validate`` serves both. Shapes may hold None while
segmenting; they are concrete while building, when every engine tensor has a known shape. So
shape-derived values (Shape, then int32 arithmetic on it) are constants while building: a layer
whose inputs are all constants is folded in numpy into :class:`Weights` instead of being added.
"""
from __future__ import annotations

from typing import AbstractSet, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.convert.graph import GraphView, NodeView, split_ref, tensor_ref
from tftrt_py.convert.ops import find_converter
from tftrt_py.convert.ops.identity import PASS_THROUGH
from tftrt_py.convert.values import InputInfo, Value, Weights
from tftrt_py.engine import layers as layer_kinds
from tftrt_py.engine.backends.numpy_backend import NumpyBackend
from tftrt_py.engine.errors import NetworkError
from tftrt_py.engine.network import Layer, Network, Tensor
from tftrt_py.engine.types import dtype_name

__all__ = ["ValidationContext", "ConversionContext"]


class ValidationContext:
    """Answers converter questions from a GraphView (static shapes, Const producers).

    `native` holds the nodes known to stay out of the engines (the segmenter adds them as it
    classifies nodes in topological order): their outputs reach an engine as run-time tensors,
    so nothing computed from them is known when building.
    """

    def __init__(self, graph: GraphView, native: Optional[AbstractSet[str]] = None, precision: str = "FP32"):
        self.graph = graph
        self.native = native if native is not None else set()
        self.precision = precision  # the conversion's precision, one of PRECISIONS (quantization ops need INT8)
        self._static: Dict[str, bool] = {}

    def input_infos(self, node: NodeView) -> List[InputInfo]:
        return [InputInfo(self.graph.dtype(r), self.graph.shape(r), self.const_value(r), self.is_static(r))
                for r in node.inputs]

    def const_value(self, ref: str) -> Optional[np.ndarray]:
        """The value of `ref` when it is a Const, possibly through pass-through ops (a frozen variable's
        Identity), else None."""
        name, port = split_ref(ref)
        node = self.graph.nodes[name]
        while node.op in PASS_THROUGH and node.name not in self.native and port < len(node.inputs):
            name, port = split_ref(node.inputs[port])
            node = self.graph.nodes[name]
        return self.graph.const_value(tensor_ref(name, port))

    def is_static(self, ref: str) -> bool:
        """Whether the tensor `ref` is known when building: a Const, the output of a converter with
        ``static_outputs`` (Shape, Size, Rank), or a convertible node whose inputs are all known."""
        stack = [split_ref(ref)[0]]
        while stack:
            name = stack[-1]
            if name in self._static:
                stack.pop()
                continue
            node = self.graph.nodes[name]
            converter = None if node.name in self.native else find_converter(node.op)
            if node.op == "Const" or getattr(converter, "static_outputs", False):
                self._static[name] = True
            elif converter is None or not node.inputs:
                self._static[name] = False
            else:
                pending = [p for p in (split_ref(r)[0] for r in node.inputs) if p not in self._static]
                if pending:
                    stack.extend(pending)
                    continue
                self._static[name] = all(self._static[split_ref(r)[0]] for r in node.inputs)
            stack.pop()
        return self._static[split_ref(ref)[0]]

    def output_shape(self, node: NodeView, port: int = 0):
        return self.graph.shape(tensor_ref(node.name, port))


class ConversionContext:
    """Holds the network being defined and the value (Tensor or Weights) of every TF tensor."""

    def __init__(self, network: Network, precision: str = "FP32"):
        self.network = network
        self.precision = precision  # one of PRECISIONS
        self.values: Dict[str, Value] = {}
        self._constants: Dict[int, Tuple[Weights, Tensor]] = {}
        self._row_conditions: Dict[Tuple[str, int], Tensor] = {}  # (source, rank) -> its rows' Select condition

    # -- reading ------------------------------------------------------------
    def inputs(self, node: NodeView) -> List[Value]:
        try:
            return [self.values[tensor_ref(*split_ref(r))] for r in node.inputs]
        except KeyError as exc:
            raise KeyError(f"{node.name}: input {exc} has not been converted") from None

    def input_infos(self, node: NodeView) -> List[InputInfo]:
        return [InputInfo(v.dtype, tuple(v.shape), v.value if isinstance(v, Weights) else None,
                          isinstance(v, Weights)) for v in self.inputs(node)]

    def output_shape(self, node: NodeView, port: int = 0):
        return None

    # -- writing ------------------------------------------------------------
    def as_tensor(self, value: Value, name: str = "const") -> Tensor:
        """An engine tensor for `value` (a Constant layer for Weights, created once per Weights)."""
        if isinstance(value, Tensor):
            return value
        key = id(value)
        if key not in self._constants:
            array = value.value
            if value.rows:
                row = self.network.add_constant(array[:1], name=name)
                tensor = self._broadcast_rows(row, value.batch_source, name)
            else:
                tensor = self.network.add_constant(array, name=name)
                if value.batch_source is not None:
                    tensor = self._pin_to_batch(tensor, value.batch_source, name)
            self._constants[key] = (value, tensor)  # holding `value` keeps its id from being reused
        return self._constants[key][1]

    def _broadcast_rows(self, row: Tensor, source: Tensor, name: str) -> Tensor:
        """`row` ([1, ...]) repeated along dim 0 of `source`, row by row.

        Select(c, row, row) is `row` whatever c holds; c has one entry per row of `source` (its
        first column), so the result follows the source's batch and the engine stays row-wise::

            source -> Slice(first column) -> Shuffle([n, 1, ...]) -> Identity(bool) --.
                                                                  row, row -> Select -> [n, ...]
        """
        n = source.shape[0]
        # A network input of the same rows serves as well (in a row-wise engine every input's dim 0 is the
        # batch): reading it rather than an intermediate keeps that intermediate's readers to the layers that
        # use its values (a fusion such as attention's needs its scores read once).
        source = next((t for t in self.network.inputs if t.rank and t.shape[0] == n), source)
        key = (source.name, row.rank)
        if key not in self._row_conditions:
            net, rank = self.network, source.rank
            column = source
            if rank > 1:
                column = net.add_layer("Slice", [column], {"start": [0] * rank, "size": [n] + [1] * (rank - 1),
                                                           "stride": [1] * rank}, name=f"{name}/rows_column").outputs[0]
            if column.shape != (n,) + (1,) * (row.rank - 1):
                column = net.add_layer("Shuffle", [column], {"reshape": [n] + [1] * (row.rank - 1)},
                                       name=f"{name}/rows_reshape").outputs[0]
            if column.dtype != "bool":
                column = net.add_layer("Identity", [column], {"dtype": "bool"}, name=f"{name}/rows_bool").outputs[0]
            self._row_conditions[key] = column
        return self.network.add_layer("Select", [self._row_conditions[key], row, row], name=f"{name}/rows").outputs[0]

    def _pin_to_batch(self, const: Tensor, source: Tensor, name: str) -> Tensor:
        """`const`, computed from the batch size of `source`, made to depend on one row of `source`.

        An engine built for batch B serves smaller batches when it is row-wise; a constant holding B
        would then be wrong. Select(true, const, row) is `const` exactly, and the one-row Slice of
        `source` it reads is not row-wise, so the engine serves only the batch it was built for::

            source -> Slice(first row) -> Shuffle([1] * rank) --.
                                        const, true -> Select -> const
        """
        net, rank = self.network, len(source.shape)
        row = net.add_layer("Slice", [source], {"start": [0] * rank, "size": [1] * rank, "stride": [1] * rank},
                            name=f"{name}/batch_pin_row").outputs[0]
        row = net.add_layer("Shuffle", [row], {"reshape": [1] * len(const.shape)},
                            name=f"{name}/batch_pin_reshape").outputs[0]
        true = net.add_constant(np.ones(const.shape, np.bool_), name=f"{name}/batch_pin_true")
        return net.add_layer("Select", [true, const, row], name=f"{name}/batch_pin").outputs[0]

    def add_layer(self, kind: str, inputs: Sequence[Value], params=None, weights=None, node: NodeView = None,
                  suffix: str = "") -> List[Value]:
        """Add a layer named after `node` (plus `suffix`); Weights operands become Constant layers.

        When every operand is Weights the layer is not added: its outputs are computed now, in
        numpy, and returned as Weights (so shape arithmetic stays readable by later converters).
        """
        base = (node.name if node is not None else kind) + suffix
        if inputs and all(isinstance(v, Weights) for v in inputs):
            layer = _folded_layer(kind, [v.value for v in inputs], params, weights, name=base)
            outs = _run_folded(layer, [v.value for v in inputs])
            return [Weights(o, **form) for o, form in zip(outs, _batch_forms(layer, inputs))]
        tensors = [self.as_tensor(v, name=f"{base}/const{i}") for i, v in enumerate(inputs)]
        return self.network.add_layer(kind, tensors, params, weights, name=base).outputs

    def set_outputs(self, node: NodeView, values: Sequence[Value]) -> None:
        for i, v in enumerate(values):
            self.values[tensor_ref(node.name, i)] = v


#: Layer kinds that only move entries, by the operands whose entries they move (None: all)
_MOVES = {"Shuffle": None, "Slice": None, "Concatenation": None, "Gather": (0,), "Identity": None}


def _batch_forms(layer: Layer, inputs: Sequence[Weights]) -> List[dict]:
    """How each output of `layer`, folded over `inputs`, depends on the batch (see :class:`Weights`).

    Rows stay rows through a layer that is row-wise for them and keeps their dim 0; batch entries
    follow layers that only move entries; anything else computed from the batch is pinned.
    """
    dependent = [v for v in inputs if v.batch_source is not None]
    if not dependent:
        return [{}] * len(layer.outputs)
    source = dependent[0].batch_source
    n = source.shape[0]
    if all(v.batch_source.shape[0] == n for v in dependent):
        if all(v.rows for v in dependent) and all(t.rank and t.shape[0] == n for t in layer.outputs) and \
                layer_kinds.get(layer.kind).rowwise(layer, [v.rows for v in inputs]):
            return [{"batch_source": source, "rows": True}] * len(layer.outputs)
        if all(v.entries is not None for v in dependent):
            entries = _moved_entries(layer, inputs)
            if entries is not None:
                return [{"batch_source": source, "entries": e} for e in entries]
    return [{"batch_source": source}] * len(layer.outputs)


def _moved_entries(layer: Layer, inputs: Sequence[Weights]) -> Optional[List[np.ndarray]]:
    """Where the batch entries of `inputs` land in the outputs of `layer`, or None when it does more than move
    them (an integer cast keeps them)."""
    if layer.kind not in _MOVES:
        return None
    moved = range(len(inputs)) if _MOVES[layer.kind] is None else _MOVES[layer.kind]
    if any(v.batch_source is not None for i, v in enumerate(inputs) if i not in moved):
        return None
    if layer.kind == "Identity":
        return [inputs[0].entries] if np.dtype(layer.outputs[0].dtype).kind in "iu" else None
    masks = [v.depends() if i in moved else v.value for i, v in enumerate(inputs)]
    return _run_folded(_folded_layer(layer.kind, masks, layer.params, layer.weights, name=layer.name), masks)


def _folded_layer(kind: str, values: Sequence[np.ndarray], params, weights, name: str) -> Layer:
    """A `kind` layer over constant `values`, its outputs inferred by the kind's shape rule (no network)."""
    values = [np.asarray(v) for v in values]
    layer = Layer(name, kind, [Tensor(f"{name}/in{i}", dtype_name(v.dtype), v.shape) for i, v in enumerate(values)],
                  [], dict(params or {}), dict(weights or {}))
    try:
        infos = layer_kinds.get(kind).infer(layer)
    except NetworkError:
        raise
    except Exception as exc:  # the shape rule rejected the operands
        raise NetworkError(f"layer {name!r} ({kind}): {exc}") from exc
    layer.outputs = [Tensor(f"{name}:{i}", dtype_name(d), tuple(int(x) for x in s)) for i, (d, s) in enumerate(infos)]
    return layer


def _run_folded(layer: Layer, values: Sequence[np.ndarray]) -> List[np.ndarray]:
    """The outputs of a folded layer over `values`, computed by the numpy backend."""
    outs = NumpyBackend().run_layer(layer, [np.asarray(v) for v in values])
    return [np.asarray(o).astype(t.dtype, copy=False).reshape(t.shape) for o, t in zip(outs, layer.outputs)]
