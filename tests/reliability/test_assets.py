"""Engine assets are read only as bounded regular files directly inside a SavedModel's assets directory."""
import os

import numpy as np
import pytest
import tensorflow as tf

from tftrt_py import trt_convert as trt
from tftrt_py.engine import PlanError
from tftrt_py.engine_op import dispatcher
from tftrt_py.engine_op.cache import MAX_ASSET_BYTES_ENV, pack_plans, read_asset


@pytest.fixture
def assets(tmp_path):
    d = tmp_path / "model" / "assets"
    d.mkdir(parents=True)
    return d


def test_a_regular_file_in_assets_is_read(assets):
    (assets / "trt-serialized-engine.op").write_bytes(pack_plans([]))
    assert read_asset(str(assets / "trt-serialized-engine.op")) == pack_plans([])


@pytest.mark.parametrize("name", ["../../../dev/zero", "../saved_model.pb", "sub/file"])
def test_paths_leaving_the_assets_directory_are_refused(assets, name):
    with pytest.raises(PlanError, match="not a file directly inside a SavedModel's assets directory"):
        read_asset(os.path.join(str(assets), name))


def test_symlinks_are_refused(assets):
    os.symlink("/dev/zero", assets / "trt-serialized-engine.op")
    with pytest.raises(PlanError, match="cannot open engine asset"):
        read_asset(str(assets / "trt-serialized-engine.op"))


def test_fifos_are_refused_without_hanging(assets):
    os.mkfifo(assets / "trt-serialized-engine.op")
    with pytest.raises(PlanError, match="not a regular file"):
        read_asset(str(assets / "trt-serialized-engine.op"))


def test_a_file_over_the_limit_is_refused(assets, monkeypatch):
    (assets / "trt-serialized-engine.op").write_bytes(b"\0" * 2048)
    monkeypatch.setenv(MAX_ASSET_BYTES_ENV, "1024")
    with pytest.raises(PlanError, match="holds 2048 bytes, more than the limit of 1024"):
        read_asset(str(assets / "trt-serialized-engine.op"))


def test_a_model_whose_engine_asset_is_a_symlink_to_dev_zero_still_serves(saved_model, tmp_path, caplog):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("mlp"))
    converter.convert()
    x = np.random.default_rng(0).standard_normal((3, 16)).astype("float32")
    converter.build(lambda: [(tf.constant(x),)])
    out = str(tmp_path / "trt")
    converter.save(out)
    [asset] = os.listdir(os.path.join(out, "assets"))
    os.remove(os.path.join(out, "assets", asset))
    os.symlink("/dev/zero", os.path.join(out, "assets", asset))
    want = tf.saved_model.load(saved_model("mlp")).signatures["serving_default"](features=tf.constant(x))
    with caplog.at_level("ERROR", logger=dispatcher.__name__):
        got = tf.saved_model.load(out).signatures["serving_default"](features=tf.constant(x))
    assert "cannot read saved engines" in caplog.text
    for key in want:
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-5, atol=1e-5)
