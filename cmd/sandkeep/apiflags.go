package main

import (
	"crypto/rand"
	"errors"
	"flag"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
	"github.com/sandkeep/sandkeep/shared/providers"
)

// Environment of the API commands (the token is never a flag: flags show in ps).
const (
	envAPI      = "SANDKEEP_API"
	envPushURL  = "SANDKEEP_PUSH_URL"
	envToken    = "SANDKEEP_TOKEN"
	envProvider = "SANDKEEP_PROVIDER"
	defaultAPI  = "http://127.0.0.1:8080"
)

// Authentication modes of --auth.
const (
	authNone = "none"
	authIAM  = "iam"
	authJWT  = "jwt"
)

// apiFlags select the API and how to authenticate to it (run, attach, tail, cancel, runs get).
type apiFlags struct {
	api    string
	tenant string
	auth   string
	token  string // from $SANDKEEP_TOKEN, --auth jwt only
	// pushURL is a deployment's push endpoint (its template's PushUrl output): the API's
	// base URL cannot name it, since API Gateway serves WebSockets from an API of their own.
	pushURL string
}

func (a *apiFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	def := defaultAPI
	if v := strings.TrimSpace(env(getenv, envAPI)); v != "" {
		def = v
	}
	fs.StringVar(&a.api, "api", def, "the sandkeep API's base URL (default $"+envAPI+", else "+defaultAPI+")")
	fs.StringVar(&a.tenant, "tenant", "", "the tenant to act as (dev server and IAM; the dev server's default is \"local\")")
	fs.StringVar(&a.pushURL, "push-url", strings.TrimSpace(env(getenv, envPushURL)),
		"a deployment's push endpoint, wss://… (default $"+envPushURL+"; the dev server's own needs none)")
	fs.StringVar(&a.auth, "auth", authNone, "authentication: none (dev server), iam (SigV4, AWS default credentials) or jwt (token in $"+envToken+")")
}

// check validates the flags and reads the token from the environment.
func (a *apiFlags) check(getenv func(string) string) error {
	u, err := url.Parse(a.api)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return usageErr("--api %q: want an absolute http(s) URL without credentials or query", a.api)
	}
	if a.pushURL != "" {
		p, err := url.Parse(a.pushURL)
		if err != nil || (p.Scheme != "ws" && p.Scheme != "wss") || p.Host == "" || p.User != nil {
			return usageErr("--push-url %q: want an absolute ws(s) URL without credentials", a.pushURL)
		}
	}
	switch a.auth {
	case authNone, authIAM:
	case authJWT:
		a.token = strings.TrimSpace(env(getenv, envToken))
		if a.token == "" {
			return usageErr("--auth jwt needs the token in $%s (never a flag: flags show in ps)", envToken)
		}
		if a.tenant != "" {
			return usageErr("--tenant does not apply to --auth jwt: the token's claim names the tenant")
		}
	default:
		return usageErr("--auth %q: want none, iam or jwt", a.auth)
	}
	return nil
}

func env(getenv func(string) string, k string) string {
	if getenv == nil {
		return ""
	}
	return getenv(k)
}

// registerRetryFor adds --retry-for: how long run, attach and tail --follow outlive
// transient failures.
func registerRetryFor(fs *flag.FlagSet, d *time.Duration) {
	fs.DurationVar(d, "retry-for", defaultRetryFor, "give up after transient failures (no answer, 429, 502-504) that lasted this long")
}

// checkRetryFor refuses a --retry-for that is not positive.
func checkRetryFor(d time.Duration) error {
	if d <= 0 {
		return usageErr("--retry-for %s: want a positive duration", d)
	}
	return nil
}

// runConfig is `sandkeep run`.
type runConfig struct {
	api       apiFlags
	thread    string
	runID     string
	sandboxID string
	provider  string
	command   string // shell text
	retryFor  time.Duration
}

// splitCommand splits args at the first "--": the flags and positionals before, the
// agent's command after.
func splitCommand(args []string) (flags, command []string, ok bool) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:], true
		}
	}
	return args, nil, false
}

// shellText is the agent command: one word is shell text as typed (`-- 'python a.py | tee x'`),
// several are quoted word by word (`-- python a.py --model x`).
func shellText(words []string) string {
	if len(words) == 1 {
		return words[0]
	}
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = journal.Quote(w)
	}
	return strings.Join(q, " ")
}

func parseRun(args []string, getenv func(string) string, w io.Writer) (runConfig, error) {
	var cfg runConfig
	before, cmd, dashed := splitCommand(args)
	fs := newFlags("sandkeep run", w)
	cfg.api.register(fs, getenv)
	fs.StringVar(&cfg.thread, "thread", "", "the thread (conversation) the run belongs to (required)")
	fs.StringVar(&cfg.runID, "run", "", "the run's id (default: a new random id)")
	fs.StringVar(&cfg.sandboxID, "sandbox", "default", "the thread's sandbox to resume or create")
	defProvider := providers.LocalProcess
	if v := strings.TrimSpace(env(getenv, envProvider)); v != "" {
		defProvider = v
	}
	fs.StringVar(&cfg.provider, "provider", defProvider, "the sandbox provider (default $"+envProvider+", else local-process)")
	registerRetryFor(fs, &cfg.retryFor)
	pos, err := parseInterspersed(fs, before)
	if err != nil {
		return cfg, err
	}
	switch {
	case len(pos) > 0:
		return cfg, usageErr("unexpected argument %q (the agent's command goes after --)", pos[0])
	case !dashed || len(cmd) == 0:
		return cfg, usageErr("run needs the agent's command after --")
	case cfg.thread == "":
		return cfg, usageErr("--thread is required")
	}
	if cfg.runID == "" {
		cfg.runID = "run-" + strings.ToLower(rand.Text()[:12])
	}
	for _, id := range [][2]string{{"--thread", cfg.thread}, {"--run", cfg.runID}, {"--sandbox", cfg.sandboxID}, {"--provider", cfg.provider}} {
		if err := contract.CheckID(id[0], id[1]); err != nil {
			return cfg, usageErr("%v", err)
		}
	}
	if err := journal.CheckRunID(cfg.runID); err != nil {
		return cfg, usageErr("--run: %v", err)
	}
	cfg.command = shellText(cmd)
	if strings.TrimSpace(cfg.command) == "" {
		return cfg, usageErr("the agent's command is empty")
	}
	if err := checkRetryFor(cfg.retryFor); err != nil {
		return cfg, err
	}
	return cfg, cfg.api.check(getenv)
}

// afterFlag is --after N: a non-negative event offset.
type afterFlag int64

func (a *afterFlag) String() string { return strconv.FormatInt(int64(*a), 10) }

func (a *afterFlag) Set(s string) error {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return errors.New("want a non-negative event offset")
	}
	*a = afterFlag(n)
	return nil
}

// attachConfig is `sandkeep attach` and `sandkeep tail` (tail: follow says whether to wait
// for more events).
type attachConfig struct {
	api      apiFlags
	runID    string
	after    int64
	follow   bool
	retryFor time.Duration
}

func parseAttach(name string, args []string, getenv func(string) string, w io.Writer) (attachConfig, error) {
	var cfg attachConfig
	var after afterFlag
	fs := newFlags("sandkeep "+name, w)
	cfg.api.register(fs, getenv)
	fs.Var(&after, "after", "print the events after this offset (a viewer that saw up to N passes N)")
	if name == "tail" {
		fs.BoolVar(&cfg.follow, "follow", false, "keep printing new events until the run ends")
	}
	registerRetryFor(fs, &cfg.retryFor)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return cfg, err
	}
	if len(pos) != 1 {
		return cfg, usageErr("%s takes exactly one RUN id", name)
	}
	cfg.runID, cfg.after = pos[0], int64(after)
	if err := contract.CheckID("RUN", cfg.runID); err != nil {
		return cfg, usageErr("%v", err)
	}
	if err := checkRetryFor(cfg.retryFor); err != nil {
		return cfg, err
	}
	return cfg, cfg.api.check(getenv)
}

// cancelConfig is `sandkeep cancel RUN | --thread T`.
type cancelConfig struct {
	api    apiFlags
	runID  string
	thread string
}

func parseCancel(args []string, getenv func(string) string, w io.Writer) (cancelConfig, error) {
	var cfg cancelConfig
	fs := newFlags("sandkeep cancel", w)
	cfg.api.register(fs, getenv)
	fs.StringVar(&cfg.thread, "thread", "", "cancel the thread's running run")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return cfg, err
	}
	switch {
	case len(pos) > 1:
		return cfg, usageErr("cancel takes one RUN id")
	case len(pos) == 1 && cfg.thread != "":
		return cfg, usageErr("cancel takes a RUN id or --thread, not both")
	case len(pos) == 0 && cfg.thread == "":
		return cfg, usageErr("cancel needs a RUN id or --thread T")
	case len(pos) == 1:
		cfg.runID = pos[0]
		if err := contract.CheckID("RUN", cfg.runID); err != nil {
			return cfg, usageErr("%v", err)
		}
	default:
		if err := contract.CheckID("--thread", cfg.thread); err != nil {
			return cfg, usageErr("%v", err)
		}
	}
	return cfg, cfg.api.check(getenv)
}
