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
echo "· ruff";          python3 "$phases" run "ruff" -- "$venv/ruff" check .
echo "· ruff format";   python3 "$phases" run "ruff format" -- "$venv/ruff" format --check .
echo "· mypy --strict"; python3 "$phases" run "mypy --strict" -- "$venv/mypy"
echo "· import layers"; python3 "$phases" run "import layers" -- "$venv/lint-imports"
echo "· docs site";     python3 "$phases" run "mkdocs build --strict" -- env NO_MKDOCS_2_WARNING=1 "$venv/mkdocs" build --strict --quiet
if [ $# -eq 0 ]; then
  # kubeflow 0.5.0 requires kubernetes<36, older than the project's own client: its test has an environment
  # of its own, and the rest of the suite (where it skips) runs without it.
  echo "· the Kubeflow SDK's flow (tests/e2e/test_sdk.py) and progress reports (tests/e2e/test_sdk_status.py), in .venv-sdk"
  TJPIPE_VENV="$root/.venv-sdk" python3 "$phases" run "environment (.venv-sdk)" -- bash "$root/scripts/bootstrap.sh" test,sdk
  TJPIPE_PHASE_PREFIX="SDK flow (.venv-sdk): " "$root/.venv-sdk/bin/pytest" -q -ra tests/e2e/test_sdk.py tests/e2e/test_sdk_status.py
fi
echo "· pytest"
# Not exec'd: the phase table follows pytest's output, and the script exits with pytest's code.
status=0
"$venv/pytest" -q -ra "$@" || status=$?
exit "$status"
