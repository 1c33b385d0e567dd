package apiclient

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
)

// runPath is /v1/runs/{runId}[/suffix] with the id escaped.
func runPath(runID, suffix string) string {
	p := "/v1/runs/" + url.PathEscape(runID)
	if suffix != "" {
		p += "/" + suffix
	}
	return p
}

// threadPath is /v1/threads/{threadId}/suffix with the id escaped.
func threadPath(threadID, suffix string) string {
	return "/v1/threads/" + url.PathEscape(threadID) + "/" + suffix
}

// Start starts (or takes over) a run and makes the caller its driver. Never repeated: a
// repeat could take the run over from the caller's own first answer.
func (c *Client) Start(ctx context.Context, req wire.StartRequest) (wire.StartResponse, error) {
	var out wire.StartResponse
	err := c.do(ctx, request{method: http.MethodPost, path: "/v1/runs", body: req, retry: once}, &out)
	return out, err
}

// Attach takes a running run over at a new driver epoch. Never repeated (each call is a
// new epoch).
func (c *Client) Attach(ctx context.Context, runID string) (wire.AttachResponse, error) {
	var out wire.AttachResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "attach"), body: wire.Empty{}, retry: once}, &out)
	return out, err
}

// PushTicket asks a JWT deployment for a push ticket of the caller's tenant and its push
// URL (docs/design.md §8.1); any other server answers 501 unsupported.
func (c *Client) PushTicket(ctx context.Context) (wire.PushTicketResponse, error) {
	var out wire.PushTicketResponse
	err := c.do(ctx, request{method: http.MethodPost, path: wire.PushTicketPath, body: wire.Empty{}, retry: safe}, &out)
	return out, err
}

// GetRun reads the run's record.
func (c *Client) GetRun(ctx context.Context, runID string) (contract.RunRecord, error) {
	var out wire.RunResponse
	err := c.do(ctx, request{method: http.MethodGet, path: runPath(runID, ""), retry: safe}, &out)
	return out.Run, err
}

// ViewRun returns the run as a viewer shows it, its sandbox's lifecycle included
// (GET /v1/runs/{runId}/view).
func (c *Client) ViewRun(ctx context.Context, runID string) (wire.RunView, error) {
	var out wire.RunViewResponse
	err := c.do(ctx, request{method: http.MethodGet, path: runPath(runID, "view"), retry: safe}, &out)
	return out.Run, err
}

// ActiveRun returns the thread's running run, or nil when the thread is idle.
func (c *Client) ActiveRun(ctx context.Context, threadID string) (*contract.RunRecord, error) {
	var out wire.ActiveRunResponse
	err := c.do(ctx, request{method: http.MethodGet, path: threadPath(threadID, "active-run"), retry: safe}, &out)
	return out.Run, err
}

// Snapshot snapshots the run's sandbox (label may be ""). Never repeated: a repeat would
// take a second snapshot.
func (c *Client) Snapshot(ctx context.Context, runID, cursor, label string) (wire.Sandbox, error) {
	req := wire.SnapshotRequest{Cursor: cursor}
	if label != "" {
		req.Label = &label
	}
	var out wire.SandboxResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "snapshot"), body: req, retry: once}, &out)
	return out.Sandbox, err
}

// Heartbeat extends the driver lease of the cursor's epoch and reports a cancel request.
func (c *Client) Heartbeat(ctx context.Context, runID, cursor string) (wire.HeartbeatResponse, error) {
	var out wire.HeartbeatResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "heartbeat"), body: wire.CursorRequest{Cursor: cursor}, retry: safe}, &out)
	return out, err
}

// Detach marks the run detached (its viewer left; the agent keeps running).
func (c *Client) Detach(ctx context.Context, runID, cursor string) (contract.RunRecord, error) {
	var out wire.RunResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "detach"), body: wire.CursorRequest{Cursor: cursor}, retry: safe}, &out)
	return out.Run, err
}

// Cancel asks the run's driver to stop (202); cancelling twice is cancelling once.
func (c *Client) Cancel(ctx context.Context, runID string) (contract.RunRecord, error) {
	var out wire.RunResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "cancel"), body: wire.Empty{}, retry: safe}, &out)
	return out.Run, err
}

// CancelThread cancels the thread's running run.
func (c *Client) CancelThread(ctx context.Context, threadID string) (contract.RunRecord, error) {
	var out wire.RunResponse
	err := c.do(ctx, request{method: http.MethodPost, path: threadPath(threadID, "cancel"), body: wire.Empty{}, retry: safe}, &out)
	return out.Run, err
}

// Append stores events at the cursor, fenced by its epoch. Never repeated here: a caller
// that lost the answer resumes from the log (its highest src), as a successor would.
func (c *Client) Append(ctx context.Context, runID string, req wire.AppendRequest) (wire.AppendResponse, error) {
	var out wire.AppendResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "events"), body: req, retry: once}, &out)
	return out, err
}

// ReadOptions selects a page of GET /v1/runs/{runId}/events.
type ReadOptions struct {
	After int64         // events with a larger offset (0 = from the start)
	Limit int           // at most this many (0 = the server's default, 100)
	Wait  time.Duration // long-poll up to this long when the open log has nothing new (≤ 20 s)
}

// ReadEvents reads the events after opts.After; Next is where the following page starts
// and Closed says the log is complete.
func (c *Client) ReadEvents(ctx context.Context, runID string, opts ReadOptions) (wire.ReadResponse, error) {
	q := url.Values{"after": {strconv.FormatInt(opts.After, 10)}}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Wait > 0 {
		q.Set("waitMs", strconv.FormatInt(min(opts.Wait.Milliseconds(), wire.MaxWaitMs), 10))
	}
	var out wire.ReadResponse
	err := c.do(ctx, request{method: http.MethodGet, path: runPath(runID, "events"), query: q, retry: safe}, &out)
	return out, err
}

// Finish writes the run's terminal (or interrupted) status at the cursor's epoch and
// closes the log. Repeated when safe: the server answers a repeat of a finish that landed
// at the same epoch with the run as it landed.
func (c *Client) Finish(ctx context.Context, runID string, req wire.FinishRequest) (contract.RunRecord, error) {
	var out wire.RunResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "finish"), body: req, retry: safe}, &out)
	return out.Run, err
}

// Agent launches the run's agent (shell text) in its sandbox under the journal wrapper,
// fenced by the cursor's epoch. Safe to repeat: a repeat, or a call once the run's journal
// exists, launches nothing and answers Launched false.
func (c *Client) Agent(ctx context.Context, runID string, req wire.AgentRequest) (wire.AgentResponse, error) {
	var out wire.AgentResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "agent"), body: req, retry: safe}, &out)
	return out, err
}

// Pump stores the journal's new lines as events fenced by the cursor's epoch, waiting up
// to req.WaitMs for new bytes. Safe to repeat: no line is stored twice.
func (c *Client) Pump(ctx context.Context, runID string, req wire.PumpRequest) (wire.PumpResponse, error) {
	var out wire.PumpResponse
	err := c.do(ctx, request{method: http.MethodPost, path: runPath(runID, "pump"), body: req, retry: safe}, &out)
	return out, err
}
