#!/usr/bin/env bash
# Benchmark entry point behind `make bench`: starts dynalite like `make test`
# (scripts/dynalite.sh), then runs `sandkeep bench` against it; extra arguments go to
# `sandkeep bench` (e.g. --ops 500 --reap 0). The Markdown report goes to stdout, progress
# to stderr; dynalite is stopped on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"

# shellcheck source=scripts/dynalite.sh
source scripts/dynalite.sh >&2

bin="$(mktemp -d -t sandkeep-bench.XXXXXX)"
trap 'rm -rf "$bin"; dynalite_cleanup' EXIT
"$GO" build -o "$bin/sandkeep" ./cmd/sandkeep
"$bin/sandkeep" bench --dynamodb-endpoint "$SANDKEEP_DYNAMODB_ENDPOINT" "$@"
