"""The settings module is the one reader of environment variables: each is declared once with its default and
meaning, read at each call, and a malformed value is an error naming the variable (strict settings) or said once
in the log with the default used."""
from __future__ import annotations

import ast
import glob
import logging
import os

import pytest

from tftrt_py import settings

PACKAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tftrt_py")


def _reads_environment(node) -> bool:
    """os.environ.get/setdefault/[...] or os.getenv."""
    def is_environ(n):
        return isinstance(n, ast.Attribute) and n.attr == "environ"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return (node.func.attr in ("get", "setdefault", "pop") and is_environ(node.func.value)) or \
            node.func.attr == "getenv"
    return isinstance(node, ast.Subscript) and is_environ(node.value)


def test_only_the_settings_module_reads_the_environment():
    readers = []
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
        if os.path.basename(path) == "settings.py":
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        readers += [f"{os.path.relpath(path, PACKAGE)}:{n.lineno}" for n in ast.walk(tree) if _reads_environment(n)]
    assert readers == [], f"environment read outside tftrt_py/settings.py: {readers}"


def test_every_setting_has_a_name_and_a_meaning():
    assert len(settings.ALL) >= 30
    for name, setting in settings.ALL.items():
        assert setting.name == name and name.isupper() and setting.doc


def test_unset_and_blank_give_the_default_and_values_are_read_at_each_call(monkeypatch):
    monkeypatch.delenv("TFTRT_PY_CONTEXTS_PER_ENGINE", raising=False)
    assert settings.CONTEXTS.get() == 4
    monkeypatch.setenv("TFTRT_PY_CONTEXTS_PER_ENGINE", "  ")
    assert settings.CONTEXTS.get() == 4 and settings.CONTEXTS.raw() is None
    monkeypatch.setenv("TFTRT_PY_CONTEXTS_PER_ENGINE", " 7 ")
    assert settings.CONTEXTS.get() == 7


def test_a_malformed_value_is_said_once_and_the_default_used(monkeypatch, caplog):
    monkeypatch.setenv("TFTRT_PY_CONTEXTS_PER_ENGINE", "a great many")
    with caplog.at_level(logging.WARNING, logger=settings.__name__):
        assert settings.CONTEXTS.get() == 4
        assert settings.CONTEXTS.get() == 4
    said = [r.getMessage() for r in caplog.records if "TFTRT_PY_CONTEXTS_PER_ENGINE" in r.getMessage()]
    assert said == ["TFTRT_PY_CONTEXTS_PER_ENGINE='a great many' is not a whole number; using the default (4)"]


def test_a_malformed_strict_setting_is_an_error_naming_the_variable(monkeypatch):
    monkeypatch.setenv("TFTRT_PY_CUDNN_PLANS", "two")
    with pytest.raises(settings.SettingError, match="^TFTRT_PY_CUDNN_PLANS='two' is not a whole number of at least 1$"):
        settings.CUDNN_PLANS.get()


@pytest.mark.parametrize("text, value", [("0", False), ("false", False), ("FALSE", False), ("1", True),
                                         ("True", True)])
def test_booleans_read_as_tensorflow_reads_them(monkeypatch, text, value):
    monkeypatch.setenv("TF_TRT_ALLOW_ENGINE_NATIVE_SEGMENT_EXECUTION", text)
    assert settings.NATIVE_FALLBACK.get() is value


def test_lists_and_thread_counts(monkeypatch):
    monkeypatch.setenv("TF_TRT_OP_DENYLIST", "Conv2D, Relu,,")
    assert settings.OP_DENYLIST.get() == {"Conv2D", "Relu"}
    monkeypatch.setenv("OMP_NUM_THREADS", "4,2")
    assert settings.OMP_NUM_THREADS.get() == 4
