package bench

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/ops/reaper"
)

// Markdown writes the report as Markdown tables (the format of docs/bench.md).
func (r *Report) Markdown(w io.Writer) error {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "## sandkeep bench, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(&b, "- engine: DynamoDB API at `%s`, fresh tables, one SDK client (call counter attached) for everything\n", r.Endpoint)
	fmt.Fprintf(&b, "- machine: `%s`, %s, %d CPUs, %s %s/%s; load average (1 min) %s at the start, %s at the end\n",
		m.Host, orDash(m.CPU), m.CPUs, m.GoVersion, m.OS, m.Arch, orDash(m.LoadStart), orDash(m.LoadEnd))
	fmt.Fprintf(&b, "- iterations: %d measured after %d warm-up; append: one %d-byte event; whole run %s\n\n",
		r.Config.Ops, r.Config.Warmup, r.Config.AppendBytes, r.Elapsed.Round(100*time.Millisecond))

	b.WriteString("### Operations (keeper over dynamostore)\n\n")
	b.WriteString("| operation | n | p50 ms | p99 ms | DynamoDB calls / op | calls by API / op | docs/design.md §11 budget | within |\n")
	b.WriteString("|---|---:|---:|---:|---:|---|---:|---|\n")
	for _, o := range r.Ops {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", o.Name, o.N(), ms(o.Percentile(50)), ms(o.Percentile(99)),
			callsCell(o), byAPICell(o.ByAPI, o.N()), budgetCell(o), yesNo(o.WithinBudget()))
	}
	notes := []string{}
	for _, o := range r.Ops {
		if o.Note != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", o.Name, o.Note))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(&b, "\n(%s.)\n", strings.Join(notes, "; "))
	}

	b.WriteString("\n### Bare calls (same client, same run, a throwaway item)\n\n")
	b.WriteString("| call | n | p50 ms | p99 ms | DynamoDB calls |\n|---|---:|---:|---:|---:|\n")
	for _, o := range r.Bare {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", o.Name, o.N(), ms(o.Percentile(50)), ms(o.Percentile(99)), callsCell(o))
	}

	c := r.StartCheck
	b.WriteString("\n### docs/design.md §11 start check\n\n")
	fmt.Fprintf(&b, "start (resumed) p50 = %s ms; bound = 1.3 × (max(PutItem p50 %s, GetItem p50 %s) + UpdateItem p50 %s) + 0.5 = %s ms; "+
		"ratio %.2f; **%s**\n", ms(c.Start), ms(c.Put), ms(c.Get), ms(c.Update), ms(c.Bound), c.Ratio, holds(c.Holds))
	if c.Path > 0 {
		fmt.Fprintf(&b, "\nDiagnostic (not docs/design.md §11's formula): against the bare calls issued in the start's own pattern "+
			"(%s, p50 %s ms), 1.3 × %s + 0.5 = %s ms; ratio %.2f; %s.\n",
			BarePath, ms(c.Path), ms(c.Path), ms(c.PathBound), c.PathRatio, holds(c.PathHolds))
	}
	if len(r.StartSplit) > 0 {
		b.WriteString("\nWhere a resumed start's time goes (each call timed inside the SDK, like the bare calls):\n\n")
		b.WriteString("| part of start (resumed) | n | p50 ms | p99 ms |\n|---|---:|---:|---:|\n")
		for _, o := range r.StartSplit {
			fmt.Fprintf(&b, "| %s | %d | %s | %s |\n", o.Name, o.N(), ms(o.Percentile(50)), ms(o.Percentile(99)))
		}
	}

	if ct := r.Contention; ct != nil {
		fmt.Fprintf(&b, "\n### %d concurrent starts on one new thread (counting provider: every Create mints a fresh id)\n\n", ct.Starts)
		b.WriteString("| starts | creates | distinct ids | destroys | row names the id | outcomes | queued on the lock | DynamoDB calls (all starts) | wall ms | start p50 / p99 ms | 1 create, equal ids, 0 destroys |\n")
		b.WriteString("|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|\n")
		fmt.Fprintf(&b, "| %d | %d | %d | %d | %s | %s | %d | %d (%s) | %s | %s / %s | **%s** |\n", ct.Starts, ct.Creates, ct.DistinctIDs,
			ct.Destroys, yesNo(ct.RowMatches), outcomesCell(ct.Outcomes), ct.LockEntries, ct.Calls, byAPICell(ct.ByAPI, 1),
			ms(ct.Wall), ms(ct.Start.Percentile(50)), ms(ct.Start.Percentile(99)), holds(ct.Holds))
	} else {
		b.WriteString("\n### Concurrent starts\n\nskipped\n")
	}

	if rp := r.Reap; rp != nil {
		fmt.Fprintf(&b, "\n### Reaper: %d detached runs past the TTL, repeated sweeps until drained\n\n", rp.Runs)
		b.WriteString("| runs | maxRuns | acting sweeps | drained | reaped | aborted (read back) | destroys | outcomes | DynamoDB calls | calls / reaped run | net of a sweep's fixed cost | empty sweep | ScannedCount | wall s | sweep p50 / p99 ms |\n")
		b.WriteString("|---:|---:|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|\n")
		fmt.Fprintf(&b, "| %d | %d | %d | %s | %d | %d | %d | %s | %d | %.2f | %.2f | %d | %d | %.1f | %s / %s |\n",
			rp.Runs, rp.Batch, rp.Sweeps, yesNo(rp.Drained), rp.Reaped, rp.Aborted, rp.Destroys, reapOutcomesCell(rp.Outcomes),
			rp.Calls, rp.PerRun(), rp.PerRunNet(), rp.EmptySweep, rp.Scanned, rp.Wall.Seconds(),
			ms(rp.Sweep.Percentile(50)), ms(rp.Sweep.Percentile(99)))
		fmt.Fprintf(&b, "\nCalls by API per reaped run: %s. Setup (%d runs written directly: row, create-claimed, detach) took %s, not counted.\n",
			byAPICell(rp.ByAPI, rp.Reaped), rp.Runs, rp.Setup.Round(100*time.Millisecond))
	} else {
		b.WriteString("\n### Reaper\n\nskipped\n")
	}
	if len(r.Delivery) > 0 {
		b.WriteString("\n### Long-poll delivery (GET /v1/runs/{runId}/events?waitMs=20000 over HTTP; one event appended 0.1–1.1 s after the GET)\n\n")
		b.WriteString("| backend | n | delivery p50 ms | delivery p99 ms | reader's DynamoDB reads / delivery | reads per second of waiting |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|\n")
		for _, d := range r.Delivery {
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %.2f |\n", d.Backend, d.Delay.N(), ms(d.Delay.Percentile(50)),
				ms(d.Delay.Percentile(99)), callsCell(d.Delay), d.ReadsPerSecond())
		}
		b.WriteString("\n(delivery: from the append's start to the reader holding the page; the reader and the writer share one process and one keeper. " +
			"Reads per second of waiting: all the reader's reads over its whole wait, including the 3 its first, empty read and the run's resolution cost; " +
			"a wait that stays idle costs 4 per second on DynamoDB, counted by shared/api/httpapi's TestIdleLongPollReads.)\n")
	} else {
		b.WriteString("\n### Long-poll delivery\n\nskipped\n")
	}
	markdownAgentDelivery(&b, r.AgentDelivery)
	markdownPush(&b, r.Push)
	markdownShip(&b, r.Ship)
	_, err := io.WriteString(w, b.String())
	return err
}

// ms renders d in milliseconds with two decimals.
func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

func callsCell(o *OpStats) string {
	lo, hi := o.CallsRange()
	if lo == hi {
		return strconv.Itoa(lo)
	}
	return fmt.Sprintf("%.2f (%d–%d)", o.CallsMean(), lo, hi)
}

// byAPICell renders calls per API divided by n, e.g. "GetItem 1, PutItem 1".
func byAPICell(by map[string]int, n int) string {
	if n == 0 || len(by) == 0 {
		return "–"
	}
	apis := make([]string, 0, len(by))
	for api := range by {
		apis = append(apis, api)
	}
	slices.Sort(apis)
	parts := make([]string, 0, len(apis))
	for _, api := range apis {
		parts = append(parts, api+" "+num(float64(by[api])/float64(n)))
	}
	return strings.Join(parts, ", ")
}

// num renders f with at most two decimals and no trailing zeros.
func num(f float64) string {
	s := strconv.FormatFloat(f, 'f', 2, 64)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func budgetCell(o *OpStats) string {
	switch {
	case o.Budget == 0:
		return "–"
	case o.Exact:
		return strconv.Itoa(o.Budget)
	}
	return "≤ " + strconv.Itoa(o.Budget)
}

func outcomesCell(m map[keeper.Outcome]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, string(k))
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[keeper.Outcome(k)]))
	}
	return strings.Join(parts, ", ")
}

func reapOutcomesCell(m map[reaper.Outcome]int) string {
	var parts []string
	for _, o := range reaper.AllOutcomes {
		if m[o] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", o, m[o]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func holds(ok bool) string {
	if ok {
		return "holds"
	}
	return "does not hold"
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}
