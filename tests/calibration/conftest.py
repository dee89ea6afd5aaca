import pytest


@pytest.fixture(scope="session")
def small_cnn(saved_model):
    """The sample CNN (conv/BN/ReLU, pooling, dense, softmax) as a SavedModel, built once per session."""
    return saved_model("small_cnn")
