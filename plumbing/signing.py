"""Stage signatures on bus messages: who made a message is checked from the message, not from the bus.

NATS permissions say which connection may publish on a subject; a leaked identity, a misconfigured
account or a compromised server would still let a stranger's bytes through. So the stage that makes a
message signs it with its own ed25519 key (the watcher its events, the planner its apply messages), and
the stage that consumes it acts only on a message signed by a key it trusts. The private key never
leaves the process that signs; public keys travel out of band (a file, a ConfigMap), never on the bus.

What is signed is a fixed prefix, the subject (length-prefixed) and the payload. The subject names the TrainJob (and the
component), so a signed message cannot be moved onto another TrainJob's subject, and an event cannot be
passed off as a plan. Headers other than the signature are not signed: ``Nats-Msg-Id`` changes when a
dead letter is retried, and the trace id is only for logs. A genuine message replayed later is still
genuine; the applier's ledger fence (``source_version``) is what keeps an old plan from winning.

Keys rotate without a restart: a keyring accepts every key in its file or directory at once, and both
the keyring and the signer notice when their files change. Rotation is add the new public key to the
consumers' trusted set, switch the signer to the new private key, and remove the old public key once
nothing signed with it is still waiting to be consumed.

The ed25519 arithmetic is libsodium's (PyNaCl, which the NATS client's nkey authentication loads anyway),
and the two PEM forms keys are kept in (PKCS#8 private, SubjectPublicKeyInfo public, as openssl writes them)
are read and written here: for ed25519 both are a fixed DER prefix and 32 bytes. The services then never
import the ``cryptography`` package, which cost each of them about 6.7 MB of RSS, and a libsodium
verification takes about half the time of OpenSSL's through ``cryptography`` (117 against 233 µs for a
1.4 kB message on the benchmark machine); every event and apply message is verified once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import nacl.exceptions
from nacl.signing import SigningKey, VerifyKey

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "Tj-Signature"
"""``<key id>:<base64 signature>``."""
DOMAIN = b"tjpipe-signature-v1\n"
"""Prefix of every signed byte string, so these signatures mean nothing to any other protocol."""
PUBLIC_KEY_PREFIX = "ed25519"
RECHECK_SECONDS = 5.0
"""How often a signer or keyring looks whether its files changed."""
UNKNOWN_KEY_RECHECK_SECONDS = 1.0
"""How often an unknown key id may make a keyring look at its files at once (a key added moments ago)."""


# ------------------------------------------------------------------------------------------------ errors


class KeyMaterialError(Exception):
    """A key or keyring cannot be loaded: the service must not start (or keeps its previous keys)."""


class SignatureError(Exception):
    """A message that must not be acted on; ``reason`` is the dead-letter reason."""

    reason = "bad-signature"


class UnsignedMessage(SignatureError):
    reason = "unsigned"


class BadSignature(SignatureError):
    reason = "bad-signature"


# ---------------------------------------------------------------------------------------------- keys


_PKCS8_ED25519 = bytes.fromhex("302e020100300506032b657004220420")
"""DER of an unencrypted PKCS#8 ed25519 private key, up to its 32-byte seed (RFC 8410)."""
_SPKI_ED25519 = bytes.fromhex("302a300506032b6570032100")
"""DER of an ed25519 SubjectPublicKeyInfo, up to its 32-byte key (RFC 8410)."""


def generate_private_key() -> SigningKey:
    return SigningKey.generate()


def key_id(public: VerifyKey) -> str:
    """16 hex digits of the SHA-256 of the raw public key: names a key in headers, files and logs."""
    return hashlib.sha256(bytes(public)).hexdigest()[:16]


def format_public_key(public: VerifyKey, comment: str = "") -> str:
    """The one-line text form keyrings read: ``ed25519 <base64 raw key> [comment]``."""
    line = f"{PUBLIC_KEY_PREFIX} {base64.b64encode(bytes(public)).decode()}"
    return f"{line} {comment}".rstrip()


def _pem(label: str, der: bytes) -> bytes:
    body = base64.b64encode(der).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----", ""]).encode()


def private_key_pem(private: SigningKey) -> bytes:
    """PKCS#8, unencrypted, as ``openssl genpkey -algorithm ed25519`` writes it."""
    return _pem("PRIVATE KEY", _PKCS8_ED25519 + bytes(private))


def public_key_pem(public: VerifyKey) -> bytes:
    """SubjectPublicKeyInfo, as ``openssl pkey -pubout`` writes it."""
    return _pem("PUBLIC KEY", _SPKI_ED25519 + bytes(public))


def _pem_der(text: str, label: str) -> bytes | None:
    """The DER inside the one ``label`` PEM block of ``text``; ``None`` when there is no such block."""
    begin, end = f"-----BEGIN {label}-----", f"-----END {label}-----"
    start = text.find(begin)
    stop = text.find(end, start + len(begin))
    if start < 0 or stop < 0 or text.strip() != text[start : stop + len(end)].strip():
        return None
    try:
        return base64.b64decode("".join(text[start + len(begin) : stop].split()), validate=True)
    except binascii.Error:
        return None


def parse_public_keys(text: str, *, source: str = "") -> list[VerifyKey]:
    """Every public key in ``text``: ``ed25519 <base64>`` lines and PEM ``PUBLIC KEY`` blocks (as openssl
    writes them); blank lines and ``#`` comments are skipped. Anything else is an error, not ignored."""
    keys: list[VerifyKey] = []
    where = f" in {source}" if source else ""
    pem: list[str] = []
    for number, raw_line in enumerate(text.splitlines(), start=1):
        line = raw_line.strip()
        if pem or line.startswith("-----BEGIN"):
            pem.append(line)
            if line.startswith("-----END"):
                keys.append(_pem_public_key("\n".join(pem) + "\n", where))
                pem = []
            continue
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) < 2 or parts[0] != PUBLIC_KEY_PREFIX:
            raise KeyMaterialError(f"line {number}{where}: expected '{PUBLIC_KEY_PREFIX} <base64 key>'")
        try:
            raw = base64.b64decode(parts[1], validate=True)
        except binascii.Error as exc:
            raise KeyMaterialError(f"line {number}{where}: not an ed25519 public key ({exc})") from None
        if len(raw) != 32:
            raise KeyMaterialError(f"line {number}{where}: not an ed25519 public key ({len(raw)} bytes, not 32)")
        keys.append(VerifyKey(raw))
    if pem:
        raise KeyMaterialError(f"unterminated PEM block{where}")
    return keys


def _pem_public_key(pem: str, where: str) -> VerifyKey:
    der = _pem_der(pem, "PUBLIC KEY")
    if der is None:
        raise KeyMaterialError(f"unreadable PEM public key{where} (want one PEM block labelled PUBLIC KEY)")
    if len(der) != len(_SPKI_ED25519) + 32 or not der.startswith(_SPKI_ED25519):
        raise KeyMaterialError(f"a PEM public key{where} is not ed25519")
    return VerifyKey(der[len(_SPKI_ED25519) :])


def load_private_key(path: Path) -> SigningKey:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyMaterialError(f"cannot read the signing key {path}: {exc.strerror or exc}") from None
    # Not decoded strictly: a decoding error would quote the offending byte, which may be key material.
    der = _pem_der(data.decode("ascii", errors="replace"), "PRIVATE KEY")
    if der is None:
        raise KeyMaterialError(
            f"{path} is not an unencrypted PEM private key (want one PEM block labelled PRIVATE KEY)"
        )
    if len(der) != len(_PKCS8_ED25519) + 32 or not der.startswith(_PKCS8_ED25519):
        raise KeyMaterialError(f"{path} is not an ed25519 private key")
    return SigningKey(der[len(_PKCS8_ED25519) :])


def signed_bytes(subject: str, payload: bytes) -> bytes:
    """The prefix, the subject's length, the subject, the payload: no byte can move from one to the other."""
    encoded = subject.encode()
    return DOMAIN + len(encoded).to_bytes(4, "big") + encoded + payload


Fingerprint = tuple[tuple[str, int, int, int], ...]


def _fingerprint(path: Path) -> Fingerprint:
    """What changes when a key file or directory is rewritten, cheaply (stat only; symlinks followed, so a
    ConfigMap volume's atomic swap counts, and so does a file replaced by rename)."""
    try:
        files = sorted(path.glob("*.pub")) if path.is_dir() else [path]
        stats = [(str(f), f.stat()) for f in files]
        return tuple((name, st.st_ino, st.st_mtime_ns, st.st_size) for name, st in stats)
    except OSError:
        return ()


# -------------------------------------------------------------------------------------------- signer


class Signer:
    """One stage's private key; signs (subject, payload) into a header value."""

    def __init__(self, private: SigningKey, *, path: Path | None = None, seen: Fingerprint = ()) -> None:
        self._private = private
        self.key_id = key_id(private.verify_key)
        self._path = path
        self._seen = seen
        self._next_check = time.monotonic() + RECHECK_SECONDS

    @classmethod
    def from_file(cls, path: str | os.PathLike[str] | None, *, setting: str) -> Signer:
        """The signer of a service; ``setting`` names the flag and variable in the error if it is unset."""
        if not path:
            raise KeyMaterialError(f"no signing key: set {setting} to the stage's ed25519 private key (PEM)")
        p = Path(path)
        seen = _fingerprint(p)  # before reading: a change made meanwhile is noticed later, not missed
        return cls(load_private_key(p), path=p, seen=seen)

    @property
    def public_key(self) -> VerifyKey:
        return self._private.verify_key

    def sign(self, subject: str, payload: bytes) -> str:
        self._reload_if_changed()
        signature = self._private.sign(signed_bytes(subject, payload)).signature
        return f"{self.key_id}:{base64.b64encode(signature).decode()}"

    def headers(self, subject: str, payload: bytes) -> dict[str, str]:
        return {SIGNATURE_HEADER: self.sign(subject, payload)}

    def _reload_if_changed(self) -> None:
        if self._path is None or time.monotonic() < self._next_check:
            return
        self._next_check = time.monotonic() + RECHECK_SECONDS
        seen = _fingerprint(self._path)
        if seen == self._seen:
            return
        try:
            private = load_private_key(self._path)
        except KeyMaterialError as exc:
            log.warning("the signing key changed but cannot be loaded (%s); still signing with %s", exc, self.key_id)
            return
        self._seen = seen
        old, self._private, self.key_id = self.key_id, private, key_id(private.verify_key)
        if old != self.key_id:
            log.info("signing key switched from %s to %s", old, self.key_id)


# ------------------------------------------------------------------------------------------- keyring


@dataclass(frozen=True)
class Verified:
    key_id: str


class Keyring:
    """The public keys a consumer trusts for one kind of message; any of them may have signed it.

    Loaded from one file (several keys, one a line) or a directory of ``*.pub`` files. More than one key
    at once is what makes rotation possible without a moment in which genuine messages are refused.
    """

    def __init__(
        self,
        keys: Mapping[str, VerifyKey],
        *,
        path: Path | None = None,
        name: str = "",
        seen: Fingerprint = (),
    ) -> None:
        self._keys = dict(keys)
        self._path = path
        self.name = name
        self._seen = seen
        now = time.monotonic()
        self._next_check = now + RECHECK_SECONDS
        self._next_unknown_check = now

    @classmethod
    def of(cls, *keys: VerifyKey, name: str = "") -> Keyring:
        return cls({key_id(k): k for k in keys}, name=name)

    @classmethod
    def from_path(cls, path: str | os.PathLike[str] | None, *, setting: str, name: str = "") -> Keyring:
        """A service's trusted keys; refuses an unset setting, a missing path and an empty set."""
        if not path:
            raise KeyMaterialError(f"no trusted keys: set {setting} to a file or directory of ed25519 public keys")
        p = Path(path)
        seen = _fingerprint(p)  # before reading, as in Signer.from_file
        return cls(_read_keys(p, setting=setting), path=p, name=name, seen=seen)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._keys))

    def verify(self, subject: str, payload: bytes, headers: Mapping[str, str] | None) -> Verified:
        """Who signed this message, or ``UnsignedMessage`` / ``BadSignature``."""
        value = (headers or {}).get(SIGNATURE_HEADER)
        if not value:
            raise UnsignedMessage(f"no {SIGNATURE_HEADER} header")
        kid, sep, encoded = value.partition(":")
        if not sep or not kid or not encoded:
            raise BadSignature(f"malformed {SIGNATURE_HEADER} header (want '<key id>:<base64>')")
        try:
            signature = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise BadSignature(f"malformed {SIGNATURE_HEADER} header (signature is not base64)") from None
        self._reload_if_changed(unknown=kid not in self._keys)
        public = self._keys.get(kid)
        if public is None:
            raise BadSignature(f"signed by key {kid[:32]!r}, which is not among the trusted {self.name} keys")
        try:
            public.verify(signed_bytes(subject, payload), signature)
        except (nacl.exceptions.BadSignatureError, ValueError):
            raise BadSignature(f"the signature of key {kid} does not match this subject and payload") from None
        return Verified(key_id=kid)

    def _reload_if_changed(self, *, unknown: bool) -> None:
        if self._path is None:
            return
        now = time.monotonic()
        if not (now >= self._next_check or (unknown and now >= self._next_unknown_check)):
            return
        self._next_check = now + RECHECK_SECONDS
        self._next_unknown_check = now + UNKNOWN_KEY_RECHECK_SECONDS
        seen = _fingerprint(self._path)
        if seen == self._seen:
            return
        try:
            keys = _read_keys(self._path, setting=str(self._path))
        except KeyMaterialError as exc:
            log.warning("the trusted %s keys changed but cannot be loaded (%s); keeping the old set", self.name, exc)
            return
        self._seen = seen
        if set(keys) != set(self._keys):
            log.info("trusted %s keys now: %s", self.name, ", ".join(sorted(keys)))
        self._keys = keys


def _read_keys(path: Path, *, setting: str) -> dict[str, VerifyKey]:
    try:
        files = sorted(path.glob("*.pub")) if path.is_dir() else [path]
        texts = [(f, f.read_text()) for f in files]
    except OSError as exc:
        raise KeyMaterialError(f"cannot read trusted keys from {path} ({setting}): {exc.strerror or exc}") from None
    keys: dict[str, VerifyKey] = {}
    for f, text in texts:
        for key in parse_public_keys(text, source=str(f)):
            keys[key_id(key)] = key
    if not keys:
        raise KeyMaterialError(f"no ed25519 public key in {path} ({setting})")
    return keys
