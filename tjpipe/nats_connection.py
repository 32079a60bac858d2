"""How a ``tjpipe`` command reaches NATS: the connection flags, what they turn into, and the connection itself.

One module for all of it, so the flags a command declares and the code that reads them cannot drift apart,
and so the CLI's modules (``cli``, ``operator_commands``, ``history_server``) all import it instead of each other.
A connection that does not come up is one ``tjpipe.exits`` error that says why, within ``--connect-timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from plumbing.configuration import NatsSettings
from tjpipe.exits import Failure, Unreachable, UsageError
from tjpipe.settings import NatsTlsOptions, add_settings, nats_tls


class NatsOptions(NatsTlsOptions, Protocol):
    """What a connection is made from: a command's parsed arguments, or a server's settings object (the
    history server's), which both hold the NATS settings and ``connect_timeout``."""

    nats_url: str
    nats_creds: str | None
    connect_timeout: float


def add_nats_flags(parser: argparse.ArgumentParser, *, creds: bool = True) -> None:
    """The flags that say where NATS is and who this process is on it (``plumbing.configuration``)."""
    add_settings(parser, NatsSettings, skip=() if creds else ("nats_creds",))


def nats_options(args: NatsOptions) -> dict[str, Any]:
    """The ``plumbing.bus.connect`` keyword arguments the NATS flags name."""
    return {"creds": args.nats_creds or None, "tls": nats_tls(args)}


class _LastError(logging.Handler):
    """Keeps the newest warning ``plumbing.bus`` logged, to say why a connection did not come up."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.text = record.getMessage().removeprefix("nats: ")


@contextmanager
def _catching_bus_warnings() -> Iterator[_LastError]:
    logger = logging.getLogger("plumbing.bus")
    handler = _LastError()
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _check_files(args: NatsOptions, *flags: str) -> None:
    for flag in flags:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"), None)
        if value and not Path(value).is_file():
            raise UsageError(f"{flag} {value}: no such file")


async def connect_nats(args: NatsOptions, command: str, *, identity: str | None = None) -> Any:
    """A NATS connection, or ``Unreachable`` once ``--connect-timeout`` has passed without one.

    A long-running command names its ``identity`` (``plumbing.bus.connect``): its inbox outlives a rotation.
    """
    import nats.errors

    from plumbing import bus

    _check_files(args, "--nats-creds", "--nats-tls-ca", "--nats-tls-cert", "--nats-tls-key")
    try:
        options = nats_options(args)
        if options.get("tls") is not None:
            options["tls"].context()  # a bad PEM is a usage error, not an unreachable server
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    timeout: float = args.connect_timeout
    with _catching_bus_warnings() as last:
        try:
            return await asyncio.wait_for(
                bus.connect(args.nats_url, name=f"tjpipe-{command}", identity=identity, **options), timeout
            )
        except bus.CredentialsError as exc:
            raise UsageError(f"{exc} (--nats-creds / NATS_CREDS)") from exc
        except bus.NotAuthorized as exc:
            raise Failure(f"{exc} (set NATS_CREDS, e.g. from .tjpipe/env)") from exc
        except TimeoutError:
            why = last.text or "no answer"
            raise Unreachable(
                f"cannot reach NATS at {args.nats_url}: {why} (gave up after {timeout:g} s; --connect-timeout)"
            ) from None
        except OSError as exc:
            raise Unreachable(f"cannot reach NATS at {args.nats_url}: {exc}") from exc
        except nats.errors.Error as exc:
            if "url" in str(exc).lower():
                raise UsageError(f"--nats-url {args.nats_url}: {str(exc).removeprefix('nats: ')}") from exc
            raise
