"""Writing a file that holds secret material (nkey seeds, TLS and service-account keys, tokens, configs
with a password): one function, so every such file is created 0600 before a byte is in it.

The mode is given to ``open`` so the file is never readable by others, even for a moment, and set again
afterwards because ``O_CREAT`` does not change the mode of a file that already exists.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_private_file(path: Path, content: str | bytes) -> None:
    """Write ``content`` to ``path`` (created or truncated) with mode 0600; text is written as UTF-8."""
    data = content.encode() if isinstance(content, str) else content
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)
