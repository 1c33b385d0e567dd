#!/usr/bin/env bash
# Test entry point behind `make test`: installs and starts a local DynamoDB (dynalite) on a
# free loopback port (scripts/dynalite.sh), exports SANDKEEP_DYNAMODB_ENDPOINT, runs
# `go vet ./...` and `go test -race ./...` (extra arguments are passed to go test), and stops
# dynalite on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"

# shellcheck source=scripts/dynalite.sh
source scripts/dynalite.sh

"$GO" vet ./...
# Extra arguments are go test flags, or package patterns that replace ./... .
pkgs=(./...)
for a in "$@"; do
	case "$a" in
	./* | github.com/*) pkgs=() ;;
	esac
done
"$GO" test -race "$@" "${pkgs[@]}"
