import pytest

from models.sample_models import save_model


@pytest.fixture(scope="session")
def small_cnn(tmp_path_factory):
    """The sample CNN (conv/BN/ReLU, pooling, dense, softmax) as a SavedModel, built once per session."""
    return save_model("small_cnn", str(tmp_path_factory.mktemp("small_cnn") / "model"))
