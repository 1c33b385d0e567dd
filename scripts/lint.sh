#!/usr/bin/env bash
# Lint behind `make lint` and `make test`: gofmt (the toolchain's own, so the Go version in
# go.mod decides the format) over every Go file outside tools/, then staticcheck at a pinned
# version, fetched and built through the Go module proxy like any module (nothing to install
# by hand; the build is cached after the first run), and `go mod tidy -diff`, so go.mod and
# go.sum say exactly what the module imports. Exits non-zero on any finding.
set -euo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"
# staticcheck 2026.2.2; it needs Go >= 1.26, the version go.mod names.
STATICCHECK_VERSION="${STATICCHECK_VERSION:-v0.8.2}"

gofmt="$("$GO" env GOROOT)/bin/gofmt"
unformatted=$(find . \( -path ./.git -o -path ./tools \) -prune -o -name '*.go' -print0 | xargs -0 "$gofmt" -l)
if [[ -n $unformatted ]]; then
	echo "lint: gofmt would change these files (run gofmt -w on them):" >&2
	echo "$unformatted" >&2
	exit 1
fi

if ! tidy_diff=$("$GO" mod tidy -diff 2>&1); then
	echo "lint: go mod tidy would change go.mod/go.sum (run go mod tidy):" >&2
	echo "$tidy_diff" >&2
	exit 1
fi

"$GO" run "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION" ./...
