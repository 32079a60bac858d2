#!/usr/bin/env bash
# Build the images the real node runs (pause, the demo's training image), here, pulling nothing from a registry:
#   bash scripts/node-images.sh          (then: tjpipe up --real-node)
#   bash scripts/node-images.sh --pipeline   (also the pipeline's own runtime and NATS images, to install deploy/ on the node)
# Needs a running Docker engine and debootstrap. A second run builds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/bootstrap.sh
if ! docker info >/dev/null 2>&1; then
  echo "node-images: no Docker engine answers (start dockerd, or see docs/getting-started.md, \"The compose stack\")" >&2
  exit 2
fi
exec .venv/bin/python tools/node_images.py "$@"
