"""Small GraphDefs for the segmenter tests, built in a tf.Graph with the node names given."""
import tensorflow as tf

from tftrt_py.convert.graph import split_ref


def graph_def(build):
    """The GraphDef of what `build()` adds to a fresh tf.Graph."""
    graph = tf.Graph()
    with graph.as_default():
        build()
    return graph.as_graph_def()


def placeholder(name="x", shape=(2, 3), dtype=tf.float32):
    return tf.compat.v1.placeholder(dtype, shape, name=name)


def native(x, name):
    """An op with no converter (Cumsum)."""
    return tf.raw_ops.Cumsum(x=x, axis=tf.constant(0, name=f"{name}_axis"), name=name)


def relu_chain(x, names):
    for name in names:
        x = tf.nn.relu(x, name=name)
    return x


def members(result):
    return [seg.nodes for seg in result.segments]


def assert_acyclic(result):
    """The graph with each segment contracted to one node has no cycle (data and control edges)."""
    view = result.view
    owner = {name: f"segment{seg.name_index}" for seg in result.segments for name in seg.nodes}
    edges = {}
    for node in view.nodes.values():
        for src in [split_ref(r)[0] for r in node.inputs] + node.control_inputs:
            a, b = owner.get(src, src), owner.get(node.name, node.name)
            if a != b:
                edges.setdefault(a, set()).add(b)
    state = {}

    def visit(n):
        state[n] = "open"
        for m in edges.get(n, ()):
            assert state.get(m) != "open", f"cycle through {m}"
            if m not in state:
                visit(m)
        state[n] = "done"

    for n in list(edges):
        if n not in state:
            visit(n)
