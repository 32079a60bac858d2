"""Kubeconfigs read without the official package (``plumbing.kube``), checked against the package itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plumbing.kube import CredentialSource, KubeConfig

CLUSTERS = """
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:6443/
    certificate-authority: pki/ca.crt
- name: lab
  cluster:
    server: https://lab.example:443
    insecure-skip-tls-verify: true
"""


def _kubeconfig(tmp_path: Path, users: str, *, current: str = "a") -> Path:
    (tmp_path / "pki").mkdir(exist_ok=True)
    (tmp_path / "pki" / "ca.crt").write_text("not read here\n")
    (tmp_path / "token").write_text("from-the-file\n")
    path = tmp_path / "kubeconfig"
    path.write_text(
        textwrap.dedent(
            f"""
            apiVersion: v1
            kind: Config
            current-context: {current}
            contexts:
            - name: a
              context: {{cluster: local, user: alice}}
            - name: b
              context: {{cluster: lab, user: bob}}
            """
        )
        + CLUSTERS
        + "users:\n"
        + textwrap.indent(textwrap.dedent(users), "")
    )
    return path


def _fields(config: KubeConfig) -> tuple[object, ...]:
    # The package keeps a token file's final newline, which no HTTP header may carry; it is stripped here.
    token = config.token.strip() if config.token else config.token
    return (config.server, token, config.ca_file, config.cert_file, config.key_file, config.verify)


USERS = {
    "token": """
        - name: alice
          user: {token: abc}
        - name: bob
          user: {token: xyz}
        """,
    "token-file": """
        - name: alice
          user: {tokenFile: token}
        - name: bob
          user: {tokenFile: token}
        """,
    "token-wins-over-file": """
        - name: alice
          user: {token: abc, tokenFile: token}
        - name: bob
          user: {token: xyz}
        """,
    "client-certificates": """
        - name: alice
          user: {client-certificate: pki/alice.crt, client-key: pki/alice.key}
        - name: bob
          user: {token: xyz}
        """,
}


@pytest.mark.parametrize("users", sorted(USERS))
@pytest.mark.parametrize("context", [None, "b"])
def test_plain_kubeconfigs_read_as_the_package_reads_them(tmp_path: Path, users: str, context: str | None) -> None:
    path = _kubeconfig(tmp_path, USERS[users])
    if users == "client-certificates":  # the package only checks that the files exist
        (tmp_path / "pki" / "alice.crt").write_text("x")
        (tmp_path / "pki" / "alice.key").write_text("x")
    ours = CredentialSource(str(path), context=context)
    theirs = CredentialSource(str(path), context=context)
    assert _fields(ours.load()) == _fields(theirs.load_with_package())
    assert ours._configuration is None  # read here, not by the package


def test_other_kinds_are_left_to_the_package(tmp_path: Path) -> None:
    path = _kubeconfig(
        tmp_path,
        """
        - name: alice
          user:
            exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/true}
        """,
    )
    assert CredentialSource(str(path))._load_plain() is None
    data = tmp_path / "data.yaml"
    data.write_text(path.read_text().replace("certificate-authority: pki/ca.crt", "certificate-authority-data: eA=="))
    assert CredentialSource(str(data), context="a")._load_plain() is None
    assert CredentialSource(f"{path}:{data}")._load_plain() is None  # a list to merge


def test_a_changed_token_file_is_read_again(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, USERS["token-file"])
    source = CredentialSource(str(path))
    assert source.load().token == "from-the-file"
    assert source.current().token == "from-the-file"
    (tmp_path / "token.new").write_text("rotated")
    (tmp_path / "token.new").replace(tmp_path / "token")
    assert source.current().token == "rotated"


def test_services_do_not_import_the_official_client(tmp_path: Path) -> None:
    path = _kubeconfig(tmp_path, USERS["token"])
    code = (
        "import sys; import applier.service, watcher.service;"
        "from plumbing.kube import KubeConfig;"
        f"KubeConfig.load({str(path)!r});"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'cryptography')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
