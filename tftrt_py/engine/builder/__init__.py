"""The builder: Network -> optimized Network -> Engine (serializable to a plan).

The pipeline is a flat, named list of passes run to a fixed point, then again with the late passes; with
``BuilderConfig.lint`` the network is checked between passes.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Callable, List, Optional, Tuple, Union

from tftrt_py.engine.backends import get_backend
from tftrt_py.engine.backends.base import Backend
from tftrt_py.engine.builder import passes
from tftrt_py.engine.builder.precision import assign_precisions
from tftrt_py.engine.builder.fusions import (activation, affine, attention, conv, gemm, horizontal, match, mlp,
                                             normalization, reduce, resize, shuffle)
from tftrt_py.engine.errors import BackendError, BuildError, EngineError
from tftrt_py.engine.runtime import Engine
from tftrt_py.engine.timing_cache import TimingCache, using
from tftrt_py.engine.types import FLOATS, PRECISIONS

__all__ = ["BuilderConfig", "Builder", "PIPELINE", "LATE_PASSES"]

logger = logging.getLogger(__name__)

#: (name, pass) in the order they run; the whole list repeats until no pass changes anything.
#: Biases and scales fold into a layer before its residual sum and activation do (they must not
#: apply after them); MLPs form from matrix multiplies that already hold their bias and activation.
#: Zero padding folds into a max pooling only behind a non-negative activation (fused or not).
PIPELINE: List[Tuple[str, Callable]] = [
    ("constant folding", passes.fold_constants),
    ("dead-layer elimination", passes.eliminate_dead_layers),
    ("identity erasure", affine.erase_identities),
    ("duplicate merging", passes.merge_duplicates),
    ("shuffle fusion", shuffle.fuse_shuffles),
    ("atrous convolution", conv.fuse_atrous),
    ("padding into convolution", conv.fuse_padding),
    ("padding into pooling", conv.fuse_pooling_padding),
    ("activation recognition", activation.recognize_activations),
    ("bias and scale folding", affine.fold_affine),
    ("residual fusion", conv.fuse_residual),
    ("activation fusion", activation.fuse_activations),
    ("activation before reshape", activation.activation_before_reshape),
    ("MLP fusion", mlp.fuse_mlp),
    ("reduction fusion", reduce.fuse_reductions),
    ("layer normalization fusion", normalization.fuse_layer_norms),
    ("attention fusion", attention.fuse_attention),
    ("horizontal fusion", horizontal.fuse_horizontal),
    ("attention column windows", attention.read_attention_windows),
]

#: Passes that wait for PIPELINE's fixed point (they would take patterns that its passes fuse better), then run
#: with it to a new one: equal computations merge (fusions want each their own copy), residual sums no
#: Normalization absorbed go into their GEMMs, a projection after an upsampling moves before it once its bias and
#: activation are settled.
LATE_PASSES: List[Tuple[str, Callable]] = [
    ("common subexpression merging", passes.merge_common_subexpressions),
    ("GEMM residual fusion", gemm.fuse_gemm_residuals),
    ("projection before resize", resize.project_before_resize),
]

MAX_ROUNDS = 50
#: The range Builder.anticipate gives tensors still being calibrated.
STAND_IN_RANGE = 1.0


@dataclasses.dataclass
class BuilderConfig:
    """How to build: precision, workspace limit and target backend."""

    precision: str = "FP32"
    max_workspace_size: int = 1 << 30
    backend: str = "numpy"
    lint: bool = False
    #: INT8 layers stay int8 on the GPU even where their fp16 kernel is faster (TensorRT's strict types).
    strict_types: bool = False
    #: The timing cache the GPU backend's tactic selection reads and fills: None for the process's default
    #: (``TFTRT_PY_TIMING_CACHE``), a TimingCache for that one, False for none. Plans do not record it.
    timing_cache: Union[None, bool, TimingCache] = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        self.precision = self.precision.upper()
        if self.precision not in PRECISIONS:
            raise BuildError(f"unknown precision {self.precision!r}; use one of {', '.join(PRECISIONS)}")
        cache = self.timing_cache
        if not (cache is None or cache is False or isinstance(cache, TimingCache)):
            raise BuildError(f"timing_cache is {self.timing_cache!r}; use None (the default cache), False (none) or "
                             f"a TimingCache")

    def recorded(self) -> dict:
        """The fields a plan records (every one but the timing cache)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "timing_cache"}


class Builder:
    """Optimizes a network and packages it as an :class:`~tftrt_py.engine.runtime.Engine`."""

    def __init__(self, config: Optional[BuilderConfig] = None):
        self.config = config or BuilderConfig()

    def optimize(self, network) -> None:
        """Run the pass pipeline in place until it reaches a fixed point, then with the late passes to another."""
        for stage in (PIPELINE, PIPELINE + LATE_PASSES):
            self._settle(network, self._for_backend(stage))
        counts = match.fusion_counts(network)
        if counts:
            logger.info("fusions in %s: %s", network.name, ", ".join(f"{n} x {r}" for r, n in sorted(counts.items())))

    def _for_backend(self, stage: List[Tuple[str, Callable]]) -> List[Tuple[str, Callable]]:
        """`stage` with the target backend's policy bound: horizontal fusion merges its horizontal_kinds only."""
        try:
            kinds = get_backend(self.config.backend).horizontal_kinds
        except BackendError:  # not usable here: the default policy
            kinds = Backend.horizontal_kinds
        return [(name, functools.partial(horizontal.fuse_horizontal, kinds=kinds)
                 if pass_ is horizontal.fuse_horizontal else pass_) for name, pass_ in stage]

    def _settle(self, network, stage: List[Tuple[str, Callable]]) -> None:
        for _ in range(MAX_ROUNDS):
            changed = False
            for name, pass_ in stage:
                if pass_(network):
                    changed = True
                    logger.debug("pass %s changed %s", name, network.name)
                    if self.config.lint:
                        network.lint()
            if not changed:
                return
        logger.warning("builder passes did not settle after %d rounds on %s", MAX_ROUNDS, network.name)

    @property
    def anticipates(self) -> bool:
        """Whether the backend does anything in anticipate() (the GPU backend does)."""
        try:
            return get_backend(self.config.backend).anticipates
        except BackendError:
            return False

    def anticipate(self, network) -> None:
        """Let the backend start the slowest work of building `network` while its INT8 ranges are still being
        calibrated: the network is optimized and its precisions assigned as build_engine does, with a stand-in
        range on every float tensor that has none (calibration gives each one); on the GPU backend the Triton
        kernels its quantized layers will be timed with start compiling. `network` is consumed."""
        for t in network.inputs + [t for layer in network.layers for t in layer.outputs]:
            if t.dtype in FLOATS and t.dynamic_range is None:
                t.dynamic_range = STAND_IN_RANGE
        self.optimize(network)
        assign_precisions(network, self.config.precision)
        with using(self.config.timing_cache):
            get_backend(self.config.backend).anticipate(network, self.config.precision, self.config.recorded())

    def build_engine(self, network) -> Engine:
        if not network.outputs:
            raise BuildError(f"network {network.name!r} has no outputs; mark at least one with mark_output()")
        start = time.perf_counter()
        try:
            network.lint()
            self.optimize(network)
        except EngineError as exc:
            raise BuildError(f"building {network.name!r} failed: {exc}") from exc
        assign_precisions(network, self.config.precision)  # once, after the fixed point (precision.py)
        with using(self.config.timing_cache):
            engine = Engine(network, precision=self.config.precision, backend=self.config.backend,
                            build_config=self.config.recorded())
        logger.info("built engine %s: %d layers in %.3f s", network.name, len(network.layers),
                    time.perf_counter() - start)
        return engine
