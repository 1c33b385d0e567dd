package daytona_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeSandbox is a sandbox of the fake Daytona.
type fakeSandbox struct {
	ID, Name, State, Desired string
	Labels                   map[string]string
	AutoStop                 int
	Snapshot                 string
	Created                  time.Time
	ErrorReason              string
	dir                      string
	// A transition in progress: after `left` more reads the state becomes `to`.
	to   string
	left int
	// held: a stop in progress stays "stopping" until released (holdStop).
	held bool
	// The billing clock: compute time accumulated in running states, and since when the
	// sandbox has been in one (zero when it is not).
	ran      time.Duration
	runSince time.Time
}

// fakeSnapshot is a snapshot of the fake Daytona.
type fakeSnapshot struct {
	ID, Name, State string
	left            int // reads until active
}

// fault is an injected failure for requests matching method and path prefix (after /api).
type fault struct {
	method, prefix string
	status         int
	after          bool // perform the operation, then answer status (an ambiguous failure)
	hang           bool // answer nothing until the client gives up
	retryAfter     string
	message        string
	times          int // how many matching requests it hits (0 = every one)
}

// fakeDaytona is an in-memory Daytona: the management API under /api and a toolbox under
// /toolbox/{id} that runs commands with the local sh, as Daytona's daemon does (command on
// stdin, own process group, stdout and stderr combined).
type fakeDaytona struct {
	t      *testing.T
	apiKey string
	srv    *httptest.Server
	val    *validator

	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	snapshots map[string]*fakeSnapshot
	faults    []*fault
	calls     []string // "METHOD path" of every request
	created   int      // sandboxes the create handler made
	steps     int      // reads a transition takes (default 1)
	pageSize  int
	lastEnv   []map[string]string // envs of toolbox requests
	bodies    []string            // raw request bodies (for secret checks)
	now       func() time.Time    // the billing clock (SetClock); time.Now by default
	stopHeld  chan string         // a held stop reached the fake (holdStop): the sandbox id
}

func newFake(t *testing.T, apiKey string) *fakeDaytona {
	f := &fakeDaytona{t: t, apiKey: apiKey, sandboxes: map[string]*fakeSandbox{}, snapshots: map[string]*fakeSnapshot{}, steps: 1, pageSize: 100,
		now: time.Now, stopHeld: make(chan string, 16)}
	f.val = newValidator(t, http.HandlerFunc(f.serve))
	f.srv = httptest.NewServer(f.val)
	t.Cleanup(f.srv.Close)
	return f
}

// URL is the API base URL to configure the provider with.
func (f *fakeDaytona) URL() string { return f.srv.URL + "/api" }

func (f *fakeDaytona) inject(ft fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, &ft)
}

// take returns the fault hitting r, if any, using up one of its hits.
func (f *fakeDaytona) take(method, path string) *fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, ft := range f.faults {
		if ft.method == method && strings.HasPrefix(path, ft.prefix) {
			if ft.times > 0 {
				if ft.times--; ft.times == 0 {
					f.faults = append(f.faults[:i], f.faults[i+1:]...)
				}
			}
			return ft
		}
	}
	return nil
}

// count returns how many requests matched method and path prefix.
func (f *fakeDaytona) count(method, prefix string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if strings.HasPrefix(c, method+" "+prefix) {
			n++
		}
	}
	return n
}

// total returns how many requests arrived.
func (f *fakeDaytona) total() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

// live returns the sandboxes not destroyed.
func (f *fakeDaytona) live() []*fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*fakeSandbox
	for _, sb := range f.sandboxes {
		if sb.State != "destroyed" && sb.Desired != "destroyed" {
			out = append(out, sb)
		}
	}
	return out
}

// set changes a sandbox's state directly (a test's stand-in for Daytona's own doing).
func (f *fakeDaytona) set(id, state string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.sandboxes[id]
	f.enter(sb, state)
	sb.to, sb.left = "", 0
	sb.Desired = desiredOf(state)
}

// billedRunning lists the states Daytona bills compute (CPU, memory) for: the sandbox's
// machine is up. Stopped and archived ones pay for their disk (archived: object storage)
// only.
var billedRunning = map[string]bool{"creating": true, "starting": true, "started": true, "stopping": true,
	"snapshotting": true, "resizing": true, "forking": true}

// enter moves sb to state on the billing clock (locked by the caller).
func (f *fakeDaytona) enter(sb *fakeSandbox, state string) {
	now := f.now()
	if !sb.runSince.IsZero() {
		sb.ran += now.Sub(sb.runSince)
		sb.runSince = time.Time{}
	}
	sb.State = state
	if billedRunning[state] {
		sb.runSince = now
	}
}

// SetClock replaces the billing clock (time.Now by default), so a test can let an hour
// pass in a moment; set it before the first sandbox is created.
func (f *fakeDaytona) SetClock(now func() time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = now
}

// RunningTime is how long sandbox id has been billed for compute, by the billing clock:
// the time it spent in a running state (billedRunning), up to now.
func (f *fakeDaytona) RunningTime(id string) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.runningTime(f.sandboxes[id])
}

// TotalRunningTime is RunningTime summed over every sandbox ever created.
func (f *fakeDaytona) TotalRunningTime() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var d time.Duration
	for _, sb := range f.sandboxes {
		d += f.runningTime(sb)
	}
	return d
}

func (f *fakeDaytona) runningTime(sb *fakeSandbox) time.Duration {
	if sb == nil {
		return 0
	}
	d := sb.ran
	if !sb.runSince.IsZero() {
		d += f.now().Sub(sb.runSince)
	}
	return d
}

// Count is how many requests reached the fake for method and a path prefix (after
// /api), e.g. Count("POST", "/sandbox/"+id+"/stop").
func (f *fakeDaytona) Count(method, prefix string) int { return f.count(method, "/api"+prefix) }

// holdStop holds the next stops of sandbox id mid-way: the sandbox stays "stopping"
// until release is called; each stop request that reaches it is announced on the
// returned channel (so a test can act while the stop is in progress).
func (f *fakeDaytona) holdStop(id string) (reached <-chan string, release func()) {
	f.mu.Lock()
	f.sandboxes[id].held = true
	f.mu.Unlock()
	return f.stopHeld, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.sandboxes[id].held = false
	}
}

func (f *fakeDaytona) state(id string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sandboxes[id].State
}

func (f *fakeDaytona) sandbox(id string) fakeSandbox {
	f.mu.Lock()
	defer f.mu.Unlock()
	return *f.sandboxes[id]
}

func desiredOf(state string) string {
	switch state {
	case "stopped", "stopping":
		return "stopped"
	case "archived", "archiving":
		return "archived"
	case "destroyed", "destroying":
		return "destroyed"
	}
	return "started"
}

func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"statusCode": status, "message": msg, "error": http.StatusText(status)})
}

func (f *fakeDaytona) sandboxJSON(sb *fakeSandbox) map[string]any {
	m := map[string]any{
		"id": sb.ID, "name": sb.Name, "organizationId": "org-test", "snapshot": sb.Snapshot, "user": "daytona",
		"env": map[string]string{}, "labels": sb.Labels, "public": false, "networkBlockAll": false, "target": "us",
		"cpu": 1, "gpu": 0, "memory": 1, "disk": 3, "state": sb.State, "desiredState": sb.Desired,
		"autoStopInterval": sb.AutoStop, "autoArchiveInterval": 10080, "autoDeleteInterval": -1,
		"createdAt": sb.Created.UTC().Format(time.RFC3339Nano), "updatedAt": sb.Created.UTC().Format(time.RFC3339Nano),
		"toolboxProxyUrl": f.srv.URL + "/toolbox",
	}
	if sb.ErrorReason != "" {
		m["errorReason"] = sb.ErrorReason
	}
	return m
}

func snapshotJSON(s *fakeSnapshot) map[string]any {
	now := time.Now().UTC().Format(time.RFC3339)
	return map[string]any{
		"id": s.ID, "name": s.Name, "organizationId": "org-test", "general": false, "imageName": s.Name, "state": s.State,
		"size": nil, "entrypoint": nil, "cpu": 1, "gpu": 0, "mem": 1, "disk": 3, "errorReason": nil,
		"createdAt": now, "updatedAt": now, "lastUsedAt": nil,
	}
}

// find returns the sandbox with id or name that is not destroyed (locked by the caller).
func (f *fakeDaytona) find(idOrName string) *fakeSandbox {
	if sb := f.sandboxes[idOrName]; sb != nil && sb.State != "destroyed" {
		return sb
	}
	for _, sb := range f.sandboxes {
		if sb.Name == idOrName && sb.State != "destroyed" {
			return sb
		}
	}
	return nil
}

// advance moves a transition one read forward (locked by the caller).
func (f *fakeDaytona) advance(sb *fakeSandbox) {
	if sb.to == "" || sb.held && sb.State == "stopping" {
		return
	}
	if sb.left--; sb.left <= 0 {
		prev := sb.State
		f.enter(sb, sb.to)
		sb.to = ""
		if prev == "snapshotting" {
			for _, s := range f.snapshots {
				if s.State == "pending" {
					s.left = 0
				}
			}
		}
	}
}

func (f *fakeDaytona) transition(sb *fakeSandbox, now, to string) {
	f.enter(sb, now)
	sb.to, sb.left = to, f.steps
	if to != "destroyed" {
		sb.Desired = desiredOf(to)
	}
}

func (f *fakeDaytona) serve(w http.ResponseWriter, r *http.Request) {
	var body bytes.Buffer
	_, _ = body.ReadFrom(r.Body)
	f.mu.Lock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path)
	f.bodies = append(f.bodies, body.String())
	f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+f.apiKey {
		writeErr(w, http.StatusUnauthorized, "Invalid credentials")
		return
	}
	path := r.URL.Path
	if ft := f.take(r.Method, strings.TrimPrefix(path, "/api")); ft != nil {
		if ft.after {
			f.route(httptest.NewRecorder(), r, path, body.Bytes())
		}
		if ft.hang {
			<-r.Context().Done()
			return
		}
		if ft.retryAfter != "" {
			w.Header().Set("Retry-After", ft.retryAfter)
		}
		writeErr(w, ft.status, cmpOr(ft.message, http.StatusText(ft.status)))
		return
	}
	f.route(w, r, path, body.Bytes())
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func (f *fakeDaytona) route(w http.ResponseWriter, r *http.Request, path string, body []byte) {
	if strings.HasPrefix(path, "/toolbox/") {
		f.toolbox(w, r, strings.TrimPrefix(path, "/toolbox/"), body)
		return
	}
	p := strings.Split(strings.Trim(strings.TrimPrefix(path, "/api"), "/"), "/")
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case len(p) == 1 && p[0] == "sandbox" && r.Method == http.MethodPost:
		f.create(w, body)
	case len(p) == 1 && p[0] == "sandbox" && r.Method == http.MethodGet:
		f.list(w, r)
	case len(p) == 2 && p[0] == "snapshots" && r.Method == http.MethodGet:
		for _, s := range f.snapshots {
			if s.Name == p[1] || s.ID == p[1] {
				if s.State == "pending" && s.left <= 0 {
					s.State = "active"
				}
				writeJSON(w, 200, snapshotJSON(s))
				return
			}
		}
		writeErr(w, 404, "Snapshot not found")
	case len(p) == 2 && p[0] == "snapshots" && r.Method == http.MethodDelete:
		for name, s := range f.snapshots {
			if s.ID == p[1] { // Daytona deletes by id only
				delete(f.snapshots, name)
				w.WriteHeader(200)
				return
			}
		}
		writeErr(w, 404, "Snapshot not found")
	case len(p) >= 2 && p[0] == "sandbox":
		sb := f.find(p[1])
		if sb == nil {
			writeErr(w, 404, fmt.Sprintf("Sandbox with ID or name %s not found", p[1]))
			return
		}
		f.sandboxOp(w, r, sb, p[2:], body)
	default:
		writeErr(w, 404, "no route")
	}
}

func (f *fakeDaytona) create(w http.ResponseWriter, body []byte) {
	var in struct {
		Name             string            `json:"name"`
		Snapshot         string            `json:"snapshot"`
		Labels           map[string]string `json:"labels"`
		AutoStopInterval *int              `json:"autoStopInterval"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		writeErr(w, 400, err.Error())
		return
	}
	if in.Name != "" && f.find(in.Name) != nil {
		writeErr(w, 409, fmt.Sprintf("Sandbox with name %s already exists", in.Name))
		return
	}
	if in.Snapshot != "" {
		s := (*fakeSnapshot)(nil)
		for _, x := range f.snapshots {
			if x.Name == in.Snapshot || x.ID == in.Snapshot {
				s = x
			}
		}
		if s == nil {
			writeErr(w, 400, fmt.Sprintf("Snapshot %s not found. Did you add it through the Daytona Dashboard?", in.Snapshot))
			return
		}
	}
	dir, err := os.MkdirTemp(f.t.TempDir(), "sb")
	if err != nil {
		writeErr(w, 500, err.Error())
		return
	}
	sb := &fakeSandbox{ID: newID(), Name: in.Name, Labels: in.Labels, AutoStop: 15, Snapshot: in.Snapshot, Created: f.now(), dir: dir}
	if sb.Labels == nil {
		sb.Labels = map[string]string{}
	}
	if in.AutoStopInterval != nil {
		sb.AutoStop = *in.AutoStopInterval
	}
	f.transition(sb, "creating", "started")
	f.sandboxes[sb.ID] = sb
	f.created++
	writeJSON(w, 200, f.sandboxJSON(sb))
}

func (f *fakeDaytona) list(w http.ResponseWriter, r *http.Request) {
	var want map[string]string
	if l := r.URL.Query().Get("labels"); l != "" {
		if err := json.Unmarshal([]byte(l), &want); err != nil {
			writeErr(w, 400, "labels: "+err.Error())
			return
		}
	}
	var all []*fakeSandbox
	for _, sb := range f.sandboxes {
		ok := sb.State != "destroyed"
		for k, v := range want {
			ok = ok && sb.Labels[k] == v
		}
		if ok {
			all = append(all, sb)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].ID < all[j].ID })
	start, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
	end := min(start+f.pageSize, len(all))
	items := []map[string]any{}
	for _, sb := range all[min(start, len(all)):end] {
		items = append(items, f.sandboxJSON(sb))
	}
	var next any
	if end < len(all) {
		next = strconv.Itoa(end)
	}
	writeJSON(w, 200, map[string]any{"items": items, "nextCursor": next})
}

func (f *fakeDaytona) sandboxOp(w http.ResponseWriter, r *http.Request, sb *fakeSandbox, rest []string, body []byte) {
	op := ""
	if len(rest) > 0 {
		op = rest[0]
	}
	switch {
	case op == "" && r.Method == http.MethodGet:
		f.advance(sb)
		if sb.State == "destroyed" {
			writeErr(w, 404, "Sandbox not found")
			return
		}
	case op == "" && r.Method == http.MethodDelete:
		if sb.to != "" && sb.to != "destroyed" {
			writeErr(w, 409, "Sandbox state change in progress")
			return
		}
		sb.Name = "DESTROYED_" + sb.Name + "_" + strconv.FormatInt(f.now().UnixNano(), 10)
		sb.Desired = "destroyed"
		f.transition(sb, "destroying", "destroyed")
	case op == "start" && r.Method == http.MethodPost:
		switch sb.State {
		case "started":
		case "stopped", "archived":
			f.transition(sb, "starting", "started")
		default:
			writeErr(w, 409, "Sandbox state change in progress")
			return
		}
	case op == "stop" && r.Method == http.MethodPost:
		switch {
		case sb.State == "started" && sb.to == "":
			f.transition(sb, "stopping", "stopped")
			if sb.held {
				f.stopHeld <- sb.ID
			}
		case sb.to != "":
			writeErr(w, 409, "Sandbox state change in progress")
			return
		default: // as Daytona: only a started sandbox can be stopped
			writeErr(w, 400, "Sandbox is not started")
			return
		}
	case op == "archive" && r.Method == http.MethodPost:
		if sb.State != "stopped" || sb.to != "" { // as Daytona: only a stopped sandbox is archived
			writeErr(w, 400, "Sandbox is not stopped")
			return
		}
		f.transition(sb, "archiving", "archived")
	case op == "autostop" && len(rest) == 2 && r.Method == http.MethodPost:
		n, err := strconv.Atoi(rest[1])
		if err != nil {
			writeErr(w, 400, "interval")
			return
		}
		sb.AutoStop = n
	case op == "snapshot" && r.Method == http.MethodPost:
		var in struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(body, &in)
		if sb.State != "started" && sb.State != "stopped" {
			writeErr(w, 400, "Sandbox must be in started or stopped state to create a snapshot")
			return
		}
		f.snapshots[in.Name] = &fakeSnapshot{ID: newID(), Name: in.Name, State: "pending", left: 1 << 30}
		f.transition(sb, "snapshotting", sb.State)
	default:
		writeErr(w, 404, "no route")
		return
	}
	if !documentedState[sb.State] {
		w.Header().Set(offContractHeader, "state "+sb.State)
	}
	writeJSON(w, 200, f.sandboxJSON(sb))
}

// documentedState lists the sandbox states the documents know.
var documentedState = map[string]bool{}

func init() {
	for _, s := range strings.Fields(`creating restoring destroyed destroying started stopped starting stopping error
		build_failed pending_build building_snapshot unknown pulling_snapshot archived archiving resizing snapshotting forking`) {
		documentedState[s] = true
	}
}

// toolbox serves /toolbox/{id}/process/execute by running the command with sh.
func (f *fakeDaytona) toolbox(w http.ResponseWriter, r *http.Request, rest string, body []byte) {
	id, op, _ := strings.Cut(rest, "/")
	f.mu.Lock()
	sb := f.sandboxes[id]
	var dir, state string
	if sb != nil {
		dir, state = sb.dir, sb.State
	}
	f.mu.Unlock()
	switch {
	case sb == nil || state == "destroyed":
		writeErr(w, 404, "sandbox not found")
		return
	case op != "process/execute" || r.Method != http.MethodPost:
		writeErr(w, 404, "no route")
		return
	case state != "started":
		writeErr(w, 400, "sandbox is not running")
		return
	}
	var in struct {
		Command string            `json:"command"`
		Envs    map[string]string `json:"envs"`
		Timeout int               `json:"timeout"`
	}
	if err := json.Unmarshal(body, &in); err != nil || strings.TrimSpace(in.Command) == "" {
		writeErr(w, 400, "invalid request body")
		return
	}
	f.mu.Lock()
	f.lastEnv = append(f.lastEnv, in.Envs)
	f.mu.Unlock()
	cmd := exec.Command("sh")
	cmd.Stdin = strings.NewReader(in.Command)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "TMPDIR=" + filepath.Join(dir)}
	for k, v := range in.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		writeJSON(w, 200, map[string]any{"exitCode": -1, "result": err.Error()})
		return
	}
	ctx := r.Context()
	if in.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(in.Timeout)*time.Second)
		defer cancel()
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	err := cmd.Wait()
	close(done)
	if ctx.Err() != nil {
		writeErr(w, http.StatusRequestTimeout, "command execution timeout")
		return
	}
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	writeJSON(w, 200, map[string]any{"exitCode": code, "result": out.String()})
}
