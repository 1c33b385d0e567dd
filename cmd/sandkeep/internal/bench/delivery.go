package bench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"time"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/dynamostore"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// Long-poll delivery: the reader's wait and the spread of the writer's append moments.
const (
	deliveryWaitMs   = 20_000                 // the reader's waitMs (the route's maximum)
	deliveryMinPause = 100 * time.Millisecond // the append comes this long after the GET at least
	deliverySpread   = time.Second            // ... plus a uniform random part of this
)

// Delivery is one backend's long-poll delivery: a reader waits on
// GET /v1/runs/{runId}/events?after=…&waitMs=20000 through the HTTP API while a writer in
// the same process appends one event at a random moment 0.1–1.1 s after the GET.
type Delivery struct {
	Backend string   // "memory" or "dynalite"
	Delay   *OpStats // append start → the reader has the page; Calls: the reader's DynamoDB reads
	Waited  time.Duration
	Reads   int // DynamoDB reads of the readers over all samples (0 on memory)
}

// ReadsPerSecond is the readers' DynamoDB reads per second of their whole wait.
func (d *Delivery) ReadsPerSecond() float64 {
	if d.Waited <= 0 {
		return 0
	}
	return float64(d.Reads) / d.Waited.Seconds()
}

// deliveries measures both backends: memory (memstore) and the endpoint's DynamoDB.
func (e *env) deliveries(ctx context.Context, table string) ([]*Delivery, error) {
	mem, err := e.delivery(ctx, "memory", memstore.New(), false)
	if err != nil {
		return nil, err
	}
	dyn, err := e.delivery(ctx, "dynalite", dynamostore.New(dynamostore.Config{Client: e.client, Table: table}), true)
	if err != nil {
		return nil, err
	}
	return []*Delivery{mem, dyn}, nil
}

// delivery runs cfg.Deliveries samples on one backend.
func (e *env) delivery(ctx context.Context, name string, b contract.Backend, counted bool) (*Delivery, error) {
	k, err := keeper.New(keeper.Config{Backend: b, Providers: []contract.Provider{newMemProvider(ProviderName)}, Logger: e.quiet})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	key := make([]byte, httpapi.MinCursorKeyLen)
	_, _ = rand.Read(key)
	base, stop, err := loopbackServer(httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{}, CursorKey: key, Logger: e.quiet}))
	if err != nil {
		return nil, err
	}
	defer stop()
	ctx = contract.WithTenant(ctx, Tenant)
	runID := "delivery-" + name
	st, err := k.Start(ctx, keeper.StartInput{RunID: runID, ThreadID: runID, Sandbox: keeper.Setup{ID: "s", Provider: ProviderName}})
	if err != nil {
		return nil, fmt.Errorf("bench: delivery start: %w", err)
	}
	at, last := st.Driver.Cursor, int64(0)
	d := &Delivery{Backend: name, Delay: newOp("long-poll delivery, "+name, 0, false)}
	data := eventData(64)
	for range e.cfg.Deliveries {
		type page struct {
			got    time.Time
			events int
			err    error
		}
		done := make(chan page, 1)
		url := fmt.Sprintf("%s/v1/runs/%s/events?after=%d&waitMs=%d", base, runID, last, deliveryWaitMs)
		reads0 := e.reads()
		t0 := time.Now()
		go func() {
			n, err := longPoll(ctx, url)
			done <- page{time.Now(), n, err}
		}()
		pause := deliveryMinPause + mrand.N(deliverySpread)
		select {
		case p := <-done:
			return nil, fmt.Errorf("bench: delivery %s: the reader answered before the append (%d events, %v)", name, p.events, p.err)
		case <-time.After(pause):
		}
		a0 := time.Now()
		res, err := k.Append(ctx, runID, at, []contract.Event{{Data: data}})
		if err != nil {
			return nil, fmt.Errorf("bench: delivery append: %w", err)
		}
		p := <-done
		if p.err != nil || p.events != 1 {
			return nil, fmt.Errorf("bench: delivery %s: the reader got %d events, %v", name, p.events, p.err)
		}
		at, last = res.Cursor, res.Last
		d.Delay.Samples = append(d.Delay.Samples, p.got.Sub(a0))
		d.Waited += p.got.Sub(t0)
		if counted {
			r := e.reads() - reads0 // the append's own call is a PutItem: not a read
			d.Delay.Calls = append(d.Delay.Calls, r)
			d.Reads += r
		}
	}
	return d, nil
}

// reads returns the DynamoDB read calls counted so far.
func (e *env) reads() int {
	s := e.counter.Snapshot()
	return s["GetItem"] + s["Query"] + s["BatchGetItem"]
}

// longPoll GETs url (tenant Tenant) and returns the number of events of the page.
func longPoll(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	req.Header.Set(httpapi.TenantHeader, Tenant)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d: %s", resp.StatusCode, body)
	}
	var page struct {
		Events []json.RawMessage `json:"events"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return 0, err
	}
	return len(page.Events), nil
}
