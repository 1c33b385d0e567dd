package e2b

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Metadata keys the provider stamps on every sandbox it creates.
const (
	// MetaKey holds the sandbox key (CreateInput.Name); Lookup filters on it.
	MetaKey = "sandkeep_key"
	// MetaCreate holds a random token per Create call: after an ambiguous create the
	// provider looks for its own attempt, never for another creator's sandbox of the
	// same name.
	MetaCreate = "sandkeep_create"
)

// The interfaces the provider implements.
var (
	_ contract.Provider     = (*Provider)(nil)
	_ contract.Lookuper     = (*Provider)(nil)
	_ contract.StatusReader = (*Provider)(nil)
	_ contract.Stopper      = (*Provider)(nil)
	_ contract.Executor     = (*Provider)(nil)
	_ contract.EnvStarter   = (*Provider)(nil)
	_ contract.EnvSetter    = (*Provider)(nil)
)

// startedSandbox is the part of E2B's create/connect answer the client reads.
type startedSandbox struct {
	SandboxID       string  `json:"sandboxID"`
	EnvdVersion     string  `json:"envdVersion"`
	EnvdAccessToken string  `json:"envdAccessToken"`
	Domain          *string `json:"domain"`
}

// sandboxSummary is the part of a listed or fetched sandbox the client reads.
type sandboxSummary struct {
	SandboxID       string            `json:"sandboxID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken"`
	Domain          *string           `json:"domain"`
	Metadata        map[string]string `json:"metadata"`
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func checkID(id string) error {
	if id == "" || strings.ContainsAny(id, "/?#%. \t\r\n") {
		return contract.Invalid("providerSandboxID", "%q is not an E2B sandbox id", id)
	}
	return nil
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Create starts a sandbox from the configured template, labelled with in.Name, and
// returns its fresh id. in.Env is kept by the client and passed to every command (see
// SetEnv); it is not sent at creation, so no secret is stored in E2B's sandbox
// configuration. in.Workspace is not used (the template is the workspace). Snapshots
// are not supported (SnapshotID must be empty).
//
// A create is not idempotent, so an ambiguous failure (5xx, 409, a transport error or
// an attempt timeout: the sandbox may exist) is never retried blindly: the provider
// first lists sandboxes labelled with this call's create token and returns the one it
// finds. Only a 429 (refused before any work) is retried directly.
func (p *Provider) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	if in.Name == "" {
		return "", contract.Invalid("Name", "required")
	}
	if in.SnapshotID != "" {
		return "", contract.Invalid("SnapshotID", "the e2b provider does not restore snapshots")
	}
	if err := contract.CheckEnv(in.Env); err != nil {
		return "", err
	}
	token := newToken()
	body := map[string]any{
		"templateID": p.cfg.Template,
		"timeout":    p.lifetimeSeconds(),
		"autoPause":  !p.cfg.KillOnTimeout,
		"secure":     true,
		"metadata":   map[string]string{MetaKey: in.Name, MetaCreate: token},
	}
	op := "create sandbox"
	var id string
	ambiguous := false // the previous attempt may have created a sandbox
	err := p.retry(ctx, op, func(ctx context.Context, attempt int) (bool, time.Duration, error) {
		if ambiguous {
			// The previous attempt may have created the sandbox; adopt it if so.
			found, ok, err := p.find(ctx, map[string]string{MetaKey: in.Name, MetaCreate: token})
			if err != nil {
				if errors.Is(err, ErrConfig) || ctx.Err() != nil {
					return true, 0, err
				}
				return false, 0, err
			}
			ambiguous = false
			if ok {
				p.log.Info("e2b: ambiguous create had landed; adopting it", "sandbox", found.SandboxID, "attempt", attempt)
				id = found.SandboxID
				// A listing carries no envd access details; the first command reads them.
				p.remember(id, "", "", "", true)
				return true, 0, nil
			}
		}
		r, err := p.call(ctx, http.MethodPost, "/sandboxes", nil, body)
		ambiguous = err != nil || r.status >= 500 || r.status == http.StatusConflict
		if err != nil {
			if ctx.Err() != nil {
				return true, 0, fmt.Errorf("e2b: %s: %w", op, err)
			}
			return false, 0, fmt.Errorf("e2b: %s: %w", op, err)
		}
		if r.status == http.StatusCreated {
			var s startedSandbox
			if err := json.Unmarshal(r.body, &s); err != nil || s.SandboxID == "" {
				// It exists, but we cannot read its id: the next attempt's lookup finds it.
				ambiguous = true
				return false, 0, fmt.Errorf("e2b: %s: unreadable answer", op)
			}
			id = s.SandboxID
			p.remember(id, s.EnvdAccessToken, deref(s.Domain), s.EnvdVersion, true)
			return true, 0, nil
		}
		apiErr := p.apiError(op, r)
		if retryableStatus(r.status) || r.status == http.StatusConflict {
			return false, retryAfter(r.header), apiErr
		}
		return true, 0, apiErr
	})
	if err != nil {
		if ambiguous {
			return "", fmt.Errorf("%w (a sandbox may have been created; Lookup(%q) finds it)", err, in.Name)
		}
		return "", err
	}
	if len(in.Env) > 0 {
		p.mergeEnv(id, in.Env)
	}
	return id, nil
}

// metadataQuery writes labels the way the list endpoint reads them: key=value pairs,
// each part percent-encoded, joined by & (the whole then encoded again as one query
// value), in sorted order so requests are reproducible.
func metadataQuery(labels map[string]string) string {
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, url.QueryEscape(k)+"="+url.QueryEscape(labels[k]))
	}
	return strings.Join(parts, "&")
}

// maxPages bounds a listing; a label filter that matches more than this many pages
// means something else is wrong.
const maxPages = 20

// find lists running and paused sandboxes carrying every label and returns the best
// match: a running one before a paused one, then the most recently started.
func (p *Provider) find(ctx context.Context, labels map[string]string) (sandboxSummary, bool, error) {
	var all []sandboxSummary
	next := ""
	for page := 0; ; page++ {
		if page == maxPages {
			return sandboxSummary{}, false, fmt.Errorf("e2b: list sandboxes: more than %d pages match %s", maxPages, metadataQuery(labels))
		}
		q := url.Values{}
		q.Set("metadata", metadataQuery(labels))
		q.Set("state", "running,paused")
		q.Set("limit", "100")
		if next != "" {
			q.Set("nextToken", next)
		}
		r, err := p.idempotent(ctx, "list sandboxes", http.MethodGet, "/v2/sandboxes", q, nil, http.StatusOK)
		if err != nil {
			return sandboxSummary{}, false, err
		}
		var got []sandboxSummary
		if err := json.Unmarshal(r.body, &got); err != nil {
			return sandboxSummary{}, false, fmt.Errorf("e2b: list sandboxes: unreadable answer: %w", err)
		}
		for _, s := range got {
			// Filter again here: a server that ignored the filter must not make us
			// adopt a stranger's sandbox.
			match := s.SandboxID != ""
			for k, v := range labels {
				match = match && s.Metadata[k] == v
			}
			if match {
				all = append(all, s)
			}
		}
		next = r.header.Get("X-Next-Token")
		if next == "" || len(got) == 0 {
			break
		}
	}
	if len(all) == 0 {
		return sandboxSummary{}, false, nil
	}
	best := slices.MinFunc(all, func(a, b sandboxSummary) int {
		if (a.State == "running") != (b.State == "running") {
			if a.State == "running" {
				return -1
			}
			return 1
		}
		return b.StartedAt.Compare(a.StartedAt)
	})
	return best, true, nil
}

// Lookup returns the id of a running or paused sandbox labelled name (a running one
// first, then the newest); found=false when none exists.
func (p *Provider) Lookup(ctx context.Context, name string) (string, bool, error) {
	if name == "" {
		return "", false, contract.Invalid("name", "required")
	}
	s, ok, err := p.find(ctx, map[string]string{MetaKey: name})
	if err != nil || !ok {
		return "", false, err
	}
	return s.SandboxID, true, nil
}

// get reads one sandbox; found=false on 404 (confirmed gone).
func (p *Provider) get(ctx context.Context, id string) (sandboxSummary, bool, error) {
	op := "get sandbox " + id
	r, err := p.idempotent(ctx, op, http.MethodGet, "/sandboxes/"+id, nil, nil, http.StatusOK, http.StatusNotFound)
	if err != nil {
		return sandboxSummary{}, false, err
	}
	if r.status == http.StatusNotFound {
		p.forget(id)
		return sandboxSummary{}, false, nil
	}
	var s sandboxSummary
	if err := json.Unmarshal(r.body, &s); err != nil {
		return sandboxSummary{}, false, fmt.Errorf("e2b: %s: unreadable answer: %w", op, err)
	}
	p.remember(id, s.EnvdAccessToken, deref(s.Domain), s.EnvdVersion, false)
	return s, true, nil
}

// Status reports running as alive, paused as stopped and 404 as gone, starting
// nothing; any other answer is an error (transient, never gone). A running sandbox's
// time to live is pushed out to Lifetime() when it would end sooner (this is the
// reaper's probe keeping a detached agent alive); a failed refresh is logged, not
// returned, since the state read is still true.
func (p *Provider) Status(ctx context.Context, id string) (contract.SandboxStatus, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	s, found, err := p.get(ctx, id)
	switch {
	case err != nil:
		return "", err
	case !found:
		return contract.SandboxGone, nil
	}
	switch s.State {
	case "running":
		if s.EndAt.IsZero() || time.Until(s.EndAt) < p.lifetime {
			if err := p.setTimeout(ctx, id); errors.Is(err, contract.ErrSandboxGone) {
				return contract.SandboxGone, nil
			} else if err != nil {
				p.log.Warn("e2b: could not refresh the sandbox timeout", "sandbox", id, "err", err.Error())
			}
		}
		return contract.SandboxAlive, nil
	case "paused":
		return contract.SandboxStopped, nil
	}
	return "", fmt.Errorf("e2b: get sandbox %s: unexpected state %q", id, p.redact(s.State))
}

// ExtendLife sets the sandbox to end Lifetime() from now (contract.LifeExtender): E2B's
// timeout is absolute, and a shipping agent makes no E2B call, so the keeper extends a
// live run's sandbox on its heartbeats (docs/design.md §5).
func (p *Provider) ExtendLife(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	return p.setTimeout(ctx, id)
}

// ExtendEvery is half the lifetime: an extension in every such period keeps a sandbox
// alive with half a lifetime to spare, so a missed heartbeat window costs nothing.
func (p *Provider) ExtendEvery() time.Duration { return p.lifetime / 2 }

// setTimeout sets the sandbox to end Lifetime() from now; ErrSandboxGone on 404.
func (p *Provider) setTimeout(ctx context.Context, id string) error {
	op := "set timeout of " + id
	r, err := p.idempotent(ctx, op, http.MethodPost, "/sandboxes/"+id+"/timeout", nil,
		map[string]int{"timeout": p.lifetimeSeconds()}, http.StatusNoContent, http.StatusNotFound)
	if err != nil {
		return err
	}
	if r.status == http.StatusNotFound {
		p.forget(id)
		return fmt.Errorf("e2b: %s: %w", op, contract.ErrSandboxGone)
	}
	p.remember(id, "", "", "", true)
	return nil
}

// Resume connects to the sandbox: a paused one is resumed, a running one keeps
// running; either way its time to live becomes at least Lifetime() from now. nil:
// alive; ErrSandboxGone: E2B answered 404; any other error is transient or ErrConfig.
func (p *Provider) Resume(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	op := "connect sandbox " + id
	r, err := p.idempotent(ctx, op, http.MethodPost, "/sandboxes/"+id+"/connect", nil,
		map[string]int{"timeout": p.lifetimeSeconds()}, http.StatusOK, http.StatusCreated, http.StatusNotFound)
	if err != nil {
		return err
	}
	if r.status == http.StatusNotFound {
		p.forget(id)
		return fmt.Errorf("e2b: %s: %w", op, contract.ErrSandboxGone)
	}
	var s startedSandbox
	if err := json.Unmarshal(r.body, &s); err != nil {
		// The sandbox is up; the envd details are fetched again when needed.
		p.log.Warn("e2b: unreadable connect answer", "sandbox", id)
		return nil
	}
	p.remember(id, s.EnvdAccessToken, deref(s.Domain), s.EnvdVersion, true)
	return nil
}

// Stop pauses the sandbox (POST /sandboxes/{id}/pause, a full snapshot E2B keeps until
// Resume connects to it again, same id and files): nil once paused, and nil for one
// already paused; ErrSandboxGone on 404. E2B answers 409 to a pause while the sandbox is
// paused or changing state: a read then decides, paused being nil and anything else a
// transient error (someone may be resuming it; it is not paused under them).
func (p *Provider) Stop(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	op := "pause sandbox " + id
	return p.retry(ctx, op, func(ctx context.Context, _ int) (bool, time.Duration, error) {
		r, err := p.call(ctx, http.MethodPost, "/sandboxes/"+id+"/pause", nil, nil)
		if err != nil {
			if ctx.Err() != nil {
				return true, 0, fmt.Errorf("e2b: %s: %w", op, err)
			}
			return false, 0, fmt.Errorf("e2b: %s: %w", op, err)
		}
		switch r.status {
		case http.StatusNoContent:
			return true, 0, nil
		case http.StatusNotFound:
			p.forget(id)
			return true, 0, fmt.Errorf("e2b: %s: %w", op, contract.ErrSandboxGone)
		case http.StatusConflict:
			s, found, err := p.get(ctx, id)
			switch {
			case err != nil:
				return true, 0, err
			case !found:
				return true, 0, fmt.Errorf("e2b: %s: %w", op, contract.ErrSandboxGone)
			case s.State == "paused":
				return true, 0, nil
			}
			return true, 0, fmt.Errorf("%w (the sandbox is %s)", p.apiError(op, r), p.redact(s.State))
		}
		apiErr := p.apiError(op, r)
		return !retryableStatus(r.status), retryAfter(r.header), apiErr
	})
}

// Destroy kills the sandbox; idempotent: a sandbox E2B no longer knows (404) is nil.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	_, err := p.idempotent(ctx, "kill sandbox "+id, http.MethodDelete, "/sandboxes/"+id, nil, nil,
		http.StatusNoContent, http.StatusNotFound)
	if err != nil {
		return err
	}
	p.forget(id)
	return nil
}
