// Package proctest tells tests whether the processes an agent started still run.
//
// A killed process stays in the process table as a zombie until its parent reaps it, and
// kill(-pgid, 0) still finds it there; a process is counted here only while it runs, so a
// test measures when the kill took effect, not when some parent got round to reaping.
package proctest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// GroupLive reports whether any process of group pgid is alive (a zombie is not), per /proc.
func GroupLive(pgid int) bool {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	want := strconv.Itoa(pgid)
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited between the glob and the read
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')') // the command name may hold spaces and parentheses
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // f[0] state, f[1] ppid, f[2] pgrp
		if len(f) > 2 && f[2] == want && f[0] != "Z" {
			return true
		}
	}
	return false
}

// WaitGroupGone polls until group pgid has no live process, failing the test after within.
func WaitGroupGone(t testing.TB, pgid int, within time.Duration, what string) {
	t.Helper()
	for deadline := time.Now().Add(within); GroupLive(pgid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (process group %d) still has a live process after %v", what, pgid, within)
		}
	}
}

// GroupOf answers the process group of a running pid, and false if there is no such process.
func GroupOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	i := strings.LastIndexByte(string(b), ')')
	if err != nil || i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 3 || f[0] == "Z" {
		return 0, false
	}
	pg, err := strconv.Atoi(f[2])
	return pg, err == nil
}
