"""Code blocks of the project's Markdown pages that are marked runnable.

A block is marked by an HTML comment on the line before its fence: ``<!-- snippet: NAME -->`` then a
```` ```python ```` block. Tests run such blocks verbatim, alone or after others.
"""
from __future__ import annotations

import os
import re
from typing import Dict

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

_BLOCK = re.compile(r"<!-- snippet: ([\w-]+) -->\n```python\n(.*?)\n```", re.S)


def snippets(page: str) -> Dict[str, str]:
    """NAME -> code of every marked block of `page` (a path relative to the repository)."""
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        text = f.read()
    found: Dict[str, str] = {}
    for name, code in _BLOCK.findall(text):
        if name in found:
            raise ValueError(f"{page}: two snippets named {name!r}")
        found[name] = code + "\n"
    return found
