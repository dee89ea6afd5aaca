"""Plans round-trip exactly; damaged or foreign plans raise a PlanError saying what is wrong."""
import numpy as np
import pytest

from tftrt_py.engine import PlanError, Runtime
from tftrt_py.engine import plan as plan_lib


def _run(engine, x):
    return engine.create_execution_context().execute_v2([x])[0]


def test_round_trip_gives_identical_outputs(conv_engine):
    x = np.random.default_rng(1).standard_normal((4, 8, 8, 3)).astype("float32")
    loaded = Runtime().deserialize_cuda_engine(conv_engine.serialize())
    np.testing.assert_array_equal(_run(loaded, x), _run(conv_engine, x))
    assert [l.name for l in loaded.network.layers] == [l.name for l in conv_engine.network.layers]
    assert loaded.precision == "FP32" and loaded.get_binding_name(0) == "TensorRTInputPH_0"


def test_truncated_plan(conv_engine):
    data = conv_engine.serialize()
    with pytest.raises(PlanError, match="truncated"):
        Runtime().deserialize_cuda_engine(data[: len(data) // 2])
    with pytest.raises(PlanError, match="truncated"):
        Runtime().deserialize_cuda_engine(data[:10])


def test_bit_flip_is_detected(conv_engine):
    data = bytearray(conv_engine.serialize())
    data[len(data) // 2] ^= 0x10
    with pytest.raises(PlanError, match="checksum"):
        Runtime().deserialize_cuda_engine(bytes(data))


def test_foreign_file_and_newer_version(conv_engine):
    with pytest.raises(PlanError, match="not a tftrt_py plan"):
        Runtime().deserialize_cuda_engine(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    data = bytearray(conv_engine.serialize())
    data[8:12] = (plan_lib.FORMAT_VERSION + 1).to_bytes(4, "little")
    with pytest.raises(PlanError, match="format version"):
        Runtime().deserialize_cuda_engine(bytes(data))


def test_loading_never_unpickles(conv_engine):
    header = plan_lib.read_header(conv_engine.serialize())
    assert all("pickle" not in str(v) for v in header.values())
