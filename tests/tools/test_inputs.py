"""Input helpers of the tools: .npy/.npz files, synthetic data, shape overrides, binding by name."""
import numpy as np
import pytest

from tftrt_py.tools.inputs import InputError, bind, load_arrays, parse_shape_override, synthetic


def test_parse_shape_override():
    assert parse_shape_override("image:1x32x32x3") == ("image", (1, 32, 32, 3))
    assert parse_shape_override("scope/x:0:8X4") == ("scope/x:0", (8, 4))
    assert parse_shape_override("s:") == ("s", ())
    for bad in ("image", ":1x2", "image:1xax3", "image:-1x3"):
        with pytest.raises(InputError):
            parse_shape_override(bad)


def test_load_arrays(tmp_path):
    a, b = np.arange(6.0).reshape(2, 3), np.ones((2,), "int32")
    np.save(tmp_path / "one.npy", a)
    np.savez(tmp_path / "positional.npz", *([b] * 10 + [a]))  # arr_10 comes after arr_9
    np.savez(tmp_path / "named.npz", features=a, mask=b)
    [got] = load_arrays(str(tmp_path / "one.npy"))
    np.testing.assert_array_equal(got, a)
    positional = load_arrays(str(tmp_path / "positional.npz"))
    assert isinstance(positional, list) and len(positional) == 11 and positional[-1].shape == (2, 3)
    assert set(load_arrays(str(tmp_path / "named.npz"))) == {"features", "mask"}
    with pytest.raises(InputError, match="does not exist"):
        load_arrays(str(tmp_path / "missing.npy"))
    (tmp_path / "junk.npy").write_bytes(b"junk")
    with pytest.raises(InputError, match="cannot read"):
        load_arrays(str(tmp_path / "junk.npy"))
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object))
    with pytest.raises(InputError, match="cannot read"):  # never unpickles
        load_arrays(str(tmp_path / "objects.npy"))


def test_synthetic_is_seeded_and_typed():
    specs = [("x", "float32", (2, 3)), ("i", "int32", (4,)), ("b", "bool", ()), ("h", "float16", (1,))]
    one, two = synthetic(specs, seed=3), synthetic(specs, seed=3)
    for name, dtype, shape in specs:
        assert one[name].dtype == np.dtype(dtype) and one[name].shape == shape
        np.testing.assert_array_equal(one[name], two[name])
    assert not np.array_equal(synthetic(specs, seed=4)["x"], one["x"])
    with pytest.raises(InputError, match="dtype"):
        synthetic([("s", "object", (1,))])


def test_bind():
    x = np.zeros(1)
    assert list(bind([x, x], ["a", "b"])) == ["a", "b"]
    assert list(bind({"b": x, "a": x}, ["a", "b"])) == ["a", "b"]
    with pytest.raises(InputError, match="got 1 input array"):
        bind([x], ["a", "b"])
    with pytest.raises(InputError, match="named"):
        bind({"a": x, "c": x}, ["a", "b"])
