# Sourced (not run) by scripts/test.sh and scripts/bench.sh, from the repository root under
# `set -euo pipefail`: installs dynalite (npm, pinned in tools/dynalite), starts it on a free
# loopback port, exports SANDKEEP_DYNAMODB_ENDPOINT, and stops it on every exit path (it
# installs the EXIT trap; INT/TERM exit 130).

DYNALITE_DIR=tools/dynalite

npm ci --prefix "$DYNALITE_DIR" --no-audit --no-fund --loglevel=error >/dev/null

dynalite_log="$(mktemp -t dynalite.XXXXXX)"
dynalite_pid=""
dynalite_cleanup() {
	if [[ -n "$dynalite_pid" ]] && kill -0 "$dynalite_pid" 2>/dev/null; then
		kill "$dynalite_pid" 2>/dev/null || true
		wait "$dynalite_pid" 2>/dev/null || true
	fi
	rm -f "$dynalite_log"
}
trap dynalite_cleanup EXIT
trap 'exit 130' INT TERM

# dynalite_answers PORT: true when something accepts TCP connections on 127.0.0.1:PORT.
dynalite_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Pick a free port robustly: a random candidate nobody answers on, then start dynalite on
# it; if it dies (e.g. EADDRINUSE after a race) try another candidate.
dynalite_port=""
for _ in $(seq 1 20); do
	candidate=$((20000 + RANDOM % 40000))
	dynalite_answers "$candidate" && continue
	node "$DYNALITE_DIR/serve.js" --host 127.0.0.1 --port "$candidate" \
		--createTableMs 0 --deleteTableMs 0 --updateTableMs 0 >"$dynalite_log" 2>&1 &
	dynalite_pid=$!
	# Bounded wait (10 s) until it accepts connections or exits.
	for _ in $(seq 1 100); do
		if ! kill -0 "$dynalite_pid" 2>/dev/null; then
			break
		fi
		if dynalite_answers "$candidate"; then
			dynalite_port="$candidate"
			break
		fi
		sleep 0.1
	done
	[[ -n "$dynalite_port" ]] && break
	kill "$dynalite_pid" 2>/dev/null || true
	wait "$dynalite_pid" 2>/dev/null || true
	dynalite_pid=""
done
if [[ -z "$dynalite_port" ]]; then
	echo "scripts/dynalite.sh: dynalite did not start; last log:" >&2
	cat "$dynalite_log" >&2 || true
	exit 1
fi

export SANDKEEP_DYNAMODB_ENDPOINT="http://127.0.0.1:$dynalite_port"
echo "dynalite listening at $SANDKEEP_DYNAMODB_ENDPOINT (pid $dynalite_pid)"
