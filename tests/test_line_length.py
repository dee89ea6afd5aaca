"""Every line of the package's, benchmarks' and tests' source fits in 120 characters (setup.cfg's flake8
max-line-length), the width the code is read at."""
from __future__ import annotations

import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
FOLDERS = ("tftrt_py", "benchmarks", "tests")
SOURCES = (".py", ".cu", ".cc", ".c", ".h")
LIMIT = 120


def long_lines():
    for folder in FOLDERS:
        for path, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if not d.startswith((".", "__pycache__"))]
            for name in files:
                if name.endswith(SOURCES):
                    with open(os.path.join(path, name), encoding="utf-8") as f:
                        for number, line in enumerate(f, 1):
                            if len(line.rstrip("\n")) > LIMIT:
                                yield f"{os.path.relpath(os.path.join(path, name), ROOT)}:{number}"


def test_no_source_line_is_longer_than_120_characters():
    assert list(long_lines()) == []
