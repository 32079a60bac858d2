"""The ``tjpipe`` exit codes, and the errors that carry them up to ``cli.main``.

Scripts and CI branch on exit codes, so each outcome has its own and they never change meaning. 1 is kept
for "differences found" (``replay``'s changed plans, ``plan --server-dry-run``'s would-change), as
``diff`` and ``kubectl diff`` use it, so a failing command can never be mistaken for a changed plan.
Commands raise these errors instead of printing and returning; ``cli.main`` prints one line for each.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    DIFFERENCES = 1
    USAGE = 2
    FAILED = 3
    UNREACHABLE = 4
    INTERRUPTED = 130


EPILOG = """exit codes:
  0    success
  1    differences found: replay's plans changed, plan --server-dry-run would change the cluster
  2    usage or configuration error: a bad flag, argument, environment value or file
  3    the command failed: not found, refused by NATS or the apiserver
  4    NATS or the Kubernetes apiserver could not be reached within --connect-timeout
  130  interrupted (Ctrl-C)

set TJPIPE_DEBUG=1 (or pass --debug) to see a traceback with an error."""


class CliError(Exception):
    """An error the user can act on: printed as one ``error: ...`` line, no traceback."""

    code: ExitCode = ExitCode.FAILED


class UsageError(CliError):
    """A bad argument, flag, environment value or file: nothing was tried."""

    code = ExitCode.USAGE


class Failure(CliError):
    """The command ran and failed: something was not found, or a server refused."""

    code = ExitCode.FAILED


class Unreachable(CliError):
    """NATS or the apiserver did not answer within the connection timeout."""

    code = ExitCode.UNREACHABLE
