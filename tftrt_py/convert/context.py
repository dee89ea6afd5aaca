"""What converters see: a ValidationContext while segmenting, a ConversionContext while building.

Both answer ``input_infos(node)`` (dtype, shape, constant value per data input, and whether
the value is known when building) so one ``validate`` serves both. Shapes may hold None while
segmenting; they are concrete while building, when every engine tensor has a known shape. So
shape-derived values (Shape, then int32 arithmetic on it) are constants while building: a layer
whose inputs are all constants is folded in numpy into :class:`Weights` instead of being added.
"""
from __future__ import annotations

import dataclasses
from typing import AbstractSet, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from tftrt_py.convert.graph import GraphView, NodeView, split_ref, tensor_ref
from tftrt_py.engine.backends.numpy_backend import NumpyBackend
from tftrt_py.engine.network import Network, Tensor

__all__ = ["InputInfo", "Weights", "ValidationContext", "ConversionContext", "fold_layer"]


@dataclasses.dataclass(frozen=True)
class InputInfo:
    dtype: str
    shape: Optional[Tuple[Optional[int], ...]]  # None: unknown rank
    value: Optional[np.ndarray] = None  # set when the input is a constant
    static: bool = False  # the value is known when building (a constant or computed from constants/shapes)

    @property
    def rank(self) -> Optional[int]:
        return None if self.shape is None else len(self.shape)


class Weights:
    """A constant operand known at build time (from a Const node or folded shape arithmetic)."""

    def __init__(self, value):
        self.value = np.asarray(value)

    @property
    def dtype(self) -> str:
        return self.value.dtype.name

    @property
    def shape(self) -> Tuple[int, ...]:
        return self.value.shape

    @property
    def rank(self) -> int:
        return self.value.ndim


Value = Union[Tensor, Weights]


class ValidationContext:
    """Answers converter questions from a GraphView (static shapes, Const producers).

    `native` holds the nodes known to stay out of the engines (the segmenter adds them as it
    classifies nodes in topological order): their outputs reach an engine as run-time tensors,
    so nothing computed from them is known when building.
    """

    def __init__(self, graph: GraphView, native: Optional[AbstractSet[str]] = None):
        self.graph = graph
        self.native = native if native is not None else set()
        self._static: Dict[str, bool] = {}

    def input_infos(self, node: NodeView) -> List[InputInfo]:
        return [InputInfo(self.graph.dtype(r), self.graph.shape(r), self.graph.const_value(r), self.is_static(r))
                for r in node.inputs]

    def is_static(self, ref: str) -> bool:
        """Whether the tensor `ref` is known when building: a Const, the output of a converter with
        ``static_outputs`` (Shape, Size, Rank), or a convertible node whose inputs are all known."""
        from tftrt_py.convert.ops.registry import find_converter

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
        self.precision = precision
        self.values: Dict[str, Value] = {}
        self._constants: Dict[int, Tensor] = {}

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
            self._constants[key] = self.network.add_constant(value.value, name=name)
        return self._constants[key]

    def add_layer(self, kind: str, inputs: Sequence[Value], params=None, weights=None, node: NodeView = None,
                  suffix: str = "") -> List[Value]:
        """Add a layer named after `node` (plus `suffix`); Weights operands become Constant layers.

        When every operand is Weights the layer is not added: its outputs are computed now, in
        numpy, and returned as Weights (so shape arithmetic stays readable by later converters).
        """
        base = (node.name if node is not None else kind) + suffix
        if inputs and all(isinstance(v, Weights) for v in inputs):
            return fold_layer(kind, [v.value for v in inputs], params, weights, name=base)
        tensors = [self.as_tensor(v, name=f"{base}/const{i}") for i, v in enumerate(inputs)]
        return self.network.add_layer(kind, tensors, params, weights, name=base).outputs

    def set_outputs(self, node: NodeView, values: Sequence[Value]) -> None:
        for i, v in enumerate(values):
            self.values[tensor_ref(node.name, i)] = v


def fold_layer(kind: str, values: Sequence[np.ndarray], params=None, weights=None, name: str = "fold") -> List[Weights]:
    """The outputs of one `kind` layer over constant `values`, computed by the numpy backend."""
    scratch = Network(name)
    layer = scratch.add_layer(kind, [scratch.add_constant(v) for v in values], params, weights, name=name)
    outs = NumpyBackend().run_layer(layer, [np.asarray(v) for v in values])
    return [Weights(np.asarray(o).astype(t.dtype, copy=False).reshape(t.shape)) for o, t in zip(outs, layer.outputs)]
