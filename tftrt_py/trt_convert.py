"""The public conversion API, named as TF-TRT's ``trt_convert``.

    from tftrt_py import trt_convert as trt
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=...)
    converter.convert(); converter.save(...)

TF1 graphs (tf.compat.v1 graph mode) use ``trt.TrtGraphConverter`` the same way, or convert online: a session
whose config's rewrite options are ``trt.get_tensorrt_rewriter_config(...)`` converts its graph when it runs.

Importing this module registers the TRTEngineOp op with TensorFlow (compiling it on first
use), so converted SavedModels load with ``tf.saved_model.load`` afterwards.
"""
from tftrt_py.convert.params import (DEFAULT_TRT_CONVERSION_PARAMS, DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES,
                                     TrtConversionParams, TrtPrecisionMode)
from tftrt_py.converters.converter_v1 import TrtGraphConverter
from tftrt_py.converters.converter_v2 import TrtGraphConverterV2
from tftrt_py.converters.online import get_tensorrt_rewriter_config
from tftrt_py.converters.profiles import supported_profile_strategies
from tftrt_py.engine_op import library as _library
from tftrt_py.engine_op.dispatcher import stats as engine_op_stats

_library.load()

__all__ = ["TrtGraphConverter", "TrtGraphConverterV2", "TrtConversionParams", "TrtPrecisionMode",
           "DEFAULT_TRT_CONVERSION_PARAMS", "DEFAULT_TRT_MAX_WORKSPACE_SIZE_BYTES", "supported_profile_strategies",
           "get_tensorrt_rewriter_config", "engine_op_stats"]
