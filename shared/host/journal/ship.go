package journal

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// The shipper's environment: the API's base URL and the run's ship token reach the shipper
// only through its own environment (contract.EnvStarter), never the agent's, never a
// command's text (docs/design.md §6).
const (
	EnvShipURL   = "SANDKEEP_SHIP_URL"
	EnvShipToken = "SANDKEEP_SHIP_TOKEN"
)

// The ship routes' answer headers the shipper reads (sh parses headers, never JSON).
const (
	HeaderShipNext  = "Sandkeep-Next"
	HeaderShipState = "Sandkeep-State"
	HeaderShipToken = "Sandkeep-Token"
)

// ShipMaxBatch bounds one shipped batch of journal bytes (the ship route's body bound).
const ShipMaxBatch = 1 << 20

// ShipSealCode is the exit code the shipper writes in the sentinel of an agent whose
// launcher died without writing one (killed with its group: 128 + SIGKILL).
const ShipSealCode = 137

// ShipOptions paces a shipper; zero fields take the defaults.
type ShipOptions struct {
	// Beat is the longest a quiet shipper goes without a request (its heartbeat; a quarter
	// of the driver lease, agentrun.ShipBeat). Default 15 s. Whole seconds (at least 1).
	Beat time.Duration
	// GiveUp is how long a shipper keeps retrying failing requests before it exits (the
	// token's lifetime: past it no request can succeed). Default 10 min.
	GiveUp time.Duration
	// Tick is the pause between two checks for new bytes while the journal is busy (for
	// Hold after it last grew). Default 20 ms.
	Tick time.Duration
	// Idle is the longest pause between two checks: past Hold the pause doubles from Tick
	// up to it. Default 100 ms.
	Idle time.Duration
	// Hold is how long the pause stays Tick after the journal grew. Default 1 s.
	Hold time.Duration
	// Linger paces a burst: when a batch went just before and new bytes are already there
	// (the agent writes faster than batches go), the next batch begins no sooner than
	// Linger after it began; otherwise new bytes are sent at once. It bounds a chatty
	// agent's requests to about one per Linger. Default 120 ms.
	Linger time.Duration
}

func (o ShipOptions) withDefaults() ShipOptions {
	if o.Beat <= 0 {
		o.Beat = 15 * time.Second
	}
	if o.GiveUp <= 0 {
		o.GiveUp = 10 * time.Minute
	}
	if o.Tick <= 0 {
		o.Tick = 20 * time.Millisecond
	}
	if o.Idle <= 0 {
		o.Idle = 100 * time.Millisecond
	}
	o.Idle = max(o.Idle, o.Tick)
	if o.Hold <= 0 {
		o.Hold = time.Second
	}
	if o.Linger <= 0 {
		o.Linger = 120 * time.Millisecond
	}
	return o
}

// secs formats d as sh's sleep reads it (fractional seconds, as GNU, busybox and BSD
// sleep accept).
func secs(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 3, 64) }

// slower is the sh case arms that lengthen the shipper's pause, doubling from tick up to
// idle (idle itself matches no arm and stays).
func slower(tick, idle time.Duration) string {
	var b strings.Builder
	for d := tick; secs(d) != secs(idle); {
		n := min(2*d, idle)
		fmt.Fprintf(&b, "%s) nap=%s ;; ", secs(d), secs(n))
		d = n
	}
	return b.String()
}

// headerRE is a sed pattern matching header name case-insensitively without GNU's I flag.
func headerRE(name string) string {
	var b strings.Builder
	for _, c := range name {
		lo, up := strings.ToLower(string(c)), strings.ToUpper(string(c))
		if lo == up {
			b.WriteRune(c)
			continue
		}
		b.WriteString("[" + up + lo + "]")
	}
	return b.String()
}

// ShipCommand returns the POSIX sh script of the run's shipper (docs/design.md §6): it
// probes the API (`command -v curl`, GET /v1/ship within 2 s; exit 90/91 when it cannot,
// before writing anything), writes its own pid (it is a process group leader) to the
// .ship.pid file, then ships the journal: a check for new bytes every Tick while the
// journal is busy, the pause doubling up to Idle once it was quiet for Hold (a check is a
// read on a descriptor held at the shipped position: it forks nothing but its sleep); new
// bytes sent at once, or, when a batch went just before, no sooner than Linger after it
// began (by /proc/uptime, read without a process), from the server's position in
// batches of at most ShipMaxBatch; an empty heartbeat when quiet for Beat.
// The answers' headers drive it: Sandkeep-Next is where it sends from (so a journal the
// agent truncates or rewrites is never sent again from an old position, and a shrunken
// one waits for growth past it), Sandkeep-Token renews the token, Sandkeep-State cancel
// kills the agent's group, exited ends the run with the stderr tail and removes the run's
// files. 409 ship-gap rewinds; superseded, terminal, 401, 403 and other client errors end
// the shipper; network errors, 429 and 5xx are retried with capped backoff for GiveUp. An
// agent whose launcher died without a sentinel (its group killed) gets one with
// ShipSealCode, so its run still ends. URL and token come from EnvShipURL and
// EnvShipToken and go to curl through its config on stdin, never its command line. Every
// path is single-quoted; invalid input yields a script that exits ExitInvalid.
func ShipCommand(dir, tenant, runID string, o ShipOptions) string {
	p, err := PathsFor(dir, tenant, runID)
	if err != nil {
		return fmt.Sprintf("echo 'sandkeep: invalid journal run id or dir' >&2\nexit %d\n", ExitInvalid)
	}
	o = o.withDefaults()
	beat := max(int64(o.Beat/time.Second), 1)
	giveUp := max(int64(o.GiveUp/time.Second), 1)
	hold := max(int64(o.Hold/o.Tick), 1)
	route := "/v1/runs/" + url.PathEscape(runID) + "/ship"
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("u=$%s tok=$%s\n", EnvShipURL, EnvShipToken)
	w("unset %s %s\n", EnvShipURL, EnvShipToken)
	w("J=%s E=%s P=%s S=%s\n", Quote(p.Journal), Quote(p.Stderr), Quote(p.PID), Quote(p.ShipPID))
	w("H=%s B=%s O=%s\n", Quote(p.ShipHeaders), Quote(p.ShipBody), Quote(p.ShipOut))
	w("R=%s N=%s\n", Quote(route), Quote(ExitNonce(runID)))
	w("beat=%d giveup=%d max=%d tick=%s linger=%s lingercs=%d hold=%d\n", beat, giveUp, ShipMaxBatch, secs(o.Tick), secs(o.Linger), max(int64(o.Linger/(10*time.Millisecond)), 1), hold)
	b.WriteString(shipBody)
	return strings.NewReplacer(
		"@HNEXT@", headerRE(HeaderShipNext),
		"@HSTATE@", headerRE(HeaderShipState),
		"@HTOKEN@", headerRE(HeaderShipToken),
		"@SEAL@", strconv.Itoa(ShipSealCode),
		"@SLOWER@", slower(o.Tick, o.Idle),
	).Replace(b.String())
}

// shipBody is the shipper's loop (ShipCommand writes its variables first). It forks as
// few processes as it can, since each costs the sandbox's CPU and, on a busy machine,
// waits for a core (docs/design.md §6): a check that finds nothing forks only its sleep;
// a batch three, the cut (tail and head, side by side) and curl; the answer is read by
// the shell itself.
const shipBody = `command -v curl >/dev/null 2>&1 || exit 90
# curl reads URL and token from its config on stdin: never on a command line.
esc() { printf '%s' "$1" | sed 's/[\\"]/\\&/g'; }
u=$(esc "${u%/}")
c=$(printf 'url = "%s/v1/ship"\n' "$u" | curl -s -o /dev/null -m 2 -w '%{http_code}' -K -) || exit 91
case $c in 2??) ;; *) exit 91 ;; esac
echo $$ >"$S" || exit 92
# Nothing more before the pid file: the agent route waits for it only a few seconds.
etok=$(esc "$tok")
# Scratch files are this process's own: a replacement can run beside its fenced-out
# predecessor for a moment, and shared files would mix their answers and batches.
H="$H.$$" B="$B.$$" O="$O.$$"
trap 'rm -f -- "$H" "$B" "$O"' EXIT
now() { date +%s; }
# clock: cs is the time in centiseconds from /proc/uptime, read by the shell (no process);
# empty where there is none.
clock() {
	cs=
	{ read -r cs _ </proc/uptime; } 2>/dev/null
	case $cs in
	*[0-9].[0-9][0-9]) cs=${cs%.*}${cs#*.} ;;
	*) cs= ;;
	esac
	while :; do case $cs in 0?*) cs=${cs#0} ;; *) break ;; esac; done
}
cr=$(printf '\r')
# post PATH BODYFILE TYPE: one request. code is its HTTP status (000: no answer), sentn
# the bytes it sent; v_next, v_tok, v_state and v_retry are the answer's headers, a token
# only of a token's characters (so it needs no escaping in curl's config). The config is
# a here-document; the headers and curl's own figures come on its stdout and are read by
# the shell itself: curl is the only process.
post() {
	curl -s -m 30 -K - -X POST -H "Content-Type: $3" -H 'Expect:' --data-binary @"$2" \
		-D - -o "$B" -w 'sandkeep %{http_code} %{size_upload}\n' >"$H" 2>/dev/null <<EOF
url = "$u$1"
header = "Authorization: Bearer $etok"
EOF
	code=000 sentn= v_next= v_tok= v_state= v_retry=
	while IFS= read -r h; do
		h=${h%"$cr"}
		case $h in
		"sandkeep "*) h=${h#sandkeep }; code=${h%% *} sentn=${h#* } ;;
		*:*) hv ;;
		esac
	done <"$H" 2>/dev/null
	case $code in [0-9][0-9][0-9]) ;; *) code=000 ;; esac
	sentn=${sentn%%.*}
}
# hv: one header line h; its value, spaces trimmed, kept when it is well formed.
hv() {
	v=${h#*:}
	while :; do case $v in [" 	"]*) v=${v#?} ;; *) break ;; esac; done
	while :; do case $v in *[" 	"]) v=${v%?} ;; *) break ;; esac; done
	case $h in
	@HNEXT@:*) case $v in ''|*[!0-9]*) ;; *) v_next=$v ;; esac ;;
	@HTOKEN@:*) case $v in ''|*[!A-Za-z0-9._-]*) ;; *) v_tok=$v ;; esac ;;
	@HSTATE@:*) case $v in [a-z]*) case $v in *[!a-z-]*) ;; *) v_state=$v ;; esac ;; esac ;;
	[Rr][Ee][Tt][Rr][Yy]-[Aa][Ff][Tt][Ee][Rr]:*) case $v in ''|*[!0-9]*) ;; *) v_retry=$v ;; esac ;;
	esac
}
pause=0.1 failing=
# answer: act on the last answer. 0: taken (state, next and token updated); 1: retry it.
answer() {
	case $code in
	200)
		failing= pause=0.1 fresh=1
		[ -z "$v_next" ] || next=$v_next
		[ -z "$v_tok" ] || tok=$v_tok etok=$v_tok
		state=$v_state
		return 0 ;;
	409)
		if grep -q '"code"[[:space:]]*:[[:space:]]*"ship-gap"' "$B" 2>/dev/null; then
			v=$v_next
			[ -n "$v" ] || v=$(sed -n 's/.*"next"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$B" | head -n 1)
			next=${v:-0} sent=${v:-0} state=running fresh=1
			return 0
		fi
		exit 0 ;;
	000|429|5??)
		t=$(now)
		[ -n "$failing" ] || failing=$t
		[ $((t - failing)) -lt "$giveup" ] || exit 3
		if [ "$code" = 429 ] && [ -n "$v_retry" ]; then sleep "$v_retry"; else sleep "$pause"; fi
		case $pause in 0.1) pause=0.2 ;; 0.2) pause=0.5 ;; 0.5) pause=1 ;; 1) pause=2 ;; *) pause=5 ;; esac
		return 1 ;;
	esac
	# superseded, terminal, a refused token, any other client error: nothing more to do.
	exit 0
}
# finish: the server stored every line through the sentinel; end the run with its code and
# the stderr tail, then remove the run's files.
finish() {
	x=$(tail -c 65536 "$J" 2>/dev/null | grep -F "\"__nonce\":\"$N\"" | head -n 1 |
		sed -n 's/.*"__exit"[[:space:]]*:[[:space:]]*\(-\{0,1\}[0-9][0-9]*\).*/\1/p')
	tail -c 4096 "$E" >"$O" 2>/dev/null || : >"$O"
	while :; do
		post "$R/end?code=${x:-@SEAL@}" "$O" 'text/plain; charset=utf-8'
		if [ "$code" = 200 ]; then
			rm -f -- "$J" "$E" "$P" "$H" "$B" "$O" "$S"
			exit 0
		fi
		answer || continue
		exit 0
	done
}
# react: the state an answer named.
react() {
	case $state in
	cancel) [ -z "$pg" ] || kill -9 -"$pg" 2>/dev/null ;;
	exited) finish ;;
	esac
}
# seal: the agent's launcher is gone and its journal has no sentinel (the group was
# killed): write one, as the launcher would have, so the run can end.
seal() {
	if ! tail -c 4096 "$J" 2>/dev/null | grep -qF "\"__nonce\":\"$N\""; then
		if [ -s "$J" ] && [ "$(tail -c 1 "$J" | wc -l)" -eq 0 ]; then printf '\n' >>"$J"; fi
		printf '{"__exit":%d,"__nonce":"%s"}\n' @SEAL@ "$N" >>"$J"
	fi
	sealed=1
}
# The check for new bytes: descriptor 3 is the journal, its offset placed at hi, the
# position past which bytes are new (a batch's tail leaves it there; dd's skip places it
# otherwise). A read there that finds anything means new bytes; one that finds nothing
# costs no process. seek asks for the placing again (hi moved elsewhere, or the journal
# was not there yet); every eleventh check is a size check instead, which also catches a
# journal replaced under its name.
next=0 sent=0 state=running pg= sealed= ticks=0 seek=1 burst= quiet=0 last=$(now) fresh= bat=
# The first request learns where the log stands (a replacement shipper resumes there).
while :; do post "$R?src=0" /dev/null application/octet-stream; answer && break; done
react
nap=$tick
while :; do
	[ -n "$pg" ] || pg=$(cat "$P" 2>/dev/null)
	hi=$next; [ "$sent" -le "$hi" ] || hi=$sent
	if [ -n "$seek" ] && { command exec 3<"$J"; } 2>/dev/null; then
		seek=
		[ "$hi" -eq 0 ] || dd bs=1 skip="$hi" count=0 <&3 >/dev/null 2>&1 || seek=1
	fi
	new=
	if [ -z "$seek" ] && [ "$ticks" -lt 10 ]; then
		line=
		if IFS= read -r line <&3 || [ -n "$line" ]; then new=1; fi
	else
		sz=$(wc -c <"$J" 2>/dev/null) || sz=
		[ $((${sz:-0} + 0)) -le "$hi" ] || new=1
	fi
	if [ -n "$new" ]; then
		# New bytes go at once, unless a batch went just before (no quiet check between):
		# the agent writes faster than batches go, and this batch begins Linger after that
		# one began, filling meanwhile. A batch that took that long already (a busy
		# machine) is followed at once: waiting would only add to every line's delay.
		if [ -n "$burst" ]; then
			clock
			if [ -n "$cs" ] && [ -n "$bat" ]; then
				lw=$((lingercs - cs + bat))
				[ "$lw" -le 0 ] || sleep "$((lw / 100)).$((lw % 100 / 10))$((lw % 10))"
			else
				sleep "$linger"
			fi
		fi
		clock
		bat=$cs
		# The batch is cut from the server's position by tail reading the journal on
		# descriptor 3, opened anew (a journal replaced under its name is followed): tail
		# leaves it at the end it read, which is where the batch ends unless head cut it.
		# No size is taken first; curl counts what it sent.
		from=$next seek=1
		if { command exec 3<"$J"; } 2>/dev/null; then
			seek=
			tail -c +$((from + 1)) <&3 2>/dev/null | head -c "$max" >"$O"
		else
			: >"$O"
		fi
		post "$R?src=$from" "$O" application/octet-stream
		# A lost answer: resend from the stored position (the descriptor is placed again).
		answer || { seek=1; continue; }
		n=$sentn
		case $n in ''|*[!0-9]*) n=$(wc -c <"$O"); n=$((n + 0)) seek=1 ;; esac
		sent=$((from + n)) burst=1 quiet=0 nap=$tick
		[ "$n" -lt "$max" ] || seek=1
		# Bytes the server left whole lines in (it stopped at a bound): send them at once.
		# A partial last line alone waits for the bytes that finish it. next is one byte
		# before the stored position (the server's ShipFrom), so the unstored bytes start
		# at next+1, and only an answer that moved past from stored anything: counting the
		# byte at next (the newline the last stored line ends with) resent it forever, and
		# a killed agent's journal was never sealed.
		if [ "$next" -lt "$from" ]; then
			sent=$next seek=1
		elif [ "$next" -gt "$from" ] && [ $((next + 1)) -lt "$sent" ] && [ "$(tail -c +$((next - from + 2)) "$O" | tr -cd '\n' | wc -c)" -gt 0 ]; then
			sent=$next seek=1
		fi
		[ "$next" -le "$sent" ] || seek=1
		react
		continue
	fi
	burst=
	if [ -z "$sealed" ] && [ -n "$pg" ] && ! kill -0 "$pg" 2>/dev/null; then
		seal
		seek=1
		continue
	fi
	ticks=$((ticks + 1))
	if [ "$ticks" -gt 10 ]; then
		# Every eleventh check: the clock, for the beat. A batch's answer is stamped here,
		# not at the answer, which would cost a process per batch (a beat is at most eleven
		# checks late); a heartbeat's is stamped at once, else quiet beats would come only
		# every other round of checks.
		ticks=0 t=$(now)
		if [ -n "$fresh" ]; then
			last=$t fresh=
		elif [ $((t - last)) -ge "$beat" ]; then
			post "$R?src=$next" /dev/null application/octet-stream
			if answer; then
				last=$(now) fresh=
				react
			fi
			seek=1
			continue
		fi
	fi
	quiet=$((quiet + 1))
	if [ "$quiet" -ge "$hold" ]; then
		case $nap in @SLOWER@esac
	fi
	sleep "$nap"
done
`

// StartShipper starts the run's shipper (ShipCommand) in the sandbox with base URL apiURL
// and the run's ship token in its environment alone, and waits until it either passed its
// probe (the pid file names it: started=true) or gave up (no curl, the API unreachable:
// started=false, the run is left to a host). The provider must be a contract.EnvStarter,
// since URL and token must never enter a command's text; one that is not ships nothing.
func StartShipper(ctx context.Context, ex contract.Executor, psid, dir, runID, apiURL, token string, o ShipOptions) (started bool, err error) {
	es, ok := ex.(contract.EnvStarter)
	if !ok {
		return false, nil
	}
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return false, err
	}
	tenant, _ := contract.Tenant(ctx)
	pgid, err := es.StartEnv(ctx, psid, ShipCommand(p.Dir, tenant, runID, o),
		map[string]string{EnvShipURL: strings.TrimRight(apiURL, "/"), EnvShipToken: token})
	if err != nil {
		return false, fmt.Errorf("journal: start the shipper of %s: %w", runID, err)
	}
	// The probe takes at most 2 s (curl -m 2); the pid file follows it at once. Only the
	// pid file naming this shipper counts: a replacement finds its dead (or cut-off)
	// predecessor's there, which says nothing of whether this one passed its probe.
	check := fmt.Sprintf("if [ \"$(cat -- %s 2>/dev/null)\" = %d ]; then echo ok; elif kill -0 %d 2>/dev/null; then echo wait; else echo no; fi", Quote(p.ShipPID), pgid, pgid)
	deadline := time.Now().Add(shipStartWait)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		res, err := ex.Exec(ctx, psid, check)
		if err != nil {
			return false, fmt.Errorf("journal: start the shipper of %s: %w", runID, err)
		}
		switch strings.TrimSpace(string(res.Stdout)) {
		case "ok":
			return true, nil
		case "no":
			return false, nil
		}
		if time.Now().After(deadline) {
			// Neither probed nor gone: it must not ship beside a host.
			_ = ex.Kill(ctx, psid, pgid)
			return false, nil
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			_ = ex.Kill(context.WithoutCancel(ctx), psid, pgid)
			return false, ctx.Err()
		case <-t.C:
		}
	}
}

// shipStartWait bounds StartShipper's wait for the probe (curl's 2 s and a margin).
const shipStartWait = 4 * time.Second

// ErrNotShipped: the run has no live shipper in the sandbox.
var ErrNotShipped = errors.New("journal: the run's agent is not shipped")

// ShipperAlive reports whether the run has a live shipper (its pid file names a live
// process), in one shell call.
func ShipperAlive(ctx context.Context, ex contract.Executor, psid, dir, runID string) (bool, error) {
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return false, err
	}
	res, err := ex.Exec(ctx, psid, "s=$(cat -- "+Quote(p.ShipPID)+" 2>/dev/null) && [ -n \"$s\" ] && kill -0 \"$s\" 2>/dev/null")
	if err != nil {
		return false, fmt.Errorf("journal: is %s shipped: %w", runID, err)
	}
	return res.ExitCode == 0, nil
}

// KillShipped kills the agent's process group of a run whose shipper is alive, in one
// shell call: the shipper then seals and ships the journal and ends the run (a cancel
// needs no host, docs/design.md §13). A run without a live shipper is ErrNotShipped and
// nothing is killed: its host ends it.
func KillShipped(ctx context.Context, ex contract.Executor, psid, dir, runID string) error {
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return err
	}
	script := "s=$(cat -- " + Quote(p.ShipPID) + " 2>/dev/null) && [ -n \"$s\" ] && kill -0 \"$s\" 2>/dev/null || exit 3\n" +
		"g=$(cat -- " + Quote(p.PID) + " 2>/dev/null) && [ \"$g\" -gt 1 ] 2>/dev/null || exit 0\n" +
		"kill -9 -\"$g\" 2>/dev/null\nexit 0\n"
	res, err := ex.Exec(ctx, psid, script)
	if err != nil {
		return fmt.Errorf("journal: kill the shipped agent of %s: %w", runID, err)
	}
	if res.ExitCode == 3 {
		return fmt.Errorf("journal: %s: %w", runID, ErrNotShipped)
	}
	return nil
}
