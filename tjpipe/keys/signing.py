"""Stage signing keys on disk: made for the local stack, and by ``tjpipe keys`` for a real deployment.

Layout of a key folder (``<state>/keys`` for ``tjpipe up``; folders holding private keys are 0700):

    watcher/signing.key               the watcher's ed25519 private key, PKCS#8 PEM, mode 0600
    planner/signing.key               the planner's
    trusted-events/watcher-<id>.pub   public keys the planner accepts events from, one file each
    trusted-plans/planner-<id>.pub    public keys the applier accepts apply messages from

One folder per thing a service is given, so each can be mounted alone (a Secret, a ConfigMap, a
compose volume) into the one service that needs it.

Public keys are one line, ``ed25519 <base64 raw key> <stage>``; a folder of them is a keyring
(``plumbing.signing.Keyring``), so a rotation is a file added and, later, a file removed. Files are written
to a temporary name and renamed, so a service that reloads its keys never reads half a file.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from tjpipe.contracts import subjects
from tjpipe.plumbing import signing
from tjpipe.settings import SIGNING_STAGES as STAGES

TRUSTED_DIR = {"watcher": "trusted-events", "planner": "trusted-plans"}


def _write_atomically(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def public_key_file_name(stage: str, kid: str) -> str:
    return f"{stage}-{kid}.pub"


def write_key_pair(private_path: Path, public_dir: Path, stage: str) -> str:
    """A new key pair: the public key into ``public_dir`` first, then the private key over
    ``private_path``, so no signature is ever made by a key nobody trusts yet. Returns the key id."""
    private = signing.generate_private_key()
    public = private.verify_key
    kid = signing.key_id(public)
    public_dir.mkdir(parents=True, exist_ok=True)
    _write_atomically(
        public_dir / public_key_file_name(stage, kid),
        (signing.format_public_key(public, stage) + "\n").encode(),
        mode=0o644,
    )
    private_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(private_path.parent, 0o700)
    _write_atomically(private_path, signing.private_key_pem(private), mode=0o600)
    return kid


@dataclass(frozen=True)
class KeyFolder:
    """A key folder in the layout above."""

    root: Path

    def signing_key(self, stage: str) -> Path:
        return self.root / stage / "signing.key"

    def trusted(self, stage: str) -> Path:
        """The keyring of the keys ``stage`` signs with (what its consumer trusts)."""
        return self.root / TRUSTED_DIR[stage]

    @property
    def trusted_events(self) -> Path:
        return self.trusted("watcher")

    @property
    def trusted_plans(self) -> Path:
        return self.trusted("planner")

    def ensure(self) -> KeyFolder:
        """Every stage has a signing key trusted by its consumer; existing keys are kept."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        for stage in STAGES:
            key = self.signing_key(stage)
            if not key.exists():
                write_key_pair(key, self.trusted(stage), stage)
                continue
            # A folder copied without its public half: trust the key that is there.
            public = signing.load_private_key(key).verify_key
            kid = signing.key_id(public)
            if not (self.trusted(stage) / public_key_file_name(stage, kid)).exists():
                self.trusted(stage).mkdir(parents=True, exist_ok=True)
                _write_atomically(
                    self.trusted(stage) / public_key_file_name(stage, kid),
                    (signing.format_public_key(public, stage) + "\n").encode(),
                    mode=0o644,
                )
        return self

    def current_key_id(self, stage: str) -> str:
        return signing.key_id(signing.load_private_key(self.signing_key(stage)).verify_key)

    def trusted_key_ids(self, stage: str) -> list[str]:
        return list(signing.Keyring.from_path(self.trusted(stage), setting=str(self.trusted(stage))).key_ids)

    def rotate(self, stage: str) -> tuple[str, str]:
        """Step one and two of a rotation: trust a new key, then sign with it. Returns (old, new) key ids;
        the old one stays trusted until ``retire``."""
        old = self.current_key_id(stage)
        new = write_key_pair(self.signing_key(stage), self.trusted(stage), stage)
        return old, new

    def retire(self, stage: str, kid: str) -> Path:
        """Step three: stop trusting ``kid``. The key in use cannot be retired."""
        if kid == self.current_key_id(stage):
            raise ValueError(f"{kid} is the key the {stage} signs with now; rotate first")
        matches = [
            f
            for f in sorted(self.trusted(stage).glob("*.pub"))
            if kid in {signing.key_id(k) for k in signing.parse_public_keys(f.read_text(), source=str(f))}
        ]
        if not matches:
            raise ValueError(f"{kid} is not among the trusted {stage} keys in {self.trusted(stage)}")
        for f in matches:
            f.unlink()
        return matches[0]

    def signer(self, stage: str) -> signing.Signer:
        return signing.Signer.from_file(self.signing_key(stage), setting=str(self.signing_key(stage)))

    def stage_for_subject(self, subject: str) -> str:
        if subject.startswith(subjects.EVENTS_PREFIX + "."):
            return "watcher"
        if subject.startswith(subjects.APPLY_PREFIX + "."):
            return "planner"
        raise ValueError(f"no stage signs messages on {subject}")

    def sign_headers(self, subject: str, payload: bytes, *, stage: str | None = None) -> dict[str, str]:
        """The signature header a genuine message on ``subject`` carries: the watcher's key for events, the
        planner's for apply messages (or ``stage``'s, to sign with the wrong stage on purpose)."""
        return self.signer(stage or self.stage_for_subject(subject)).headers(subject, payload)

    def service_env(self, service: str) -> dict[str, str]:
        """The signing settings of one service: only the signer gets its private key."""
        env: dict[str, str] = {}
        if service in STAGES:
            env["TJPIPE_SIGNING_KEY"] = str(self.signing_key(service).resolve())
        if service == "planner":
            env["TJPIPE_TRUSTED_EVENT_KEYS"] = str(self.trusted_events.resolve())
        if service == "applier":
            env["TJPIPE_TRUSTED_PLAN_KEYS"] = str(self.trusted_plans.resolve())
        return env
