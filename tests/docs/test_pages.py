"""The README and docs/ stay true: marked snippets run, relative links and file references resolve, the
configuration page lists exactly the environment variables the package reads, and the prose describes the code
rather than its history."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

import pytest

from snippets import REPO, snippets
from tftrt_py import settings

PAGES = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
#: the README's snippets run together, in tests/docs/test_readme_workflow.py
DOC_SNIPPETS = [(page, name) for page in PAGES if page != "README.md" for name in snippets(page)]


def _text(page: str) -> str:
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        return f.read()


@pytest.mark.parametrize("page, name", DOC_SNIPPETS)
def test_marked_snippet_runs(page, name, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TFTRT_PY_BACKEND"}
    done = subprocess.run([sys.executable, "-c", snippets(page)[name]], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"{page} snippet {name!r} failed:\n{done.stderr[-3000:]}"


_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATH = re.compile(r"`((?:tftrt_py|benchmarks|models|tests|docs|\.ci)/[\w./-]+\.(?:py|md|cc|sh|cu))`")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_and_file_references_resolve(page):
    text, base = _text(page), os.path.dirname(os.path.join(REPO, page))
    broken = []
    prose = re.sub(r"```.*?```", "", text, flags=re.S)  # links live outside code blocks
    for target in _LINK.findall(re.sub(r"`[^`\n]*`", "", prose)):
        if re.match(r"[a-z]+:", target):
            continue  # an URL
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(base, path)) if path else os.path.join(REPO, page)
        if not os.path.exists(resolved):
            broken.append(target)
        elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
            broken.append(target)
    broken += [ref for ref in _PATH.findall(text) if not os.path.exists(os.path.join(REPO, ref))]
    assert not broken, f"{page}: links or paths that do not resolve: {broken}"


def _anchors(path: str) -> set:
    """GitHub's heading anchors of a Markdown file."""
    with open(path, encoding="utf-8") as f:
        headings = [line.lstrip("#").strip() for line in f if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_configuration_lists_exactly_the_environment_variables_the_package_reads():
    text = _text("docs/configuration.md")
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)`", text, re.M))  # the table's first column
    for line in re.findall(r"^- (`.*?):", text, re.M):  # "- `A`, `B`: ..." lists of other software's variables
        documented |= set(re.findall(r"`([A-Z][A-Z0-9_]+)`", line))
    read = set(settings.ALL)
    assert not read - documented, f"read but not in docs/configuration.md: {sorted(read - documented)}"
    assert not documented - read, f"in docs/configuration.md but never read: {sorted(documented - read)}"


HISTORY = re.compile(r"\b(?:(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
                     r"[a-z]+teenth|twentieth|thirtieth|twenty-[a-z]+|\d+(?:st|nd|rd|th)) session|sessions? ago|"
                     r"issue #?\d+|tried and (?:ran|was) slower)\b", re.I)


def test_prose_says_what_the_code_does_not_how_it_got_there():
    files = PAGES + [os.path.relpath(p, REPO) for folder in ("tftrt_py", "tests", "benchmarks", "models")
                     for p in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True)]
    files.remove(os.path.join("tests", "docs", "test_pages.py"))  # it names what it looks for
    found = [f"{f}: {m.group(0)!r}" for f in files for m in HISTORY.finditer(_text(f))]
    assert not found, "development history in the project's prose:\n" + "\n".join(found)
