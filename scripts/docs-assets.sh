#!/usr/bin/env bash
# Mermaid for the documentation site, served with the site itself so that its diagrams render with no network
# (mkdocs-material would load it from a CDN): the version pinned in tools/mermaid/package.json, installed by
# `npm ci` exactly as tools/mermaid/package-lock.json locks it (npm checks every package's integrity hash), and
# its one browser bundle copied to docs/assets/javascripts/mermaid.min.js (not in git), which mkdocs.yml names
# in extra_javascript. scripts/test.sh runs this before it builds the site; it does the work again only when
# the lock file changed. Needs npm (Node.js); .ci/run installs it when missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
lock="$root/tools/mermaid/package-lock.json"
out="$root/docs/assets/javascripts/mermaid.min.js"
stamp="$root/tools/mermaid/.fetched-lock-sha256"
want="$(sha256sum "$lock" | cut -d' ' -f1)"
if [ -f "$out" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "scripts/docs-assets.sh needs npm (Node.js) to fetch Mermaid as tools/mermaid/package-lock.json locks it" >&2
  exit 2
fi
scratch="$(mktemp -d "${TMPDIR:-/tmp}/tjpipe-mermaid.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
cp "$root/tools/mermaid/package.json" "$lock" "$scratch/"
(cd "$scratch" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >/dev/null)
mkdir -p "$(dirname "$out")"
cp "$scratch/node_modules/mermaid/dist/mermaid.min.js" "$out.tmp"
mv "$out.tmp" "$out"
echo "$want" >"$stamp"
echo "docs/assets/javascripts/mermaid.min.js: mermaid $(node -p "require('$scratch/node_modules/mermaid/package.json').version" 2>/dev/null || echo '?')"
