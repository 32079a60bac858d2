#!/usr/bin/env bash
# Install what is missing, then run every check and test: `bash scripts/test.sh [pytest args]`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Every phase's wall time goes to one file (.ci/run passes its own, with its apt and dockerd rows in it);
# the table of it is printed on the way out, whatever failed, and the log's last line is the tests' summary.
phases="$root/scripts/phases.py"
if [ -z "${TJPIPE_PHASES:-}" ]; then
  TJPIPE_PHASES="$(mktemp "${TMPDIR:-/tmp}/tjpipe-phases.XXXXXX")"
fi
export TJPIPE_PHASES
export TJPIPE_RUN_STARTED="${TJPIPE_RUN_STARTED:-$(date +%s.%N)}"
trap 'status=$?; python3 "$phases" report --exit-code "$status"; exit "$status"' EXIT
python3 "$phases" run "environment (.venv)" -- bash "$root/scripts/bootstrap.sh" test
cd "$root"
venv="$root/.venv/bin"
# The Go binaries, built once into ~/.cache/trainjob-pipeline (each build holds a file lock, so a test that
# asks for a binary still being built waits for it).
go_builds() {
  echo "· building or finding kube-apiserver and etcd (first build: a few minutes)"
  "$venv/python" "$phases" go kube
  echo "· building or finding JobSet's manager (its webhooks run in tests/jobset; first build: a few minutes)"
  "$venv/python" "$phases" go jobset
  echo "· building or finding kube-controller-manager, kube-scheduler and kwok (the simulated cluster; first build: a few minutes)"
  "$venv/python" "$phases" go cluster
  echo "· building or finding Trainer v2.3.0's controller manager (tests/takeover, tests/lifecycle, the benchmark; first build: a few minutes)"
  "$venv/python" "$phases" go trainer
  echo "· building or finding helm (tests/deploy render the Kubeflow chart; first build: a few minutes)"
  "$venv/python" "$phases" go helm
  echo "· building or finding the real node's kubelet, kube-proxy, containerd, runc, CNI plugins and CoreDNS (tests/real_node; first build: several minutes)"
  "$venv/python" "$phases" go node
}
# Every check runs, and the first failure is the script's exit code once they all did.
checks_status=0
check() { python3 "$phases" run "$@" || { code=$?; [ "$checks_status" -ne 0 ] || checks_status=$code; }; }
checks() {
  echo "· ruff";          check "ruff" -- "$venv/ruff" check .
  echo "· ruff format";   check "ruff format" -- "$venv/ruff" format --check .
  echo "· mypy --strict"; check "mypy --strict" -- "$venv/mypy"
  echo "· import layers"; check "import layers" -- "$venv/lint-imports"
  # Mermaid served with the site (diagrams render offline): fetched as tools/mermaid/package-lock.json locks it.
  echo "· docs assets";   check "docs assets (mermaid)" -- bash "$root/scripts/docs-assets.sh"
  echo "· docs site";     check "mkdocs build --strict" -- env NO_MKDOCS_2_WARNING=1 "$venv/mkdocs" build --strict
}

if [ $# -gt 0 ]; then
  # One folder or test (`scripts/test.sh tests/unit`): the steps one after another, as they always were.
  go_builds
  checks
  [ "$checks_status" -eq 0 ] || exit "$checks_status"
  echo "· pytest"
  # Not exec'd: the phase table follows pytest's output, and the script exits with pytest's code.
  status=0
  "$venv/pytest" -q -ra "$@" || status=$?
  exit "$status"
fi

# The whole run: what needs no Go binary runs beside the Go builds, then the tests in two lanes side by side.
# docs/contributing.md ("CI time") says why these folders, and what was measured.
#  - beside the Go builds (a cold run's 9 minutes; nothing in a warm one): the checks, the SDK's environment,
#    and the test folders that start no server and need no Go binary;
#  - lane 1 and lane 2: the folders named below, in this order; then lane 2 runs every folder not named
#    anywhere (a new folder lands there until it is placed) and the SDK flow in .venv-sdk. Each lane is one
#    pytest with its own session fixtures (a NATS server and an apiserver each); ports are the kernel's free
#    ones; the folders that use the Docker engine are in one lane, so no two image builds or compose
#    projects run at once; the order puts what keeps the cores busy (tests/golden, tests/deploy: more than
#    a core each) beside what waits (tests/faults, tests/security: a third of one), by the phase table's
#    cpu notes and the folders' times in a warm run.
pure=(tests/unit tests/wire tests/distribution tests/docs)
lane1=(tests/progress_under_load tests/compose tests/containers tests/golden tests/deploy tests/history
  tests/fleet_history tests/status_endpoint tests/local tests/real_node)
lane2=(tests/differential tests/lifecycle tests/cli tests/fleet tests/fleet_e2e tests/faults tests/security tests/e2e
  tests/jobset tests/takeover)
# The cost budgets count per behaviour (per observation, per held status, per second of a clock), so the
# machine's pace moves their units, not their verdict; they run alone once the lanes are done (about 45 s), where
# their audit-logged cluster of their own does not crowd the lanes' two cores.
alone=(tests/budgets)
for path in tests/*/ tests/test_*.py tests/*_test.py; do
  path="${path%/}"
  [ -e "$path" ] || continue
  case "${path#tests/}" in _* | .*) continue ;; esac
  case " ${pure[*]} ${lane1[*]} ${lane2[*]} ${alone[*]} " in *" $path "*) continue ;; esac
  lane2+=("$path")
done
lanes="$(mktemp -d "${TMPDIR:-/tmp}/tjpipe-lanes.XXXXXX")"
# background NAME COMMAND...: runs COMMAND (set -e) with its output going to the log line by line as it comes,
# each line tagged [NAME]; its exit code goes to $lanes/NAME.rc, and $lanes/NAME.out once its output is out.
declare -A running=()
background() {
  local name="$1"
  shift
  ( set +e; ( set -e; "$@" ); echo $? >"$lanes/$name.rc" ) > >(sed -u "s/^/[$name] /"; : >"$lanes/$name.out") 2>&1 &
  running[$name]=$!
}
# finished NAME...: waits for them, and (at most 10 s) for the last of their output, which a process they left
# behind holding the pipe cannot hold up longer; returns the first non-zero exit code.
finished() {
  local name code first=0
  for name in "$@"; do wait "${running[$name]}" || true; done
  for name in "$@"; do
    for _ in $(seq 100); do [ -e "$lanes/$name.out" ] && break; sleep 0.1; done
    code="$(cat "$lanes/$name.rc" 2>/dev/null || echo 1)"
    [ "$first" -ne 0 ] || first="$code"
  done
  return "$first"
}
run_lane1() { TJPIPE_PHASE_PREFIX="  lane 1: " "$venv/pytest" -q -ra "${lane1[@]}"; }
run_lane2() {
  local sdk=0 rest=0
  TJPIPE_PHASE_PREFIX="  lane 2: " "$venv/pytest" -q -ra "${lane2[@]}" || rest=$?
  TJPIPE_PHASE_PREFIX="  lane 2: SDK flow (.venv-sdk): " "$root/.venv-sdk/bin/pytest" -q -ra \
    tests/e2e/test_sdk.py tests/e2e/test_sdk_status.py || sdk=$?
  [ "$rest" -eq 0 ] || return "$rest"
  return "$sdk"
}

block="side by side: Go builds | checks, .venv-sdk, pure tests"
python3 "$phases" open "$block"
started="$(date +%s.%N)"
TJPIPE_PHASE_PREFIX="  Go builds: " background go go_builds
export TJPIPE_PHASE_PREFIX="  beside them: "
checks
echo "· the Kubeflow SDK's environment (.venv-sdk: tests/e2e/test_sdk.py and test_sdk_status.py)"
# kubeflow 0.5.0 requires kubernetes<36, older than the project's own client: its test has an environment
# of its own, and the rest of the suite (where it skips) runs without it.
TJPIPE_VENV="$root/.venv-sdk" check "environment (.venv-sdk)" -- bash "$root/scripts/bootstrap.sh" test,sdk
echo "· pytest: ${pure[*]}"
status=0
"$venv/pytest" -q -ra "${pure[@]}" || status=$?
unset TJPIPE_PHASE_PREFIX
go_status=0
finished go || go_status=$?
python3 "$phases" record "$block" --since "$started" --note "wall time of the block"
[ "$go_status" -eq 0 ] || exit "$go_status"
[ "$checks_status" -eq 0 ] || exit "$checks_status"

block="side by side: the tests in two lanes"
python3 "$phases" open "$block"
started="$(date +%s.%N)"
echo "· pytest, lane 1: ${lane1[*]}"
echo "· pytest, lane 2: ${lane2[*]}; then the SDK flow (.venv-sdk)"
background "lane 1" run_lane1
background "lane 2" run_lane2
lanes_status=0
finished "lane 1" "lane 2" || lanes_status=$?
python3 "$phases" record "$block" --since "$started" --note "wall time of the block"
[ "$status" -ne 0 ] || status="$lanes_status"
rm -rf "$lanes"
echo "· pytest, alone after the lanes: ${alone[*]}"
alone_status=0
TJPIPE_PHASE_PREFIX="alone: " "$venv/pytest" -q -ra "${alone[@]}" || alone_status=$?
[ "$status" -ne 0 ] || status="$alone_status"
# Not exec'd: the phase table (the exit trap) follows the tests' output, and the script exits with their code.
exit "$status"
