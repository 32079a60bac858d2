"""What the docs tests share: the repository's paths, its generator, and the fenced blocks of a page.

A block a user would paste is a fence whose info string is a shell (``bash``, ``sh``, ``shell``, ``console``).
The line before it may carry a marker: ``<!-- not run: REASON -->`` (never run, and the reason is required),
``<!-- run: last -->`` (run after every other block, as ``tjpipe down`` must be), or ``<!-- real node: REASON
-->`` (needs pods that run: not run against an API server alone, run by ``tests/real_node/test_install.py`` on
a cluster with a real node). Every other such block is run, in the order of the pages and of the blocks in them.

The install page's test and the real node's install test share the rest: Trainer's install as the page expects
to find it (``trainer_install``), the environment the page's commands run in (``install_env``), and how one
block runs (``run_block``).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from kubernetes import client as kube_client

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
SHELLS = ("bash", "sh", "shell", "console")
MARKER = re.compile(r"^<!--\s*(not run|run|real node):\s*(.*?)\s*-->$")


@functools.cache
def gen_docs() -> ModuleType:
    """``tools/gen_docs.py`` as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "tools" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    info: str
    text: str
    marker: str  # "", "not run", "run" or "real node"
    note: str  # the marker's reason, or "last"


def blocks(page: str) -> list[Block]:
    """Every fenced block of ``docs/<page>`` whose info string is a shell, with the marker before it."""
    found: list[Block] = []
    lines = (DOCS / page).read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("```"):
            i += 1
            continue
        info = line[3:].strip().split(" ")[0]
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        if info in SHELLS:
            before = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            match = MARKER.match(before)
            marker, note = (match.group(1), match.group(2)) if match else ("", "")
            found.append(Block(page, i + 1, info, "\n".join(lines[i + 1 : end]) + "\n", marker, note))
        i = end + 1
    return found


ITEM = re.compile(r"^( *)([-*+]|\d+\.) ")


def list_problems(page: str) -> list[str]:
    """Lists GitHub renders but Python-Markdown (the site) does not: a list straight after a paragraph line
    runs into the paragraph, and a nested item indented less than four spaces is not nested."""
    problems: list[str] = []
    fence, in_list, prev = False, False, ""
    for number, line in enumerate((DOCS / page).read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        elif not fence:
            item = ITEM.match(line)
            if item:
                indent = len(item.group(1))
                if indent == 0 and not in_list and prev.strip():
                    problems.append(f"docs/{page}:{number}: a blank line before the list")
                if 0 < indent < 4:
                    problems.append(f"docs/{page}:{number}: indent a nested item by four spaces")
                in_list = True
            elif in_list and line.strip() and not line.startswith(" ") and not prev.strip():
                in_list = False
        prev = line
    return problems


# ------------------------------------------------------------------------------------------- the install page

INSTALL_PAGE = "install.md"
BIN = Path(sys.executable).parent


def trainer_install(api: kube_client.ApiClient, *, replicas: int = 1) -> None:
    """What Trainer v2.3.0's install leaves that the install page's commands act on: the namespace
    ``kubeflow-system`` with Trainer's and JobSet's controller Deployments (their images are only names: with
    ``replicas`` 0 nothing tries to run them) and Trainer's two webhook configurations."""
    core, apps = kube_client.CoreV1Api(api), kube_client.AppsV1Api(api)
    admission = kube_client.AdmissionregistrationV1Api(api)
    core.create_namespace(kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name="kubeflow-system")))
    for name in ("kubeflow-trainer-controller-manager", "jobset-controller-manager"):
        labels = {"app.kubernetes.io/name": name}
        apps.create_namespaced_deployment(
            "kubeflow-system",
            kube_client.V1Deployment(
                metadata=kube_client.V1ObjectMeta(name=name),
                spec=kube_client.V1DeploymentSpec(
                    replicas=replicas,
                    selector=kube_client.V1LabelSelector(match_labels=labels),
                    template=kube_client.V1PodTemplateSpec(
                        metadata=kube_client.V1ObjectMeta(labels=labels),
                        spec=kube_client.V1PodSpec(containers=[kube_client.V1Container(name="manager", image=name)]),
                    ),
                ),
            ),
        )
    service = kube_client.AdmissionregistrationV1ServiceReference(
        namespace="kubeflow-system", name="kubeflow-trainer-controller-manager", path="/validate", port=443
    )
    rule = kube_client.V1RuleWithOperations(
        api_groups=["trainer.kubeflow.org"], api_versions=["v1alpha1"], operations=["CREATE"], resources=["trainjobs"]
    )
    hook: dict[str, Any] = {
        "client_config": kube_client.AdmissionregistrationV1WebhookClientConfig(service=service),
        "rules": [rule],
        "admission_review_versions": ["v1"],
        "side_effects": "None",
        "failure_policy": "Ignore",  # nothing answers it here; the page deletes it before anything is created
    }
    admission.create_validating_webhook_configuration(
        kube_client.V1ValidatingWebhookConfiguration(
            metadata=kube_client.V1ObjectMeta(name="validator.trainer.kubeflow.org"),
            webhooks=[kube_client.V1ValidatingWebhook(name="validator.trainjob.trainer.kubeflow.org", **hook)],
        )
    )
    admission.create_mutating_webhook_configuration(
        kube_client.V1MutatingWebhookConfiguration(
            metadata=kube_client.V1ObjectMeta(name="defaulter.trainer.kubeflow.org"),
            webhooks=[kube_client.V1MutatingWebhook(name="defaulter.trainjob.trainer.kubeflow.org", **hook)],
        )
    )


def _go_caches() -> dict[str, str]:
    """The machine's Go caches, named outright, so that a test ``HOME`` neither hides nor refills them."""
    names = ("GOMODCACHE", "GOCACHE", "GOPATH")
    out = subprocess.run(["go", "env", *names], capture_output=True, text=True, check=True, timeout=60).stdout
    return dict(zip(names, out.splitlines(), strict=True))


def install_env(root: Path, *, kubeconfig: Path, kubectl: Path, cache_dir: Path) -> dict[str, str]:
    """The environment the page's commands run in: ``HOME`` a folder under ``root`` (the page's secrets never
    touch the developer's), ``kubectl`` of the API server's release and this environment's ``tjpipe`` and
    ``python`` first on ``PATH``, the cluster's kubeconfig, the machine's Go and build caches."""
    tools, home = root / "bin", root / "home"
    tools.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    if not (tools / "kubectl").exists():
        (tools / "kubectl").symlink_to(kubectl)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    env.update(_go_caches())
    env.update(
        KUBECONFIG=str(kubeconfig),
        HOME=str(home),
        TJPIPE_CACHE_DIR=str(cache_dir),
        PATH=f"{tools}{os.pathsep}{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def run_block(block: Block, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """One block, as ``bash -e -o pipefail``, from the repository's top folder (the page says to run from there)."""
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.text],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_ran(block: Block, done: subprocess.CompletedProcess[str]) -> None:
    where = f"docs/{block.page}:{block.line}"
    assert done.returncode == 0, f"{where} failed ({done.returncode}):\n{block.text}\n{done.stdout}\n{done.stderr}"
