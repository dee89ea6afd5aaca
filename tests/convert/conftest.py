import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "models"))

from sample_models import save_model  # noqa: E402


@pytest.fixture(scope="session")
def saved_model(tmp_path_factory):
    """saved_model(name) -> directory of sample model `name`, built once per session."""
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = save_model(name, str(tmp_path_factory.mktemp(name) / "model"))
        return cache[name]

    return get
