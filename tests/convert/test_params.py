"""TrtConversionParams and TrtPrecisionMode behave as TF-TRT's."""
import re

import numpy as np
import pytest

from tftrt_py import trt_convert as trt


def test_defaults_are_tf_trts():
    p = trt.DEFAULT_TRT_CONVERSION_PARAMS
    assert p == trt.TrtConversionParams(max_workspace_size_bytes=1 << 30, precision_mode="FP32",
                                        minimum_segment_size=3, maximum_cached_engines=1, use_calibration=True,
                                        allow_build_at_runtime=True)


def test_replace_works_as_in_the_seed():
    p = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(max_workspace_size_bytes=(1 << 32))
    p = p._replace(precision_mode="FP16")._replace(maximum_cached_engines=100)
    assert (p.max_workspace_size_bytes, p.precision_mode, p.maximum_cached_engines) == (1 << 32, "FP16", 100)
    assert trt.DEFAULT_TRT_CONVERSION_PARAMS.precision_mode == "FP32"


def test_precision_modes_accept_lower_case():
    assert trt.TrtPrecisionMode.supported_precision_modes() == ["FP32", "FP16", "INT8", "FP8", "fp32", "fp16", "int8",
                                                                "fp8"]


@pytest.mark.parametrize("kwargs, message", [
    ({"precision_mode": "FP64"}, "precision mode 'FP64' is not supported"),
    ({"minimum_segment_size": 0}, "minimum segment size should be positive or -1"),
    ({"minimum_segment_size": -2}, "minimum segment size should be positive or -1"),
    ({"maximum_cached_engines": 0}, "maximum_cached_engines"),
    ({"max_workspace_size_bytes": -1}, "max_workspace_size_bytes"),
])
def test_bad_values_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        trt.TrtGraphConverterV2(input_saved_model_dir="unused", **kwargs)
    with pytest.raises(ValueError, match=message):
        trt.TrtGraphConverterV2(input_saved_model_dir="unused",
                                conversion_params=trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(**kwargs))


@pytest.mark.parametrize("name", ["minimum_segment_size", "maximum_cached_engines", "max_workspace_size_bytes"])
@pytest.mark.parametrize("value", ["3", 3.0, True, None])
def test_an_integer_parameter_of_another_type_is_a_type_error_naming_it(name, value):
    message = "^" + re.escape(f"{name} should be an int, got {value!r} of type {type(value).__name__}; pass {name}=")
    with pytest.raises(TypeError, match=message):
        trt.TrtGraphConverterV2(input_saved_model_dir="unused", **{name: value})
    with pytest.raises(TypeError, match=message):
        trt.TrtGraphConverterV2(input_saved_model_dir="unused",
                                conversion_params=trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(**{name: value}))


def test_numpy_integers_are_integers():
    trt.TrtGraphConverterV2(input_saved_model_dir="unused", minimum_segment_size=np.int64(5),
                            maximum_cached_engines=np.int32(2), max_workspace_size_bytes=np.int64(1 << 20))


def test_unknown_profile_strategy_is_refused():
    with pytest.raises(ValueError, match="profile_strategy 'Widest' is not supported. It should be one of "):
        trt.TrtGraphConverterV2(input_saved_model_dir="unused", use_dynamic_shape=True,
                                dynamic_shape_profile_strategy="Widest")
    # as in TF-TRT, the strategy is only checked in dynamic shape mode; its case does not matter
    trt.TrtGraphConverterV2(input_saved_model_dir="unused", dynamic_shape_profile_strategy="Widest")
    trt.TrtGraphConverterV2(input_saved_model_dir="unused", use_dynamic_shape=True,
                            dynamic_shape_profile_strategy="range+optimal")


@pytest.mark.parametrize("precision, chosen, used", [
    ("INT8", None, "entropy"),  # TensorRT's default
    ("int8", None, "entropy"),
    ("FP8", None, "minmax"),  # E4M3's range covers the outliers entropy clips
    ("fp8", None, "minmax"),
    ("FP8", "Entropy", "entropy"),  # a chosen calibrator always wins
    ("INT8", "percentile", "percentile"),
])
def test_the_calibrator_is_the_chosen_one_else_the_precisions_default(precision, chosen, used):
    from tftrt_py.convert.params import calibration_algorithm

    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode=precision, calibration_algorithm=chosen)
    assert calibration_algorithm(params) == used
