"""Engine networks lowered to ONNX models, layer kind by layer kind (see :mod:`.registry`).

:func:`lower` is the whole lowering: ONNX Runtime runs its models (the backend); other ONNX runtimes can where
they have the few ONNX Runtime contrib ops used (:data:`~.graph.CONTRIB`: fused attention, bias-GELU, INT8 matrix
multiplies to float; OpenVINO 2026.4 compiles BERT-base's FP32 engine). Precisions follow the CPU's: FP16 layers
compute in fp32 on the fp16-rounded weights the builder stored (said once, as TensorRT says of precisions a device
lacks), float16 tensors are widened to float32 where layers read them and rounded back where they are written (so
bindings keep their dtypes); INT8 layers are lowered by :mod:`.int8` (QDQ pairs); FP8 layers compute in fp32
(said once: ORT's CPU has float8 Quantize/DequantizeLinear but no float8 kernels, so emulating FP8 there would only
be slower).
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from tftrt_py.engine.backends.onnxruntime import data, nn, pointwise  # noqa: F401  (register the lowerings)
from tftrt_py.engine.backends.onnxruntime.graph import Graph, compute_dtype, onnx_dtype
from tftrt_py.engine.backends.onnxruntime.int8 import INT8_LOWERINGS
from tftrt_py.engine.backends.onnxruntime.registry import LOWERINGS, NUMPY_KINDS
from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.network import Layer, Network, Tensor

__all__ = ["lower", "lowerable", "LOWERINGS", "NUMPY_KINDS"]

logger = logging.getLogger(__name__)

_said = set()


def _once(key: str, message: str, *args) -> None:
    if key not in _said:
        _said.add(key)
        logger.warning(message, *args)


class _Values:
    """The ONNX value holding each engine tensor (in the tensor's dtype), and its float32 widening."""

    def __init__(self, g: Graph):
        self.g, self.names, self._wide = g, {}, {}

    def read(self, t: Tensor) -> str:
        if t.dtype != compute_dtype(t.dtype):
            if t.name not in self._wide:
                self._wide[t.name] = self.g.cast(self.names[t.name], t.dtype, compute_dtype(t.dtype))
            return self._wide[t.name]
        return self.names[t.name]


def _lower_layer(g: Graph, values: _Values, layer: Layer) -> None:
    fn = (layer.precision == "INT8" and INT8_LOWERINGS.get(layer.kind)) or LOWERINGS.get(layer.kind)
    if fn is None:
        why = NUMPY_KINDS.get(layer.kind, "no lowering is registered for it")
        raise BackendError(f"layer {layer.name!r}: kind {layer.kind!r} has no ONNX lowering ({why})")
    ins = [values.read(t) for t in layer.inputs]
    if layer.precision == "FP16":
        _once("fp16", "FP16 requested: ONNX Runtime's CPU kernels compute FP16 layers in fp32 on their weights "
                      "rounded to fp16 (activations are not rounded; the numpy backend rounds them as the GPU does), "
                      "so outputs differ from FP32 by fp16-sized amounts (1e-4 to 1e-3 relative), not fp32's")
    elif layer.precision == "FP8":
        _once("fp8", "FP8 requested: the CPU runs FP32 (no FP8 kernels on ONNX Runtime's CPU; the numpy backend "
                     "computes FP8 as the GPU does)")
    outs = fn(g, layer, ins)
    for t, out in zip(layer.outputs, outs):
        values.names[t.name] = g.cast(out, compute_dtype(t.dtype), t.dtype)


def _info(name: str, t: Tensor):
    from onnx import helper

    return helper.make_tensor_value_info(name, onnx_dtype(t.dtype), list(t.shape))


def lower(network: Network, layers: Optional[Sequence[Layer]] = None, inputs: Optional[Sequence[Tensor]] = None,
          outputs: Optional[Sequence[Tensor]] = None, external: Optional[dict] = None):
    """The ``onnx.ModelProto`` computing `network`: graph inputs and outputs named and typed as its bindings
    (an output that repeats a name gets a fresh one; outputs are positional). `layers`, `inputs` and
    `outputs` lower a part of it instead (the layers, in order, from those tensors to those). With `external`
    (a dict), large constants go there instead of into the proto (see :data:`.graph.EXTERNAL_BYTES`).

    Raises BackendError naming a layer whose kind has no lowering (see NUMPY_KINDS).
    """
    from onnx import helper

    layers = network.layers if layers is None else layers
    inputs = network.inputs if inputs is None else inputs
    outputs = network.outputs if outputs is None else outputs
    g = Graph(external)
    values = _Values(g)
    for t in inputs:
        values.names[t.name] = t.name
    for layer in layers:
        _lower_layer(g, values, layer)
    taken = {t.name for t in inputs}
    out_infos = []
    for t in outputs:
        name = t.name if t.name not in taken else g.fresh("output")
        taken.add(name)
        g.nodes.append(helper.make_node("Identity", [values.names[t.name]], [name], name=g.fresh("Identity")))
        out_infos.append(_info(name, t))
    return g.model(network.name, [_info(t.name, t) for t in inputs], out_infos)


def lowerable(layer: Layer) -> bool:
    """Whether ONNX Runtime runs `layer` (else the numpy kernel does, between ONNX Runtime sub-graphs)."""
    return layer.kind in LOWERINGS


