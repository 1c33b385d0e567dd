#!/usr/bin/env bash
# Test entry point behind `make test`: installs and starts a local DynamoDB (dynalite) on a
# free loopback port (scripts/dynalite.sh), installs chromium for the browser test when
# absent (scripts/chromium.sh), exports SANDKEEP_DYNAMODB_ENDPOINT, runs
# `go vet -race ./...`, the lint (scripts/lint.sh: gofmt, staticcheck), `go test -race ./...`
# (extra arguments are passed to go test) and the TypeScript packages' tests
# (scripts/typescript.sh), and stops dynalite on every exit path.
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
"$GO" test -race -timeout 20m "$@" "${pkgs[@]}"
# clients/typescript: npm ci from the lock file, vitest against sandkeep dev (memory, dynalite);
# left out when the arguments name Go packages.
if ((${#pkgs[@]})); then
	GO="$GO" bash scripts/typescript.sh
fi
