"""The documentation site: generated references current, every page in the navigation, links that resolve.

``mkdocs build --strict`` also runs in scripts/test.sh; here it runs on a copy with one fault put in at a
time, to show that the configuration really turns each fault into a failure (a setting dropped from
mkdocs.yml would otherwise let the site rot without anyone seeing).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .support import DOCS, REPO, gen_docs, list_problems

MKDOCS = Path(sys.executable).parent / "mkdocs"
needs_mkdocs = pytest.mark.skipif(not MKDOCS.exists(), reason="mkdocs is not installed (the test extra has it)")


def _build(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(root / "site")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    shutil.copy(REPO / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(DOCS, tmp_path / "docs")
    return tmp_path


def test_the_generated_references_are_current() -> None:
    assert gen_docs().main(["--check"]) == 0, "run: python tools/gen_docs.py"


def test_check_names_a_stale_page(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = copy / "docs" / "reference" / "settings.md"
    settings.write_text(settings.read_text().replace("TJPIPE_METRICS_PORT", "TJPIPE_METRICS_PORT_OLD"))
    assert gen_docs().main(["--check", "--docs", str(copy / "docs")]) == 1
    assert "reference/settings.md" in capsys.readouterr().err
    assert "TJPIPE_METRICS_PORT_OLD" in settings.read_text(), "--check writes nothing"


@needs_mkdocs
def test_the_site_builds_strict_with_no_warning(copy: Path) -> None:
    built = _build(copy)
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr, built.stderr


@needs_mkdocs
@pytest.mark.parametrize(
    ("fault", "warning"),
    [
        ("a page missing from the navigation", 'not included in the "nav"'),
        ("a link to a page that does not exist", "not found among documentation files"),
        ("a link to a heading that does not exist", "does not contain an anchor"),
    ],
)
def test_each_fault_fails_the_strict_build(copy: Path, fault: str, warning: str) -> None:
    page = copy / "docs" / "troubleshooting.md"
    if fault == "a page missing from the navigation":
        (copy / "docs" / "orphan.md").write_text("# Orphan\n")
    elif fault == "a link to a page that does not exist":
        page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    else:
        page.write_text(page.read_text() + "\nSee [a heading](operating.md#no-such-heading).\n")
    built = _build(copy)
    assert built.returncode != 0
    assert warning in built.stderr, built.stderr


def test_the_readme_is_one_page_and_keeps_what_ci_runs() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()
    for command in ("bash scripts/test.sh", "bash scripts/up.sh"):
        assert f"```bash\n{command}\n```" in readme, command
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), link
    first_screen = "\n".join(readme.splitlines()[:20])
    for page in ("docs/install.md", "docs/data-scientists.md"):
        assert f"]({page})" in first_screen, f"the README's first screen links {page}"


def test_every_command_help_names_a_page_that_exists() -> None:
    from tjpipe.cli import DOCS_PAGES, build_parser

    for page in set(DOCS_PAGES.values()):
        path, _, anchor = page.partition("#")
        text = (REPO / path).read_text()
        if anchor:
            headings = [gen_docs().slug(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)]
            assert anchor in headings, page
    gen = gen_docs()
    for command in gen._walk(gen._subcommands(build_parser(), [])):
        assert "documentation: docs/" in (command.parser.epilog or ""), command.words


def test_every_list_renders_as_a_list_on_the_site() -> None:
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert [problem for page in pages for problem in list_problems(page)] == []


def test_the_command_line_page_names_every_command() -> None:
    from tjpipe.cli import build_parser

    page = (DOCS / "cli.md").read_text()
    commands = [c.words[0] for c in gen_docs()._subcommands(build_parser(), [])]
    assert [c for c in commands if f"`{c}`" not in page] == []


def test_the_ratio_chart_shows_the_figures_the_performance_page_prints() -> None:
    data = json.loads((DOCS / "data" / "benchmark.json").read_text())
    page = (DOCS / "performance.md").read_text()
    assert data["rows"]
    for row in data["rows"]:
        assert row["ratio_as_printed"] in page, row
        assert float(row["ratio_as_printed"].rstrip("\N{MULTIPLICATION SIGN}")) == row["ratio"], row


def test_troubleshooting_explains_every_warning_the_services_log() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    warnings = gen_docs().log_warnings()
    assert len(warnings) > 30, warnings
    missing = {message: where for message, where in warnings.items() if f"| `{message}` |" not in page}
    assert missing == {}, "explain these in docs/troubleshooting.md, 'A service logs a warning'"


def test_check_names_a_stale_generated_table(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    configuration = copy / "docs" / "configuration.md"
    configuration.write_text(configuration.read_text().replace("| `TJ_PROGRESS` |", "| `TJ_PROGRESS_OLD` |"))
    assert gen_docs().main(["--check", "--docs", str(copy / "docs")]) == 1
    assert "configuration.md" in capsys.readouterr().err


def test_the_settings_reference_names_every_variable_the_code_reads() -> None:
    page = (DOCS / "reference" / "settings.md").read_text()
    read: set[str] = set()
    for package in (*gen_docs().SERVICE_PACKAGES, "contracts"):
        for path in (REPO / package).rglob("*.py"):
            if "local" not in path.relative_to(REPO).parts:
                read |= set(
                    re.findall(r"""(?:environ\.get\(|getenv\(|env=)["'](TJPIPE_[A-Z0-9_]+)["']""", path.read_text())
                )
    assert len(read) > 20, read
    assert sorted(name for name in read if f"`{name}`" not in page) == []
