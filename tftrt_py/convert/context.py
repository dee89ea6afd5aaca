"""What converters see: a ValidationContext while segmenting, a ConversionContext while building.

Both answer ``input_infos(node)`` (dtype, shape, constant value per data input) so one
``validate`` serves both. Shapes may hold None while segmenting; they are concrete
while building, when every engine tensor has a known shape.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from tftrt_py.convert.graph import GraphView, NodeView, split_ref, tensor_ref
from tftrt_py.engine.network import Network, Tensor

__all__ = ["InputInfo", "Weights", "ValidationContext", "ConversionContext"]


@dataclasses.dataclass(frozen=True)
class InputInfo:
    dtype: str
    shape: Optional[Tuple[Optional[int], ...]]  # None: unknown rank
    value: Optional[np.ndarray] = None  # set when the input is a constant

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
    """Answers converter questions from a GraphView (static shapes, Const producers)."""

    def __init__(self, graph: GraphView):
        self.graph = graph

    def input_infos(self, node: NodeView) -> List[InputInfo]:
        return [InputInfo(self.graph.dtype(r), self.graph.shape(r), self.graph.const_value(r)) for r in node.inputs]

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
        return [InputInfo(v.dtype, tuple(v.shape), v.value if isinstance(v, Weights) else None)
                for v in self.inputs(node)]

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
                  suffix: str = "") -> List[Tensor]:
        """Add a layer named after `node` (plus `suffix`); Weights operands become Constant layers."""
        base = (node.name if node is not None else kind) + suffix
        tensors = [self.as_tensor(v, name=f"{base}/const{i}") for i, v in enumerate(inputs)]
        return self.network.add_layer(kind, tensors, params, weights, name=base).outputs

    def set_outputs(self, node: NodeView, values: Sequence[Value]) -> None:
        for i, v in enumerate(values):
            self.values[tensor_ref(node.name, i)] = v
