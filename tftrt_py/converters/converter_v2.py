"""TrtGraphConverterV2: TF2 SavedModel -> converted SavedModel (TF-TRT's API)."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import uuid
import weakref
from typing import Optional

import tensorflow as tf
from tensorflow.python.saved_model import signature_constants, tag_constants
from tensorflow.python.trackable import autotrackable
from tqdm import tqdm

from tftrt_py import settings
from tftrt_py.convert import segment_weights, variables
from tftrt_py.convert.build import INPUT_PREFIX
from tftrt_py.convert.errors import AlreadyConvertedError, MissingQuantizationRangeError
from tftrt_py.convert.graph import GraphView, split_ref
from tftrt_py.convert.params import (DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES, TrtConversionParams, TrtPrecisionMode,
                                     parse_conversion_params)
from tftrt_py.convert.rewrite import ALLOW_BUILD_ATTR, ENGINE_OP, EngineOpAttrs, rewrite
from tftrt_py.converters import graph_io, profiles as profiles_lib, restore, saved_weights, summary as summary_lib
from tftrt_py.converters import xla_loops
from tftrt_py.converters.memory import MemoryReturn, frees_its_memory
from tftrt_py.engine.timing_cache import TimingCache, default_timing_cache
from tftrt_py.engine_op import dispatcher, library
from tftrt_py.engine_op.binding import binding_of
from tftrt_py.engine_op.cache import engine_asset_name, write_plans
from tftrt_py.engine_op.op import warm_up_backend, warm_up_device
from tftrt_py.segmenter import segment_graph

__all__ = ["TrtGraphConverterV2"]

logger = logging.getLogger(__name__)


def _convert_to_tensors(inp):
    """(args, kwargs) for one input_fn item: a dict, a list/tuple, or a single array."""
    try:
        if isinstance(inp, dict):
            return [], {k: tf.convert_to_tensor(v) for k, v in inp.items()}
        if isinstance(inp, (list, tuple)):
            return [tf.convert_to_tensor(v) for v in inp], {}
        return [tf.convert_to_tensor(inp)], {}
    except (TypeError, ValueError) as exc:
        raise RuntimeError(f"Failed to convert input to tensor: {exc}") from exc


def _timing_cache(value):
    """The converter's timing_cache argument as BuilderConfig takes it: None (the default cache), False (none), a
    TimingCache, or the path of a cache file (loaded; builds save to it)."""
    if value is None or value is False or isinstance(value, TimingCache):
        return value
    if isinstance(value, (str, os.PathLike)):
        return TimingCache.load(os.fspath(value))
    raise TypeError(f"timing_cache is {type(value).__name__}; pass a TimingCache, the path of a cache file, False "
                    f"(no cache) or None (the default one)")


class TrtGraphConverterV2:
    """Converts a TF2 SavedModel signature so its supported subgraphs run in tftrt_py engines."""

    def __init__(self, input_saved_model_dir=None, input_saved_model_tags=None, input_saved_model_signature_key=None,
                 use_dynamic_shape=None, dynamic_shape_profile_strategy=None,
                 max_workspace_size_bytes=DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES, precision_mode=TrtPrecisionMode.FP32,
                 minimum_segment_size=3, maximum_cached_engines=1, use_calibration=True, allow_build_at_runtime=True,
                 conversion_params: Optional[TrtConversionParams] = None, calibration_algorithm=None,
                 timing_cache=None, compile_native_loops=False):
        if not tf.executing_eagerly():
            raise RuntimeError("TrtGraphConverterV2 needs eager execution (TF2 behaviour); use TrtGraphConverter "
                               "in tf.compat.v1 graph mode")
        if conversion_params is None:
            conversion_params = TrtConversionParams(
                max_workspace_size_bytes=max_workspace_size_bytes, precision_mode=precision_mode,
                minimum_segment_size=minimum_segment_size, maximum_cached_engines=maximum_cached_engines,
                use_calibration=use_calibration, allow_build_at_runtime=allow_build_at_runtime,
                calibration_algorithm=calibration_algorithm)
        self._params = parse_conversion_params(conversion_params)
        self._timing_cache = _timing_cache(timing_cache)
        self._compile_native_loops = bool(compile_native_loops)  # see converters.xla_loops (our addition)
        self._input_saved_model_dir = input_saved_model_dir
        self._input_saved_model_tags = input_saved_model_tags or [tag_constants.SERVING]
        self._input_saved_model_signature_key = (input_saved_model_signature_key
                                                 or signature_constants.DEFAULT_SERVING_SIGNATURE_DEF_KEY)
        self._int8_without_calibration = self._params.quantized and not self._params.use_calibration
        self._need_calibration = self._params.calibrates
        self._calibrated = False
        self._calibration_seconds = None
        self._converted = False
        self._build_called_once = False
        self._converted_func = None
        self._converted_graph_def = None
        self._report = None
        # Dynamic shapes: build() collects input shapes and builds one profile engine per profile.
        self._use_dynamic_shape = bool(use_dynamic_shape)
        self._profile_strategy = "Unknown"
        if self._use_dynamic_shape:
            self._profile_strategy = (profiles_lib.PROFILE_STRATEGY_RANGE if dynamic_shape_profile_strategy is None
                                      else profiles_lib.verify_profile_strategy(dynamic_shape_profile_strategy))
        # TF-TRT's experimental feature: variables stay variables (see convert/variables.py)
        self.freeze = not variables.is_experimental_feature_activated(variables.DISABLE_GRAPH_FREEZING)
        if not self.freeze and not self._use_dynamic_shape:
            logger.warning("Disabling graph freezing is only possible in dynamic shape mode. The graph will be "
                           "frozen.")
            self.freeze = True
        self._variable_reads = {}  # ReadVariableOp name -> the kept variable it reads
        self._captures = {}  # Placeholder name -> the outside tensor it captures (handles of kept variables)
        self._variables = []  # the variables kept as variables (see convert.variables)
        self._resources = {}  # captured resources that are not variables (tables): placeholder name -> trackable
        self._written = {}  # Placeholder name -> a variable the function writes (kept whatever its size)
        self._saves_variables = True  # whether save() writes them as variables (else as constants of their values)
        # TF-TRT's test-only switch (its tests' DisableNonTrtOptimizers()): only grappler's pruner runs before
        # segmentation, no constant folding or merging of equal computations (graph_io.PRUNING_ONLY)
        self._test_only_disable_non_trt_optimizers = False
        # the last attribute made here is the last one freed: the memory of the others goes back to the system then
        self._memory = MemoryReturn()

    @property
    def timing_cache(self) -> Optional[TimingCache]:
        """The timing cache this converter's engines build with (TensorRT's ITimingCache; our addition to TF-TRT's
        API): the one passed in, else the process's default (``TFTRT_PY_TIMING_CACHE``); None when off. Its
        ``serialize()`` gives it back as bytes, ``save(path)`` as a file."""
        if self._timing_cache is None:
            return default_timing_cache()
        return None if self._timing_cache is False else self._timing_cache

    # -- convert --------------------------------------------------------------
    @frees_its_memory
    def convert(self, calibration_input_fn=None):
        """Segment the signature and insert engine ops; returns the converted ConcreteFunction.

        INT8 with use_calibration: `calibration_input_fn` (a generator of inputs, as build's input_fn) runs
        through the converted function with every engine op calibrating; each op's calibration table goes
        into its ``calibration_data`` attribute and the INT8 engines for the calibrated shapes are built.
        """
        if self._converted:
            raise AlreadyConvertedError(self)
        if self._need_calibration and not calibration_input_fn:
            raise ValueError("Should specify calibration_input_fn because INT8 calibration is needed")
        if not self._need_calibration and calibration_input_fn:
            raise ValueError("Should not specify calibration_input_fn because INT8 calibration is not needed")
        library.load()
        if self._need_calibration:  # (warm_up_backend says why only then)
            warm_up_backend(self.timing_cache)
        else:
            warm_up_device()
        saved_model, func = graph_io.load_signature(
            self._input_saved_model_dir, self._input_saved_model_tags, self._input_saved_model_signature_key)
        output_names = [t.name for t in func.outputs]
        if not self.freeze and variables.reference_variables(func.graph.as_graph_def()):
            logger.warning("%s holds TF1 reference variables (VariableV2), which cannot stay variables in a TF2 "
                           "SavedModel: the graph will be frozen", self._input_saved_model_dir)
            self.freeze = True
        self._resources = restore.captured_resources(saved_model, func)
        if self.freeze:  # the loaded model goes but for its large variables and its tables
            captured, self._written = self._kept_variables(func)
            self._saves_variables = sum(map(variables.nbytes, captured.values())) >= settings.KEEP_VARIABLES.get()
            kept = {**captured, **self._written}
            graph_def, self._input_names = graph_io.frozen_graph_def(func, keep={*kept, *self._resources})
            self._captures = {internal.op.name: external for external, internal in func.graph.captures
                              if internal.op.name in kept or internal.op.name in self._resources}
            self._variables = list(kept.values())
            self._func, graph = graph_io.signature_of(func), tf.Graph()
            del saved_model, func
        else:
            self._saved_model, self._func, graph = saved_model, func, func.graph
            self._captures = {internal.op.name: external for external, internal in func.graph.captures}
            self._variables = list(func.variables)
            self._input_names = [t.name for t in func.inputs if t.op.name not in self._captures]
            graph_def, captured = func.graph.as_graph_def(), variables.captured_variables(func)
        graph_def = graph_io.inline_calls(graph_def, keep={n.split(":")[0] for n in output_names})
        optimizers = graph_io.PRUNING_ONLY if self._test_only_disable_non_trt_optimizers else \
            graph_io.GRAPPLER_OPTIMIZERS
        graph_def = graph_io.optimize_and_unroll(graph_def, graph, self._input_names + output_names, optimizers)
        self._variable_reads = variables.variable_reads(graph_def, captured)
        variables.read_directly(graph_def, self._variable_reads)
        view = variables.WeightsView(graph_def, self._variable_reads) if self._variable_reads else GraphView(graph_def)
        params = self._params
        result = segment_graph(view, minimum_segment_size=params.minimum_segment_size, fetches=output_names,
                               precision_mode=params.precision)
        self._report = result.report
        segments = variables.reads_as_inputs(result.segments, self._variable_reads)
        attrs = EngineOpAttrs(precision_mode=params.precision,
                              max_cached_engines_count=params.maximum_cached_engines,
                              workspace_size_bytes=params.max_workspace_size_bytes,
                              use_calibration=params.use_calibration)
        if self._use_dynamic_shape:
            attrs.profile_strategy = self._profile_strategy
        converted, fetch_map = rewrite(graph_def, view, segments, attrs, fetches=output_names)
        if self._compile_native_loops:
            converted, renamed = xla_loops.compile_loops(converted, list(fetch_map.values()))
            fetch_map = {name: renamed[ref] for name, ref in fetch_map.items()}
        engine_ops = len(segments)
        values = view.values if self._variable_reads else {}
        del graph_def, view, result, segments  # the converted graph and kept variables hold the weights now
        variables.mark_weight_inputs(converted, self._variable_reads)
        # the engine ops outlive the functions and sessions this converter makes and drops, until it goes; those
        # reading variables take their values now (sharing the variables' memory)
        weights = {n.attr["segment_key"].s.decode(): {i: values[split_ref(n.input[i])[0]]
                                                      for i in variables.weight_inputs(n)}
                   for n in converted.node if n.op == ENGINE_OP}
        weakref.finalize(self, dispatcher.pin(weights, self._timing_cache,
                                              {k: w for k, w in weights.items() if w}))
        self._output_names = [fetch_map[n] for n in output_names]
        self._converted_graph_def = converted
        self._converted_func = graph_io.function_from_graph_def(self._func, converted, self._input_names,
                                                                self._output_names, self._captures)
        logger.info("converted %s: %d engine op(s)%s", self._input_saved_model_dir, engine_ops,
                    f", {len(self._variable_reads)} variable read(s) kept" if self._variable_reads else "")
        if self._need_calibration:
            self._execute_calibration(calibration_input_fn)
        self._converted = True
        return self._converted_func

    @staticmethod
    def _kept_variables(func):
        """The variables of `func` freezing keeps (placeholder name -> variable): those of LARGE_VARIABLE_BYTES
        or more that only ReadVariableOps use, their reads feeding engines as weights; and those `func` writes,
        their reads native (see convert.variables)."""
        every = variables.captured_variables(func)
        if not every:
            return {}, {}
        graph_def = graph_io.inline_calls(func.graph.as_graph_def())
        large = variables.large_variables(func)
        read = variables.only_read(graph_def, large)
        changed = variables.written(graph_def, every)
        return {n: v for n, v in large.items() if n in read}, {n: v for n, v in every.items() if n in changed}

    def _execute_calibration(self, calibration_input_fn):
        """Run calibration_input_fn's inputs with every engine op calibrating, then write each op's table into
        its calibration_data attribute and rebuild the converted function (as TF-TRT does)."""
        algorithm, precision = self._params.calibration_algorithm, self._params.precision  # INT8 or FP8
        nodes = self._engine_nodes()
        keys = [n.attr["segment_key"].s.decode() for n in nodes]
        start = time.perf_counter()
        for key in keys:
            dispatcher.start_calibrating(key, algorithm)
        batches = 0
        try:
            for inp in tqdm(calibration_input_fn(), desc=f"{precision} calibration ({algorithm})", unit="batch"):
                self._run(inp)
                batches += 1
        finally:
            tables = [dispatcher.finish_calibrating(key) for key in keys]
        for node, table in zip(nodes, tables):
            node.attr["calibration_data"].s = table
        self._converted_func = graph_io.function_from_graph_def(self._func, self._converted_graph_def,
                                                                self._input_names, self._output_names,
                                                                self._captures)
        self._calibrated = True
        self._calibration_seconds = time.perf_counter() - start
        logger.info("%s calibration (%s) of %d engine op(s) over %d batch(es): %.2f s", precision, algorithm,
                    len(nodes), batches, self._calibration_seconds)

    def _run(self, inp) -> None:
        """Run the converted function on one of input_fn's inputs, without TF's graph optimizer: the graph was
        optimized before segmentation, and on its first call grappler would copy every native segment's weights
        through its passes again (seconds for BERT-base)."""
        args, kwargs = _convert_to_tensors(inp)
        with graph_io.grappler_off():
            self._converted_func(*args, **kwargs)

    # -- build ----------------------------------------------------------------
    @frees_its_memory
    def build(self, input_fn):
        """Run the converted function on input_fn's inputs so engines get built for those shapes."""
        if self._build_called_once:
            raise NotImplementedError("build() is already called. It is not supported to call build() more "
                                      "than once.")
        if not input_fn:
            raise RuntimeError("input_fn is None. Method build() needs input_fn to be specified in order to "
                               "build TensorRT engines")
        if not self._converted:
            raise RuntimeError("Need to call convert() before build()")
        if self._use_dynamic_shape:
            self._build_profiles(input_fn)
        else:
            for inp in input_fn():
                self._run(inp)
        self._build_called_once = True
        if self._int8_without_calibration:
            self._check_quantization_ranges()
        for line in summary_lib.describe_native_runs(self.native_engine_ops(),
                                                     summary_lib.engine_op_counts(self._converted_graph_def)):
            logger.warning("no engine, the native segment runs instead: %s", line)

    def native_engine_ops(self):
        """Engine op name -> {input shapes: why} for each input shape of build() (and INT8 calibration) that
        no engine serves: those inputs run the op's native segment. Our addition to TF-TRT's API."""
        if not self._converted:
            raise RuntimeError("Need to call convert() before native_engine_ops()")
        return summary_lib.native_runs(self._converted_graph_def)

    def _check_quantization_ranges(self):
        """INT8 without calibration: engines that lacked quantization ranges are an error of build() naming the
        tensors (user guide 2.9.3.1), not a silent native fallback (at serving time they do fall back)."""
        problems, tensors = [], []
        for node in self._engine_nodes():
            op = dispatcher.find(node.attr["segment_key"].s.decode())
            if op is None or not op.missing_ranges:
                continue
            names = sorted({t for ts in op.missing_ranges.values() for t in ts})
            # an engine input is named by the graph tensor feeding it (engines number the inputs not weights)
            bound = variables.engine_inputs(node)
            names = [node.input[bound[int(t[len(INPUT_PREFIX):])]] if t.startswith(INPUT_PREFIX) else t
                     for t in names]
            problems.append(f"{node.name}: {', '.join(names)}")
            tensors += names
        if problems:
            raise MissingQuantizationRangeError(
                "INT8 with use_calibration=False needs a quantization range for each tensor an int8 layer reads; "
                f"missing for {'; '.join(problems)}. Add QuantizeAndDequantizeV2/V3 or FakeQuantWithMinMaxVars/Args "
                "ops giving their ranges, or convert with use_calibration=True and a calibration_input_fn",
                tensors=tensors)

    def _build_profiles(self, input_fn):
        """Collect each engine op's input shapes over input_fn (the ops run natively meanwhile), then build
        one profile engine per profile the strategy makes from them."""
        keys = [n.attr["segment_key"].s.decode() for n in self._engine_nodes()]
        for key in keys:
            dispatcher.start_collecting(key)
        try:
            for inp in input_fn():
                self._run(inp)
        finally:
            collected = {key: dispatcher.stop_collecting(key) for key in keys}
        for key in keys:
            op = dispatcher.find(key)
            profiles = profiles_lib.make_profiles(self._profile_strategy, collected[key])
            if op is None or not profiles:
                continue
            if len(profiles) > self._params.maximum_cached_engines:
                logger.warning("%s: %s makes %d profiles but maximum_cached_engines is %d: later profile "
                               "engines evict earlier ones", op.name, self._profile_strategy, len(profiles),
                               self._params.maximum_cached_engines)
            op.add_profiles(profiles, collected[key])
            logger.info("%s: %d profile engine(s) (%s) for %d collected shape(s)", op.name, len(profiles),
                        self._profile_strategy, len(collected[key]))

    # -- save -----------------------------------------------------------------
    def _engine_nodes(self):
        return [n for n in self._converted_graph_def.node if n.op == ENGINE_OP]

    @frees_its_memory
    def save(self, output_saved_model_dir, save_gpu_specific_engines=True, options=None, *, overwrite=False):
        """Save the converted signature as a SavedModel, with the engines built so far as assets
        (``assets/trt-serialized-engine.<engine op>``; an empty one without save_gpu_specific_engines).

        A non-empty output directory is refused unless `overwrite` (our addition), the input SavedModel's
        directory (or one inside it) always.
        """
        if not self._converted:
            raise RuntimeError("Need to call convert() before save()")
        out = os.path.realpath(output_saved_model_dir)
        src = os.path.realpath(self._input_saved_model_dir)
        if os.path.commonpath([out, src]) == src:
            raise ValueError(f"save() would write into the input SavedModel {self._input_saved_model_dir!r}; "
                             f"choose another output directory")
        if os.path.isdir(out) and os.listdir(out) and not overwrite:
            raise ValueError(f"output directory {output_saved_model_dir!r} is not empty; pass overwrite=True to "
                             f"save into it anyway")
        asset_dir = tempfile.mkdtemp(prefix="tftrt_engines_")
        try:
            weights = self._save(output_saved_model_dir, save_gpu_specific_engines, options, asset_dir)
        finally:
            shutil.rmtree(asset_dir, ignore_errors=True)
        saved_weights.write_weights(output_saved_model_dir, weights)  # (_save's copy of the graph gone but these)

    def _save(self, output_saved_model_dir, save_gpu_specific_engines, options, asset_dir):
        """Write the SavedModel; returns the weights it holds as stand-ins, for saved_weights.write_weights."""
        graph_def = type(self._converted_graph_def)()
        graph_def.CopyFrom(self._converted_graph_def)
        kept, tracked, rewritten = self._captures, self._variables, set()
        weights_function = f"{variables.WEIGHTS_FUNCTION}_{uuid.uuid4().hex}"
        if self.freeze and not self._saves_variables:  # served faster as constants (see convert.segment_weights)
            moved, rewritten = segment_weights.reads_into_segments(graph_def, self._variable_reads)
            variables.reads_as_constants(graph_def, {k: v for k, v in self._variable_reads.items() if k not in moved},
                                         weights_function)
            kept = {name: handle for name, handle in kept.items() if name in {n.name for n in graph_def.node}}
            tracked = list(self._written.values())  # variables the model writes stay variables
        functions = {f.signature.name: f for f in graph_def.library.function}
        root = autotrackable.AutoTrackable()
        assets, captures = [], {}
        for node in graph_def.node:
            if node.op != ENGINE_OP:
                continue
            node.attr[ALLOW_BUILD_ATTR].b = self._params.allow_build_at_runtime
            op = dispatcher.find(node.attr["segment_key"].s.decode())
            engines = op.engines() if op else []
            if not engines:  # as TF-TRT: an op that built nothing gets no asset
                continue
            path = os.path.join(asset_dir, engine_asset_name(node.name))
            binding = None
            if node.name in rewritten:  # its segment now holds weights it took as inputs: the same computation
                binding = binding_of(node, functions[node.attr["segment_func"].func.name])  # (it calls none)
            with open(path, "wb") as f:  # (left empty without save_gpu_specific_engines, as TF-TRT's)
                if save_gpu_specific_engines:
                    write_plans(f, engines, binding)
            asset = tf.saved_model.Asset(path)
            assets.append(asset)
            placeholder = graph_def.node.add(name=f"{node.name}/engine_assets", op="Placeholder")
            placeholder.attr["dtype"].type = tf.string.as_datatype_enum
            node.input.insert(len(node.attr["InT"].list.type), f"{placeholder.name}:0")
            node.attr["Tassets"].list.type.append(tf.string.as_datatype_enum)
            captures[placeholder.name] = asset.asset_path
            logger.info("saving %d engine(s) of %s", len(engines) if save_gpu_specific_engines else 0, node.name)
        root.tftrt_engine_assets = assets
        if tracked:
            root.tftrt_variables = tracked
        if self._resources:
            root.tftrt_resources = list(self._resources.values())
        # the weights this save made constants go into saved_model.pb after the writer (converters.saved_weights);
        # a writer of the chunked format (experimental_image_format) gets them itself
        weights = ({} if getattr(options, "experimental_image_format", False)
                   else saved_weights.stand_in_weights(graph_def, weights_function))
        func = graph_io.function_from_graph_def(self._func, graph_def, self._input_names, self._output_names,
                                                {**captures, **kept})
        tf.saved_model.save(root, output_saved_model_dir, {self._input_saved_model_signature_key: func},
                            options=options)
        return weights

    # -- summary --------------------------------------------------------------
    def summary(self, line_length=160, detailed=True, print_fn=None):
        """Print each engine (device, node count, I/O dtypes and shapes, op histogram), totals, after build()
        the engine ops that run natively for the shapes built (and why), and the non-conversion report."""
        if not self._converted:
            raise RuntimeError(f"Impossible to call `{type(self).__name__}.summary()` before calling "
                               f"{type(self).__name__}.convert()`.")
        if line_length < 160:
            raise ValueError(f"Invalid `line_length` value has been received: {line_length}. Minimum: 160.")
        summary_lib.print_summary(self._converted_graph_def, self._report, line_length, detailed, print_fn or print,
                                  built=self._build_called_once or self._calibrated)
