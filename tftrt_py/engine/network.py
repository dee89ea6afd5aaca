"""The engine's network IR: tensors, layers and the network that holds them.

A Network is a DAG of Layers over named Tensors, like TensorRT's INetworkDefinition.
Every layer is created through :meth:`Network.add_layer`, which gives it a unique
name and infers its outputs' shapes and dtypes from the layer kind's rule
(:mod:`tftrt_py.engine.layers`). Shapes are concrete: a network is defined for the
input shapes an engine is built for.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.engine import layers as layer_kinds
from tftrt_py.engine.errors import NetworkError
from tftrt_py.engine.types import dtype_name

__all__ = ["Tensor", "Layer", "Network"]

@dataclasses.dataclass
class Tensor:
    """A value flowing between layers: its name, dtype name and concrete shape."""

    name: str
    dtype: str
    shape: Tuple[int, ...]
    producer: Optional["Layer"] = dataclasses.field(default=None, repr=False, compare=False)
    #: Symmetric INT8 dynamic range (max abs value), when known.
    dynamic_range: Optional[float] = None

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclasses.dataclass(eq=False)
class Layer:
    """One operation: a kind (see engine.layers), inputs, outputs, JSON params and weights.

    Layers compare by identity: a network holds each once, and finding one in a list must not compare
    weights."""

    name: str
    kind: str
    inputs: List[Tensor]
    outputs: List[Tensor]
    params: Dict[str, Any]
    weights: Dict[str, np.ndarray]
    precision: Optional[str] = None

    def __repr__(self) -> str:
        ins = ", ".join(t.name for t in self.inputs)
        outs = ", ".join(f"{t.name}{list(t.shape)}" for t in self.outputs)
        return f"<{self.kind} {self.name!r}: ({ins}) -> ({outs})>"


class Network:
    """A DAG of layers. Inputs and outputs are named tensors (the engine's bindings)."""

    def __init__(self, name: str = "network"):
        self.name = name
        self.inputs: List[Tensor] = []
        self.outputs: List[Tensor] = []
        self.layers: List[Layer] = []
        self._names: set = set()
        self._insert_at: Optional[int] = None

    # -- creation ---------------------------------------------------------
    def unique_name(self, base: str) -> str:
        name, i = base, 1
        while name in self._names:
            name = f"{base}_{i}"
            i += 1
        self._names.add(name)
        return name

    def add_input(self, name: str, dtype, shape: Sequence[int]) -> Tensor:
        if any(d is None or d < 0 for d in shape):
            raise NetworkError(f"input {name!r} has unknown dims {list(shape)}; an engine is built for concrete shapes")
        tensor = Tensor(self.unique_name(name), dtype_name(dtype), tuple(int(d) for d in shape))
        self.inputs.append(tensor)
        return tensor

    def add_layer(self, kind: str, inputs: Sequence[Tensor], params: Optional[Dict[str, Any]] = None,
                  weights: Optional[Dict[str, np.ndarray]] = None, name: Optional[str] = None) -> Layer:
        """Create a layer of `kind`; its output tensors are inferred by the kind's rule."""
        spec = layer_kinds.get(kind)
        layer = Layer(self.unique_name(name or kind), kind, list(inputs), [], dict(params or {}),
                      {k: np.asarray(v, order="C") for k, v in (weights or {}).items()})
        try:
            infos = spec.infer(layer)
        except NetworkError:
            raise
        except Exception as exc:  # shape rule rejected the inputs
            raise NetworkError(f"layer {layer.name!r} ({kind}): {exc}") from exc
        outs = [(f"{layer.name}:{i}", dtype, shape) for i, (dtype, shape) in enumerate(infos)]
        layer.outputs = [Tensor(n, dtype_name(d), tuple(int(x) for x in s), producer=layer) for n, d, s in outs]
        if self._insert_at is None:
            self.layers.append(layer)
        else:
            self.layers.insert(self._insert_at, layer)
            self._insert_at += 1
        return layer

    def add_constant(self, value: np.ndarray, name: str = "const") -> Tensor:
        value = np.asarray(value)
        return self.add_layer("Constant", [], {}, {"value": value}, name=name).outputs[0]

    def mark_output(self, tensor: Tensor, name: Optional[str] = None) -> Tensor:
        """Make `tensor` a network output, optionally under binding `name`."""
        if name is not None and name != tensor.name:
            taken = tensor.producer is None or self.is_output(tensor)
            if taken:  # an input or an existing output keeps its name: bind a copy
                tensor = self.add_layer("Identity", [tensor], name=name).outputs[0]
            self._names.add(name)
            tensor.name = name
        self.outputs.append(tensor)
        return tensor

    @contextlib.contextmanager
    def inserting_before(self, layer: Layer) -> Iterator[None]:
        """New layers go right before `layer` (keeps the list topologically ordered)."""
        saved, self._insert_at = self._insert_at, self.layers.index(layer)
        try:
            yield
        finally:
            self._insert_at = saved

    # -- queries ----------------------------------------------------------
    def consumers(self) -> Dict[str, List[Layer]]:
        """Map tensor name -> layers that read it."""
        users: Dict[str, List[Layer]] = {}
        for layer in self.layers:
            for t in layer.inputs:
                users.setdefault(t.name, []).append(layer)
        return users

    def is_output(self, tensor: Tensor) -> bool:
        return any(t is tensor for t in self.outputs)

    # -- editing ----------------------------------------------------------
    def replace_all_uses(self, old: Tensor, new: Tensor, readers: Optional[Sequence[Layer]] = None) -> None:
        """Point every reader of `old` (layers and network outputs) at `new`; `new` holds the same values,
        so it takes `old`'s INT8 dynamic range when it has none. `readers`, when given, are the layers that
        read `old` (from :meth:`consumers`): only they are rewritten."""
        if new.dynamic_range is None:
            new.dynamic_range = old.dynamic_range
        for layer in self.layers if readers is None else readers:
            layer.inputs = [new if t is old else t for t in layer.inputs]
        self.outputs = [new if t is old else t for t in self.outputs]

    def erase(self, layer: Layer, users: Optional[Dict[str, List[Layer]]] = None) -> None:
        """Remove a layer whose outputs nobody reads. `users`, when given, is the network's current
        :meth:`consumers` map (a caller that keeps one up to date saves recomputing it)."""
        users = self.consumers() if users is None else users
        for t in layer.outputs:
            if users.get(t.name) or self.is_output(t):
                raise NetworkError(f"cannot erase {layer.name!r}: its output {t.name!r} still has users")
        self.layers.remove(layer)

    def lint(self) -> None:
        """Check the invariants passes rely on: topological order, known tensors, unique names."""
        known = {t.name for t in self.inputs}
        names = set()
        for layer in self.layers:
            if layer.name in names:
                raise NetworkError(f"duplicate layer name {layer.name!r}")
            names.add(layer.name)
            for t in layer.inputs:
                if t.name not in known:
                    raise NetworkError(f"layer {layer.name!r} reads {t.name!r} before it is produced")
            known.update(t.name for t in layer.outputs)
        for t in self.outputs:
            if t.name not in known:
                raise NetworkError(f"network output {t.name!r} is not produced by any layer")
