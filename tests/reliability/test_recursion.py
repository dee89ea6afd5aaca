"""A crafted model whose native segment function holds a TRTEngineOp or calls itself would recurse without end
(building from it, or running it as the fallback): the engine op refuses it at once with the reason."""
import pytest
import tensorflow as tf
from tensorflow.core.framework import function_pb2, graph_pb2, types_pb2

from tftrt_py.convert.build import SegmentGraph
from tftrt_py.convert.errors import ConversionError
from tftrt_py.engine_op import library

FLOAT = types_pb2.DT_FLOAT


def function(name, inner_op=None, callee=None):
    """FunctionDef `name`(x) -> y; y = x * x, or the output of an `inner_op` node calling `callee`."""
    fdef = function_pb2.FunctionDef()
    fdef.signature.name = name
    fdef.signature.input_arg.add(name="x", type=FLOAT)
    fdef.signature.output_arg.add(name="y", type=FLOAT)
    node = fdef.node_def.add(name="inner", input=["x"])
    if inner_op == "TRTEngineOp":
        node.op = "TRTEngineOp"
        node.attr["InT"].list.type.append(FLOAT)
        node.attr["OutT"].list.type.append(FLOAT)
        node.attr["segment_func"].func.name = callee
        fdef.ret["y"] = "inner:out_tensor:0"
    elif inner_op == "PartitionedCall":
        node.op = "PartitionedCall"
        node.attr["Tin"].list.type.append(FLOAT)
        node.attr["Tout"].list.type.append(FLOAT)
        node.attr["f"].func.name = callee
        fdef.ret["y"] = "inner:output:0"
    else:
        node.op, node.input[:] = "Mul", ["x", "x"]
        node.attr["T"].type = FLOAT
        fdef.ret["y"] = "inner:z:0"
    return fdef


def engine_op_model(functions):
    """A concrete function running one TRTEngineOp whose segment_func is functions[0] (no engine, no plan)."""
    library.load()
    graph_def = graph_pb2.GraphDef()
    graph_def.library.function.extend(functions)
    graph_def.node.add(name="x", op="Placeholder").attr["dtype"].type = FLOAT
    op = graph_def.node.add(name="TRTEngineOp_000_000", op="TRTEngineOp", input=["x"])
    op.attr["InT"].list.type.append(FLOAT)
    op.attr["OutT"].list.type.append(FLOAT)
    op.attr["segment_func"].func.name = functions[0].signature.name
    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name="m"), [])
    return wrapped.prune(wrapped.graph.get_tensor_by_name("m/x:0"),
                         wrapped.graph.get_tensor_by_name("m/TRTEngineOp_000_000:0"))


# Function names are global to the process (TF's eager context): each case has its own.
CRAFTED = {
    "an engine op of itself inside": ([function("seg1", "TRTEngineOp", "seg1")], "seg1 contains a TRTEngineOp"),
    "an engine op of another function inside": ([function("seg2", "TRTEngineOp", "other2"), function("other2")],
                                                "seg2 contains a TRTEngineOp"),
    "a call to itself": ([function("seg3", "PartitionedCall", "seg3")], "seg3 calls itself"),
}


@pytest.mark.parametrize("functions, reason", CRAFTED.values(), ids=CRAFTED.keys())
def test_a_recursive_segment_is_refused_with_the_reason(functions, reason):
    with pytest.raises(ConversionError, match=reason):
        SegmentGraph.from_function_def(functions[0])
    model = engine_op_model(functions)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"TRTEngineOp m/TRTEngineOp_000_000: RecursiveSegmentError: no engine or native "
                             f"segment can serve it: its native segment function {reason}"):
        model(tf.ones([2]))


# Through another function: the kernel hands create() every function the segment reaches.
INDIRECT = {
    "a call to itself through another function": (
        [function("seg5", "PartitionedCall", "mid5"), function("mid5", "PartitionedCall", "seg5")],
        "seg5 calls itself through mid5"),
    "an engine op inside a function it calls": (
        [function("seg6", "PartitionedCall", "mid6"), function("mid6", "TRTEngineOp", "other6"),
         function("other6")], r"seg6 contains a TRTEngineOp \(inner, through mid6\)"),
}


@pytest.mark.parametrize("functions, reason", INDIRECT.values(), ids=INDIRECT.keys())
def test_recursion_through_other_functions_is_refused_with_the_reason(functions, reason):
    model = engine_op_model(functions)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"RecursiveSegmentError: .*{reason}"):
        model(tf.ones([2]))


def test_a_segment_calling_a_plain_function_still_runs():
    model = engine_op_model([function("seg7", "PartitionedCall", "mid7"), function("mid7")])
    assert model(tf.constant([2.0, 3.0])).numpy().tolist() == [4.0, 9.0]


def test_a_plain_segment_still_runs():
    model = engine_op_model([function("seg4")])
    assert model(tf.constant([2.0, 3.0])).numpy().tolist() == [4.0, 9.0]
