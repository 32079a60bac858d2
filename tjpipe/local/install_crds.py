"""Install the Trainer, JobSet and PodGroup CRDs where KUBECONFIG points: ``python -m tjpipe.local.install_crds``.

This is the one-shot ``crds`` service of ``compose/docker-compose.yml``; it works the same against any cluster.
The CRDs come from ``crd_manifests()``, i.e. from the owning projects' Go modules (and controller-gen for
Volcano), so the image that runs it carries a Go toolchain (the Dockerfile's ``crds`` stage).

``--server`` and ``--write-kubeconfig`` exist for compose: k3s writes a kubeconfig that points at
``https://127.0.0.1:6443``, which is only right inside the k3s container. With ``--server https://k3s:6443``
the kubeconfig is rewritten to the address other containers use, and ``--write-kubeconfig`` saves that copy
for the services, which start only after this command has succeeded.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.kubeapi import new_api_client
from tjpipe.settings import env_flag, resolve

_POLL_SECONDS = 2.0


def rewrite_server(kubeconfig: dict[str, Any], server: str) -> dict[str, Any]:
    """The kubeconfig with every cluster's ``server`` set to ``server``."""
    clusters = kubeconfig.get("clusters") or []
    if not clusters:
        raise ValueError("the kubeconfig names no cluster")
    for entry in clusters:
        entry.setdefault("cluster", {})["server"] = server
    return kubeconfig


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        # Read by the services, which run as another user in another container; the credentials it holds
        # are the ones k3s already wrote world-readable to the same kind of volume.
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    finally:
        Path(partial).unlink(missing_ok=True)


def _wait_for_api(kubeconfig: Path, *, timeout: float) -> None:
    from kubernetes import client

    deadline = time.monotonic() + timeout
    while True:
        try:
            with new_api_client(kubeconfig) as api:
                client.VersionApi(api).get_code()
            return
        except Exception as error:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the API server in {kubeconfig} did not answer within {timeout:.0f}s") from error
            time.sleep(_POLL_SECONDS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tjpipe.local.install_crds", description=__doc__.splitlines()[0])
    env_flag(parser, "--kubeconfig", env="KUBECONFIG", help="the cluster to install the CRDs into")
    parser.add_argument("--server", help="rewrite the kubeconfig's server address (e.g. https://k3s:6443)")
    parser.add_argument("--write-kubeconfig", type=Path, help="save the (rewritten) kubeconfig here")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for the API server")
    args = resolve(parser.parse_args(argv), os.environ)  # this entry point's edge: its one environment read
    if not args.kubeconfig:
        print("install_crds: set KUBECONFIG or pass --kubeconfig", file=sys.stderr)
        return 2
    kubeconfig = Path(args.kubeconfig)

    if args.server or args.write_kubeconfig:
        loaded = yaml.safe_load(kubeconfig.read_text())
        if args.server:
            loaded = rewrite_server(loaded, args.server)
        target: Path = args.write_kubeconfig or kubeconfig
        _write_atomically(target, yaml.safe_dump(loaded, sort_keys=False))
        kubeconfig = target
        print(f"install_crds: kubeconfig for the services written to {target}", flush=True)

    _wait_for_api(kubeconfig, timeout=args.timeout)
    started = time.monotonic()
    manifests = crd_manifests(progress=lambda line: print(f"install_crds: {line}", flush=True))
    with new_api_client(kubeconfig) as api:
        install_crds(api, manifests)
    names = ", ".join(m["metadata"]["name"] for m in manifests)
    print(f"install_crds: installed in {time.monotonic() - started:.1f}s: {names}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
