"""INT8: calibrators (entropy, minmax, percentile), the calibration table, and dynamic ranges from
quantization ops. Imports without TensorFlow."""
from tftrt_py.calibration.calibrators import CALIBRATORS, Calibrator, Histogram, get_calibrator
from tftrt_py.calibration.collector import CalibrationEngine, Collector
from tftrt_py.calibration.ranges import apply_ranges, set_range, symmetric_range
from tftrt_py.calibration.table import CalibrationTable, CalibrationTableError

__all__ = ["CALIBRATORS", "Calibrator", "Histogram", "get_calibrator", "Collector", "CalibrationEngine",
           "CalibrationTable", "CalibrationTableError", "apply_ranges", "set_range", "symmetric_range"]
