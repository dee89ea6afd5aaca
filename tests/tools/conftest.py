import os
import subprocess
import sys
import types

import numpy as np
import pytest

from support import subprocess_env

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _run_cli(module, *args, code=None, timeout=300):
    """Run `python -m tftrt_py.tools.<module> args` (or `python -c code`) with the repo on PYTHONPATH."""
    env = subprocess_env()
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", f"tftrt_py.tools.{module}", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="session")
def run_cli():
    return _run_cli


@pytest.fixture(scope="session")
def cnn_trt(saved_model, tmp_path_factory):
    """The sample CNN converted by tftrt-convert with engines built for batch 4."""
    root = tmp_path_factory.mktemp("cnn_trt")
    build = root / "batch4.npy"
    np.save(build, np.random.default_rng(0).standard_normal((4, 32, 32, 3)).astype("float32"))
    out = root / "model"
    proc = _run_cli("cli_convert", "--input-dir", saved_model("small_cnn"), "--output-dir", str(out),
                    "--build-data", str(build))
    assert proc.returncode == 0, proc.stderr
    return types.SimpleNamespace(dir=str(out), proc=proc)


@pytest.fixture(scope="session")
def cnn_plans(cnn_trt, tmp_path_factory):
    """(plan paths, folder) of the converted CNN's engines, exported once."""
    from tftrt_py.tools.export import export_plans

    out = tmp_path_factory.mktemp("cnn_plans")
    return export_plans(cnn_trt.dir, str(out)), str(out)
