"""The README and the site speak to the people who use the pipeline: no word about how it was made.

A reader cannot open this repository's issue tracker from a page, and "the third pass" or "this session" means
nothing to them; a figure is dated instead, and an upstream issue (Trainer's, JobSet's, nats-server's) is a link
to it, so the reader can follow it. The rule is a word list, not judgement: each pattern below names something
only the people building the project would say. The allowlist is explicit and small: a phrase that is the
name of something a reader meets (pytest's "session fixture"), and pages that another change is rewriting.
"""

from __future__ import annotations

import re

import pytest

from .support import DOCS, REPO

FORBIDDEN = {
    "an issue number of this repository": re.compile(r"\b[Ii]ssues? #\d+|(?<![\w/\]])#\d{1,3}\b"),
    "a pass (say what was done, and when)": re.compile(r"\b[Pp]ass(es)?\b"),
    "a session": re.compile(r"\b[Ss]essions?\b"),
    "a helper": re.compile(r"\b[Hh]elpers?\b"),
    "the lead": re.compile(r"\b[Tt]he lead\b"),
    "a brief": re.compile(r"\b[Bb]riefs?\b"),
}
UPSTREAM_NUMBER = re.compile(r"(?<![\w/\[])#\d{4,}\b")
"""An upstream issue number (Trainer's run to four digits) written bare, not as a link."""

ALLOWED_PHRASES = ("session fixture",)
"""Words that are the name of something the reader meets: pytest's fixture scope."""

ALLOWED_PAGES: set[str] = set()
"""Pages being rewritten by a change of their own; each is to leave this set with that change."""


def _pages() -> list[str]:
    pages = ["README.md", *(f"docs/{p.relative_to(DOCS)}" for p in sorted(DOCS.rglob("*.md")))]
    return [p for p in pages if p.removeprefix("docs/") not in ALLOWED_PAGES]


def _strip(text: str) -> str:
    text = re.sub(r"\]\([^)]*\)", lambda m: "]" + " " * (len(m.group(0)) - 1), text)  # a link's target
    for phrase in ALLOWED_PHRASES:
        text = re.sub(phrase, lambda m: " " * len(m.group(0)), text, flags=re.IGNORECASE)
    return text


def problems(text: str, where: str) -> list[str]:
    """Each forbidden word, also where a line break splits it ("the" at a line's end, "lead" at the next's)."""
    clean = _strip(text.replace("\n", " "))  # one character for one: offsets stay those of ``text``
    found: list[str] = []
    patterns = [*FORBIDDEN.items(), ("an upstream issue number not linked", UPSTREAM_NUMBER)]
    for what, pattern in patterns:
        for match in pattern.finditer(clean):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{where}:{line}: {what}: {match.group(0)!r}")
    return found


def test_no_page_speaks_of_how_the_project_is_made() -> None:
    assert [p for page in _pages() for p in problems((REPO / page).read_text(), page)] == []


@pytest.mark.parametrize(
    "text",
    [
        "the third pass (issue #39)",
        "after this session's work",
        "two helpers' tests ran beside it",
        "the lead's benchmark",
        "guarantees the brief keeps",
        "see #27",
        "Trainer's #3008 is fixed",
        "beside the\nlead's benchmark",
    ],
)
def test_each_word_is_caught(text: str) -> None:
    assert problems(text, "page") != []


@pytest.mark.parametrize(
    "text",
    [
        "[#3008](https://github.com/kubeflow/trainer/issues/3008)",
        "the session fixture `sim_cluster`",
        "the test passed; a password; passing through",
        "PKCS#8 keys",
        "the third round of efficiency work (2026-12-05)",
    ],
)
def test_what_is_allowed_passes(text: str) -> None:
    assert problems(text, "page") == []
