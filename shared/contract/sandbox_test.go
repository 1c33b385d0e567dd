package contract

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestParseRunStatusExact(t *testing.T) {
	for _, s := range []string{"running", "interrupted", "completed", "failed", "aborted"} {
		st, err := ParseRunStatus(s)
		if err != nil || string(st) != s {
			t.Errorf("ParseRunStatus(%q) = %q, %v", s, st, err)
		}
	}
	for _, s := range []string{"", "Running", "RUNNING", " running", "done", "cancelled"} {
		if _, err := ParseRunStatus(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseRunStatus(%q) err = %v, want ErrInvalid", s, err)
		}
	}
	terminal := map[RunStatus]bool{StatusCompleted: true, StatusFailed: true, StatusAborted: true}
	for _, s := range []RunStatus{StatusRunning, StatusInterrupted, StatusCompleted, StatusFailed, StatusAborted} {
		if s.Terminal() != terminal[s] {
			t.Errorf("%s.Terminal() = %v", s, s.Terminal())
		}
	}
}

func TestFieldJSON(t *testing.T) {
	var p RunPatch
	in := `{"status":"completed","finishedAt":5,"error":null,"cancelRequested":false,"usage":{"tokens":[1,2]}}`
	if err := json.Unmarshal([]byte(in), &p); err != nil {
		t.Fatal(err)
	}
	if st, ok := p.Status.Value(); !ok || st != StatusCompleted {
		t.Errorf("status = %v %v", st, ok)
	}
	if !p.Error.IsClear() {
		t.Error("null must clear error")
	}
	if v, ok := p.CancelRequested.Value(); !ok || v {
		t.Error("false must be set, not left alone")
	}
	if !p.SandboxKey.IsZero() || !p.DriverEpoch.IsZero() {
		t.Error("absent keys must be left alone")
	}
	out, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var back RunPatch
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatal(err)
	}
	out2, _ := json.Marshal(back)
	if string(out) != string(out2) || strings.Contains(string(out), "sandboxKey") {
		t.Errorf("round trip %s != %s", out, out2)
	}
	if !strings.Contains(string(out), `"error":null`) {
		t.Errorf("clear must encode as null: %s", out)
	}
}

func TestPatchApplyAndCheck(t *testing.T) {
	key, det, epoch, yes := "k", int64(7), int64(2), true
	r := RunRecord{RunID: "r", Status: StatusRunning, StartedAt: 1, SandboxKey: &key, DetachedSince: &det, DriverEpoch: &epoch, CancelRequested: &yes}
	p := RunPatch{SandboxKey: Clear[string](), DetachedSince: Clear[int64](), CancelRequested: Clear[bool](), DriverEpoch: Clear[int64]()}
	got := p.ApplyTo(r)
	if got.SandboxKey != nil || got.DetachedSince != nil || got.CancelRequested != nil || got.DriverEpoch != nil {
		t.Fatalf("clear-all left %+v", got)
	}
	if got.Status != StatusRunning || got.StartedAt != 1 || r.SandboxKey == nil {
		t.Fatalf("clear-all changed other fields or the input: %+v", got)
	}
	if !(RunPatch{}).Empty() || p.Empty() {
		t.Fatal("Empty is wrong")
	}
	if err := (RunPatch{Status: Clear[RunStatus]()}).Check(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("clearing status: %v", err)
	}
	if err := (RunPatch{Status: Set(RunStatus("nope"))}).Check(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("unknown status: %v", err)
	}
}

func TestTenantAndIDs(t *testing.T) {
	for _, ok := range []string{"", "acme", "a.b_c-9", strings.Repeat("x", 64)} {
		if err := CheckTenant(ok); err != nil {
			t.Errorf("CheckTenant(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"a#b", "a|b", "é", strings.Repeat("x", 65), "a b"} {
		if err := CheckTenant(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckTenant(%q) = %v", bad, err)
		}
	}
	ctx := WithTenant(context.Background(), "a#b")
	if _, err := Tenant(ctx); !errors.Is(err, ErrInvalid) {
		t.Errorf("Tenant(a#b) = %v", err)
	}
	// A forgotten tenant is an error, never the empty tenant; "" is chosen explicitly.
	if got, err := Tenant(context.Background()); !errors.Is(err, ErrNoTenant) || errors.Is(err, ErrInvalid) || got != "" {
		t.Errorf("Tenant(no tenant) = %q, %v; want ErrNoTenant (not ErrInvalid)", got, err)
	}
	if got, err := Tenant(WithTenant(context.Background(), "")); err != nil || got != "" {
		t.Errorf("Tenant(explicit \"\") = %q, %v", got, err)
	}
	for _, bad := range []string{"", "a/b", "a b", strings.Repeat("x", 257), "a#b", ".", ".."} {
		if err := CheckID("runId", bad); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "runId") {
			t.Errorf("CheckID(%q) = %v", bad, err)
		}
	}
	if err := CheckID("runId", "run:1.a_b-C"); err != nil {
		t.Error(err)
	}
}

func TestSplitEventsDeterministic(t *testing.T) {
	big := json.RawMessage(`"` + strings.Repeat("x", 128<<10) + `"`)
	var evs []Event
	for i := range 8 {
		evs = append(evs, Event{Src: int64(i + 1), Data: big})
	}
	a, b := SplitEvents(evs), SplitEvents(evs)
	if len(a) < 3 || len(a) != len(b) {
		t.Fatalf("split into %d / %d chunks", len(a), len(b))
	}
	n := 0
	for i, c := range a {
		size := 0
		for _, e := range c {
			size += len(e.Data) + eventOverhead
		}
		if size > MaxItemBytes || len(c) != len(b[i]) {
			t.Fatalf("chunk %d: %d bytes, %d events", i, size, len(c))
		}
		n += len(c)
	}
	if n != 8 {
		t.Fatalf("split lost events: %d", n)
	}
	if d1, again := BatchDigest(1, evs), BatchDigest(1, slices.Clone(evs)); d1 == BatchDigest(2, evs) || d1 != again {
		t.Fatal("digest must depend on epoch and be stable")
	}
	if err := CheckEvents([]Event{{Data: json.RawMessage(`"` + strings.Repeat("x", MaxEventBytes) + `"`)}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("oversize event: %v", err)
	}
}

func TestReclaimAt(t *testing.T) {
	det, yes := int64(50), true
	base := RunState{RunRecord: RunRecord{Status: StatusRunning, StartedAt: 10}}
	if at, ok := ReclaimAt(base, 60); !ok || at != 120 {
		t.Errorf("never leased: %d %v, want startedAt + lease 70 rounded up to a whole lease, 120", at, ok)
	}
	base.LeaseUntil = 99
	if at, _ := ReclaimAt(base, 60); at != 120 {
		t.Errorf("leased: %d, want the lease end 99 rounded up to a whole lease, 120", at)
	}
	base.LaunchBy = 98
	if at, _ := ReclaimAt(base, 60); at != 98 {
		t.Errorf("launch deadline before the lease: %d, want launchBy 98 as it is", at)
	}
	base.LaunchBy = 0
	base.DetachedSince = &det
	if at, _ := ReclaimAt(base, 60); at != 50 {
		t.Errorf("detached: %d, want detachedSince as it is", at)
	}
	base.CancelRequested = &yes
	if at, _ := ReclaimAt(base, 60); at != 0 {
		t.Errorf("cancelled: %d", at)
	}
	base.Status = StatusInterrupted
	if _, ok := ReclaimAt(base, 60); ok {
		t.Error("interrupted runs are never reaped")
	}
}

// TestLeaseReclaimAt: a lease end rounds up to the next whole driver lease, never down, so
// every lease ending inside one step shares its reclaimAt and the one past it moves it.
func TestLeaseReclaimAt(t *testing.T) {
	const s = DefaultDriverLease
	for _, c := range []struct{ end, lease, want int64 }{
		{0, s, 0}, {1, s, s}, {s - 1, s, s}, {s, s, s}, {s + 1, s, 2 * s}, {2*s - 1, s, 2 * s},
		{1_800_000_000_001, s, 1_800_000_060_000}, // an epoch-ms lease
		{1_800_000_000_001, 3000, 1_800_000_003_000},
		{-1, s, 0}, {-s - 1, s, -s},
		{math.MaxInt64 - math.MaxInt64%s, s, math.MaxInt64 - math.MaxInt64%s}, {math.MaxInt64, s, math.MaxInt64}, // saturates
		{12_345, 0, 12_345}, {12_345, -1, 12_345}, // no lease: as it is
	} {
		got := LeaseReclaimAt(c.end, c.lease)
		if got != c.want {
			t.Errorf("LeaseReclaimAt(%d, %d) = %d, want %d", c.end, c.lease, got, c.want)
		}
		if got < c.end {
			t.Errorf("LeaseReclaimAt(%d, %d) = %d lies before the lease end", c.end, c.lease, got)
		}
	}
}

func TestCheckEnv(t *testing.T) {
	if err := CheckEnv(map[string]string{"TOKEN": "x", "_a1": "", "B_2": "multi\nline"}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []map[string]string{{"": "x"}, {"1A": "x"}, {"A=B": "x"}, {"A.B": "x"}, {"A": "nul\x00"}} {
		if err := CheckEnv(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("CheckEnv(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
