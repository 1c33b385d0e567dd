package contract

// MaxListLimit bounds one page of a run listing.
const MaxListLimit = 100

// RunFilter narrows a run listing; a zero field matches every run.
type RunFilter struct {
	ThreadID string    // "" = every thread of the tenant
	Status   RunStatus // "" = every status
}

// Matches reports whether st passes the filter.
func (f RunFilter) Matches(st RunRecord) bool {
	return (f.ThreadID == "" || st.ThreadID == f.ThreadID) && (f.Status == "" || st.Status == f.Status)
}

// RunPos is a position in a listing's order (startedAt, then runId, both descending).
type RunPos struct {
	StartedAt int64
	RunID     string
}

// Before reports whether a run at p comes after q in newest-first order.
func (p RunPos) Before(q RunPos) bool {
	if p.StartedAt != q.StartedAt {
		return p.StartedAt < q.StartedAt
	}
	return p.RunID < q.RunID
}

// PosOf returns the listing position of r.
func PosOf(r RunRecord) RunPos { return RunPos{StartedAt: r.StartedAt, RunID: r.RunID} }

// RunPage is one page of a run listing.
type RunPage struct {
	Runs []RunState // newest first
	// Next is where the following page starts (exclusive); nil when the listing is done. A
	// filtered page may hold fewer than limit runs (even none) and still have a Next.
	Next *RunPos
}

// CheckListing validates a listing's inputs (ErrInvalid naming the field).
func CheckListing(f RunFilter, after *RunPos, limit int) error {
	if f.ThreadID != "" {
		if err := CheckStoreID("threadId", f.ThreadID); err != nil {
			return err
		}
	}
	if f.Status != "" {
		if _, err := ParseRunStatus(string(f.Status)); err != nil {
			return err
		}
	}
	if after != nil {
		if after.StartedAt < 0 {
			return Invalid("after", "startedAt must not be negative")
		}
		if err := CheckStoreID("after", after.RunID); err != nil {
			return err
		}
	}
	if limit < 1 || limit > MaxListLimit {
		return Invalid("limit", "must be 1..%d", MaxListLimit)
	}
	return nil
}
