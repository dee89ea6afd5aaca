"""GEMM residual fusion: a residual sum of a MatrixMultiply's or MLP's output becomes the GEMM's residual input,
added in its epilogue (cuBLASLt's C operand on the GPU) instead of in a pass of its own.

    x -> MatrixMultiply | MLP [-> reshape] -> ElementWise sum(., r) -> y
        =>   x -> MatrixMultiply | MLP (residual r [reshaped]) [-> reshape] -> y

Pre-norm transformer blocks (GPT-2, ViT) need it: each block's two sums feed both the next LayerNorm and the next
sum, so no Normalization absorbs them. It runs once the main pipeline has settled (Builder.optimize's late stage),
so sums that a LayerNorm reads alone have already become that Normalization's residual (post-norm blocks, BERT).
A reshape between the GEMM and the sum (Keras's Tensordot) moves behind the sum; the residual gets the inverse
reshape (both keep memory order: no data moves).
"""
from __future__ import annotations

import logging
from typing import Optional, Tuple

from tftrt_py.engine.builder.fusions.match import (FLOATS, GEMM_OPERANDS, activation_of, gemm_residual, record,
                                                  reshape_only, sole_producer)
from tftrt_py.engine.network import Layer, Network, Tensor

__all__ = ["fuse_gemm_residuals"]

logger = logging.getLogger(__name__)


def _fusable(network: Network, users, tensor: Tensor) -> Optional[Tuple[Layer, Optional[Layer]]]:
    """(GEMM, reshape or None) producing `tensor` for this sum alone: a float GEMM without activation or residual."""
    reshape = sole_producer(network, users, tensor, ("Shuffle",))
    if reshape is not None:
        if not reshape_only(reshape):
            return None
        tensor = reshape.inputs[0]
    gemm = sole_producer(network, users, tensor, tuple(GEMM_OPERANDS))
    if (gemm is None or gemm_residual(gemm) is not None or activation_of(gemm) is not None
            or tensor.dtype not in FLOATS):
        return None
    return gemm, reshape


def _match(network: Network, users, layer: Layer):
    """(GEMM, reshape or None, residual) for sum `layer`; among two fusable GEMMs, the later takes the other."""
    if layer.kind != "ElementWise" or layer.params["op"] != "sum":
        return None
    out = layer.outputs[0]
    found = []
    for t, r in zip(layer.inputs, layer.inputs[::-1]):
        fusable = t.shape == out.shape and r.shape == out.shape and r.dtype == out.dtype and _fusable(network, users, t)
        if fusable:
            found.append((network.layers.index(fusable[0]), *fusable, r))
    return max(found, key=lambda f: f[0])[1:] if found else None


def _fuse(network: Network, layer: Layer, gemm: Layer, reshape: Optional[Layer], r: Tensor) -> str:
    old = layer.outputs[0]
    name = " + ".join(l.name for l in (gemm, reshape, layer) if l is not None)
    with network.inserting_before(layer):  # after r and after every GEMM input
        if reshape is not None:
            rows = [-1, *gemm.outputs[0].shape[1:]]  # -1: the network stays re-batchable (runtime.rebatched)
            r = network.add_layer("Shuffle", [r], {"reshape": rows},
                                  name=f"{layer.name} (residual rows)").outputs[0]
        fused = network.add_layer(gemm.kind, [*gemm.inputs, r], dict(gemm.params), dict(gemm.weights), name=name)
        new = fused.outputs[0]
        if reshape is not None:
            new = network.add_layer("Shuffle", [new], dict(reshape.params), name=reshape.name).outputs[0]
    new.dynamic_range = old.dynamic_range
    network.replace_all_uses(old, new)
    for erased in (layer, reshape, gemm):
        if erased is not None:
            network.erase(erased)
    if network.is_output(new):
        new.name = old.name
    return name


def fuse_gemm_residuals(network: Network) -> bool:
    """Fuse each residual sum into the MatrixMultiply or MLP producing one of its operands."""
    changed = False
    users = network.consumers()
    for layer in list(network.layers):
        match = _match(network, users, layer)
        if match is None:
            continue
        logger.info("GEMM + residual sum: %s", _fuse(network, layer, *match))
        record(network, "GEMM + residual sum")
        users = network.consumers()
        changed = True
    return changed
