#!/usr/bin/env bash
# Install what is missing, then run the local stack with the demo TrainJob: `bash scripts/up.sh [tjpipe up flags]`.
# The stack is its own (loopback servers) whatever KUBECONFIG/NATS_URL say; --kubeconfig, --nats-url or --use-env adopt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/bootstrap.sh" local
cd "$root"
exec "$root/.venv/bin/tjpipe" up --demo "$@"
