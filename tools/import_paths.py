"""Rewrite module paths from ``tjpipe.<folder>`` to the folder's own name: ``tjpipe.applier.core`` -> ``applier.core``.

The top-level folders (``contracts``, ``plumbing``, ``watcher``, ``planner``, ``applier``) are import roots
of their own (CONTRIBUTING.md, "Module paths"). This is the mechanical half of that change, kept as a
script so that it can be run again over a tree that gained code written against the old paths (a merge):
it rewrites every dotted ``tjpipe.<folder>`` path in the repository's text files, then lets ruff re-sort
the import blocks it touched. Running it twice changes nothing the second time.

    .venv/bin/python tools/import_paths.py
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("contracts", "plumbing", "watcher", "planner", "applier")
OLD_PATH = re.compile(rf"\btjpipe\.({'|'.join(FOLDERS)})\b")


def _repository_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    here = Path(__file__).resolve()
    paths = (ROOT / name for name in listed.decode().split("\0") if name)
    return [p for p in paths if p.is_file() and not p.is_symlink() and p.resolve() != here]


def rewrite(text: str) -> str:
    return OLD_PATH.sub(r"\1", text)


def main() -> int:
    changed: list[Path] = []
    for path in _repository_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        new = rewrite(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    print(f"rewrote module paths in {len(changed)} files")
    python = [str(p.relative_to(ROOT)) for p in changed if p.suffix == ".py"]
    if python:
        # The renamed imports sort differently (contracts before tjpipe): only the import order is fixed.
        sorted_imports = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--quiet", "--select", "I", "--fix", *python], cwd=ROOT
        )
        if sorted_imports.returncode != 0:
            print("ruff could not re-sort every import block; run: ruff check --select I --fix .", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
