#!/usr/bin/env bash
# Create .venv (if needed) and install the project with the given extras. Sourced by the other scripts.
# TJPIPE_VENV names another environment (the tests keep the Kubeflow SDK in one of its own).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-local}"
venv="${TJPIPE_VENV:-$root/.venv}"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "trainjob-pipeline needs Python 3.11 or newer (found: $("$python" --version 2>&1))" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "· creating $venv"
  "$python" -m venv "$venv"
fi
stamp="$venv/.installed-$extras"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  echo "· installing trainjob-pipeline[$extras] into $venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -e "$root[$extras]"
  touch "$stamp"
fi
