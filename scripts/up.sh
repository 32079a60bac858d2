#!/usr/bin/env bash
# Install what is missing, then run the local stack with the demo TrainJob: `bash scripts/up.sh [tjpipe up flags]`.
# The stack is its own (loopback servers) whatever KUBECONFIG/NATS_URL say; --kubeconfig, --nats-url or --use-env adopt.
# The demo's training stand-in calls the Kubeflow SDK, which needs an older Kubernetes client than the project's:
# it gets an environment of its own, .venv-sdk, where the demo finds it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" local
TJPIPE_VENV="$root/.venv-sdk" bash "$root/scripts/bootstrap.sh" sdk
# A real node runs images built here (pause, the demo's training image); a second run finds them built.
for arg in "$@"; do
  if [ "$arg" = "--real-node" ]; then bash "$root/scripts/node-images.sh"; fi
done
cd "$root"
exec "$root/.venv/bin/tjpipe" up --demo "$@"
