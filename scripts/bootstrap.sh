#!/usr/bin/env bash
# Create .venv (if needed) and install the project with the given extras, every package at the version and with
# the hashes of its lock (tools/locks.py: which lock serves which extras, and why nothing is installed from ranges).
# Whatever the lock does not name is removed, so the environment is the lock. Run by the other scripts.
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
lock="$("$python" "$root/tools/locks.py" for-extras "$extras")"
stamp="$venv/.installed-$extras"
if [ ! -f "$stamp" ] || [ "$root/$lock" -nt "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  echo "· installing trainjob-pipeline[$extras] into $venv from $lock"
  rm -f "$venv"/.installed-*  # one lock at a time: the next script's extras install theirs again
  pip=("$venv/bin/python" -m pip --disable-pip-version-check)
  "${pip[@]}" install -q --require-hashes --no-deps -r "$root/$lock"
  "$python" "$root/tools/locks.py" sync "$lock" "$venv/bin/python"
  "${pip[@]}" install -q --no-deps -e "$root"
  touch "$stamp"
fi
