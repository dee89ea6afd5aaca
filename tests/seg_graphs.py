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
    """The graph with each segment replaced by one node reading the segment's inputs (its copies inside it) has
    no cycle (data and control edges)."""
    view = result.view
    owner = {name: f"segment{seg.name_index}" for seg in result.segments for name in seg.nodes}
    deps = {name: [split_ref(r)[0] for r in node.inputs] + node.control_inputs
            for name, node in view.nodes.items() if name not in owner}
    for seg in result.segments:
        deps[f"segment{seg.name_index}"] = [split_ref(r)[0] for r in seg.inputs] + seg.control_inputs
    edges = {}
    for name, srcs in deps.items():
        for src in srcs:
            edges.setdefault(owner.get(src, src), set()).add(name)
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
