#!/usr/bin/env bash
# Make the Python locks again from pyproject.toml, then the files that record a locked version (tools/locks.py says
# why every environment is installed from a lock). `bash scripts/lock.sh` keeps each pin that still fits and adds
# what is new; `--upgrade` takes the newest of everything; `--upgrade-package NAME` (repeatable) takes just those.
# pip-tools runs from an environment of its own in the user cache.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tools="${TJPIPE_CACHE_DIR:-$HOME/.cache/trainjob-pipeline}/pip-tools-7.7.0"
if [ ! -x "$tools/bin/pip-compile" ]; then
  echo "· installing pip-tools 7.7.0 into $tools"
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check "pip-tools==7.7.0"
fi
for lock in $(python3 tools/locks.py order); do
  echo "· $lock"
  python3 tools/locks.py make "$lock" "$tools/bin/pip-compile" "$@"
done
echo "· contracts/kube.py from the locked Kubernetes client"
bash scripts/bootstrap.sh test
.venv/bin/python tools/gen_kube_types.py
git status --short -- 'requirements*.lock' contracts/kube.py
