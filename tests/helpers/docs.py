"""The docs' commands, read from their Markdown (:func:`section`, :func:`blocks`, :func:`command`)."""

from __future__ import annotations

import re
import shlex

from tests.helpers.paths import REPO


def section(title: str, page: str) -> str:
    """The text of ``page`` (relative to the repository) under the heading ``title`` up to the next heading of
    level 2 or 3."""
    text = (REPO / page).read_text()
    start = text.index(title)
    match = re.compile(r"^#{2,3} ", re.M).search(text, start + len(title))
    return text[start: match.start() if match else len(text)]


def blocks(text: str, lang: str) -> list[str]:
    """The contents of the fenced ``lang`` code blocks of a Markdown text, in order."""
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def command(block: str) -> list[str]:
    """The arguments after ``python -m grasp_lightning`` of a docs bash block (continuations joined, ``# ...``
    comments dropped)."""
    words = shlex.split(block.replace("\\\n", " "), comments=True)
    return words[words.index("grasp_lightning") + 1:]
