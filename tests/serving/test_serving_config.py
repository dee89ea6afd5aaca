"""TF Serving's text-proto config files and version policies."""
import pytest

from tftrt_py.serving.config import (BatchingOptions, ModelSpec, VersionPolicy, parse_batching_parameters,
                                     parse_model_config)

MODEL_CONFIG = """
model_config_list {
  config { name: "cnn" base_path: "/models/cnn" model_platform: "tensorflow" }
  config {
    name: "mlp" base_path: "/models/mlp"
    model_version_policy { specific { versions: 1 versions: 3 } }
    version_labels { key: "stable" value: 1 }
    version_labels { key: "canary" value: 3 }
  }
  config { name: "all" base_path: "rel/all" model_version_policy { all {} } }
  config { name: "two" base_path: "/m/two" model_version_policy { latest { num_versions: 2 } } }
}
"""


def test_model_config_file_lists_models_policies_and_labels():
    cnn, mlp, every, two = parse_model_config(MODEL_CONFIG)
    assert cnn == ModelSpec("cnn", "/models/cnn")
    assert mlp.version_policy == VersionPolicy("specific", versions=(1, 3))
    assert dict(mlp.version_labels) == {"stable": 1, "canary": 3}
    assert every.base_path == "rel/all" and every.version_policy.kind == "all"
    assert two.version_policy == VersionPolicy("latest", num_versions=2)


def test_version_policies_select_versions():
    available = [3, 1, 7, 5]
    assert VersionPolicy().select(available) == [7]
    assert VersionPolicy("latest", num_versions=2).select(available) == [5, 7]
    assert VersionPolicy("all").select(available) == [1, 3, 5, 7]
    assert VersionPolicy("specific", versions=(3, 4)).select(available) == [3]


@pytest.mark.parametrize("text, message", [
    ("model_config_list { config { name: 'a' } }", "base_path"),
    ("model_config_list { config { name: 'a' base_path: '/a' model_platform: 'onnx' } }", "model_platform"),
    ("model_config_list { config { name: 'a' base_path: '/a' } config { name: 'a' base_path: '/b' } }", "twice"),
    ("model_config_list { config { name: 'a' base_path: '/a' model_version_policy { specific {} } } }",
     "no versions"),
    ("custom_model_config { }", "model_config_list"),
    ("model_config_list { config { name: 'a' base_path: '/a' unknown_field: 1 } }", "ModelServerConfig"),
    ("__import__('os').system('true')", "ModelServerConfig"),
    ("", "no models"),
])
def test_bad_model_configs_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_model_config(text)


def test_batching_parameters_file():
    options = parse_batching_parameters("""
        max_batch_size { value: 8 } batch_timeout_micros { value: 500 } max_enqueued_batches { value: 3 }
        num_batch_threads { value: 4 } thread_pool_name { value: "pool" }
        allowed_batch_sizes: 2 allowed_batch_sizes: 4 allowed_batch_sizes: 8""")
    assert options == BatchingOptions(max_batch_size=8, batch_timeout_micros=500, max_enqueued_batches=3,
                                      num_batch_threads=4, allowed_batch_sizes=(2, 4, 8))
    assert [options.padded_size(n) for n in (1, 2, 3, 5, 8)] == [2, 2, 4, 8, 8]


def test_batching_parameters_default_to_tf_servings():
    options = parse_batching_parameters("")
    assert (options.max_batch_size, options.batch_timeout_micros, options.max_enqueued_batches) == (1000, 0, 10)
    assert options.num_batch_threads >= 1 and options.padded_size(7) == 7


@pytest.mark.parametrize("text, message", [
    ("pad_variable_length_inputs: true", "pad_variable_length_inputs is not supported"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 4", "must equal max_batch_size"),
    ("max_batch_size { value: 8 } allowed_batch_sizes: 8 allowed_batch_sizes: 4", "increasing"),
    ("num_batch_threads { value: 0 }", "num_batch_threads"),
    ("max_batch_size: 8", "BatchingParameters"),
    ("enable_everything: true", "BatchingParameters"),
])
def test_bad_batching_parameters_say_what_is_wrong(text, message):
    with pytest.raises(ValueError, match=message):
        parse_batching_parameters(text)
