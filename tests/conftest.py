"""Fixtures shared by every test folder."""
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Engine ops serve on the numpy backend, the reference the suite's tolerances and FP16/INT8 emulation assume
# (tests/engine/onnxruntime and tests/engine/gpu pick their backends themselves).
os.environ.setdefault("TFTRT_PY_BACKEND", "numpy")
# GPU tests time their tactics: a shared timing cache would hand one test's (possibly restricted) choice to another
# (tests of the cache pass theirs explicitly)
os.environ.setdefault("TFTRT_PY_TIMING_CACHE", "0")

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "models"))


@pytest.fixture(scope="session")
def saved_model(tmp_path_factory):
    """saved_model(name) -> directory of sample model `name` (models/sample_models.py), built once per session."""
    from sample_models import save_model

    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = save_model(name, str(tmp_path_factory.mktemp(name) / "model"))
        return cache[name]

    return get
