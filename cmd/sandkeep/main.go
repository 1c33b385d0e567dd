// Command sandkeep is the local dev server (the main job: `sandkeep dev`) and the operator
// CLI (`table create`, `runs get`). Configuration is parsed once here, per subcommand, with
// the flag package; nothing lives in globals.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/sandkeep/sandkeep/cmd/sandkeep/internal/termsafe"
)

const usage = `usage:
  sandkeep dev [--addr 127.0.0.1:8080] [--reap-every 30s] [--detached-ttl 15m] [--idle-stop 10m]
               [--dynamodb-endpoint URL] [--table NAME] [provider flags]
  sandkeep run --thread T [--run ID] [--sandbox ID] [--provider NAME] [--retry-for 2m] -- CMD [ARG...]
  sandkeep attach RUN [--after N] [--retry-for 2m]
  sandkeep tail RUN [--after N] [--follow] [--retry-for 2m]
  sandkeep cancel RUN | --thread T
  sandkeep runs get RUN_ID
      (run, attach, tail, cancel and runs get take [--api URL] [--tenant T] [--auth none|iam|jwt]
       [--push-url wss://…]; --api defaults to $SANDKEEP_API, else http://127.0.0.1:8080;
       --push-url to $SANDKEEP_PUSH_URL; the jwt token is $SANDKEEP_TOKEN)
  sandkeep runs get RUN_ID --tenant T --table NAME [--dynamodb-endpoint URL]   (the table itself)
  sandkeep table create --table NAME [--dynamodb-endpoint URL]
  sandkeep bench --dynamodb-endpoint URL [--ops 200] [--warmup 20] [--contention 64] [--reap 1000]
                 [--reap-batch 25] [--append-bytes 1024] [--deliveries 40]
`

// usageError: the command line is wrong (exit status 2, usage printed).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErr(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// streams are the process's standard streams and environment, passed down so tests can
// capture and supply them.
type streams struct {
	out, err io.Writer
	env      func(string) string // nil: an empty environment
}

func main() {
	sig, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() {
		// The first signal starts a graceful shutdown; restoring the default action makes
		// a second one end the process at once. The command's ctx ends only after the
		// restore, so no second signal can land in between and be swallowed.
		<-sig.Done()
		stop()
		cancel(context.Cause(sig))
	}()
	code := run(ctx, os.Args[1:], streams{out: os.Stdout, err: os.Stderr, env: os.Getenv})
	stop()
	cancel(nil)
	os.Exit(code)
}

// run executes one command line and returns the process exit status: 0 success, 1 failure,
// 2 a usage error; run, attach and tail choose theirs (exitStatus). Everything it prints
// goes through termsafe: an agent's or a server's text never acts as a terminal control.
func run(ctx context.Context, args []string, std streams) int {
	std.out, std.err = termsafe.NewWriter(std.out), termsafe.NewWriter(std.err)
	logger := slog.New(slog.NewJSONHandler(std.err, nil))
	if len(args) >= 1 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help") {
		fmt.Fprint(std.out, usage+reapUsage)
		return 0
	}
	err := dispatch(ctx, args, std, logger)
	var status *exitStatus
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(std.err, usage+reapUsage)
		return 0
	case errors.As(err, &status):
		return status.code
	case errors.As(err, new(*usageError)):
		fmt.Fprintf(std.err, "sandkeep: %v\n%s", err, usage+reapUsage)
		return 2
	}
	fmt.Fprintf(std.err, "sandkeep: %v\n", err)
	return 1
}

func dispatch(ctx context.Context, args []string, std streams, logger *slog.Logger) error {
	cmd := strings.Join(args[:min(2, len(args))], " ")
	if handled, err := dispatchReaper(ctx, args, std, logger); handled {
		return err
	}
	switch {
	case len(args) >= 1 && args[0] == "dev":
		cfg, err := parseDev(args[1:], std.env, std.err)
		if err != nil {
			return err
		}
		return runDev(ctx, cfg, std.out, logger)
	case cmd == "table create":
		cfg, err := parseTable(args[2:], std.err)
		if err != nil {
			return err
		}
		return runTableCreate(ctx, cfg, std.out)
	case cmd == "runs get":
		cfg, err := parseRunsGet(args[2:], std.env, std.err)
		if err != nil {
			return err
		}
		return runRunsGet(ctx, cfg, std.out)
	case len(args) >= 1 && args[0] == "run":
		cfg, err := parseRun(args[1:], std.env, std.err)
		if err != nil {
			return err
		}
		return runRun(ctx, cfg, std)
	case len(args) >= 1 && args[0] == "attach":
		cfg, err := parseAttach("attach", args[1:], std.env, std.err)
		if err != nil {
			return err
		}
		return runAttach(ctx, cfg, std)
	case len(args) >= 1 && args[0] == "tail":
		cfg, err := parseAttach("tail", args[1:], std.env, std.err)
		if err != nil {
			return err
		}
		return runTail(ctx, cfg, std)
	case len(args) >= 1 && args[0] == "cancel":
		cfg, err := parseCancel(args[1:], std.env, std.err)
		if err != nil {
			return err
		}
		return runCancel(ctx, cfg, std)
	case len(args) >= 1 && args[0] == "bench":
		return runBench(ctx, args[1:], std.out, std.err)
	case len(args) == 0:
		return usageErr("no command")
	}
	return usageErr("unknown command %q", cmd)
}

// newFlags returns a flag set that reports errors (not exits) and prints to w.
func newFlags(name string, w io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(w)
	return fs
}

// parseInterspersed parses flags that may come before or after positional arguments
// (`runs get ID --tenant T`) and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageErr("%v", err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}
