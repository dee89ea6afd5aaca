"""An engine op's INT8 calibration: its calibration table, or the collector filling one.

An op with precision INT8 and use_calibration whose ``calibration_data`` is empty calibrates (as TF-TRT's
op does): each run executes an FP32 calibration engine for the input shapes, recording every tensor into
the collector, and returns its outputs. :meth:`OpCalibration.finish` turns the histograms into the table;
from then on the op builds INT8 engines with the table's ranges. TrtGraphConverterV2.convert() starts
calibration explicitly with the conversion's calibration_algorithm (:func:`dispatcher.start_calibrating`);
otherwise an op starts its precision's default calibrator on its first run.
"""
from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from tftrt_py.calibration.collector import CalibrationEngine, Collector
from tftrt_py.calibration.table import CalibrationTable, CalibrationTableError

__all__ = ["OpCalibration"]

logger = logging.getLogger(__name__)


class OpCalibration:
    """Calibration state of one engine op."""

    def __init__(self, op_name: str, needed: bool, calibration_data: bytes = b"", default: str = "entropy"):
        self.op_name, self.default = op_name, default
        self.needed = needed  # INT8 with use_calibration
        self.table = b""
        self.ranges: Optional[Dict[str, float]] = None  # by engine tensor name, once there is a table
        self.collector: Optional[Collector] = None
        self._engines: Dict[tuple, CalibrationEngine] = {}
        self._lock = threading.Lock()
        if calibration_data:
            self.set_table(calibration_data)

    def set_table(self, data: bytes) -> None:
        """Use the calibration table `data` (a table that cannot be read is logged and gives no ranges)."""
        with self._lock:
            self.table = bytes(data)
            try:
                self.ranges = CalibrationTable.from_bytes(self.table).ranges
            except CalibrationTableError as exc:
                logger.warning("TRTEngineOp %s: ignoring its calibration_data: %s", self.op_name, exc)
                self.ranges = {}
            self.collector = None
            self._engines.clear()

    def start(self, algorithm: Optional[str] = None) -> None:
        """Collect statistics (again) with `algorithm` (None: the default); the op's runs calibrate until finish()."""
        algorithm = algorithm or self.default
        with self._lock:
            self.collector = Collector(algorithm)
            self._engines.clear()
            logger.info("TRTEngineOp %s: calibration (%s) started", self.op_name, algorithm)

    @property
    def active(self) -> bool:
        """True while the op's runs calibrate (starting the default calibrator when it needs a table)."""
        if self.collector is None and self.needed and self.ranges is None:
            self.start()
        return self.collector is not None

    def run(self, make_engine: Callable[[tuple], CalibrationEngine], arrays: Sequence[np.ndarray]
            ) -> List[np.ndarray]:
        """One calibration run: the FP32 outputs for `arrays`, their tensors recorded.

        `make_engine(shapes)` defines the calibration engine the first time a shape arrives.
        """
        shapes = tuple(tuple(a.shape) for a in arrays)
        with self._lock:
            collector, engine = self.collector, self._engines.get(shapes)
        if engine is None:
            engine = make_engine(shapes)
            with self._lock:
                self._engines[shapes] = engine
        return engine.execute(arrays, collector)

    def finish(self) -> List[tuple]:
        """Turn the statistics into the table (kept in :attr:`table`); the input shapes calibrated.

        Nothing collected (the op never ran) leaves the op without a table, logged as TF-TRT does.
        """
        with self._lock:
            collector, self.collector = self.collector, None
            self._engines.clear()
        if collector is None:
            return []
        if not collector.batches:
            logger.warning("Warning calibration error for %s: it never ran during calibration", self.op_name)
            return []
        table = collector.table()
        self.set_table(table.to_bytes())
        logger.info("TRTEngineOp %s: calibrated %d tensor(s) over %d batch(es) (%s)", self.op_name,
                    len(table.ranges), collector.batches, collector.calibrator.name)
        return list(collector.shapes)
