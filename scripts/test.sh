#!/usr/bin/env bash
# Test entry point behind `make test`: installs and starts a local DynamoDB (dynalite) on a
# free loopback port (scripts/dynalite.sh), installs chromium for the browser test when
# absent (scripts/chromium.sh), exports SANDKEEP_DYNAMODB_ENDPOINT, runs
# `go vet -race ./...`, the lint (scripts/lint.sh: gofmt, staticcheck), `go test -race ./...`
# (extra arguments are passed to go test) with the TypeScript packages' tests
# (scripts/typescript.sh) beside it, and stops dynalite on every exit path.
set -euo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"

# shellcheck source=scripts/dynalite.sh
source scripts/dynalite.sh
# shellcheck source=scripts/chromium.sh
source scripts/chromium.sh

# Published third-party documents (SAM's JSON schema and its transform, the providers'
# OpenAPI documents) are never committed here: the project's shared notes keep copies under
# ../shared/vendor (see its README). The template and provider contract tests validate
# against them; each is found through one variable (shared/testkit/published), and a test whose
# document is missing fails under CI=true. The TypeScript tests load TanStack AI's own
# conformance suites from its vendored source (SANDKEEP_TANSTACK_AI).
vendor=../shared/vendor
for pair in SANDKEEP_SAM_SCHEMA:sam/sam.schema.json \
	SANDKEEP_SAM_TRANSLATOR:sam/translator \
	SANDKEEP_DAYTONA_OPENAPI:daytona/openapi.yaml \
	SANDKEEP_DAYTONA_TOOLBOX_OPENAPI:daytona/toolbox-openapi.yaml \
	SANDKEEP_E2B_OPENAPI:e2b/openapi.yml \
	SANDKEEP_E2B_PROCESS_PROTO:e2b/process.proto \
	SANDKEEP_TANSTACK_AI:tanstack-ai; do
	name=${pair%%:*} file=${pair#*:}
	if [[ -z "${!name:-}" && -e "$vendor/$file" ]]; then
		export "$name=$(cd "$vendor" && pwd)/$file"
	fi
done

# vet type-checks against its dependencies' compiled export data: with -race that is the
# very compilation `go test -race` below takes from the build cache, where plain `go vet`
# would compile everything once more. The files the race tag leaves out (clitest's
# norace.go) are vetted on their own; the TypeScript step's build reuses that compilation.
"$GO" vet -race ./...
"$GO" vet ./shared/testkit/clitest
GO="$GO" bash scripts/lint.sh
# Extra arguments are go test flags, or package patterns that replace ./... .
pkgs=(./...)
for a in "$@"; do
	case "$a" in
	./* | github.com/*) pkgs=() ;;
	esac
done
# clients/typescript: npm ci from the lock file, vitest against sandkeep dev (memory, dynalite);
# left out when the arguments name Go packages. It runs beside go test, whose packages spend
# much of their time waiting on processes and dynalite (its servers use a table of their own),
# its output held back and printed after go test's.
ts_pid=""
if ((${#pkgs[@]})); then
	ts_log="$(mktemp -t typescript.XXXXXX)"
	GO="$GO" bash scripts/typescript.sh >"$ts_log" 2>&1 &
	ts_pid=$!
	# On an early exit, stop the TypeScript step too (its EXIT trap stops its servers).
	trap '[[ -n "$ts_pid" ]] && kill "$ts_pid" 2>/dev/null; rm -f "$ts_log"; dynalite_cleanup' EXIT
fi
go_rc=0
"$GO" test -race -timeout 20m "$@" "${pkgs[@]}" || go_rc=$?
ts_rc=0
if [[ -n "$ts_pid" ]]; then
	wait "$ts_pid" || ts_rc=$?
	ts_pid=""
	cat "$ts_log"
	((ts_rc == 0)) || echo "test: the TypeScript step failed (exit $ts_rc)" >&2
fi
((go_rc == 0 && ts_rc == 0))
