// Package e2b is a contract.Provider for E2B (https://e2b.dev) over its REST control
// plane, with an Executor over the sandbox's envd process service.
//
// Identity. Every sandbox is created from Config.Template with two metadata labels:
// MetaKey = the sandbox key (CreateInput.Name) and MetaCreate = a random token of that
// Create call. Lookup lists running and paused sandboxes by MetaKey (a running one
// first, then the newest). A create is not idempotent: after an ambiguous failure
// (5xx, 409, transport error, attempt timeout) the next attempt first lists by this
// call's token and adopts what it finds, so a lost success never yields a second
// sandbox; only a 429 is retried directly. If E2B's listing has not caught up yet, a
// second sandbox can still appear; the first is then an orphan that the reaper's
// intent sweep finds by Lookup, and that E2B's timeout ends after Lifetime() at most.
//
// States. Status: running → alive, paused → stopped, 404 → gone, anything else an
// error (never gone). Resume is E2B's connect: it resumes a paused sandbox and only
// ever lengthens a running one's time to live; 404 → contract.ErrSandboxGone. Stop is
// pause (docs/design.md §2.5): a paused sandbox keeps its id and files; already paused
// is nil. Destroy is kill; 404 is success.
//
// Lifetime. E2B ends a sandbox when its time to live runs out. Every create, resume
// and probe (Status of a running sandbox ending sooner) asks for Lifetime() =
// max(Timeout, DetachedTTL + SweepPeriod + LifetimeMargin), and an Exec/Start
// refreshes it when this client last did so more than Lifetime()/4 ago, so a host
// reading its agent's journal keeps the sandbox alive while attached, and a detached
// agent outlives its TTL plus one sweep. Sandboxes are created with autoPause (unless
// Config.KillOnTimeout): a time to live that runs out pauses rather than kills, so the
// thread's files survive for its next run.
//
// Commands. Exec starts `/bin/bash -l -c command` through envd's Start (a Connect
// server-streaming call, JSON envelopes) as Config.User and collects stdout, stderr and
// the exit status. Start launches the command under setsid(1) in a wrapper that prints
// the new process group's id from inside the group (so the group exists when Start
// returns) and exits at once; Kill runs `kill -KILL -- -pgid` and treats "No such
// process" as success. E2B has no call that changes a sandbox's environment, so env
// (CreateInput.Env and SetEnv) lives in this client and is passed with every process
// start; a host that resumes a sandbox calls SetEnv again.
//
// Errors. 401/403 wrap ErrConfig and are never retried. 429, 5xx, 409 and transport
// errors are retried with full-jitter backoff, never past the ctx deadline, then
// returned as transient errors. ErrSandboxGone only when E2B answered 404 (for envd
// calls: when the proxy's 502 is confirmed by a 404 from the control plane). No API
// key, envd access token or env value (of 8 bytes or more) appears in an error or a
// log line: server text is redacted before it is used.
package e2b
