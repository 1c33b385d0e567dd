#!/usr/bin/env bash
# The TypeScript step of `make test` (scripts/test.sh runs it): installs clients/typescript
# from its lock file (npm ci), builds the sandkeep binary once, type-checks and builds the
# packages, and runs their vitest suite, whose global setup starts `sandkeep dev` in memory and
# on dynalite (SANDKEEP_DYNAMODB_ENDPOINT) from that binary. The servers are stopped by the
# suite, and by this script's EXIT trap should the suite itself die. Node >= 20 is taken
# from the machine; without it the step is skipped, which fails under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	if [[ "${CI:-}" == "true" ]]; then
		echo "typescript: node and npm are required (CI=true)" >&2
		exit 1
	fi
	echo "typescript: node/npm not found; skipping the TypeScript tests" >&2
	exit 0
fi
if (($(node -p 'process.versions.node.split(".")[0]') < 20)); then
	echo "typescript: Node >= 20 is required, found $(node --version)" >&2
	exit 1
fi

work=$(mktemp -d)
pids="$work/pids"
mkdir -p "$pids"
ts_cleanup() {
	# The suite stops its servers itself; these are only what a killed suite left behind.
	local f
	for f in "$pids"/*; do
		[[ -e "$f" ]] && kill -KILL "$(cat "$f")" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap ts_cleanup EXIT
trap 'exit 130' INT TERM

start=$SECONDS
"$GO" build -o "$work/sandkeep" ./cmd/sandkeep
(cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
(cd clients/typescript && SANDKEEP_BIN="$work/sandkeep" SANDKEEP_TS_PIDS="$pids" npm test)
echo "typescript: done in $((SECONDS - start)) s"
