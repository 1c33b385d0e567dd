package journal

import (
	"context"
	"fmt"

	"github.com/sandkeep/sandkeep/shared/contract"
)

// Exists reports whether ctx's tenant's run runID has a journal in the sandbox: the
// launch script creates it before anything else, so none means no agent ever started
// there (docs/design.md §4.2, the launch deadline).
func Exists(ctx context.Context, ex contract.Executor, psid, dir, runID string) (bool, error) {
	p, err := PathsIn(ctx, ex, dir, runID)
	if err != nil {
		return false, err
	}
	res, err := ex.Exec(ctx, psid, "test -e "+Quote(p.Journal))
	if err != nil {
		return false, fmt.Errorf("journal: is there one for %s: %w", runID, err)
	}
	return res.ExitCode == 0, nil
}
