#!/usr/bin/env bash
# Build every image compose/docker-compose.yml names, here, pulling nothing from a registry:
#   bash scripts/compose-images.sh          (then: docker compose -f compose/docker-compose.yml up -d)
# Needs a running Docker engine and debootstrap; Go builds the control plane's binaries on first use (cached
# in ~/.cache/trainjob-pipeline, shared with `tjpipe up`). A second run builds only what changed.
# What each image is made from: tools/compose_images.py, and docs/getting-started.md, "The compose stack".
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/bootstrap.sh
if ! docker info >/dev/null 2>&1; then
  echo "compose-images: no Docker engine answers (start dockerd, or see docs/getting-started.md, "The compose stack")" >&2
  exit 2
fi
exec .venv/bin/python tools/compose_images.py "$@"
