"""The engine's dtypes and precisions: the names plans, bindings, builder configs and backends use."""
from __future__ import annotations

import numpy as np

from tftrt_py.engine.errors import NetworkError

__all__ = ["DTYPES", "FLOATS", "PRECISIONS", "QUANTIZED", "dtype_name", "canonical_precision"]

#: Engine dtypes by name; plans and bindings use these names.
DTYPES = {
    "float32": np.float32,
    "float16": np.float16,
    "int32": np.int32,
    "int64": np.int64,
    "int8": np.int8,
    "bool": np.bool_,
}

#: The float dtypes: those reduced precisions round.
FLOATS = ("float32", "float16")

#: Build precisions (TF-TRT's precision modes; FP8 is ours).
PRECISIONS = ("FP32", "FP16", "INT8", "FP8")

#: Precisions whose int8-capable layers quantize their operands with dynamic ranges (calibration or QDQ ops);
#: the other layers of such engines run as in FP16.
QUANTIZED = ("INT8", "FP8")


def dtype_name(dtype) -> str:
    """The engine name of a numpy dtype; NetworkError where the engine has no such dtype."""
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise NetworkError(f"dtype {name} is not supported by the engine (supported: {', '.join(DTYPES)})")
    return name


def canonical_precision(value) -> str:
    """A precision mode in TF-TRT's spellings ("FP16", "fp16", TrtPrecisionMode.FP16) as one of PRECISIONS."""
    name = str(value).upper()
    if name not in PRECISIONS:
        raise ValueError(f"precision mode {value!r} is not supported; use one of {', '.join(PRECISIONS)} "
                         f"(or lower case)")
    return name
