"""What the project says about itself wherever a person reads it: its version, and where its guide is.

The history server carries the data scientists' page itself (``static/guide.html``, generated from
``docs/data-scientists.md`` by ``tools/gen_docs.py``), so the link its UI shows works wherever it runs, with no
documentation site published anywhere and nothing fetched from elsewhere.
"""

from __future__ import annotations

DATA_SCIENTISTS_GUIDE = "/static/guide.html"
"""Where the history server serves the page for the people who run TrainJobs and read their history."""


def version() -> str:
    """The installed package's version (what ``tjpipe --version`` prints)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("trainjob-pipeline")
    except PackageNotFoundError:
        return "unknown (not installed)"
