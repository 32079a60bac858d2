#!/usr/bin/env bash
# Retake the history server's screenshots the documentation shows (docs/history-*.png), by its browser tests
# (tests/history/test_browser.py, test_timeline_browser.py, test_find.py, test_compare.py and
# test_retention_browser.py; Chromium and ChromeDriver from Debian): `bash tools/screenshots.sh`.
# Every picture the tests take lands in a temporary folder (TJPIPE_SCREENSHOTS); those a page of docs/ links
# to are copied over the old ones. Never edit the pictures by hand: a changed UI is retaken by this command.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mktemp -d "${TMPDIR:-/tmp}/tjpipe-screenshots.XXXXXX")"
trap 'rm -rf "$out"' EXIT
TJPIPE_SCREENSHOTS="$out" "$root/.venv/bin/pytest" -q "$root/tests/history/test_browser.py" \
  "$root/tests/history/test_timeline_browser.py" "$root/tests/history/test_find.py" \
  "$root/tests/history/test_compare.py" \
  "$root/tests/history/test_retention_browser.py" "$@"
copied=0
for png in "$out"/*.png; do
  name="$(basename "$png")"
  if grep -q "($name)" "$root"/docs/*.md; then
    cp "$png" "$root/docs/$name"
    echo "docs/$name"
    copied=$((copied + 1))
  fi
done
[ "$copied" -gt 0 ] || { echo "no picture the docs link to was taken" >&2; exit 1; }
