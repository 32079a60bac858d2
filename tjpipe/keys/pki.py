"""A throwaway CA and a serving certificate for a webhook the local apiserver calls on 127.0.0.1.

The API server only calls admission webhooks over HTTPS and checks them against the configuration's
``caBundle``; locally nothing else needs to trust them, so a CA is made per start, kept only in the work
folder (key 0600), and handed to the webhook configuration. JobSet's manager and ``tjpipe webhook`` share it.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tjpipe.private_files import write_private_file


def self_signed_ca(
    common_name: str, *, not_before: datetime.datetime, not_after: datetime.datetime
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A P-256 CA that signs certificates only (path length 0); every CA this project makes is one of these."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return ca_key, ca_cert


def serving_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    *,
    common_name: str,
    names: Sequence[x509.GeneralName],
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    client_auth: bool = False,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new P-256 key and a certificate for it, signed by the CA, valid for ``names``, for serving TLS
    (and, with ``client_auth``, for connecting as a client too, as NATS routes do)."""
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, *([ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else [])]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def private_key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    """The unencrypted PKCS#8 PEM form of a key, as kube-apiserver, nats-server and aiohttp read it."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def write_serving_pki(
    cert_dir: Path,
    *,
    ca_name: str,
    common_name: str,
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (and ``dns_names``, ``ip_addresses``) in ``cert_dir`` as
    tls.crt/tls.key; returns the CA PEM."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    not_before, not_after = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=30)
    ca_key, ca_cert = self_signed_ca(ca_name, not_before=not_before, not_after=not_after)
    key, cert = serving_certificate(
        ca_key,
        ca_cert,
        common_name=common_name,
        names=[
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            *(x509.DNSName(name) for name in dns_names),
            *(x509.IPAddress(ipaddress.ip_address(address)) for address in ip_addresses),
        ],
        not_before=not_before,
        not_after=not_after,
    )
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    (cert_dir / "ca.crt").write_bytes(ca_pem)
    (cert_dir / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_private_file(cert_dir / "tls.key", private_key_pem(key))
    return ca_pem
