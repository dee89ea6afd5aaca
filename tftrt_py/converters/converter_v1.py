"""TrtGraphConverter: TF-TRT's TF1 API (a frozen GraphDef or a TF1 SavedModel, tf.compat.v1 graph mode).

Static mode (``is_dynamic_op=False``, the TF1 default) builds each engine inside convert() for
``max_batch_size`` (or the smallest ``_tftrt_op_max_batch_size`` int attr on its segment's nodes) and
stores its plan in the node's ``serialized_segment``; a batch up to that size runs on it (row-wise
engines serve smaller batches), a larger one runs the native segment — static ops never build at run time.
Dynamic mode builds engines per input shape at run time, as TrtGraphConverterV2 does. INT8 with
calibration always runs dynamic ops (user guide 2.6).
"""
from __future__ import annotations

import logging
import weakref

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.saved_model import signature_constants, tag_constants

from tftrt_py.convert.build import SegmentGraph, build_engine
from tftrt_py.convert.errors import AlreadyConvertedError, MissingQuantizationRangeError
from tftrt_py.convert.graph import GraphView, split_ref, tensor_ref
from tftrt_py.convert.params import (DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES, TrtConversionParams, TrtPrecisionMode,
                                     parse_conversion_params)
from tftrt_py.convert.rewrite import ALLOW_BUILD_ATTR, ENGINE_OP, EngineOpAttrs, rewrite, segment_max_batch_size
from tftrt_py.converters import graph_io
from tftrt_py.engine import BuilderConfig
from tftrt_py.engine_op import dispatcher, library
from tftrt_py.segmenter import segment_graph

__all__ = ["TrtGraphConverter"]

logger = logging.getLogger(__name__)

STATIC_SHAPES_WARNING = "Input shapes must be fully defined when in static mode. Please try is_dynamic_op=True."


def _node_name(item) -> str:
    """A node name from a node name, a tensor name ("logits:0") or a tf.Tensor."""
    return split_ref(item.name if isinstance(item, tf.Tensor) else str(item))[0]


class TrtGraphConverter:
    """Converts a TF1 frozen GraphDef or SavedModel so its supported subgraphs run in tftrt_py engines.

        converter = TrtGraphConverter(input_graph_def=frozen_graph, nodes_blacklist=["logits", "classes"])
        trt_graph = converter.convert()
    """

    def __init__(self, input_saved_model_dir=None, input_saved_model_tags=None, input_saved_model_signature_key=None,
                 input_graph_def=None, nodes_denylist=None, nodes_blacklist=None, session_config=None,
                 max_batch_size=1, max_workspace_size_bytes=DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES,
                 precision_mode=TrtPrecisionMode.FP32, minimum_segment_size=3, is_dynamic_op=False,
                 maximum_cached_engines=1, use_calibration=True, use_function_backup=True):
        if tf.executing_eagerly():
            raise RuntimeError("Please use tf.experimental.tensorrt.Converter in TF 2.0. (tftrt_py: use "
                               "TrtGraphConverterV2, or call TrtGraphConverter inside `with tf.Graph().as_default():`)")
        if input_graph_def and input_saved_model_dir:
            raise ValueError("Can only specify one of input_graph_def and input_saved_model_dir")
        if not input_graph_def and not input_saved_model_dir:
            raise ValueError("Must specify one of input_graph_def and input_saved_model_dir")
        if nodes_denylist is not None and nodes_blacklist is not None:
            raise ValueError("Specify only one of nodes_denylist and nodes_blacklist (its old name)")
        self._input_graph_def = input_graph_def
        self._input_saved_model_dir = input_saved_model_dir
        self._input_saved_model_tags = input_saved_model_tags or [tag_constants.SERVING]
        self._input_saved_model_signature_key = (input_saved_model_signature_key
                                                 or signature_constants.DEFAULT_SERVING_SIGNATURE_DEF_KEY)
        self._nodes_denylist = list(nodes_denylist if nodes_denylist is not None else nodes_blacklist or [])
        self._session_config = session_config or config_pb2.ConfigProto()
        self._params = parse_conversion_params(TrtConversionParams(
            max_workspace_size_bytes=max_workspace_size_bytes, precision_mode=precision_mode,
            minimum_segment_size=minimum_segment_size, maximum_cached_engines=maximum_cached_engines,
            use_calibration=use_calibration, allow_build_at_runtime=True))

        self._need_calibration = self._params.calibrates
        if self._need_calibration and not use_function_backup:
            raise ValueError("Calibration requires enabling fallback to TF function execution.")
        if self._need_calibration and not is_dynamic_op:
            logger.warning("INT8 precision mode with calibration is supported with dynamic TRT ops only. "
                           "Disregarding is_dynamic_op parameter.")
            is_dynamic_op = True
        self._is_dynamic_op = is_dynamic_op
        # the engine ops' max_batch_size attr (before _tftrt_op_max_batch_size annotations): the argument
        self._max_batch_size_attr = max_batch_size if isinstance(max_batch_size, int) else 1
        if is_dynamic_op:
            self._max_batch_size = None
            if max_batch_size is not None:
                logger.warning("When is_dynamic_op==True max_batch_size should be None")
        else:
            if not isinstance(max_batch_size, int):
                raise ValueError("When is_dynamic_op==False max_batch_size should be an integer")
            self._max_batch_size = max_batch_size
        self._use_function_backup = use_function_backup

        self._converted = False
        # TF-TRT's test-only switch (its tests' DisableNonTrtOptimizers()): only grappler's pruner runs before
        # segmentation, no constant folding or merging of equal computations (graph_io.PRUNING_ONLY)
        self._test_only_disable_non_trt_optimizers = False
        self._converted_graph_def = None
        self._signature_def = None
        self._report = None
        self._calibration_data_collected = False

    # -- convert --------------------------------------------------------------
    def convert(self):
        """Segment the graph and insert engine ops (building static engines now); returns the GraphDef."""
        if self._converted:
            raise AlreadyConvertedError(self)
        library.load()
        if self._input_graph_def:
            if not self._nodes_denylist:
                raise ValueError("A GraphDef input needs nodes_denylist (nodes_blacklist): the names of its output "
                                 "nodes, which stay native and can be fetched after conversion (without them "
                                 "TF-TRT's grappler fails with 'Failed to import metagraph')")
            frozen, protected = self._input_graph_def, self._nodes_denylist
        else:
            frozen, protected = self._freeze_saved_model()
        frozen = graph_io.inline_calls(frozen, keep={_node_name(n) for n in protected})
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(frozen, name="")
        fetches = [tensor_ref(*split_ref(_node_name(n))) for n in protected]
        optimizers = graph_io.PRUNING_ONLY if self._test_only_disable_non_trt_optimizers else \
            graph_io.GRAPPLER_OPTIMIZERS
        graph_def = graph_io.optimize_and_unroll(graph.as_graph_def(), graph, [_node_name(n) for n in protected],
                                                 optimizers)
        view = GraphView(graph_def)
        params = self._params
        result = segment_graph(view, minimum_segment_size=params.minimum_segment_size,
                               nodes_denylist={_node_name(n) for n in protected}, fetches=fetches,
                               precision_mode=params.precision)
        self._report = result.report
        segments, plans = self._static_engines(view, result.segments)
        attrs = EngineOpAttrs(precision_mode=params.precision,
                              max_cached_engines_count=params.maximum_cached_engines,
                              workspace_size_bytes=params.max_workspace_size_bytes,
                              use_calibration=params.use_calibration,
                              max_batch_size=self._max_batch_size_attr,
                              use_function_backup=self._use_function_backup)
        converted, _ = rewrite(graph_def, view, segments, attrs, fetches=fetches)
        # the engine ops outlive the functions and sessions this converter makes and drops, until it goes
        weakref.finalize(self, dispatcher.pin(n.attr["segment_key"].s.decode() for n in converted.node
                                              if n.op == ENGINE_OP))
        engine_nodes = [n for n in converted.node if n.op == ENGINE_OP]  # in segment order
        for node, segment, plan in zip(engine_nodes, segments, plans):
            if plan is not None:
                node.attr["serialized_segment"].s = plan
                node.attr["static_engine"].b = True
                node.attr[ALLOW_BUILD_ATTR].b = False  # a static op never builds at run time
            elif not self._use_function_backup:  # dynamic builds need the segment (TF-TRT 1.x keeps it here)
                node.attr["serialized_segment"].s = segment.graph_def(view).SerializeToString()
        self._converted_graph_def = converted
        self._converted = True
        logger.info("converted %s: %d engine op(s), %d static", self._input_saved_model_dir or "the GraphDef",
                    len(segments), sum(p is not None for p in plans))
        return converted

    def _freeze_saved_model(self):
        """(frozen GraphDef, nodes to keep native) of the SavedModel signature; keeps the signature def."""
        key = self._input_saved_model_signature_key
        with tf.compat.v1.Session(graph=tf.Graph(), config=self._session_config) as sess:
            meta_graph = tf.compat.v1.saved_model.loader.load(sess, self._input_saved_model_tags,
                                                              self._input_saved_model_dir)
            if key not in meta_graph.signature_def:
                raise ValueError(f"SavedModel {self._input_saved_model_dir!r} has no signature {key!r}; "
                                 f"available: {sorted(meta_graph.signature_def)}")
            self._signature_def = meta_graph.signature_def[key]
            io_nodes = {_node_name(t.name) for t in list(self._signature_def.inputs.values())
                        + list(self._signature_def.outputs.values())}
            # Signature tensors stay native (TF-TRT keeps its fetch nodes out of engines): the signature
            # def stays valid for save().
            protected = sorted(io_nodes | {_node_name(n) for n in self._nodes_denylist})
            frozen = tf.compat.v1.graph_util.convert_variables_to_constants(
                sess, sess.graph.as_graph_def(add_shapes=True), protected)
        return frozen, protected

    def _static_engines(self, view, segments):
        """(segments to convert, plan bytes or None per segment). Static mode builds each engine for
        max_batch_size now; a segment whose build fails stays native; unknown non-batch dims make that op
        dynamic (with the user guide's warning)."""
        if self._is_dynamic_op:
            return list(segments), [None] * len(segments)
        config = BuilderConfig(precision=self._params.precision,
                               max_workspace_size=self._params.max_workspace_size_bytes)
        kept, plans = [], []
        for i, segment in enumerate(segments):
            shapes = [view.shape(ref) for ref in segment.inputs]
            if any(s is None or None in s[1:] for s in shapes):
                logger.warning("%s (segment %d, input shapes %s)", STATIC_SHAPES_WARNING, i,
                               [None if s is None else list(s) for s in shapes])
                kept.append(segment)
                plans.append(None)
                continue
            batch = segment_max_batch_size(segment, view, self._max_batch_size)
            shapes = [(batch,) + tuple(s[1:]) if s else () for s in shapes]
            try:
                engine = build_engine(SegmentGraph.from_graph_def(segment.graph_def(view)), shapes,
                                      name=f"segment_{i}", config=config)
            except MissingQuantizationRangeError:  # INT8 without calibration: the user must add ranges (2.9.3.1)
                raise
            except Exception as exc:  # TF-TRT leaves a segment native when its static engine fails to build
                logger.warning("static engine for segment %d (input shapes %s) failed to build, so it stays "
                               "native: %s: %s", i, [list(s) for s in shapes], type(exc).__name__, exc)
                continue
            kept.append(segment)
            plans.append(engine.serialize())
        return kept, plans

    # -- calibrate ------------------------------------------------------------
    def calibrate(self, fetch_names, num_runs, feed_dict_fn=None, input_map_fn=None):
        """Run the converted graph num_runs times (INT8 calibration) and return the calibrated GraphDef,
        each engine op's calibration table in its ``calibration_data`` attr."""
        assert self._converted, "Need to call convert() before calibrate()"
        assert self._need_calibration, "calibrate() needs precision_mode='INT8' and use_calibration=True"
        assert not self._calibration_data_collected, "calibrate() was already called"
        if (feed_dict_fn and input_map_fn) or (not feed_dict_fn and not input_map_fn):
            raise ValueError("Should specify one and only one of feed_dict_fn and input_map_fn.")
        graph = tf.Graph()
        with graph.as_default():
            input_map = input_map_fn() if input_map_fn else None
            for k, v in (input_map or {}).items():
                if not isinstance(k, str):
                    raise ValueError("Keys of input_map_fn must be of type str")
                if not isinstance(v, tf.Tensor):
                    raise ValueError("Values of input_map_fn must be of type tf.Tensor")
            fetches = tf.graph_util.import_graph_def(self._converted_graph_def, input_map=input_map,
                                                     return_elements=fetch_names, name="")
        nodes = [n for n in self._converted_graph_def.node if n.op == ENGINE_OP]
        keys = [n.attr["segment_key"].s.decode() for n in nodes]
        for key in keys:
            dispatcher.start_calibrating(key, self._params.calibration_algorithm)
        try:
            with tf.compat.v1.Session(graph=graph, config=self._session_config) as sess:
                for _ in range(num_runs):
                    sess.run(fetches, feed_dict=feed_dict_fn() if feed_dict_fn else None)
        finally:
            tables = [dispatcher.finish_calibrating(key) for key in keys]
        for node, table in zip(nodes, tables):
            node.attr["calibration_data"].s = table
        self._calibration_data_collected = True
        return self._converted_graph_def

    # -- save -----------------------------------------------------------------
    def save(self, output_saved_model_dir):
        """Save the converted graph as a TF1 SavedModel with the input's signature def."""
        assert self._converted, "Need to call convert() before save()"
        if self._need_calibration:
            assert self._calibration_data_collected, "Need to call calibrate() before save() in INT8 calibration mode"
        if self._input_graph_def:
            raise ValueError("Not able to save to a SavedModel since input is a GraphDef")
        builder = tf.compat.v1.saved_model.Builder(output_saved_model_dir)
        with tf.Graph().as_default():
            tf.graph_util.import_graph_def(self._converted_graph_def, name="")
            with tf.compat.v1.Session(config=self._session_config) as sess:
                builder.add_meta_graph_and_variables(
                    sess, self._input_saved_model_tags,
                    signature_def_map={self._input_saved_model_signature_key: self._signature_def})
        builder.save()
