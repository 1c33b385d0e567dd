package daytona_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/host/journal"
)

// TestStartKillImmediately kills each group right after Start returns: the id must name
// an existing group by then (the dangerous path of a cancel racing a launch).
func TestStartKillImmediately(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := ctxFor(t)
	id := mustCreate(t, p, "sk_race")
	const rounds = 5
	killed := 0
	for i := 0; i < rounds; i++ {
		pgid, err := p.Start(ctx, id, "sleep 300")
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Kill(ctx, id, pgid); err != nil {
			t.Fatal(err)
		}
		waitDead(t, pgid)
		killed++
	}
	if killed != rounds {
		t.Fatalf("killed %d of %d", killed, rounds)
	}
}

// waitDead polls /proc (bounded) until pid is gone or a zombie.
func waitDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, _ := procState(t, pid); st == "" || st == "Z" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d survived Kill", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJournalOverDaytona runs the docs/design.md §6 journal launcher, reader and probe through the
// Daytona executor: the pid file names the group Start returned, bytes round-trip, and
// KillAgent ends the agent.
func TestJournalOverDaytona(t *testing.T) {
	f := newFake(t, testKey)
	p, _ := newProvider(t, f)
	ctx := contract.WithTenant(ctxFor(t), "") // the journal is named for its tenant: "" here
	id := mustCreate(t, p, "sk_journal")
	dir := filepath.Join(f.sandbox(id).dir, "runs")

	pgid, err := journal.Launch(ctx, p, id, dir, "run/1", `printf '{"a":1}\n'; printf 'caf\303\251\n'; exit 3`)
	if err != nil {
		t.Fatal(err)
	}
	// The launcher writes its pid file asynchronously: poll it (bounded).
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, found, err := journal.PID(ctx, p, id, dir, "run/1")
		if err != nil {
			t.Fatal(err)
		}
		if found {
			if got != pgid {
				t.Fatalf("pid file %d, want the group %d Start returned", got, pgid)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no pid file")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var pr journal.ProbeResult
	for {
		if pr = journal.Probe(ctx, p, id, dir, "run/1"); pr.State == journal.Finished || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if pr.State != journal.Finished || pr.ExitCode != 3 {
		t.Fatalf("probe: %+v", pr)
	}
	if _, err := journal.Launch(ctx, p, id, dir, "run/1", "true"); err == nil {
		t.Fatal("a second launch of the same run was accepted")
	}

	pgid2, err := journal.Launch(ctx, p, id, dir, "run-2", "sleep 300")
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for { // KillAgent needs the pid file the launcher writes asynchronously
		if _, found, _ := journal.PID(ctx, p, id, dir, "run-2"); found || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := journal.KillAgent(ctx, p, id, dir, "run-2"); err != nil {
		t.Fatal(err)
	}
	waitDead(t, pgid2)
}
