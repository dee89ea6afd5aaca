"""A CNN trained here on scikit-learn's digits keeps its held-out accuracy in FP16 (within 0.5 points of FP32),
INT8 (within 1 point, for each calibrator) and FP8 (within 1 point, minmax ranges; computed by the numpy
backend as the GPU computes E4M3). Prints the table the README shows (pytest -s)."""
import pytest

from models import digits_cnn


@pytest.mark.slow
def test_digits_cnn_accuracy_in_fp16_int8_and_fp8(tmp_path):
    path = str(tmp_path / "digits_cnn")
    trained = digits_cnn.save(path)
    assert trained >= 95.0
    rows = digits_cnn.evaluate(path)
    print("\n" + digits_cnn.format_table(rows))
    by = {(r["precision"], r["calibrator"]): r["accuracy"] for r in rows}
    fp32 = by[("FP32", None)]
    assert by[("TensorFlow", None)] == pytest.approx(trained) and fp32 == pytest.approx(trained)
    assert abs(by[("FP16", None)] - fp32) <= 0.5
    for calibrator in digits_cnn.CALIBRATORS:
        assert abs(by[("INT8", calibrator)] - fp32) <= 1.0, calibrator
    assert abs(by[("FP8", "minmax")] - fp32) <= 1.0
    assert all(r["calibration_s"] > 0 for r in rows if r["precision"] in ("INT8", "FP8"))
