"""The site's diagrams render with no network: Mermaid is served with the site (scripts/docs-assets.sh fetches
the version tools/mermaid/package-lock.json locks), not loaded from a CDN as mkdocs-material would by default.

The build is opened from disk in Debian's Chromium, headless, where no host name resolves, so nothing can be
fetched from anywhere; a diagram drawn there was drawn by the copy the site carries. The lock is checked too:
Mermaid pinned to one version, every package with an integrity hash, and no registry address written in it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from needs import unavailable

from .support import DOCS, REPO
from .test_site import MKDOCS, _build

MERMAID = DOCS / "assets" / "javascripts" / "mermaid.min.js"
PACKAGE = REPO / "tools" / "mermaid"


def test_mermaid_is_pinned_and_locked() -> None:
    package = json.loads((PACKAGE / "package.json").read_text())
    lock = json.loads((PACKAGE / "package-lock.json").read_text())
    version = package["dependencies"]["mermaid"]
    assert version[0].isdigit(), f"pin mermaid to one version, not {version!r}"
    assert lock["packages"]["node_modules/mermaid"]["version"] == version
    for name, entry in lock["packages"].items():
        if name:
            assert entry.get("integrity", "").startswith("sha512-"), name
            assert "resolved" not in entry, (
                f"{name}: the lock names no registry (npm --omit-lockfile-registry-resolved)"
            )
    assert "assets/javascripts/mermaid.min.js" in (REPO / "mkdocs.yml").read_text()
    assert "docs-assets.sh" in (REPO / "scripts" / "test.sh").read_text()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MKDOCS.exists():
        unavailable("mkdocs is not installed (the test extra has it)")
    fetched = subprocess.run(["bash", str(REPO / "scripts" / "docs-assets.sh")], capture_output=True, text=True)
    if fetched.returncode != 0:
        unavailable(f"scripts/docs-assets.sh could not fetch Mermaid: {fetched.stderr.strip()}")
    root = tmp_path_factory.mktemp("offline-site")
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(DOCS, root / "docs")
    built = _build(root)
    assert built.returncode == 0, built.stderr
    return root / "site"


def test_the_site_carries_mermaid(site: Path) -> None:
    assert (site / "assets" / "javascripts" / "mermaid.min.js").read_bytes() == MERMAID.read_bytes()
    assert 'src="assets/javascripts/mermaid.min.js"' in (site / "index.html").read_text()


def test_a_diagram_renders_with_no_network(site: Path, tmp_path: Path) -> None:
    from history.support import browser

    # no name resolves: a CDN cannot be reached
    driver = browser(tmp_path, arguments=("--host-resolver-rules=MAP * ~NOTFOUND",))
    try:
        driver.get((site / "index.html").as_uri())
        # mkdocs-material draws each diagram into a closed shadow root of a new div.mermaid that replaces the
        # source block: drawn when no source is left and the drawing has a height.
        drawn = (
            "const d = document.querySelector('div.mermaid');"
            " return !!d && !document.querySelector('pre.mermaid') && d.getBoundingClientRect().height > 50;"
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not driver.execute_script(drawn):
            time.sleep(0.25)
        assert driver.execute_script(drawn), "the home page's diagram was not drawn offline"
    finally:
        driver.quit()
