"""The pipeline keeps going under load and bad state: full streams, a bus made by an older version, a refused
component, a poisoned or foreign ledger claim, a plan too large for the bus.

These were security tests once; they test progress, not a trust boundary, so they live here, on the same
fixtures (a private API server per module, the three services' command lines on it).
"""

from security.conftest import module_kube, pipeline

__all__ = ["module_kube", "pipeline"]
