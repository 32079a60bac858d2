"""One message a stage consumes, from its arrival to its end, and the ways it can end, each written once.

The planner and the applier each took a message as loose arguments (the message, its decoded form, how many
attempts it had, when its work started) and wrote the end of a message wherever one could end: the dead
letter, then the terminate, three times in the applier alone. A ``Delivery`` carries what belongs to one
message, and its endings are here:

- ``ack``: done; JetStream forgets it.
- ``retry``: not now; JetStream delivers it again after the delay (a nak with a delay).
- ``dead_letter``: never; kept on the dead-letter stream with why (``plumbing.bus.dead_letter``), then
  terminated so that JetStream never delivers it again. ``keep_dead_letter`` and ``terminate`` are its two
  halves, for a stage that records a result between them (the applier's ``failed``).

A message that ends none of these ways (the process stopped, or its handler raised) is delivered again after
the consumer's ack wait: nothing is lost. A message ends once: a second ending is a bug, and raises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from nats.aio.msg import Msg
from nats.js import JetStreamContext

from contracts import subjects
from plumbing import bus
from plumbing.observability import DEAD_LETTERS

T = TypeVar("T")

Ending = Literal["acked", "retried", "dead-lettered"]


@dataclass
class Delivery(Generic[T]):
    """One delivery of one message to one stage: the message, what it decoded to, and how it is going."""

    msg: Msg
    stage: str
    """The consuming stage, as the dead letters and their metric name it."""
    js: JetStreamContext
    decoded: T | None = None
    """The message's decoded form, once ``plumbing.intake.admit`` has verified and decoded it."""
    attempts: int = 0
    """Attempts at its work in this delivery (the applier's in-process retries)."""
    started: float = field(default_factory=time.perf_counter)
    """When its work started (``time.perf_counter``); a stage resets it when the work waited for its turn."""
    ended: Ending | None = None

    @property
    def message(self) -> T:
        """The decoded message; only after ``admit`` let it through."""
        if self.decoded is None:
            raise RuntimeError(f"{self.msg.subject}: not decoded yet")
        return self.decoded

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started

    @property
    def deliveries(self) -> int:
        """How often JetStream has delivered this message, this time included."""
        return self.msg.metadata.num_delivered or 1

    def _end(self, how: Ending) -> None:
        if self.ended is not None:
            raise RuntimeError(f"{self.msg.subject}: {how} after it was {self.ended}")
        self.ended = how

    async def ack(self) -> None:
        """Done. Not awaited by the server: a lost ack means one redelivery, which every stage answers again."""
        self._end("acked")
        await self.msg.ack()

    async def retry(self, delay: float) -> None:
        """Not now: delivered again after ``delay`` seconds."""
        self._end("retried")
        await self.msg.nak(delay=delay)

    async def dead_letter(self, *, reason: str, error: str, trainjob: tuple[str, str] | None = None) -> None:
        """Never: kept with why on the dead-letter stream, then terminated."""
        await self.keep_dead_letter(reason=reason, error=error, trainjob=trainjob)
        await self.terminate()

    async def keep_dead_letter(self, *, reason: str, error: str, trainjob: tuple[str, str] | None = None) -> None:
        """The dead letter alone, filed under ``trainjob`` (namespace, name), by default the subject's."""
        if self.ended is not None:
            raise RuntimeError(f"{self.msg.subject}: dead-lettered after it was {self.ended}")
        namespace, name = trainjob if trainjob is not None else subjects.trainjob_of_subject(self.msg.subject)
        DEAD_LETTERS.labels(stage=self.stage, reason=reason).inc()
        await bus.dead_letter(
            self.js, self.msg, stage=self.stage, reason=reason, error=error, namespace=namespace, name=name
        )

    async def terminate(self) -> None:
        """Never delivered again (after ``keep_dead_letter``)."""
        self._end("dead-lettered")
        await self.msg.term()
