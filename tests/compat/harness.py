"""Convert a compat case as TF-TRT's integration tests do and read back what the conversion made."""
import inspect

import tensorflow as tf

from tftrt_py import trt_convert as trt

INPUT_PLACEHOLDER, OUTPUT_IDENTITY = "TensorRTInputPH_", "TensorRTOutputPH_"
#: Prefixes function inlining gives the nodes of the signature's function.
INLINED = ("StatefulPartitionedCall/", "PartitionedCall/")
#: Output tolerances (rtol = atol) per precision, as DESIGN.md's numerics.
TOLERANCE = {"FP32": 1e-5, "FP16": 1e-2, "INT8": 1e-1}


def save_case(case, directory):
    module = tf.Module()
    module.run = tf.function(case.fn, input_signature=case.specs)
    tf.saved_model.save(module, directory, signatures=module.run)
    return directory


def without_graph_number(name):
    """TRTEngineOp_000_001 -> TRTEngineOp_001 (TF-TRT's tests strip the per-conversion graph number)."""
    prefix, _graph, index = name.split("_")
    return f"{prefix}_{index}"


class Converted:
    """A V2 conversion of a case: converter, converted graph, engine nodes and their segments."""

    def __init__(self, case, saved_model_dir, precision="FP32", dynamic=False, strategy="Range"):
        self.case = case
        kwargs = dict(use_dynamic_shape=True, dynamic_shape_profile_strategy=strategy) if dynamic else {}
        self.converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model_dir, precision_mode=precision,
                                                 maximum_cached_engines=4, **kwargs)
        batches = [case.inputs(b) for b in case.batches]
        calibrate = (lambda: iter(batches)) if precision == "INT8" else None
        self.func = self.converter.convert(calibration_input_fn=calibrate)
        self.converter.build(input_fn=lambda: iter(batches))
        self.graph_def = self.converter._converted_graph_def
        self.original = tf.saved_model.load(saved_model_dir).signatures["serving_default"]
        functions = {f.signature.name: f for f in self.graph_def.library.function}
        self.engines = {without_graph_number(n.name): n for n in self.graph_def.node if n.op == "TRTEngineOp"}
        self.segments = {name: functions[n.attr["segment_func"].func.name] for name, n in self.engines.items()}

    def segment_nodes(self, engine):
        """(op nodes but Identities, Const nodes) of `engine`'s native segment, by name in the case's function."""
        nodes = [n for n in self.segments[engine].node_def
                 if not n.name.startswith((INPUT_PLACEHOLDER, OUTPUT_IDENTITY))]
        return ({case_name(n.name) for n in nodes if n.op not in ("Const", "Identity")},
                {case_name(n.name) for n in nodes if n.op == "Const"})

    def graph_nodes(self):
        """Names (as in the case's function) of the converted graph's nodes."""
        return {case_name(n.name) for n in self.graph_def.node}

    def outputs(self, inputs):
        """(converted, native) outputs for one set of inputs, as lists of arrays."""
        feeds = {name: tf.constant(x) for name, x in zip(inspect.signature(self.case.fn).parameters, inputs)}
        got, want = self.func(**feeds), self.original(**feeds)
        return [got[k].numpy() for k in sorted(got)], [want[k].numpy() for k in sorted(want)]


def case_name(name):
    return next((name[len(p):] for p in INLINED if name.startswith(p)), name)


def case_ops(case):
    """Node name -> op type in the case's function."""
    graph = tf.function(case.fn).get_concrete_function(*case.specs).graph
    return {op.name: op.type for op in graph.get_operations()}
