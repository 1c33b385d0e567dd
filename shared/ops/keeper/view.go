package keeper

import (
	"context"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Sandbox states a viewer sees (ViewSandbox.State).
const (
	SandboxLive       = "live"       // the instance row names the run's sandbox
	SandboxReclaiming = "reclaiming" // the row carries a pending reclaim
	SandboxGone       = "gone"       // no row, or the row names another sandbox
)

// ViewSandbox is the sandbox a listed run uses, as its instance row tells it now.
type ViewSandbox struct {
	Key               string `json:"key"`
	Provider          string `json:"provider,omitempty"`          // "" when the row is gone
	ProviderSandboxID string `json:"providerSandboxId,omitempty"` // the run's, else the row's
	State             string `json:"state"`                       // SandboxLive, SandboxReclaiming or SandboxGone
	// Lifecycle is what the sandbox costs now (docs/design.md §5): running, stopping,
	// stopped, archived or gone, since LifecycleSince (epoch ms; 0 when unknown: no row).
	Lifecycle      string `json:"lifecycle"`
	LifecycleSince int64  `json:"lifecycleSince,omitempty"`
}

// The lifecycle states a viewer sees (ViewSandbox.Lifecycle); archived is a provider's
// cold storage (the idle stop's probe found it so), which a start resumes like a stopped
// sandbox.
const (
	LifecycleRunning  = "running"
	LifecycleStopping = contract.LifecycleStopping
	LifecycleStopped  = contract.LifecycleStopped
	LifecycleArchived = contract.LifecycleArchived
	LifecycleGone     = contract.LifecycleGone
)

// RunView is a run as a viewer shows it: the record, the driver lease and the sandbox.
type RunView struct {
	contract.RunRecord
	LeaseUntil int64        `json:"leaseUntil,omitempty"` // end of the driver lease (ms); 0 = never leased
	Lapsed     bool         `json:"lapsed,omitempty"`     // the reaper stamped detachedSince from a lapsed lease
	Sandbox    *ViewSandbox `json:"sandbox,omitempty"`    // nil: the run names no sandbox
}

// RunViewPage is one page of ListRuns.
type RunViewPage struct {
	Runs []RunView
	Next *contract.RunPos // nil: no more
}

// ListRuns returns a page of the tenant's runs for display (contract.RunLister), each with
// its sandbox as the instance rows tell it now (one batch read per page when the backend
// offers contract.RowsReader). A backend without a lister is ErrUnsupported.
func (k *Keeper) ListRuns(ctx context.Context, f contract.RunFilter, after *contract.RunPos, limit int) (RunViewPage, error) {
	l, ok := k.st.RunLister()
	if !ok {
		return RunViewPage{}, fmt.Errorf("keeper: list runs: %w: the run store offers no listing", ErrUnsupported)
	}
	if err := contract.CheckListing(f, after, limit); err != nil {
		return RunViewPage{}, err
	}
	page, err := l.ListRuns(ctx, f, after, limit)
	if err != nil {
		return RunViewPage{}, fmt.Errorf("keeper: list runs: %w", err)
	}
	views, err := k.views(ctx, page.Runs)
	if err != nil {
		return RunViewPage{}, err
	}
	return RunViewPage{Runs: views, Next: page.Next}, nil
}

// View returns one run for display (consistent read); unknown is ErrUnknownRun.
func (k *Keeper) View(ctx context.Context, runID string) (RunView, error) {
	st, err := k.st.Runs().State(ctx, runID)
	if err != nil {
		return RunView{}, fmt.Errorf("keeper: view run: %w", err)
	}
	if st == nil {
		return RunView{}, fmt.Errorf("keeper: view run %q: %w", runID, contract.ErrUnknownRun)
	}
	views, err := k.views(ctx, []contract.RunState{*st})
	if err != nil {
		return RunView{}, err
	}
	return views[0], nil
}

// views joins runs with the instance rows of their sandbox keys.
func (k *Keeper) views(ctx context.Context, runs []contract.RunState) ([]RunView, error) {
	var keys []string
	seen := map[string]bool{}
	for _, r := range runs {
		if r.SandboxKey != nil && !seen[*r.SandboxKey] {
			seen[*r.SandboxKey] = true
			keys = append(keys, *r.SandboxKey)
		}
	}
	rows, err := k.rows(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("keeper: list runs: instance rows: %w", err)
	}
	out := make([]RunView, 0, len(runs))
	for _, r := range runs {
		v := RunView{RunRecord: r.RunRecord, LeaseUntil: r.LeaseUntil, Lapsed: r.Lapsed}
		if r.SandboxKey != nil {
			row := rows[*r.SandboxKey]
			sb := &ViewSandbox{Key: *r.SandboxKey, ProviderSandboxID: r.ProviderSandboxID, State: SandboxGone, Lifecycle: LifecycleGone}
			if row != nil && (r.ProviderSandboxID == "" || row.ProviderSandboxID == r.ProviderSandboxID) {
				sb.Provider, sb.ProviderSandboxID, sb.State = row.Provider, row.ProviderSandboxID, SandboxLive
				sb.Lifecycle, sb.LifecycleSince = row.Lifecycle, row.LifecycleSince
				if sb.Lifecycle == contract.LifecycleRunning {
					sb.Lifecycle = LifecycleRunning
				}
				if row.Reclaiming != "" {
					sb.State = SandboxReclaiming
				}
			}
			v.Sandbox = sb
		}
		out = append(out, v)
	}
	return out, nil
}

// rows reads the instance rows of keys: one batch when the backend offers RowsReader.
func (k *Keeper) rows(ctx context.Context, keys []string) (map[string]*contract.InstanceRow, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if rr, ok := k.st.RowsReader(); ok {
		return rr.GetRows(ctx, keys)
	}
	out := map[string]*contract.InstanceRow{}
	for _, key := range keys {
		row, err := k.st.Instances().GetRow(ctx, key)
		if err != nil {
			return nil, err
		}
		if row != nil {
			out[key] = row
		}
	}
	return out, nil
}
