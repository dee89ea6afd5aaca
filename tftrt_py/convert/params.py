"""Conversion parameters (TF-TRT's names and defaults) and their parsing into :class:`ConversionParams`.

The converters parse the user's TrtConversionParams once (:func:`parse_conversion_params`); the code behind them
reads only the parsed value.
"""
from __future__ import annotations

import collections
import dataclasses
import numbers

from tftrt_py.engine.types import PRECISIONS, QUANTIZED, canonical_precision

__all__ = ["TrtPrecisionMode", "TrtConversionParams", "DEFAULT_TRT_CONVERSION_PARAMS",
           "DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES", "CALIBRATION_ALGORITHMS", "DEFAULT_CALIBRATORS",
           "ConversionParams", "parse_conversion_params", "calibration_algorithm", "quantized"]

DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES = 1 << 30

#: INT8 calibrators (tftrt_py.calibration.calibrators), the first the default.
CALIBRATION_ALGORITHMS = ("entropy", "minmax", "percentile")


class TrtPrecisionMode:
    FP32 = "FP32"
    FP16 = "FP16"
    INT8 = "INT8"
    #: Our extension, not TF-TRT's: the layers INT8 quantizes (convolutions, matrix multiplies, attention) in FP8
    #: (E4M3) with the ranges INT8 uses (calibration or quantization ops), on GPUs of compute capability 8.9+.
    FP8 = "FP8"

    @staticmethod
    def supported_precision_modes():
        return list(PRECISIONS) + [p.lower() for p in PRECISIONS]


class TrtConversionParams(collections.namedtuple("TrtConversionParams", [
        "max_workspace_size_bytes", "precision_mode", "minimum_segment_size", "maximum_cached_engines",
        "use_calibration", "allow_build_at_runtime", "calibration_algorithm"])):
    """Parameters of a conversion (see TF-TRT's TrtConversionParams for each field's meaning).

    Fields after TF-TRT's: ``calibration_algorithm`` — the calibrator: "entropy", "minmax" or "percentile"
    (99.99th percentile); None (the default): the precision's own (:data:`DEFAULT_CALIBRATORS`).
    """

    def __new__(cls, max_workspace_size_bytes=DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES,
                precision_mode=TrtPrecisionMode.FP32, minimum_segment_size=3, maximum_cached_engines=1,
                use_calibration=True, allow_build_at_runtime=True, calibration_algorithm=None):
        return super().__new__(cls, max_workspace_size_bytes, precision_mode, minimum_segment_size,
                               maximum_cached_engines, use_calibration, allow_build_at_runtime,
                               calibration_algorithm)


DEFAULT_TRT_CONVERSION_PARAMS = TrtConversionParams()


#: The calibrator of a precision when none is chosen: TensorRT's entropy for INT8; max |value| for FP8, whose E4M3
#: range covers the outliers entropy clips (NVIDIA's ModelOpt calibrates FP8 by max too). ResNet-50 v1.5 with
#: random weights, numpy backend (benchmarks/resnet50_accuracy.py): FP8 minmax 5.5e-2 relative L2, entropy 1.5e-1.
DEFAULT_CALIBRATORS = {"INT8": "entropy", "FP8": "minmax"}


def calibration_algorithm(params: "TrtConversionParams") -> str:
    """The calibrator a conversion uses: its calibration_algorithm, else its precision's default."""
    if params.calibration_algorithm is not None:
        return str(params.calibration_algorithm).lower()
    return DEFAULT_CALIBRATORS.get(canonical_precision(params.precision_mode), "entropy")


def quantized(precision: str) -> bool:
    """The precision (one of PRECISIONS) quantizes with dynamic ranges (INT8, FP8): it calibrates, or takes
    quantization ops' ranges."""
    return precision in QUANTIZED


#: The integer parameters: each must be an int (not a bool, a float or a string like "3") before its value is read.
INTEGER_PARAMS = ("max_workspace_size_bytes", "minimum_segment_size", "maximum_cached_engines")


def _check_integers(params: TrtConversionParams) -> None:
    for name in INTEGER_PARAMS:
        value = getattr(params, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{name} should be an int, got {value!r} of type {type(value).__name__}; pass "
                            f"{name}={getattr(DEFAULT_TRT_CONVERSION_PARAMS, name)} for example")


@dataclasses.dataclass(frozen=True)
class ConversionParams:
    """TrtConversionParams checked and normalised: what the converters and the code below them read."""

    max_workspace_size_bytes: int
    precision: str  # one of PRECISIONS
    minimum_segment_size: int
    maximum_cached_engines: int
    use_calibration: bool
    allow_build_at_runtime: bool
    calibration_algorithm: str  # the chosen calibrator, else the precision's default

    @property
    def quantized(self) -> bool:
        return quantized(self.precision)

    @property
    def calibrates(self) -> bool:
        """INT8/FP8 with calibration: the engines need calibration data."""
        return self.quantized and self.use_calibration


def parse_conversion_params(params: TrtConversionParams) -> ConversionParams:
    """The checked ConversionParams of `params`. Raises TF-TRT's errors for invalid values (ValueError), and a
    TypeError naming an integer parameter given as another type."""
    supported = TrtPrecisionMode.supported_precision_modes()
    if params.precision_mode not in supported:
        raise ValueError(f"precision mode '{params.precision_mode}' is not supported."
                         f"It should be one of {supported}")
    _check_integers(params)
    if params.minimum_segment_size <= 0 and params.minimum_segment_size != -1:
        raise ValueError("minimum segment size should be positive or -1 (to disable main graph conversion).")
    if params.maximum_cached_engines < 1:
        raise ValueError(f"maximum_cached_engines should be a positive integer, got {params.maximum_cached_engines!r}")
    if params.max_workspace_size_bytes <= 0:
        raise ValueError(f"max_workspace_size_bytes should be a positive integer, got "
                         f"{params.max_workspace_size_bytes!r}")
    if params.calibration_algorithm is not None and str(params.calibration_algorithm).lower() not in \
            CALIBRATION_ALGORITHMS:
        raise ValueError(f"calibration_algorithm should be one of {', '.join(CALIBRATION_ALGORITHMS)}, got "
                         f"{params.calibration_algorithm!r}")
    return ConversionParams(int(params.max_workspace_size_bytes), canonical_precision(params.precision_mode),
                            int(params.minimum_segment_size), int(params.maximum_cached_engines),
                            bool(params.use_calibration), bool(params.allow_build_at_runtime),
                            calibration_algorithm(params))
