"""Ending asyncio tasks on Python 3.11, where one cancellation is not always enough.

A cancellation that reaches ``asyncio.wait_for`` just as its inner wait completes is lost there (fixed in
3.12), and the task runs on to its next wait. Pull loops, watches and informers wait that way all the time,
so cancelling one and waiting once for it could wait for ever: a lease round that released a partition so
never ended, and the replica stopped renewing and claiming (found by tests/containers after a network
partition). Everything that ends its own loops therefore cancels until they have ended.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(*tasks: asyncio.Task[Any], every: float = 1.0) -> None:
    """Cancel ``tasks`` and wait until all have ended, cancelling again each ``every`` seconds those still
    running; an exception a task ended with is logged, not raised."""
    for task in tasks:
        task.cancel()
    running = {task for task in tasks if not task.done()}
    while running:
        _, running = await asyncio.wait(running, timeout=every)
        for task in running:
            task.cancel()
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s ended with %r", task.get_name(), task.exception())
