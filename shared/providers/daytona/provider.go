// Package daytona is a contract.Provider over Daytona's REST API (docs/design.md §2.5): the management
// API (sandboxes, snapshots) at Config.BaseURL and each sandbox's toolbox (process
// execution) behind the toolbox proxy URL Daytona reports for it. Every capability is
// implemented: Lookuper, StatusReader, Stopper, Snapshotter, Restorer, Executor and EnvSetter.
//
// Decisions the spec leaves open:
//   - Names. A sandbox is named "<key>-<8 hex>" and labelled sandkeep.key=<key>. The random
//     suffix keeps "a name is not an identity" true (every Create yields a fresh sandbox)
//     and makes the name an idempotency token: Daytona refuses a second sandbox of the
//     same name (409), so after an ambiguous create failure (5xx, timeout) the client
//     reads the sandbox by that name and adopts it, or resends the same create; it never
//     makes a second one. Lookup lists by the label (Daytona's listing is eventually
//     consistent, so a sandbox created a moment ago may be missed).
//   - States. started → alive; stopped (and stopping) → stopped; archived (and archiving)
//     → archived; destroyed, destroying, a desired state of destroyed, or 404 → gone.
//     error, build_failed, unknown and states this client does not know are transient
//     errors, never gone. Resume starts a stopped or archived sandbox and waits for started
//     within the context's deadline, polling through transitional states; Stop stops a
//     started one and waits for stopped the same way (docs/design.md §2.5).
//   - Auto-stop. Daytona stops a sandbox after autoStopInterval idle minutes (15 by
//     default), counting API activity, not processes. A working agent must not be
//     stopped mid-run, and its shipper makes no Daytona traffic, so Create sends
//     Config.AutoStop (0 = disabled by default), Create and Resume correct a sandbox whose
//     interval is shorter, and sandkeep stops idle sandboxes itself (Stop).
//   - Secrets. CreateInput.Env and SetEnv values are kept in this Provider's memory and
//     sent with each command (the toolbox's envs); they are never sent at create time,
//     because Daytona returns a sandbox's create-time env in every read.
//   - Commands. The toolbox returns one combined output string, so Exec runs the command
//     under a POSIX wrapper that base64-encodes stdout and stderr separately (exact bytes,
//     as the journal's byte positions need); the image must have sh, base64, mktemp and,
//     for Start, setsid.
//   - Snapshots are named "sandkeep-<id prefix>-<label>-<8 hex>" and taken without stopping
//     the sandbox (stopping would kill a running agent); the name is the snapshot id.
//   - CreateInput.Workspace is not interpreted (bootstrapping is the caller's).
package daytona

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Name is the provider name stored in sandbox keys and instance rows.
const Name = "daytona"

// KeyLabel is the label carrying the sandbox key on every sandbox this provider creates.
const KeyLabel = "sandkeep.key"

// maxCreateRounds bounds how often one Create resends its request after ambiguous failures.
const maxCreateRounds = 5

// Provider is the Daytona provider; safe for concurrent use.
type Provider struct {
	cfg Config

	mu      sync.Mutex
	env     map[string]map[string]string // per sandbox id: secrets for its commands
	toolbox map[string]string            // per sandbox id: its toolbox base URL
}

var (
	_ contract.Provider        = (*Provider)(nil)
	_ contract.Lookuper        = (*Provider)(nil)
	_ contract.StatusReader    = (*Provider)(nil)
	_ contract.Stopper         = (*Provider)(nil)
	_ contract.Snapshotter     = (*Provider)(nil)
	_ contract.SnapshotDeleter = (*Provider)(nil)
	_ contract.Restorer        = (*Provider)(nil)
	_ contract.Executor        = (*Provider)(nil)
	_ contract.EnvStarter      = (*Provider)(nil)
	_ contract.EnvSetter       = (*Provider)(nil)
)

// New validates cfg (errors wrap contract.ErrInvalid) and returns a provider.
func New(cfg Config) (*Provider, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Provider{cfg: c, env: map[string]map[string]string{}, toolbox: map[string]string{}}, nil
}

// Name is "daytona".
func (p *Provider) Name() string { return Name }

// sandboxDTO is the part of Daytona's Sandbox (and SandboxListItem) this client reads.
type sandboxDTO struct {
	ID               string            `json:"id"`
	Name             string            `json:"name"`
	State            string            `json:"state"`
	DesiredState     string            `json:"desiredState"`
	Labels           map[string]string `json:"labels"`
	ToolboxProxyURL  string            `json:"toolboxProxyUrl"`
	AutoStopInterval *float64          `json:"autoStopInterval"`
	ErrorReason      string            `json:"errorReason"`
	CreatedAt        string            `json:"createdAt"`
}

// createBody is the CreateSandbox request this client sends.
type createBody struct {
	Name             string            `json:"name"`
	Snapshot         string            `json:"snapshot,omitempty"`
	Target           string            `json:"target,omitempty"`
	Labels           map[string]string `json:"labels"`
	AutoStopInterval int               `json:"autoStopInterval"`
}

// phase is what a Daytona state means to this client.
type phase int

const (
	phaseAlive    phase = iota // started
	phaseStopped               // stopped, archived: Resume starts it
	phaseStopping              // stopping, archiving: becomes stopped (or archived)
	phaseStarting              // on its way to started
	phaseBusy                  // snapshotting, resizing, forking: returns to where it was
	phaseGone                  // destroyed or being destroyed: never comes back
	phaseFailed                // error, build_failed: needs a human (or Daytona's recovery)
	phaseUnknown               // "unknown" or a state this client does not know
)

// classify maps a sandbox's state to a phase; a desired state of destroyed is gone.
func classify(sb *sandboxDTO) phase {
	if sb.DesiredState == "destroyed" {
		return phaseGone
	}
	switch sb.State {
	case "started":
		return phaseAlive
	case "stopped", "archived":
		return phaseStopped
	case "stopping", "archiving":
		return phaseStopping
	case "creating", "starting", "restoring", "pulling_snapshot", "pending_build", "building_snapshot":
		return phaseStarting
	case "snapshotting", "resizing", "forking":
		return phaseBusy
	case "destroyed", "destroying":
		return phaseGone
	case "error", "build_failed":
		return phaseFailed
	}
	return phaseUnknown
}

// goneErr is the confirmed-gone error of sandbox id.
func goneErr(id, why string) error {
	return fmt.Errorf("daytona: sandbox %s %s: %w", id, why, contract.ErrSandboxGone)
}

// stateErr is the transient error of a sandbox in a state that is neither alive,
// stopped nor gone.
func (p *Provider) stateErr(id string, sb *sandboxDTO) error {
	reason := ""
	if sb.ErrorReason != "" {
		reason = ": " + p.redactor(id).apply(sb.ErrorReason)
	}
	return transientf("sandbox %s is %s%s", id, sb.State, reason)
}

func (p *Provider) api(path string) string { return p.cfg.BaseURL + path }

func seg(s string) string { return url.PathEscape(s) }

// get reads sandbox idOrName; a 404 is a confirmed ErrSandboxGone.
func (p *Provider) get(ctx context.Context, idOrName string) (*sandboxDTO, error) {
	var sb sandboxDTO
	err := p.do(ctx, request{op: "get sandbox", method: http.MethodGet, url: p.api("/sandbox/" + seg(idOrName))}, &sb, p.redactor(idOrName))
	if statusOf(err) == http.StatusNotFound {
		p.forget(idOrName)
		return nil, goneErr(idOrName, "not found")
	}
	if err != nil {
		return nil, err
	}
	if sb.ToolboxProxyURL != "" && classify(&sb) == phaseAlive {
		p.mu.Lock()
		p.toolbox[sb.ID] = strings.TrimRight(sb.ToolboxProxyURL, "/") + "/" + seg(sb.ID)
		p.mu.Unlock()
	}
	return &sb, nil
}

// Status reads the sandbox's state without starting it: alive, stopped, archived or
// gone; any other state, and any failure, is a transient error.
func (p *Provider) Status(ctx context.Context, id string) (contract.SandboxStatus, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	sb, err := p.get(ctx, id)
	if errors.Is(err, contract.ErrSandboxGone) {
		return contract.SandboxGone, nil
	}
	if err != nil {
		return "", err
	}
	switch classify(sb) {
	case phaseAlive:
		return contract.SandboxAlive, nil
	case phaseStopped, phaseStopping:
		if sb.State == "archived" || sb.State == "archiving" {
			return contract.SandboxArchived, nil
		}
		return contract.SandboxStopped, nil
	case phaseGone:
		return contract.SandboxGone, nil
	}
	return "", p.stateErr(id, sb)
}

// Stop stops a started sandbox, keeping its disk, and waits within ctx's deadline until
// Daytona reports it stopped: stopped, archiving or archived is nil at once, one stopping is
// waited for, one starting or busy is waited for and then stopped, ErrSandboxGone when it
// is confirmed gone, and error, unknown and any failure are transient. It asks for one
// stop only: a sandbox started again while stopping (someone resumed it) is a transient
// error, never stopped a second time under the one who started it.
func (p *Provider) Stop(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WaitTimeout)
	defer cancel()
	last, asked := "", false
	for {
		sb, err := p.get(ctx, id)
		if err != nil {
			if last != "" && ctx.Err() != nil {
				return transientf("stop %s: still %s: %w", id, last, err)
			}
			return err
		}
		last = sb.State
		switch ph := classify(sb); {
		case ph == phaseGone:
			p.forget(id)
			return goneErr(id, "is "+cmp.Or(sb.State, "destroyed"))
		case ph == phaseStopped, sb.State == "archiving": // archiving: stopped, its disk moving
			p.forget(id) // a command now reads the state: ErrNotStarted, not a dead proxy
			return nil
		case ph == phaseFailed, ph == phaseUnknown:
			return p.stateErr(id, sb)
		case ph == phaseAlive, ph == phaseStarting:
			switch {
			case asked:
				return transientf("stop %s: started again while stopping (now %s)", id, sb.State)
			case ph == phaseAlive:
				var err error
				if asked, err = p.stop(ctx, id); err != nil {
					return err
				}
			}
		}
		if err := p.pause(ctx, "stop", id, sb.State); err != nil {
			return err
		}
	}
}

// stop asks Daytona to stop a started sandbox; accepted reports whether it did. A
// refusal because a state change is in progress (409) or the state moved (400) is not an
// error: the caller re-reads.
func (p *Provider) stop(ctx context.Context, id string) (accepted bool, err error) {
	err = p.do(ctx, request{op: "stop sandbox", method: http.MethodPost, url: p.api("/sandbox/" + seg(id) + "/stop")}, nil, p.redactor(id))
	switch statusOf(err) {
	case http.StatusNotFound:
		return false, goneErr(id, "not found")
	case http.StatusConflict, http.StatusBadRequest:
		p.cfg.Logger.DebugContext(ctx, "daytona: stop refused; re-reading", "sandbox", id, "status", statusOf(err))
		return false, nil
	}
	return err == nil, err
}

// Resume returns nil once the sandbox is started (starting a stopped or archived one and
// waiting within ctx's deadline), ErrSandboxGone when it is confirmed gone, and a
// transient error otherwise. It also corrects an auto-stop interval that is too short.
func (p *Provider) Resume(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WaitTimeout)
	defer cancel()
	last := "" // the state seen last, to name it when the deadline cuts a read short
	for {
		sb, err := p.get(ctx, id)
		if err != nil {
			if last != "" && ctx.Err() != nil {
				return transientf("resume %s: still %s: %w", id, last, err)
			}
			return err
		}
		last = sb.State
		switch classify(sb) {
		case phaseAlive:
			return p.ensureAutoStop(ctx, sb)
		case phaseGone:
			p.forget(id)
			return goneErr(id, "is "+cmp.Or(sb.State, "destroyed"))
		case phaseFailed, phaseUnknown:
			return p.stateErr(id, sb)
		case phaseStopped:
			if err := p.start(ctx, id); err != nil {
				return err
			}
		}
		if err := p.pause(ctx, "resume", id, sb.State); err != nil {
			return err
		}
	}
}

// start asks Daytona to start a stopped sandbox. A refusal because a state change is in
// progress (409) or the state moved (400) is not an error: the caller re-reads.
func (p *Provider) start(ctx context.Context, id string) error {
	err := p.do(ctx, request{op: "start sandbox", method: http.MethodPost, url: p.api("/sandbox/" + seg(id) + "/start")}, nil, p.redactor(id))
	switch statusOf(err) {
	case http.StatusNotFound:
		return goneErr(id, "not found")
	case http.StatusConflict, http.StatusBadRequest:
		p.cfg.Logger.DebugContext(ctx, "daytona: start refused; re-reading", "sandbox", id, "status", statusOf(err))
		return nil
	}
	return err
}

// pause waits one poll interval; a done ctx ends the wait with a transient error naming
// the state the sandbox was still in.
func (p *Provider) pause(ctx context.Context, op, id, state string) error {
	t := time.NewTimer(p.cfg.PollInterval)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return transientf("%s %s: still %s: %w", op, id, cmp.Or(state, "settling"), ctx.Err())
	case <-t.C:
		return nil
	}
}

// ensureAutoStop sets the sandbox's auto-stop interval when it would stop a detached run
// sooner than Config allows (0, disabled, is always accepted).
func (p *Provider) ensureAutoStop(ctx context.Context, sb *sandboxDTO) error {
	want := p.cfg.autoStopMinutes()
	if sb.AutoStopInterval != nil {
		have := *sb.AutoStopInterval
		if have == 0 || (want > 0 && have >= float64(want)) {
			return nil
		}
	}
	p.cfg.Logger.DebugContext(ctx, "daytona: correcting auto-stop", "sandbox", sb.ID, "minutes", want)
	u := p.api("/sandbox/" + seg(sb.ID) + "/autostop/" + strconv.Itoa(want))
	err := p.do(ctx, request{op: "set auto-stop", method: http.MethodPost, url: u}, nil, p.redactor(sb.ID))
	if statusOf(err) == http.StatusNotFound {
		return goneErr(sb.ID, "not found")
	}
	return err
}

// Destroy deletes the sandbox; a sandbox already gone (404, destroyed, being destroyed)
// is nil. A delete refused while a state change is in progress is retried until ctx ends.
func (p *Provider) Destroy(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WaitTimeout)
	defer cancel()
	for {
		err := p.do(ctx, request{op: "delete sandbox", method: http.MethodDelete, url: p.api("/sandbox/" + seg(id))}, nil, p.redactor(id))
		switch statusOf(err) {
		case http.StatusNotFound:
			err = nil
		case http.StatusConflict:
			sb, gerr := p.get(ctx, id)
			switch {
			case errors.Is(gerr, contract.ErrSandboxGone):
				err = nil
			case gerr != nil:
				return gerr
			case classify(sb) == phaseGone:
				err = nil
			default:
				if perr := p.pause(ctx, "destroy", id, sb.State); perr != nil {
					return perr
				}
				continue
			}
		}
		if err == nil {
			p.forget(id)
			p.mu.Lock()
			delete(p.env, id)
			p.mu.Unlock()
		}
		return err
	}
}

// Lookup finds a live sandbox labelled with the key name (the newest, preferring a
// healthy one). Daytona's listing is eventually consistent: a brand-new sandbox may be
// missed for a moment.
func (p *Provider) Lookup(ctx context.Context, name string) (string, bool, error) {
	if err := checkName(name); err != nil {
		return "", false, err
	}
	labels, _ := json.Marshal(map[string]string{KeyLabel: name}) // a string map always encodes
	var found []sandboxDTO
	cursor := ""
	for page := 0; page < 20; page++ {
		q := url.Values{"labels": {string(labels)}, "limit": {"100"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var res struct {
			Items      []sandboxDTO `json:"items"`
			NextCursor *string      `json:"nextCursor"`
		}
		err := p.do(ctx, request{op: "list sandboxes", method: http.MethodGet, url: p.api("/sandbox?" + q.Encode())}, &res, p.redactor(""))
		if err != nil {
			return "", false, err
		}
		for _, sb := range res.Items {
			if sb.Labels[KeyLabel] == name && classify(&sb) != phaseGone {
				found = append(found, sb)
			}
		}
		if res.NextCursor == nil || *res.NextCursor == "" {
			break
		}
		cursor = *res.NextCursor
	}
	if len(found) == 0 {
		return "", false, nil
	}
	healthy := func(sb *sandboxDTO) int {
		if ph := classify(sb); ph == phaseFailed || ph == phaseUnknown {
			return 1
		}
		return 0
	}
	best := slices.MinFunc(found, func(a, b sandboxDTO) int {
		return cmp.Or(cmp.Compare(healthy(&a), healthy(&b)), -cmp.Compare(a.CreatedAt, b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return best.ID, true, nil
}

// Create makes a new sandbox named "<in.Name>-<random>", labelled with in.Name, from
// in.SnapshotID or Config.Snapshot, waits until it is started and returns its id. An
// ambiguous failure never leaves a second sandbox (see the package comment).
func (p *Provider) Create(ctx context.Context, in contract.CreateInput) (string, error) {
	return p.create(ctx, in, cmp.Or(in.SnapshotID, p.cfg.Snapshot), in.SnapshotID != "")
}

// Restore creates a new sandbox from in.SnapshotID like Create; ErrSandboxGone when
// Daytona confirms the snapshot no longer exists.
func (p *Provider) Restore(ctx context.Context, in contract.CreateInput) (string, error) {
	if in.SnapshotID == "" {
		return "", contract.Invalid("snapshotId", "required")
	}
	return p.create(ctx, in, in.SnapshotID, true)
}

func (p *Provider) create(ctx context.Context, in contract.CreateInput, snapshot string, restoring bool) (string, error) {
	if err := checkName(in.Name); err != nil {
		return "", err
	}
	if err := contract.CheckEnv(in.Env); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WaitTimeout)
	defer cancel()
	body := createBody{
		Name:             in.Name + "-" + randHex(4),
		Snapshot:         snapshot,
		Target:           p.cfg.Target,
		Labels:           map[string]string{KeyLabel: in.Name},
		AutoStopInterval: p.cfg.autoStopMinutes(),
	}
	red := append(p.redactor(""), envValues(in.Env)...)
	var sb *sandboxDTO
	for round := 1; sb == nil; round++ {
		var got sandboxDTO
		err := p.do(ctx, request{op: "create sandbox", method: http.MethodPost, url: p.api("/sandbox"), body: body, retry: retryRejected}, &got, red)
		st := statusOf(err)
		switch {
		case err == nil:
			sb = &got
			continue
		case st == http.StatusBadRequest && restoring:
			if gone, gerr := p.snapshotGone(ctx, snapshot); gerr != nil {
				return "", gerr
			} else if gone {
				return "", fmt.Errorf("daytona: snapshot %s: %w", snapshot, contract.ErrSandboxGone)
			}
			return "", err
		case st == http.StatusBadRequest:
			return "", fmt.Errorf("%w (check Config.Snapshot and Config.Target): %w", ErrConfig, err)
		case st == http.StatusConflict, transientStatus(st) && st != http.StatusTooManyRequests && ctx.Err() == nil:
			// The outcome is unknown (or the name is taken: by this very create). The name is
			// this call's alone, so a sandbox of that name is the one this call made.
			p.cfg.Logger.DebugContext(ctx, "daytona: create outcome unknown; reading by name", "name", body.Name, "status", st)
			found, gerr := p.get(ctx, body.Name)
			switch {
			case gerr == nil:
				sb = found
				continue
			case !errors.Is(gerr, contract.ErrSandboxGone):
				return "", gerr
			}
			if round >= maxCreateRounds {
				return "", err
			}
			if perr := p.pause(ctx, "create", body.Name, "unconfirmed"); perr != nil {
				return "", errors.Join(err, perr)
			}
		default:
			return "", err
		}
	}
	p.SetEnvLocal(sb.ID, in.Env)
	if err := p.Resume(ctx, sb.ID); err != nil {
		// Nothing records a sandbox whose create failed: remove it rather than leak it.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.DestroyTimeout)
		defer cancel()
		if derr := p.Destroy(dctx, sb.ID); derr != nil {
			p.cfg.Logger.WarnContext(ctx, "daytona: could not remove a sandbox that failed to start", "sandbox", sb.ID, "err", derr.Error())
		}
		return "", fmt.Errorf("daytona: created sandbox %s did not start: %w", sb.ID, stripGone(err))
	}
	return sb.ID, nil
}

// stripGone turns a gone error of a sandbox this call just made into a plain failure: a
// create that failed is not "the sandbox is gone".
func stripGone(err error) error {
	if errors.Is(err, contract.ErrSandboxGone) {
		return errors.New(strings.ReplaceAll(err.Error(), contract.ErrSandboxGone.Error(), "vanished"))
	}
	return err
}

// snapshotDTO is the part of Daytona's SnapshotDto this client reads.
type snapshotDTO struct {
	ID          string  `json:"id"`
	Name        string  `json:"name"`
	State       string  `json:"state"`
	ErrorReason *string `json:"errorReason"`
}

// getSnapshot reads snapshot idOrName; found=false on 404.
func (p *Provider) getSnapshot(ctx context.Context, idOrName string) (*snapshotDTO, bool, error) {
	var s snapshotDTO
	err := p.do(ctx, request{op: "get snapshot", method: http.MethodGet, url: p.api("/snapshots/" + seg(idOrName))}, &s, p.redactor(""))
	if statusOf(err) == http.StatusNotFound {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return &s, true, nil
}

// snapshotGone reports whether Daytona confirms the snapshot no longer exists (404, or
// being removed).
func (p *Provider) snapshotGone(ctx context.Context, idOrName string) (bool, error) {
	s, found, err := p.getSnapshot(ctx, idOrName)
	if err != nil {
		return false, err
	}
	return !found || s.State == "removing", nil
}

// Snapshot snapshots the sandbox (without stopping it), waits until the snapshot is
// active within ctx's deadline, and returns its name, which Restore accepts.
func (p *Provider) Snapshot(ctx context.Context, id, label string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WaitTimeout)
	defer cancel()
	name := snapshotName(id, label)
	err := p.do(ctx, request{op: "create snapshot", method: http.MethodPost, url: p.api("/sandbox/" + seg(id) + "/snapshot"),
		body: map[string]string{"name": name}, retry: retryRejected}, nil, p.redactor(id))
	switch st := statusOf(err); {
	case err == nil:
	case st == http.StatusNotFound:
		return "", goneErr(id, "not found")
	case transientStatus(st) && st != http.StatusTooManyRequests && ctx.Err() == nil:
		// Unknown outcome: go on only when the snapshot is visibly under way.
		sb, gerr := p.get(ctx, id)
		if gerr != nil {
			return "", gerr
		}
		if _, found, serr := p.getSnapshot(ctx, name); serr != nil || (!found && sb.State != "snapshotting") {
			return "", err
		}
	default:
		return "", err
	}
	for { // the sandbox is "snapshotting" until the snapshot is taken
		sb, err := p.get(ctx, id)
		if err != nil {
			return "", err
		}
		if ph := classify(sb); ph == phaseFailed || ph == phaseGone {
			return "", fmt.Errorf("daytona: snapshot %s of %s failed: %w", name, id, p.stateErr(id, sb))
		}
		if sb.State != "snapshotting" {
			break
		}
		if err := p.pause(ctx, "snapshot", id, sb.State); err != nil {
			return "", err
		}
	}
	for missing := 0; ; {
		s, found, err := p.getSnapshot(ctx, name)
		switch {
		case err != nil:
			return "", err
		case !found:
			if missing++; missing > 10 {
				return "", fmt.Errorf("daytona: snapshot %s of %s never appeared", name, id)
			}
		case s.State == "active":
			return name, nil
		case s.State == "error" || s.State == "build_failed" || s.State == "removing" || s.State == "inactive":
			reason := ""
			if s.ErrorReason != nil {
				reason = ": " + p.redactor(id).apply(*s.ErrorReason)
			}
			return "", fmt.Errorf("daytona: snapshot %s of %s is %s%s", name, id, s.State, reason)
		}
		if err := p.pause(ctx, "snapshot", name, "pending"); err != nil {
			return "", err
		}
	}
}

// DeleteSnapshot deletes the snapshot named snap (what Snapshot returned): Daytona deletes
// by id, so the name is looked up first. Idempotent: a snapshot not found, or already
// being removed, is nil.
func (p *Provider) DeleteSnapshot(ctx context.Context, snap string) error {
	if snap == "" {
		return contract.Invalid("snapshotId", "empty")
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.WaitTimeout)
	defer cancel()
	s, found, err := p.getSnapshot(ctx, snap)
	switch {
	case err != nil:
		return err
	case !found || s.State == "removing":
		return nil
	}
	err = p.do(ctx, request{op: "delete snapshot", method: http.MethodDelete, url: p.api("/snapshots/" + seg(s.ID))}, nil, p.redactor(""))
	if statusOf(err) == http.StatusNotFound {
		return nil
	}
	return err
}

var unsafeLabel = regexp.MustCompile(`[^a-z0-9]+`)

// snapshotName is "sandkeep-<first 12 of id>-<label>-<8 hex>": unique per call, only
// characters Daytona accepts in a display name.
func snapshotName(id, label string) string {
	l := strings.Trim(unsafeLabel.ReplaceAllString(strings.ToLower(label), "-"), "-")
	l = strings.Trim(l[:min(len(l), 32)], "-")
	idp := strings.Trim(unsafeLabel.ReplaceAllString(strings.ToLower(id), "-"), "-")
	idp = idp[:min(len(idp), 12)]
	return "sandkeep-" + strings.Trim(idp+"-"+cmp.Or(l, "snap"), "-") + "-" + randHex(4)
}

// SetEnv sets variables for every later Exec/Start in the sandbox, merged with those set
// before. They live in this Provider's memory only (no request is made), so a new
// Provider needs them again (keeper re-injects after every resume).
func (p *Provider) SetEnv(ctx context.Context, id string, env map[string]string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := contract.CheckEnv(env); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	p.SetEnvLocal(id, env)
	return nil
}

// SetEnvLocal merges env into the variables of sandbox id without validation.
func (p *Provider) SetEnvLocal(id string, env map[string]string) {
	if len(env) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.env[id]
	if m == nil {
		m = map[string]string{}
		p.env[id] = m
	}
	maps.Copy(m, env)
}

// envOf returns a copy of the variables of sandbox id (nil when none).
func (p *Provider) envOf(id string) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.env[id]) == 0 {
		return nil
	}
	return maps.Clone(p.env[id])
}

// forget drops the cached toolbox URL of sandbox id.
func (p *Provider) forget(id string) {
	p.mu.Lock()
	delete(p.toolbox, id)
	p.mu.Unlock()
}

// redactor returns the secrets that must never appear in an error about sandbox id: the
// API key and the sandbox's injected values.
func (p *Provider) redactor(id string) redactor {
	r := redactor{p.cfg.APIKey}
	if id != "" {
		r = append(r, envValues(p.envOf(id))...)
	}
	return r
}

// redactorWith is redactor plus the values of one command's own variables.
func (p *Provider) redactorWith(id string, extra map[string]string) redactor {
	if len(extra) == 0 {
		return p.redactor(id)
	}
	env := maps.Clone(p.envOf(id))
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range extra {
		env["\x00"+k] = v // kept apart from a sandbox variable of the same name
	}
	return append(redactor{p.cfg.APIKey}, envValues(env)...)
}

// envValues lists the values worth redacting (4 bytes or more; shorter ones are not
// secrets and would blank out ordinary words), longest first so none is half replaced.
func envValues(env map[string]string) []string {
	var v []string
	for _, s := range env {
		if len(s) >= 4 {
			v = append(v, s)
		}
	}
	slices.SortFunc(v, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return v
}

var safeName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)

// checkName accepts a sandbox key usable in a Daytona name and label.
func checkName(name string) error {
	if !safeName.MatchString(name) {
		return contract.Invalid("name", "want 1-200 characters of [A-Za-z0-9._-]")
	}
	return nil
}

// checkID rejects an id that could not name a sandbox (empty, or with a path separator).
func checkID(id string) error {
	if id == "" || strings.ContainsAny(id, "/?#\x00") || id == "." || id == ".." {
		return contract.Invalid("providerSandboxId", "%q is not a Daytona sandbox id", id)
	}
	return nil
}

// randHex returns 2n random hex digits.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}
