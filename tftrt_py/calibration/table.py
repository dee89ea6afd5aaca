"""The calibration table: what an engine op keeps in its ``calibration_data`` attribute.

Text in TensorRT's format: a header line naming the calibrator, then one ``tensor: scale`` line per tensor,
the scale (dynamic range / 127) written as the hex digits of its big-endian float32, as TensorRT writes it::

    TRT-tftrt_py-EntropyCalibration2
    TensorRTInputPH_0: 3c010204
    conv1/Relu:0: 3d2a5d27

Tensor names are those of the engine network an op defines from its segment (the same for every input
shape), so one table serves every engine the op builds. Reading also takes a decimal scale.
"""
from __future__ import annotations

import dataclasses
import struct
from typing import Dict

__all__ = ["CalibrationTable", "CalibrationTableError", "HEADER_PREFIX", "QMAX"]

HEADER_PREFIX = "TRT-tftrt_py-"
QMAX = 127


class CalibrationTableError(ValueError):
    pass


def _scale_text(scale: float) -> str:
    return struct.pack(">f", scale).hex()


def _scale_value(text: str) -> float:
    text = text.strip()
    if len(text) == 8:
        try:
            return struct.unpack(">f", bytes.fromhex(text))[0]
        except ValueError:
            pass
    return float(text)


@dataclasses.dataclass
class CalibrationTable:
    """Calibrator name (as in the header, e.g. ``EntropyCalibration2``) and dynamic range per tensor."""

    calibrator: str
    ranges: Dict[str, float]

    def to_bytes(self) -> bytes:
        lines = [HEADER_PREFIX + self.calibrator]
        lines += [f"{name}: {_scale_text(amax / QMAX)}" for name, amax in self.ranges.items()]
        return ("\n".join(lines) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "CalibrationTable":
        """Parse a table; raises CalibrationTableError naming the bad line."""
        try:
            lines = data.decode().splitlines()
        except UnicodeDecodeError:
            raise CalibrationTableError("calibration table is not text") from None
        if not lines or not lines[0].startswith("TRT-"):
            raise CalibrationTableError(f"calibration table must start with a 'TRT-...' header line, got "
                                        f"{lines[0][:60]!r}" if lines else "calibration table is empty")
        ranges = {}
        for number, line in enumerate(lines[1:], start=2):
            if not line.strip():
                continue
            name, sep, value = line.rpartition(": ")
            try:
                if not sep or not name:
                    raise ValueError("expected 'tensor: scale'")
                scale = _scale_value(value)
                if not (scale >= 0 and scale != float("inf")):
                    raise ValueError(f"scale {scale} is not a finite number >= 0")
            except ValueError as exc:
                raise CalibrationTableError(f"calibration table line {number} ({line[:80]!r}): {exc}") from None
            ranges[name] = scale * QMAX
        header = lines[0][len(HEADER_PREFIX):] if lines[0].startswith(HEADER_PREFIX) else lines[0].split("-")[-1]
        return cls(header, ranges)
