"""Loading a SavedModel for one signature restores the variables that signature reads, and only those when the
checkpoint maps them; a captured resource whose state lives in the checkpoint (a hash table) gets TensorFlow's own
restore; a TF1 SavedModel's variables come restored by its loader."""
import numpy as np
import pytest
import tensorflow as tf

from tftrt_py import trt_convert as trt
from tftrt_py.converters import restore
from tftrt_py.converters.graph_io import SavedModelError

SPEC = tf.TensorSpec([None, 3], tf.float32)


class TwoWeights(tf.Module):
    """A signature reading `used` and a second function reading `unused`."""

    def __init__(self):
        super().__init__()
        self.used = tf.Variable(np.arange(12, dtype=np.float32).reshape(3, 4) / 7)
        self.unused = tf.Variable(np.full((4, 4), 5, np.float32))

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        return {"y": tf.matmul(x, self.used)}

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def other(self, x):
        return tf.matmul(x, self.unused)


def save(module, path, **signatures):
    tf.saved_model.save(module, str(path), signatures=signatures or {"serving_default": module.serve})
    return str(path)


def test_the_signature_s_variables_are_restored_and_the_others_are_not_read(tmp_path):
    module = TwoWeights()
    path = save(module, tmp_path / "m")
    loaded = restore.load_for_signature(path, ["serve"], "serving_default")
    np.testing.assert_array_equal(loaded.used.numpy(), module.used.numpy())
    assert not bool(loaded.unused.is_initialized())
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(loaded.signatures["serving_default"](tf.constant(x))["y"].numpy(),
                                  x @ module.used.numpy())


def test_a_variable_shared_by_two_trackable_lists_is_restored_once_from_its_key(tmp_path):
    """A Keras export tracks each weight in two lists; the walk finds the variable under either."""
    module = TwoWeights()
    module.all_weights = [module.used, module.unused]
    loaded = restore.load_for_signature(save(module, tmp_path / "m"), ["serve"], "serving_default")
    np.testing.assert_array_equal(loaded.used.numpy(), module.used.numpy())


class ManyWeights(tf.Module):
    """Variables of several sizes and dtypes, more of them than the restore's threads."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(3)
        self.weights = [tf.Variable(rng.standard_normal((n, 3)).astype(np.float32)) for n in (1, 40, 7, 300, 2, 9)]
        self.offsets = tf.Variable(rng.integers(-5, 5, (3,)).astype(np.int32))
        self.scale = tf.Variable(np.float16(0.5))

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        y = sum(tf.reduce_sum(w) for w in self.weights) + tf.cast(tf.reduce_sum(self.offsets), tf.float32)
        return {"y": x * y * tf.cast(self.scale, tf.float32)}


def test_variables_read_in_several_threads_each_get_their_own_value(tmp_path, monkeypatch):
    monkeypatch.setattr(restore, "RESTORE_THREADS", 3)
    module = ManyWeights()
    loaded = restore.load_for_signature(save(module, tmp_path / "m"), ["serve"], "serving_default")
    for got, want in zip(loaded.weights + [loaded.offsets, loaded.scale],
                         module.weights + [module.offsets, module.scale]):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.numpy(), want.numpy())


class Table(tf.Module):
    """A signature reading a MutableHashTable, whose contents only the checkpoint holds."""

    def __init__(self):
        super().__init__()
        self.scale = tf.Variable(2.0)
        self.table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.float32, default_value=-1.0)
        self.table.insert(tf.constant([1, 2], tf.int64), tf.constant([10.0, 20.0]))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def serve(self, keys):
        return {"y": self.table.lookup(keys) * self.scale}


def test_a_captured_table_gets_tensorflow_s_whole_restore(tmp_path):
    loaded = restore.load_for_signature(save(Table(), tmp_path / "m"), ["serve"], "serving_default")
    out = loaded.signatures["serving_default"](tf.constant([1, 2, 3], tf.int64))["y"].numpy()
    np.testing.assert_array_equal(out, [20.0, 40.0, -2.0])


def test_a_missing_signature_restores_nothing_and_is_left_to_the_caller(tmp_path):
    loaded = restore.load_for_signature(save(TwoWeights(), tmp_path / "m"), ["serve"], "absent")
    assert not bool(loaded.used.is_initialized())


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "reference"])
def test_a_tf1_saved_model_comes_restored_by_its_loader(tmp_path, resource):
    """Its name-based checkpoint has no object graph: TensorFlow's loader restores it, reference variables too."""
    path = str(tmp_path / "tf1")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.compat.v1.get_variable("w", initializer=np.eye(3, dtype=np.float32) * 3, use_resource=resource)
        y = tf.identity(tf.matmul(x, w), name="y")
        sess.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.saved_model.simple_save(sess, path, {"x": x}, {"y": y})
    loaded = restore.load_for_signature(path, ["serve"], "serving_default")
    out = loaded.signatures["serving_default"](x=tf.ones([1, 3]))["y"].numpy()
    np.testing.assert_array_equal(out, [[3.0, 3.0, 3.0]])


def test_a_converted_model_equals_the_native_one(tmp_path):
    module = TwoWeights()
    path = save(module, tmp_path / "m")
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=path)
    func = converter.convert()
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(func(tf.constant(x))["y"].numpy(), x @ module.used.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("damage", ["truncated", "removed"])
def test_a_damaged_checkpoint_is_one_clear_error(tmp_path, damage):
    path = save(TwoWeights(), tmp_path / "m")
    data = next((tmp_path / "m" / "variables").glob("variables.data-*"))
    if damage == "truncated":
        data.write_bytes(data.read_bytes()[:10])
    else:
        data.unlink()
    with pytest.raises(SavedModelError, match="cannot load"):
        trt.TrtGraphConverterV2(input_saved_model_dir=path).convert()


class Looping(tf.Module):
    """A signature calling functions through attributes (a while loop's body and condition, a cond's branches),
    a function with a registered gradient, and reading a captured constant."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.eye(3, dtype=np.float32) * 0.5)
        self.offset = tf.constant(np.arange(3, dtype=np.float32))

    @tf.function(input_signature=[SPEC])
    def serve(self, x):
        @tf.custom_gradient
        def scaled(v):
            return v * 2.0, lambda dy: dy * 2.0

        y = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, tf.matmul(v, self.w)), (0, x))[1]
        y = tf.cond(tf.reduce_sum(y) > 0, lambda: scaled(y), lambda: y - 1.0)
        return {"y": y + self.offset}


def _library(path):
    from tensorflow.python.saved_model import loader_impl
    return loader_impl.parse_saved_model(path).meta_graphs[0]


def test_the_loader_gets_only_the_functions_the_object_graph_calls(tmp_path, monkeypatch):
    """The TF1-style saver's functions (traced_save/traced_restore) go; every concrete function of the object graph
    and each function it reaches stays; the loaded signature computes as the original, loaded pruned (not by
    tf.saved_model.load's whole load)."""
    module = Looping()
    path = save(module, tmp_path / "m")
    meta = _library(path)
    before = {f.signature.name for f in meta.graph_def.library.function}
    restore._prune(meta)
    after = {f.signature.name for f in meta.graph_def.library.function}
    assert {n for n in before - after} and all("traced_save" in n or "traced_restore" in n for n in before - after)
    assert set(meta.object_graph_def.concrete_functions) <= after
    assert any("while_body" in n for n in after) and any("cond_true" in n for n in after)
    assert {n.name for n in meta.graph_def.node} == {
        n.constant.operation for n in meta.object_graph_def.nodes if n.WhichOneof("kind") == "constant"} != set()
    monkeypatch.setattr(tf.saved_model, "load", None)
    loaded = restore.load_for_signature(path, ["serve"], "serving_default")
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_allclose(loaded.signatures["serving_default"](tf.constant(x))["y"].numpy(),
                               module.serve(tf.constant(x))["y"].numpy(), rtol=1e-6)


def test_tags_the_saved_model_lacks_get_tensorflow_s_own_error(tmp_path):
    path = save(TwoWeights(), tmp_path / "m")
    with pytest.raises(ValueError, match="incompatible argument to `tags`"):
        restore.load_for_signature(path, ["train"], "serving_default")
