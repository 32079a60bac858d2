#!/usr/bin/env bash
# Install what is missing, then run every check and test: `bash scripts/test.sh [pytest args]`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" test
cd "$root"
venv="$root/.venv/bin"
echo "· building or finding kube-apiserver and etcd (first build: a few minutes)"
"$venv/python" -c 'from tjpipe.local.toolchain import ensure_kube_binaries as e; e(progress=print)'
echo "· building or finding JobSet's manager (its webhooks run in tests/jobset; first build: a few minutes)"
"$venv/python" -c 'from tjpipe.local.toolchain import ensure_jobset_manager as e; e(progress=print)'
echo "· building or finding kube-controller-manager, kube-scheduler and kwok (the simulated cluster; first build: a few minutes)"
"$venv/python" -c 'from tjpipe.local.toolchain import ensure_cluster_binaries as e; e(progress=print)'
echo "· building or finding Trainer v2.3.0's controller manager (tests/takeover, tests/lifecycle, the benchmark; first build: a few minutes)"
"$venv/python" -c 'from tjpipe.local.toolchain import ensure_trainer_controller as e; e(progress=print)'
echo "· building or finding helm (tests/deploy render the Kubeflow chart; first build: a few minutes)"
"$venv/python" -c 'from tjpipe.local.helm import ensure_helm as e; e(progress=print)'
echo "· ruff";          "$venv/ruff" check .
echo "· ruff format";   "$venv/ruff" format --check .
echo "· mypy --strict"; "$venv/mypy"
echo "· import layers"; "$venv/lint-imports"
if [ $# -eq 0 ]; then
  # kubeflow 0.5.0 requires kubernetes<36, older than the project's own client: its test has an environment
  # of its own, and the rest of the suite (where it skips) runs without it.
  echo "· the Kubeflow SDK's flow (tests/e2e/test_sdk.py), in .venv-sdk"
  TJPIPE_VENV="$root/.venv-sdk" bash "$root/scripts/bootstrap.sh" test,sdk
  "$root/.venv-sdk/bin/pytest" -q -ra tests/e2e/test_sdk.py
fi
echo "· pytest"
exec "$venv/pytest" -q -ra "$@"
