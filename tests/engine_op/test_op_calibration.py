"""An engine op's calibration state: the calibrator it starts when it needs a table and none was started."""
import pytest

from tftrt_py.engine_op.calibration import OpCalibration


@pytest.mark.parametrize("default", ["entropy", "minmax"])
def test_an_op_needing_a_table_starts_its_default_calibrator_on_its_first_run(default):
    calibration = OpCalibration("op", needed=True, default=default)
    assert calibration.active
    assert calibration.collector.calibrator.name == default


def test_a_calibrator_started_explicitly_wins_over_the_default():
    calibration = OpCalibration("op", needed=True, default="minmax")
    calibration.start("percentile")
    assert calibration.active and calibration.collector.calibrator.name == "percentile"


def test_an_op_with_a_table_or_without_quantization_does_not_calibrate():
    assert not OpCalibration("op", needed=False).active
    assert not OpCalibration("op", needed=True, calibration_data=b"TRT-tftrt_py-MinMaxCalibration\n").active
