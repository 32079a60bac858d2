"""What the docs tests share: the repository's paths, its generator, and the fenced blocks of a page.

A block a user would paste is a fence whose info string is a shell (``bash``, ``sh``, ``shell``, ``console``).
The line before it may carry a marker: ``<!-- not run: REASON -->`` (never run, and the reason is required)
or ``<!-- run: last -->`` (run after every other block, as ``tjpipe down`` must be). Every other such block
is run, in the order of the pages and of the blocks in them.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SHELLS = ("bash", "sh", "shell", "console")
MARKER = re.compile(r"^<!--\s*(not run|run):\s*(.*?)\s*-->$")


@functools.cache
def gen_docs() -> ModuleType:
    """``tools/gen_docs.py`` as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    info: str
    text: str
    marker: str  # "", "not run", or "run"
    note: str  # the marker's reason, or "last"


def blocks(page: str) -> list[Block]:
    """Every fenced block of ``docs/<page>`` whose info string is a shell, with the marker before it."""
    found: list[Block] = []
    lines = (DOCS / page).read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("```"):
            i += 1
            continue
        info = line[3:].strip().split(" ")[0]
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if info in SHELLS:
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            match = MARKER.match(before)
            marker, note = (match.group(1), match.group(2)) if match else ("", "")
            found.append(Block(page, i + 1, info, "\n".join(lines[i + 1 : end]) + "\n", marker, note))
        i = end + 1
    return found


ITEM = re.compile(r"^( *)([-*+]|\d+\.) ")


def list_problems(page: str) -> list[str]:
    """Lists GitHub renders but Python-Markdown (the site) does not: a list straight after a paragraph line
    runs into the paragraph, and a nested item indented less than four spaces is not nested."""
    problems: list[str] = []
    fence, in_list, prev = False, False, ""
    for number, line in enumerate((DOCS / page).read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            item = ITEM.match(line)
            if item:
                indent = len(item.group(1))
                if indent == 0 and not in_list and prev.strip():
                    problems.append(f"docs/{page}:{number}: a blank line before the list")
                if 0 < indent < 4:
                    problems.append(f"docs/{page}:{number}: indent a nested item by four spaces")
                in_list = True
            elif in_list and line.strip() and not line.startswith(" ") and not prev.strip():
                in_list = False
        prev = line
    return problems
