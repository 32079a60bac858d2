"""``tjpipe`` as a subprocess, where no server is needed or none answers: exact output and exit codes.

Exit codes (tjpipe --help): 0 ok, 1 differences, 2 usage, 3 failed, 4 unreachable.
"""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml

from contracts.messages import ObjectApply
from tjpipe.cli import build_parser
from tjpipe.history_tools import preview

from .support import SDK_COMMAND, closed_port, runtime, tjpipe, trainjob

NAMESPACE_RULE = (
    "a namespace is at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit "
    "(expected [NAMESPACE/]NAME)\n"
)
NAME_RULE = (
    "a name is at most 63 lowercase letters, digits and '-', starting with a letter and ending with a letter or "
    "digit (expected [NAMESPACE/]NAME)\n"
)
COMMANDS = [
    a
    for a in build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
]


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    """A TrainJob made by the Kubeflow SDK (its command is a function's source) and its runtime, one file."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all([trainjob("sdk", "team-a", "tiny"), runtime("tiny")], sort_keys=False))
    return path


def _container(objects: list[dict[str, object]]) -> dict[str, object]:
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    spec: dict[str, object] = jobset["spec"]  # type: ignore[assignment]
    job = spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]  # type: ignore[index]
    container: dict[str, object] = job["containers"][0]
    return container


def _expected_objects(namespace: str = "team-a") -> list[object]:
    import msgspec

    messages = preview(trainjob("sdk", namespace, "tiny"), runtime("tiny"))
    return [msgspec.to_builtins(m.object) for m in messages if isinstance(m, ObjectApply)]


def test_version_comes_from_the_package() -> None:
    done = tjpipe("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"tjpipe {version('trainjob-pipeline')}\n", "")


def test_help_documents_the_exit_codes() -> None:
    done = tjpipe("--help")
    assert done.returncode == 0 and done.stderr == ""
    assert "exit codes:\n  0    success\n  1    differences found" in done.stdout
    assert "\n  4    NATS or the Kubernetes apiserver could not be reached within --connect-timeout\n" in done.stdout


def test_plan_prints_user_code_exactly_as_yaml_and_json(job_file: Path) -> None:
    done = tjpipe("plan", "-f", str(job_file))
    assert (done.returncode, done.stderr) == (0, "")
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert objects == _expected_objects()
    assert _container(objects)["command"] == SDK_COMMAND
    # The source is printed as a literal block, line by line as written, brackets and all.
    assert "              - |\n                x = batch[i]\n" in done.stdout
    assert '                open("[/opt/x]")  # :smile: [bold]not bold[/bold]\n' in done.stdout

    as_json = tjpipe("plan", "-f", str(job_file), "-o", "json")
    assert (as_json.returncode, as_json.stderr) == (0, "")
    assert as_json.stdout == json.dumps(objects, indent=2, ensure_ascii=False) + "\n"
    assert '"x = batch[i]\\nopen(\\"[/opt/x]\\")  # :smile: [bold]not bold[/bold]\\n"' in as_json.stdout

    from_stdin = tjpipe("plan", "-f", "-", stdin=job_file.read_text())
    assert (from_stdin.returncode, from_stdin.stdout, from_stdin.stderr) == (0, done.stdout, "")


def test_plan_namespace_flag(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump_all([trainjob("sdk", None, "tiny"), runtime("tiny")]))
    done = tjpipe("plan", "-f", str(path), "-n", "team-b", "-o", "json")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout) == _expected_objects("team-b")

    path.write_text(yaml.safe_dump_all([trainjob("sdk", "team-a", "tiny"), runtime("tiny")]))
    clash = tjpipe("plan", "-f", str(path), "-n", "team-b")
    assert (clash.returncode, clash.stdout) == (2, "")
    assert clash.stderr == "error: the TrainJob's namespace 'team-a' does not match --namespace 'team-b'\n"


def test_plan_runtime_from_its_own_file_and_stdin(tmp_path: Path, job_file: Path) -> None:
    job = tmp_path / "only-job.yaml"
    job.write_text(yaml.safe_dump(trainjob("sdk", "team-a", "tiny")))
    rt = tmp_path / "runtime.yaml"
    rt.write_text(yaml.safe_dump(runtime("tiny")))
    reference = tjpipe("plan", "-f", str(job_file)).stdout
    done = tjpipe("plan", "-f", str(job), "--runtime", "-", stdin=rt.read_text())
    assert (done.returncode, done.stdout, done.stderr) == (0, reference, "")
    both = tjpipe("plan", "-f", "-", "--runtime", "-", stdin="")
    assert (both.returncode, both.stderr) == (2, "error: only one of -f and --runtime can read stdin\n")


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["-f", "{tmp}/missing.yaml"], None, "error: -f {tmp}/missing.yaml: no such file\n"),
        (
            ["-f", "-"],
            "kind: [TrainJob\n",
            "error: stdin: not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'\n",
        ),
        (["-f", "-"], "kind: ConfigMap\n", "error: stdin must hold exactly one TrainJob (found 0)\n"),
        (["-f", "-"], "kind: TrainJob\n", "error: stdin: the TrainJob has no metadata.name\n"),
        (["-f", "-"], "- a\n- b\n", "error: stdin: every YAML document must be a Kubernetes object (a mapping)\n"),
        (["-f", "{job}", "--runtime", "{tmp}/nope.yaml"], None, "error: --runtime {tmp}/nope.yaml: no such file\n"),
        (
            ["-f", "{job}", "-o", "table"],
            None,
            "error: -o table shows a --server-dry-run diff; plan prints objects as yaml or json\n",
        ),
        (
            ["-f", "{job}", "--from-cluster"],
            None,
            "error: --from-cluster and --server-dry-run need a kubeconfig: --kubeconfig or KUBECONFIG\n",
        ),
        ([], None, "error: one of the arguments -f/--file --from-history is required (see: tjpipe plan --help)\n"),
        (
            ["-f", "{job}", "--cluster", "a"],
            None,
            "error: --cluster names the member cluster whose history --from-history reads\n",
        ),
        (
            ["--from-history", "team-a/x", "--runtime", "{tmp}/r.yaml"],
            None,
            "error: --from-history plans the runtime recorded with the TrainJob: no --runtime or --from-cluster\n",
        ),
        (
            ["--from-history", "team-a/x", "--cluster", "a.>"],
            None,
            "error: --cluster: cluster name 'a.>' is not a DNS label (lowercase letters, digits and '-', at most 63): "
            "it is the cluster's JetStream domain and one token of its subjects at the hub\n",
        ),
    ],
)
def test_plan_usage_errors_are_one_line(
    tmp_path: Path, job_file: Path, args: list[str], stdin: str | None, message: str
) -> None:
    fill = {"tmp": str(tmp_path), "job": str(job_file)}
    done = tjpipe("plan", *(a.format(**fill) for a in args), stdin=stdin, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", message.format(**fill))


def test_plan_of_an_invalid_trainjob(tmp_path: Path) -> None:
    bad = trainjob("sdk", "team-a", "tiny")
    bad["spec"]["trainer"]["numNodes"] = "two"  # type: ignore[index]
    done = tjpipe("plan", "-f", "-", stdin=yaml.safe_dump_all([bad, runtime("tiny")]))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "error: stdin: not a valid TrainJob or runtime: Expected `int`, got `str` - at `$.spec.trainer.numNodes`\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["history", "Team/x"],
            "error: invalid namespace 'Team' in 'Team/x': " + NAMESPACE_RULE,
        ),
        (
            ["history", "a/b/c"],
            "error: invalid namespace 'a/b' in 'a/b/c': " + NAMESPACE_RULE,
        ),
        (
            ["history", "ns/x.>"],
            "error: invalid TrainJob name 'x.>' in 'ns/x.>': " + NAME_RULE,
        ),
        (["history", "ns/x", "-n", "other"], "error: 'ns/x' names namespace 'ns' but --namespace says 'other'\n"),
        (["history"], "error: the following arguments are required: [NAMESPACE/]NAME (see: tjpipe history --help)\n"),
        (
            ["history", "ns/x", "-o", "xml"],
            "error: argument -o/--output: invalid choice: 'xml' (choose from 'table', 'json', 'yaml') "
            "(see: tjpipe history --help)\n",
        ),
        (["replay"], "error: name a TrainJob ([NAMESPACE/]NAME) or pass --all\n"),
        (["replay", "ns/x", "--all"], "error: name one TrainJob or pass --all, not both\n"),
        (
            ["replay", "ns/x", "--since", "yesterday"],
            "error: invalid --since 'yesterday': expected a duration such as 90s, 30m, 2h or 1d, "
            "or an ISO 8601 time such as 2026-01-31T12:00:00Z\n",
        ),
        (
            ["replay", "--all", "--from-seq", "0"],
            "error: argument --from-seq: invalid positive integer value: '0' (see: tjpipe replay --help)\n",
        ),
        (
            ["dlq", "show", "x"],
            "error: argument SEQ: invalid positive integer value: 'x' (see: tjpipe dlq show --help)\n",
        ),
        (["dlq", "retry"], "error: name dead letters by sequence, or pass --all\n"),
        (["history", "ns/x", "--nats-url", "nats://["], "error: --nats-url nats://[: invalid connect url option\n"),
        (["dlq", "retry", "3", "--all"], "error: name dead letters by sequence or pass --all, not both\n"),
        (
            ["history", "ns/x", "--nats-creds", "/nonexistent/reader.nk"],
            "error: --nats-creds /nonexistent/reader.nk: no such file\n",
        ),
        (
            ["history", "ns/x", "--connect-timeout", "0"],
            "error: argument --connect-timeout: invalid positive number value: '0' (see: tjpipe history --help)\n",
        ),
        (
            ["frobnicate"],
            "error: argument COMMAND: invalid choice: 'frobnicate' (choose from "
            + ", ".join(f"'{c}'" for c in COMMANDS)
            + ") (see: tjpipe --help)\n",
        ),
    ],
)
def test_bad_arguments_are_usage_errors_before_any_connection(args: list[str], message: str) -> None:
    # NATS_URL names a closed port: were anything tried, the error would be "cannot reach" (exit code 4).
    done = tjpipe(*args, env={"NATS_URL": f"nats://127.0.0.1:{closed_port()}"})
    assert (done.returncode, done.stdout, done.stderr) == (2, "", message)


def test_a_bad_environment_value_is_one_error_and_help_still_works() -> None:
    helped = tjpipe("dlq", "list", "--help", env={"TJPIPE_METRICS_PORT": "abc"})
    assert helped.returncode == 0 and helped.stdout.startswith("usage: tjpipe dlq list") and helped.stderr == ""
    done = tjpipe("history", "ns/x", env={"TJPIPE_CONNECT_TIMEOUT": "soon"})
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == "error: TJPIPE_CONNECT_TIMEOUT: not a valid positive number: 'soon'\n"


@pytest.mark.parametrize(
    "args",
    [
        ["history", "ns/x"],
        ["replay", "--all"],
        ["dlq", "list"],
        ["dlq", "show", "1"],
        ["dlq", "retry", "1"],
        ["bus-setup"],
    ],
)
def test_nats_down_is_reported_after_the_connect_timeout(args: list[str]) -> None:
    url = f"nats://127.0.0.1:{closed_port()}"
    done = tjpipe(*args, "--nats-url", url, "--connect-timeout", "1", timeout=30)
    assert (done.returncode, done.stdout) == (4, "")
    assert done.stderr.startswith(f"error: cannot reach NATS at {url}: "), done.stderr
    assert done.stderr.endswith(" (gave up after 1 s; --connect-timeout)\n") and done.stderr.count("\n") == 1


def test_an_unreachable_apiserver_is_reported(tmp_path: Path, job_file: Path) -> None:
    server = f"https://127.0.0.1:{closed_port()}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
                "current-context": "gone",
            }
        )
    )
    for flags in (["--from-cluster"], ["--server-dry-run"]):
        done = tjpipe(
            "plan", "-f", str(job_file), *flags, "--connect-timeout", "1", env={"KUBECONFIG": str(kubeconfig)}
        )
        assert (done.returncode, done.stdout) == (4, "")
        assert done.stderr.startswith(f"error: cannot reach the apiserver at {server}: "), done.stderr
        assert done.stderr.count("\n") == 1
    missing = tjpipe(
        "plan", "-f", str(job_file), "--from-cluster", "--kubeconfig", str(kubeconfig), "--context", "nope"
    )
    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr.startswith(f"error: kubeconfig {kubeconfig}: "), missing.stderr
    assert "nope" in missing.stderr and missing.stderr.count("\n") == 1


def test_up_refuses_a_state_folder_with_a_running_stack(tmp_path: Path) -> None:
    state = tmp_path / "state [bold]x[/]"  # printed exactly, not read as markup
    (state / "logs").mkdir(parents=True)
    (state / "logs" / "nats-server.pid").write_text("1")
    done = tjpipe("up", "--state-dir", str(state))
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == (f"error: a stack seems to be running already ({state / 'logs'}); run 'tjpipe down' first\n")


def test_signing_keys_and_down(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    made = tjpipe("keys", "init", "--dir", str(folder))
    assert made.returncode == 0 and made.stdout.startswith(f"keys in {folder}: watcher "), made
    listed = tjpipe("keys", "list", "--dir", str(folder))
    assert listed.returncode == 0 and listed.stdout.count("signs with") == 2
    as_json = tjpipe("keys", "list", "--dir", str(folder), "-o", "json")
    assert (as_json.returncode, as_json.stderr) == (0, "")
    rows = json.loads(as_json.stdout)
    assert [r["stage"] for r in rows] == ["watcher", "planner"]
    assert all(r["trusted"] == [r["signs_with"]] for r in rows)
    assert listed.stdout == "".join(
        f"{r['stage']}: signs with {r['signs_with']}; trusted: {r['signs_with']}\n" for r in rows
    )
    refused = tjpipe("keys", "retire", "watcher", "[nope]", "--dir", str(folder))
    assert (refused.returncode, refused.stdout) == (3, "")
    assert refused.stderr == f"error: [nope] is not among the trusted watcher keys in {folder}/trusted-events\n"
    nothing = tjpipe("down", "--state-dir", str(tmp_path / "state"))
    assert (nothing.returncode, nothing.stdout, nothing.stderr) == (0, "nothing was running\n", "")


def test_completion_scripts_are_printed() -> None:
    for shell, first in (("bash", "# tjpipe completion for bash"), ("zsh", "#compdef tjpipe"), ("fish", "# tjpipe")):
        done = tjpipe("completion", shell)
        assert done.returncode == 0 and done.stdout.startswith(first) and done.stderr == "", shell


def test_down_purge_deletes_a_state_folder_and_nothing_else(tmp_path: Path) -> None:
    state = tmp_path / "state [x]"
    (state / "logs").mkdir(parents=True)
    (state / "kubeconfig").write_text("made by the stack")
    (state / "notes.txt").write_text("mine")
    refused = tjpipe("down", "--purge", "--state-dir", str(state))
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == f"error: {state} holds what the stack did not make (notes.txt); not purging it\n"
    assert (state / "notes.txt").read_text() == "mine" and (state / "kubeconfig").exists()
    (state / "notes.txt").unlink()
    purged = tjpipe("down", "--purge", "--state-dir", str(state))
    assert (purged.returncode, purged.stdout, purged.stderr) == (
        0,
        f"nothing was running\ndeleted the state folder {state}\n",
        "",
    )
    assert not state.exists()
    again = tjpipe("down", "--purge", "--state-dir", str(state))
    assert (again.returncode, again.stdout, again.stderr) == (
        0,
        f"nothing was running\nno state folder at {state}\n",
        "",
    )
    a_file = tmp_path / "file"
    a_file.write_text("mine")
    not_a_folder = tjpipe("down", "--purge", "--state-dir", str(a_file))
    assert (not_a_folder.returncode, not_a_folder.stdout) == (2, "")
    assert not_a_folder.stderr == f"error: {a_file} is not a folder; not purging it\n" and a_file.exists()


def test_plan_plans_as_a_planner_with_trainjob_status_does(tmp_path: Path, job_file: Path) -> None:
    """The same settings as the planner's (as .tjpipe/env exports them on the local stack): the preview then
    holds what the TrainJobStatus plugin adds; without them, nothing of it."""
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    env = {
        "TJPIPE_TRAINJOB_STATUS": "true",
        "TJPIPE_STATUS_SERVER_URL": "https://127.0.0.1:10443",
        "TJPIPE_STATUS_SERVER_CA": str(ca),
    }
    done = tjpipe("plan", "-f", str(job_file), env=env)
    assert (done.returncode, done.stderr) == (0, "")
    objects = [d for d in yaml.safe_load_all(done.stdout) if d]
    (config_map,) = [o for o in objects if o["metadata"]["name"] == "sdk-tls-config"]
    assert config_map["data"] == {"ca.crt": ca.read_text()}
    env_names = {e["name"]: e.get("value") for e in _container(objects)["env"]}  # type: ignore[attr-defined]
    url = "https://127.0.0.1:10443/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/sdk/status"
    assert env_names["KUBEFLOW_TRAINER_SERVER_URL"] == url
    off = tjpipe("plan", "-f", str(job_file), "--no-trainjob-status", env=env)
    assert [d for d in yaml.safe_load_all(off.stdout) if d] == _expected_objects()
    broken = tjpipe("plan", "-f", str(job_file), env={**env, "TJPIPE_STATUS_SERVER_CA": str(tmp_path / "none")})
    assert broken.returncode == 2 and "TJPIPE_STATUS_SERVER_CA: cannot read" in broken.stderr
