#!/usr/bin/env bash
# Test entry point behind `make test`: installs and starts a local DynamoDB (dynalite) on a
# free loopback port, exports SANDKEEP_DYNAMODB_ENDPOINT, runs `go vet ./...` and
# `go test -race ./...` (extra arguments are passed to go test), and stops dynalite on every
# exit path.
set -euo pipefail
cd "$(dirname "$0")/.."

GO="${GO:-go}"
DYNALITE_DIR=tools/dynalite

npm ci --prefix "$DYNALITE_DIR" --no-audit --no-fund --loglevel=error >/dev/null

log="$(mktemp -t dynalite.XXXXXX)"
pid=""
cleanup() {
	if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -f "$log"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# answers PORT: true when something accepts TCP connections on 127.0.0.1:PORT.
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Pick a free port robustly: a random candidate nobody answers on, then start dynalite on
# it; if it dies (e.g. EADDRINUSE after a race) try another candidate.
port=""
for _ in $(seq 1 20); do
	candidate=$((20000 + RANDOM % 40000))
	answers "$candidate" && continue
	node "$DYNALITE_DIR/node_modules/dynalite/cli.js" --host 127.0.0.1 --port "$candidate" \
		--createTableMs 0 --deleteTableMs 0 --updateTableMs 0 >"$log" 2>&1 &
	pid=$!
	# Bounded wait (10 s) until it accepts connections or exits.
	for _ in $(seq 1 100); do
		if ! kill -0 "$pid" 2>/dev/null; then
			break
		fi
		if answers "$candidate"; then
			port="$candidate"
			break
		fi
		sleep 0.1
	done
	[[ -n "$port" ]] && break
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	pid=""
done
if [[ -z "$port" ]]; then
	echo "scripts/test.sh: dynalite did not start; last log:" >&2
	cat "$log" >&2 || true
	exit 1
fi

export SANDKEEP_DYNAMODB_ENDPOINT="http://127.0.0.1:$port"
echo "dynalite listening at $SANDKEEP_DYNAMODB_ENDPOINT (pid $pid)"

"$GO" vet ./...
# Extra arguments are go test flags, or package patterns that replace ./... .
pkgs=(./...)
for a in "$@"; do
	case "$a" in
	./* | github.com/*) pkgs=() ;;
	esac
done
"$GO" test -race "$@" "${pkgs[@]}"
