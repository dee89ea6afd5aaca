"""TF-TRT's online conversion (TF1 sessions): get_tensorrt_rewriter_config and its "TensorRTOptimizer" pass.

A session whose ``config.graph_options.rewrite_options`` is the RewriterConfig :func:`get_tensorrt_rewriter_config`
returns converts its graph when it first runs: Grappler calls the "TensorRTOptimizer" custom optimizer registered
by the op library (kernel.cc), which calls :func:`optimize`. Engine ops made online build their engines per input
shape at run time (dynamic ops, also for ``is_dynamic_op=False``); static engines, INT8 calibration and saving
need ``TrtGraphConverter``.
"""
from __future__ import annotations

import logging
from typing import List, Optional

from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import rewriter_config_pb2

from tftrt_py.convert.graph import GraphView, split_ref
from tftrt_py.convert.params import TrtConversionParams, TrtPrecisionMode, parse_conversion_params
from tftrt_py.convert.rewrite import ENGINE_OP, EngineOpAttrs, rewrite
from tftrt_py.converters.profiles import PROFILE_STRATEGY_RANGE, verify_profile_strategy
from tftrt_py.segmenter import segment_graph

__all__ = ["OPTIMIZER_NAME", "get_tensorrt_rewriter_config", "optimize"]

logger = logging.getLogger(__name__)

OPTIMIZER_NAME = "TensorRTOptimizer"
#: The conversion parameters the pass's parameter map carries, with their AttrValue fields.
PARAMETERS = {"minimum_segment_size": "i", "max_workspace_size_bytes": "i", "precision_mode": "s",
              "maximum_cached_engines": "i", "use_calibration": "b", "allow_build_at_runtime": "b"}
#: The Grappler item of a session's graph (others are functions of its library, native segments included).
MAIN_GRAPH_ID = "tf_graph"


def get_tensorrt_rewriter_config(conversion_params, is_dynamic_op=None, max_batch_size=None, is_v2=False,
                                 disable_non_trt_optimizers=False, use_implicit_batch=True,
                                 profile_strategy=PROFILE_STRATEGY_RANGE):
    """The RewriterConfig that makes Grappler run the TensorRTOptimizer pass, as TF-TRT builds it."""
    parse_conversion_params(conversion_params)
    if is_v2 and is_dynamic_op is not None and not is_dynamic_op:
        raise ValueError("is_dynamic_op is either None or True for TF2")
    if not is_v2 and is_dynamic_op is None:
        raise ValueError("is_dynamic_op can't be None for TF1")
    if (is_dynamic_op is None or is_dynamic_op) and max_batch_size is not None:
        raise ValueError("max_batch_size has to be None for TF2 or when is_dynamic_op == True in TF1")
    if is_dynamic_op is not None and not is_dynamic_op and not isinstance(max_batch_size, int):
        raise ValueError("max_batch_size has to be an integer for is_dynamic_op==False in TF1")
    config = rewriter_config_pb2.RewriterConfig()
    config.remapping = rewriter_config_pb2.RewriterConfig.OFF  # fused ops TF-TRT would not convert
    config.experimental_disable_folding_quantization_emulation = True  # keep Const->QDQ chains for INT8 ranges
    if not disable_non_trt_optimizers:
        config.optimizers.extend(["pruning", "debug_stripper", "layout", "dependency", "constfold",
                                  "common_subgraph_elimination"])
    config.meta_optimizer_iterations = rewriter_config_pb2.RewriterConfig.ONE
    optimizer = config.custom_optimizers.add()
    if not disable_non_trt_optimizers:
        config.custom_optimizers.add().name = "constfold"  # cleans up the Consts the engines took
    optimizer.name = OPTIMIZER_NAME
    p = optimizer.parameter_map
    for name, field in PARAMETERS.items():
        value = getattr(conversion_params, name)
        setattr(p[name], field, str(value).encode() if field == "s" else value)
    if is_dynamic_op is not None:
        p["is_dynamic_op"].b = is_dynamic_op
    if max_batch_size is not None:
        p["max_batch_size"].i = max_batch_size
    p["use_implicit_batch"].b = use_implicit_batch
    if not use_implicit_batch:
        p["profile_strategy"].s = verify_profile_strategy(profile_strategy).lower().encode()
    if disable_non_trt_optimizers:
        _disable_non_trt_optimizers(config)
    return config


def _disable_non_trt_optimizers(config) -> None:
    """TF-TRT's trt_utils.disable_non_trt_optimizers_in_rewriter_config."""
    off = rewriter_config_pb2.RewriterConfig.OFF
    for field in ("arithmetic_optimization", "auto_mixed_precision", "constant_folding", "debug_stripper",
                  "dependency_optimization", "function_optimization", "implementation_selector", "layout_optimizer",
                  "loop_optimization", "pin_to_host_optimization", "remapping", "scoped_allocator_optimization",
                  "shape_optimization"):
        setattr(config, field, off)
    config.auto_parallel.enable = False
    config.disable_meta_optimizer = False  # the meta optimizer runs TensorRTOptimizer
    config.disable_model_pruning = True
    config.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    config.min_graph_nodes = -1


def optimize(item_id: str, graph_def: bytes, fetch: List[str], config: bytes) -> Optional[bytes]:
    """The Grappler pass: the session graph with its segments replaced by engine ops (None: unchanged).

    Library functions (native segments included) are left as they are, and so is a graph holding engine ops.
    """
    if item_id != MAIN_GRAPH_ID:
        return None
    graph = graph_pb2.GraphDef.FromString(graph_def)
    if any(n.op == ENGINE_OP for n in graph.node):
        return None
    params = rewriter_config_pb2.RewriterConfig.CustomGraphOptimizer.FromString(config).parameter_map
    get = lambda key, kind, default: getattr(params[key], kind) if key in params else default
    conversion = _conversion_params(params)
    view = GraphView(graph)
    protected = {split_ref(f)[0] for f in fetch}
    result = segment_graph(view, minimum_segment_size=conversion.minimum_segment_size, nodes_denylist=protected,
                           fetches=list(fetch), precision_mode=conversion.precision)
    if not result.segments:
        return None
    if conversion.precision == TrtPrecisionMode.INT8 and conversion.use_calibration:
        logger.warning("%s: INT8 calibration does not run online; for calibrated INT8 engines use "
                       "TrtGraphConverter(...).convert() and calibrate()", OPTIMIZER_NAME)
    strategy = get("profile_strategy", "s", b"").decode()
    attrs = EngineOpAttrs(precision_mode=conversion.precision,
                          max_cached_engines_count=conversion.maximum_cached_engines,
                          workspace_size_bytes=conversion.max_workspace_size_bytes,
                          use_calibration=conversion.use_calibration,
                          allow_build_at_runtime=conversion.allow_build_at_runtime,
                          max_batch_size=get("max_batch_size", "i", 1))
    if strategy and not get("use_implicit_batch", "b", True):
        attrs.profile_strategy = verify_profile_strategy(strategy)
    converted, _ = rewrite(graph, view, result.segments, attrs, fetches=list(fetch))
    engines = [n for n in converted.node if n.op == ENGINE_OP]  # in segment order
    for node, segment in zip(engines, result.segments):  # placed graph: an engine op goes where its segment was
        node.device = view.nodes[segment.nodes[0]].def_.device
    logger.info("%s: %d engine op(s) in the session graph", OPTIMIZER_NAME, len(result.segments))
    return converted.SerializeToString()


def _conversion_params(parameter_map):
    """The ConversionParams of the pass's parameter map (TrtConversionParams' defaults where one is missing)."""
    given = {name: getattr(parameter_map[name], field) for name, field in PARAMETERS.items() if name in parameter_map}
    if "precision_mode" in given:
        given["precision_mode"] = given["precision_mode"].decode()
    return parse_conversion_params(TrtConversionParams(**given))
