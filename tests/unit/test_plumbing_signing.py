"""Stage signatures: what verifies, what does not, and rotation through files (plumbing.signing, tjpipe.keys)."""

from __future__ import annotations

import base64
import os
import stat
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from plumbing import signing
from plumbing.signing import SIGNATURE_HEADER, BadSignature, KeyMaterialError, Keyring, Signer, UnsignedMessage
from tjpipe.keys.signing import KeyFolder, write_key_pair

SUBJECT = "tj.apply.3.team-a.job.jobset"
PAYLOAD = b'{"component":"jobset","x":1}'


def _signer() -> Signer:
    return Signer(signing.generate_private_key())


def test_round_trip_names_the_key() -> None:
    signer = _signer()
    ring = Keyring.of(signer.public_key)
    verified = ring.verify(SUBJECT, PAYLOAD, signer.headers(SUBJECT, PAYLOAD))
    assert verified.key_id == signer.key_id
    assert len(signer.key_id) == 16 and int(signer.key_id, 16) >= 0


def test_a_changed_payload_or_subject_does_not_verify() -> None:
    signer = _signer()
    ring = Keyring.of(signer.public_key)
    headers = signer.headers(SUBJECT, PAYLOAD)
    with pytest.raises(BadSignature, match="does not match"):
        ring.verify(SUBJECT, PAYLOAD.replace(b"1", b"2"), headers)
    with pytest.raises(BadSignature):
        ring.verify(SUBJECT, PAYLOAD + b" ", headers)
    # The same bytes moved onto another TrainJob's subject, or from an apply subject to an event subject.
    with pytest.raises(BadSignature):
        ring.verify("tj.apply.3.team-b.job.jobset", PAYLOAD, headers)
    with pytest.raises(BadSignature):
        ring.verify("tj.ev.3.team-a.job", PAYLOAD, headers)


def test_the_subject_and_payload_boundary_is_fixed() -> None:
    """Moving a byte between subject and payload is not the same message."""
    signer = _signer()
    ring = Keyring.of(signer.public_key)
    headers = signer.headers("tj.ev.1.a.b", b"c\nd")
    with pytest.raises(BadSignature):
        ring.verify("tj.ev.1.a.b\nc", b"d", headers)


def test_a_key_that_is_not_trusted_is_refused() -> None:
    trusted, stranger = _signer(), _signer()
    ring = Keyring.of(trusted.public_key, name="plan")
    with pytest.raises(BadSignature, match="not among the trusted plan keys"):
        ring.verify(SUBJECT, PAYLOAD, stranger.headers(SUBJECT, PAYLOAD))
    # A stranger claiming a trusted key id still needs that key's signature.
    forged = trusted.key_id + ":" + stranger.sign(SUBJECT, PAYLOAD).split(":", 1)[1]
    with pytest.raises(BadSignature, match="does not match"):
        ring.verify(SUBJECT, PAYLOAD, {SIGNATURE_HEADER: forged})


def test_missing_and_malformed_headers() -> None:
    signer = _signer()
    ring = Keyring.of(signer.public_key)
    for headers in (None, {}, {"Nats-Msg-Id": "x"}, {SIGNATURE_HEADER: ""}):
        with pytest.raises(UnsignedMessage) as caught:
            ring.verify(SUBJECT, PAYLOAD, headers)
        assert caught.value.reason == "unsigned"
    for value in ("nocolon", ":abc", f"{signer.key_id}:", f"{signer.key_id}:not base64!", "a:b:c"):
        with pytest.raises(BadSignature) as bad:
            ring.verify(SUBJECT, PAYLOAD, {SIGNATURE_HEADER: value})
        assert bad.value.reason == "bad-signature"
    short = f"{signer.key_id}:{base64.b64encode(b'short').decode()}"
    with pytest.raises(BadSignature):
        ring.verify(SUBJECT, PAYLOAD, {SIGNATURE_HEADER: short})


def test_rotation_accepts_both_keys_while_both_are_trusted() -> None:
    old, new = _signer(), _signer()
    ring = Keyring.of(old.public_key, new.public_key)
    assert ring.verify(SUBJECT, PAYLOAD, old.headers(SUBJECT, PAYLOAD)).key_id == old.key_id
    assert ring.verify(SUBJECT, PAYLOAD, new.headers(SUBJECT, PAYLOAD)).key_id == new.key_id
    after = Keyring.of(new.public_key)
    with pytest.raises(BadSignature):
        after.verify(SUBJECT, PAYLOAD, old.headers(SUBJECT, PAYLOAD))


def test_keyring_files_lines_pem_and_comments(tmp_path: Path) -> None:
    a, b = _signer(), _signer()
    # Written by another implementation (OpenSSL, through cryptography), read by this module's own PEM reader.
    pem = Ed25519PublicKey.from_public_bytes(bytes(b.public_key)).public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path = tmp_path / "keys.pub"
    path.write_text(f"# trusted\n\n{signing.format_public_key(a.public_key, 'watcher old')}\n{pem.decode()}")
    ring = Keyring.from_path(path, setting="X")
    assert set(ring.key_ids) == {a.key_id, b.key_id}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "no ed25519 public key"),
        ("# only a comment\n", "no ed25519 public key"),
        ("ssh-ed25519 AAAA\n", "expected 'ed25519"),
        ("ed25519 !!!\n", "not an ed25519 public key"),
        ("ed25519 " + base64.b64encode(b"x" * 31).decode() + "\n", "not an ed25519 public key"),
        ("-----BEGIN PUBLIC KEY-----\nAAAA\n", "unterminated"),
    ],
)
def test_bad_keyrings_are_refused(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "keys.pub"
    path.write_text(text)
    with pytest.raises(KeyMaterialError, match=error):
        Keyring.from_path(path, setting="--trusted-event-keys / TJPIPE_TRUSTED_EVENT_KEYS")


def test_unset_settings_name_the_flag_and_variable(tmp_path: Path) -> None:
    with pytest.raises(KeyMaterialError, match="--trusted-plan-keys / TJPIPE_TRUSTED_PLAN_KEYS"):
        Keyring.from_path(None, setting="--trusted-plan-keys / TJPIPE_TRUSTED_PLAN_KEYS")
    with pytest.raises(KeyMaterialError, match="TJPIPE_SIGNING_KEY"):
        Signer.from_file("", setting="--signing-key / TJPIPE_SIGNING_KEY")
    with pytest.raises(KeyMaterialError, match="cannot read"):
        Signer.from_file(tmp_path / "absent.key", setting="X")
    with pytest.raises(KeyMaterialError, match="cannot read"):
        Keyring.from_path(tmp_path / "absent.pub", setting="X")
    (tmp_path / "empty").mkdir()
    with pytest.raises(KeyMaterialError, match="no ed25519 public key"):
        Keyring.from_path(tmp_path / "empty", setting="X")
    (tmp_path / "not-a.key").write_text("hello")
    with pytest.raises(KeyMaterialError, match="not an unencrypted PEM private key"):
        Signer.from_file(tmp_path / "not-a.key", setting="X")


def test_key_folder_layout_and_modes(tmp_path: Path) -> None:
    folder = KeyFolder(tmp_path / "keys").ensure()
    assert stat.S_IMODE(folder.root.stat().st_mode) == 0o700
    for stage in ("watcher", "planner"):
        assert stat.S_IMODE(folder.signing_key(stage).stat().st_mode) == 0o600
        assert folder.trusted_key_ids(stage) == [folder.current_key_id(stage)]
    assert folder.current_key_id("watcher") != folder.current_key_id("planner")
    # Idempotent: a second ensure keeps the keys.
    before = folder.current_key_id("watcher")
    KeyFolder(folder.root).ensure()
    assert folder.current_key_id("watcher") == before
    # Each service gets only its own private key.
    assert set(folder.service_env("watcher")) == {"TJPIPE_SIGNING_KEY"}
    assert set(folder.service_env("planner")) == {"TJPIPE_SIGNING_KEY", "TJPIPE_TRUSTED_EVENT_KEYS"}
    assert set(folder.service_env("applier")) == {"TJPIPE_TRUSTED_PLAN_KEYS"}
    assert folder.service_env("planner")["TJPIPE_SIGNING_KEY"].endswith("planner/signing.key")
    assert stat.S_IMODE(folder.signing_key("planner").parent.stat().st_mode) == 0o700


def test_sign_headers_uses_the_stage_of_the_subject(tmp_path: Path) -> None:
    folder = KeyFolder(tmp_path / "keys").ensure()
    events = Keyring.from_path(folder.trusted_events, setting="X")
    plans = Keyring.from_path(folder.trusted_plans, setting="X")
    event_subject = "tj.ev.5.ns.job"
    events.verify(event_subject, PAYLOAD, folder.sign_headers(event_subject, PAYLOAD))
    plans.verify(SUBJECT, PAYLOAD, folder.sign_headers(SUBJECT, PAYLOAD))
    with pytest.raises(BadSignature):  # the watcher's key is no planner key
        plans.verify(SUBJECT, PAYLOAD, folder.sign_headers(SUBJECT, PAYLOAD, stage="watcher"))
    with pytest.raises(ValueError):
        folder.sign_headers("tj.result.1.ns.job.jobset", PAYLOAD)


def _expire_checks(*objs: Signer | Keyring) -> None:
    for obj in objs:
        obj._next_check = time.monotonic() - 1
        if isinstance(obj, Keyring):
            obj._next_unknown_check = time.monotonic() - 1


def test_rotation_through_files_without_a_restart(tmp_path: Path) -> None:
    """The documented procedure, on running objects: trust new, sign with new, retire old."""
    folder = KeyFolder(tmp_path / "keys").ensure()
    signer = folder.signer("planner")
    ring = Keyring.from_path(folder.trusted_plans, setting="X", name="plan")
    old_id = signer.key_id
    assert ring.verify(SUBJECT, PAYLOAD, signer.headers(SUBJECT, PAYLOAD)).key_id == old_id
    old_headers = signer.headers(SUBJECT, PAYLOAD)

    old, new = folder.rotate("planner")
    assert old == old_id and new != old
    assert sorted(folder.trusted_key_ids("planner")) == sorted([old, new])
    _expire_checks(signer)
    new_headers = signer.headers(SUBJECT, PAYLOAD)
    assert signer.key_id == new
    # The keyring learns the new key the first time it sees it (no wait for the periodic check) and keeps
    # accepting the old one: messages signed before the switch still verify.
    ring._next_check = time.monotonic() + 3600
    assert ring.verify(SUBJECT, PAYLOAD, new_headers).key_id == new
    assert ring.verify(SUBJECT, PAYLOAD, old_headers).key_id == old

    with pytest.raises(ValueError, match="signs with now"):
        folder.retire("planner", new)
    folder.retire("planner", old)
    assert folder.trusted_key_ids("planner") == [new]
    _expire_checks(ring)
    with pytest.raises(BadSignature):
        ring.verify(SUBJECT, PAYLOAD, old_headers)
    assert ring.verify(SUBJECT, PAYLOAD, new_headers).key_id == new


def test_a_broken_key_file_keeps_the_previous_keys(tmp_path: Path) -> None:
    folder = KeyFolder(tmp_path / "keys").ensure()
    signer = folder.signer("watcher")
    ring = Keyring.from_path(folder.trusted_events, setting="X")
    headers = signer.headers("tj.ev.1.a.b", PAYLOAD)
    (folder.trusted_events / "broken.pub").write_text("garbage\n")
    folder.signing_key("watcher").write_text("garbage")
    _expire_checks(signer, ring)
    assert ring.verify("tj.ev.1.a.b", PAYLOAD, headers).key_id == signer.key_id
    assert ring.verify("tj.ev.1.a.b", PAYLOAD, signer.headers("tj.ev.1.a.b", PAYLOAD))


def test_write_key_pair_never_leaves_a_readable_private_key(tmp_path: Path) -> None:
    kid = write_key_pair(tmp_path / "k" / "planner.key", tmp_path / "pub", "planner")
    assert (tmp_path / "pub" / f"planner-{kid}.pub").read_text().startswith("ed25519 ")
    assert stat.S_IMODE(os.stat(tmp_path / "k" / "planner.key").st_mode) == 0o600
    assert not list((tmp_path / "k").glob(".*tmp"))


def test_pem_forms_agree_with_openssl(tmp_path: Path) -> None:
    """This module reads and writes ed25519 PEM itself; OpenSSL (through cryptography) must agree both ways."""
    theirs = Ed25519PrivateKey.generate()
    path = tmp_path / "signing.key"
    path.write_bytes(
        theirs.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    ours = signing.load_private_key(path)
    message = signing.signed_bytes(SUBJECT, PAYLOAD)
    assert ours.sign(message).signature == theirs.sign(message)  # ed25519 signatures are deterministic
    reread = serialization.load_pem_private_key(signing.private_key_pem(ours), password=None)
    assert isinstance(reread, Ed25519PrivateKey)
    assert reread.sign(message) == theirs.sign(message)
    public = serialization.load_pem_public_key(signing.public_key_pem(ours.verify_key))
    assert isinstance(public, Ed25519PublicKey)
    header = Signer(ours).sign(SUBJECT, PAYLOAD)
    public.verify(base64.b64decode(header.split(":", 1)[1]), message)  # raises unless OpenSSL agrees


@pytest.mark.parametrize(
    ("key", "error"),
    [
        (ec.generate_private_key(ec.SECP256R1()), "is not an ed25519 private key"),
        (Ed25519PrivateKey.generate(), "is not an unencrypted PEM private key"),  # written encrypted below
    ],
)
def test_other_private_keys_are_refused(tmp_path: Path, key: object, error: str) -> None:
    encryption: serialization.KeySerializationEncryption = serialization.NoEncryption()
    if isinstance(key, Ed25519PrivateKey):
        encryption = serialization.BestAvailableEncryption(b"secret")
    assert isinstance(key, Ed25519PrivateKey | ec.EllipticCurvePrivateKey)
    path = tmp_path / "signing.key"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    with pytest.raises(KeyMaterialError, match=error):
        Signer.from_file(path, setting="X")


def test_a_pem_public_key_of_another_algorithm_is_refused(tmp_path: Path) -> None:
    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    path = tmp_path / "keys.pub"
    path.write_bytes(pem)
    with pytest.raises(KeyMaterialError, match="is not ed25519"):
        Keyring.from_path(path, setting="X")


def test_a_binary_key_file_is_refused_without_quoting_it(tmp_path: Path) -> None:
    path = tmp_path / "signing.key"
    der = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.write_bytes(der + b"\xff")
    with pytest.raises(KeyMaterialError, match="is not an unencrypted PEM private key") as raised:
        Signer.from_file(path, setting="X")
    assert "0x" not in str(raised.value) and "\\x" not in str(raised.value)
