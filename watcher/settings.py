"""The watcher's settings, each declared once (``plumbing.configuration``): the command line, the settings
reference and the deployment checks are made from these fields.

A module of its own, importing nothing that does I/O, so that ``tjpipe`` builds its parser from it without
loading the watcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from plumbing.configuration import (
    ABOVE_ZERO,
    KubeSettings,
    NamespaceSettings,
    ServiceSettings,
    SigningSettings,
    StatusIntervalSettings,
    setting,
)


@dataclass(kw_only=True)
class WatcherSettings(ServiceSettings, KubeSettings, NamespaceSettings, SigningSettings, StatusIntervalSettings):
    resync_seconds: float = setting(
        300.0, flag="--resync-seconds", env=None, unit="seconds", check=ABOVE_ZERO, help="relist TrainJobs this often"
    )
