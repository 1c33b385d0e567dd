package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/testkit/dynamotest"
)

// TestBenchCommandTiny runs `sandkeep bench` on a tiny config against dynalite and checks
// the report has every section (no timing is asserted). Every section is sized down here:
// a default (the push section's 1000 watchers, its 10 s idle windows) costs minutes.
func TestBenchCommandTiny(t *testing.T) {
	t.Parallel()
	ep := dynamotest.Endpoint(t)
	var out, progress bytes.Buffer
	err := runBench(t.Context(), []string{"--dynamodb-endpoint", ep, "--ops", "2", "--warmup", "0",
		"--contention", "4", "--reap", "6", "--reap-batch", "4", "--append-bytes", "200",
		"--deliveries", "2", "--agent-lines", "3", "--agent-silent", "1s",
		"--push-lines", "3", "--push-watchers", "10", "--push-idle", "500ms",
		"--ship-lines", "3", "--ship-chatty", "20", "--ship-silent", "500ms", "--ship-launches", "1"}, &out, &progress)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, progress.String())
	}
	md := out.String()
	for _, want := range []string{
		"| start, sandbox resumed | 2 |", "| finish | 2 |", "| UpdateItem (conditional) | 2 |",
		"### docs/design.md §11 start check", "4 concurrent starts", "| 4 | 1 | 1 | 0 | yes |",
		"Reaper: 6 detached runs", "| 6 | 4 | 2 | yes | 6 | 6 | 6 | expired 6 |", "one 200-byte event",
		"### Agent delivery", "| memory | 3 |", "| dynalite | 3 |", "### Push: agent line",
		"### Shipper (docs/design.md §8.2)", "| stored by A", "| chatty | 20 |", "### Push, deployed path (docs/design.md §8.1)", "| agent line → post received | 3 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if !strings.Contains(progress.String(), "(0 warm-up + 2 measured") {
		t.Errorf("--warmup 0 still warmed up: %q", progress.String())
	}
}

// TestBenchCommandSkipsAndRejects: 0 skips a section; a missing endpoint or a stray
// argument is an error before anything runs.
func TestBenchCommandSkipsAndRejects(t *testing.T) {
	t.Parallel()
	var out, progress bytes.Buffer
	for name, args := range map[string][]string{
		"no endpoint": {"--ops", "1"},
		"stray arg":   {"--dynamodb-endpoint", "http://127.0.0.1:1", "extra"},
		"zero ops":    {"--dynamodb-endpoint", "http://127.0.0.1:1", "--ops", "0"},
		"bad flag":    {"--no-such-flag"},
	} {
		if err := runBench(t.Context(), args, &out, &progress); err == nil {
			t.Errorf("%s: accepted %q", name, args)
		}
	}
	ep := dynamotest.Endpoint(t)
	out.Reset()
	err := runBench(t.Context(), []string{"--dynamodb-endpoint", ep, "--ops", "1", "--warmup", "0", "--contention", "0", "--reap", "0",
		"--deliveries", "0", "--agent-lines", "0", "--push-lines", "0", "--ship-lines", "0"}, &out, &progress)
	if err != nil {
		t.Fatal(err)
	}
	if md := out.String(); !strings.Contains(md, "### Concurrent starts\n\nskipped") || !strings.Contains(md, "### Reaper\n\nskipped") {
		t.Errorf("--contention 0 --reap 0 did not skip both sections:\n%s", md)
	}
	if md := out.String(); strings.Contains(md, "### Agent delivery") || strings.Contains(md, "### Shipper") || strings.Contains(md, "### Push") {
		t.Errorf("--agent-lines 0 --push-lines 0 --ship-lines 0 did not skip those sections:\n%s", md)
	}
	if md := out.String(); strings.Contains(md, "### Push") {
		t.Errorf("--push-lines 0 did not skip the push section:\n%s", md)
	}
}
