"""What the project says about itself wherever a person reads it: its version, and where its documentation is.

One place for the documentation's address, so the history server's links (and anything else that points a
reader at a page) change together when the site moves; a page is ``DOCS_BASE_URL`` plus its path on the site
(``data-scientists/`` for ``docs/data-scientists.md``), as MkDocs builds it.
"""

from __future__ import annotations

DOCS_BASE_URL = "https://trainjob-pipeline.github.io/trainjob-pipeline/"
"""The documentation site's root, ending in ``/``."""
DATA_SCIENTISTS_PAGE = "data-scientists/"
"""The page for the people who run TrainJobs and read their history (``docs/data-scientists.md``)."""


def version() -> str:
    """The installed package's version (what ``tjpipe --version`` prints)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("trainjob-pipeline")
    except PackageNotFoundError:
        return "unknown (not installed)"


def docs_url(page: str = "") -> str:
    return DOCS_BASE_URL + page
