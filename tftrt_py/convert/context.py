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
from tftrt_py.engine import layers as layer_kinds
from tftrt_py.engine.backends.numpy_backend import NumpyBackend
from tftrt_py.engine.errors import NetworkError
from tftrt_py.engine.network import Layer, Network, Tensor, dtype_name

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
    """A constant operand known at build time (from a Const node or folded shape arithmetic).

    `batch_source`: the engine tensor whose shape (so, whose batch size) the value was computed from,
    if any; see :meth:`ConversionContext.as_tensor`.
    """

    def __init__(self, value, batch_source: Optional[Tensor] = None):
        self.value = np.asarray(value)
        self.batch_source = batch_source

    @classmethod
    def derived(cls, value, *operands) -> "Weights":
        """Weights computed from `operands`, keeping the batch source of the first operand that has one."""
        return cls(value, next((v.batch_source for v in operands if isinstance(v, Weights) and v.batch_source
                                is not None), None))

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

    def __init__(self, graph: GraphView, native: Optional[AbstractSet[str]] = None, precision: str = "FP32"):
        self.graph = graph
        self.native = native if native is not None else set()
        self.precision = precision.upper()  # the conversion's precision_mode (quantization ops need INT8)
        self._static: Dict[str, bool] = {}

    def input_infos(self, node: NodeView) -> List[InputInfo]:
        return [InputInfo(self.graph.dtype(r), self.graph.shape(r), self.const_value(r), self.is_static(r))
                for r in node.inputs]

    def const_value(self, ref: str) -> Optional[np.ndarray]:
        """The value of `ref` when it is a Const, possibly through pass-through ops (a frozen variable's
        Identity), else None."""
        from tftrt_py.convert.ops.identity import PASS_THROUGH

        name, port = split_ref(ref)
        node = self.graph.nodes[name]
        while node.op in PASS_THROUGH and node.name not in self.native and port < len(node.inputs):
            name, port = split_ref(node.inputs[port])
            node = self.graph.nodes[name]
        return self.graph.const_value(tensor_ref(name, port))

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
        self.precision = precision.upper()
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
            array = value.value
            if array.dtype == np.int64 and np.all(np.abs(array) < 2 ** 31):  # engines compute in int32
                array = array.astype(np.int32)
            tensor = self.network.add_constant(array, name=name)
            if value.batch_source is not None:
                tensor = self._pin_to_batch(tensor, value.batch_source, name)
            self._constants[key] = tensor
        return self._constants[key]

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
            folded = fold_layer(kind, [v.value for v in inputs], params, weights, name=base)
            return [Weights.derived(w.value, *inputs) for w in folded]
        tensors = [self.as_tensor(v, name=f"{base}/const{i}") for i, v in enumerate(inputs)]
        return self.network.add_layer(kind, tensors, params, weights, name=base).outputs

    def set_outputs(self, node: NodeView, values: Sequence[Value]) -> None:
        for i, v in enumerate(values):
            self.values[tensor_ref(node.name, i)] = v


def fold_layer(kind: str, values: Sequence[np.ndarray], params=None, weights=None, name: str = "fold") -> List[Weights]:
    """The outputs of one `kind` layer over constant `values`, computed by the numpy backend.

    The layer is checked by its kind's shape rule but joins no network (0-d values keep their shape).
    """
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
    outs = NumpyBackend().run_layer(layer, values)
    return [Weights(np.asarray(o).astype(t.dtype, copy=False).reshape(t.shape)) for o, t in zip(outs, layer.outputs)]
