"""The calibration table's text format (TensorRT's) and its round trip."""
import struct

import pytest

from tftrt_py.calibration import CalibrationTable, CalibrationTableError


def test_round_trip_in_tensorrt_format():
    ranges = {"TensorRTInputPH_0": 2.5, "model/conv1/Relu:0": 6.0, "a name: with colons:0": 0.001}
    data = CalibrationTable("EntropyCalibration2", ranges).to_bytes()
    lines = data.decode().splitlines()
    assert lines[0] == "TRT-tftrt_py-EntropyCalibration2"
    assert lines[1] == "TensorRTInputPH_0: " + struct.pack(">f", 2.5 / 127).hex()
    table = CalibrationTable.from_bytes(data)
    assert table.calibrator == "EntropyCalibration2" and list(table.ranges) == list(ranges)
    for name, amax in ranges.items():
        assert table.ranges[name] == pytest.approx(amax, rel=1e-6)
    assert CalibrationTable.from_bytes(table.to_bytes()).ranges == table.ranges  # stable after one trip


def test_reads_tables_of_tensorrt_and_decimal_scales():
    table = CalibrationTable.from_bytes(b"TRT-8601-EntropyCalibration2\ninput: 3c010a14\nrelu:0: 0.05\n\n")
    assert table.calibrator == "EntropyCalibration2"
    assert table.ranges["input"] == pytest.approx(struct.unpack(">f", bytes.fromhex("3c010a14"))[0] * 127)
    assert table.ranges["relu:0"] == pytest.approx(0.05 * 127)


@pytest.mark.parametrize("data, message", [
    (b"", "calibration table is empty"),
    (b'{"TensorRTInputPH_0": 2.5}', "must start with a 'TRT-...' header line"),
    (b"TRT-tftrt_py-MinMaxCalibration\nno separator here\n", r"line 2 \('no separator here'\): expected"),
    (b"TRT-tftrt_py-MinMaxCalibration\nx: 3c010a14\ny: -1.0\n", r"line 3 .*not a finite number >= 0"),
    (b"\xff\xfe", "not text"),
])
def test_bad_tables_raise_naming_the_problem(data, message):
    with pytest.raises(CalibrationTableError, match=message):
        CalibrationTable.from_bytes(data)
