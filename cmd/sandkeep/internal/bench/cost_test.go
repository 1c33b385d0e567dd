package bench

import (
	"math"
	"os"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestCostPricesWhatTheTemplateDeploys: the cost model prices Lambda as template.yaml
// deploys it (the Globals' architecture and memory size), and a shipped run's ship
// requests reach the Ship function through its function URL, which adds no request
// charge: 500 lone events cost their invocations, appends, subscription Queries and
// messages (docs/bench.md), computed here by hand from the published prices.
func TestCostPricesWhatTheTemplateDeploys(t *testing.T) {
	raw, err := os.ReadFile("../../../../template.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tmpl struct {
		Globals struct {
			Function struct {
				Architectures []string `yaml:"Architectures"`
				MemorySize    int      `yaml:"MemorySize"`
			} `yaml:"Function"`
		} `yaml:"Globals"`
	}
	if err := yaml.Unmarshal(raw, &tmpl); err != nil {
		t.Fatal(err)
	}
	g := tmpl.Globals.Function
	if len(g.Architectures) != 1 || g.Architectures[0] != "arm64" || priceLambdaGBs != 0.0000133334 {
		t.Errorf("template architectures %v priced at $%v per GB-s; arm64 is $0.0000133334 (us-east-1)", g.Architectures, priceLambdaGBs)
	}
	if float64(g.MemorySize)/1024 != lambdaGB {
		t.Errorf("template memory %d MB, the model prices %.3f GB", g.MemorySize, lambdaGB)
	}
	// Ten ship requests, each storing one event and posting it once, 10 ms each.
	d := &Deployed{Requests: map[string]int{"POST ship": 10}, Posts: 10, EvPosts: 10,
		ShipDynamo: map[string]int{"PutItem": 10, "Query": 10}, ShipBusy: 100 * time.Millisecond, DriverLease: time.Minute}
	const batches = 500.0
	want := batches*(0.20+0.625+0.125+1.00)/1e6 + // per batch: invocation, append, subscriptions, message
		2*0.20/1e6 + // the first request and the end
		batches*0.010*0.25*0.0000133334 + // 10 ms at 256 MB per batch, arm64
		2*1.00/1e6 + // the subscribe's answer and closed
		40*0.625/1e6 + // the lease renewed every quarter lease for ten minutes
		10*0.25/1e6 + // connection-minutes
		3*0.20/1e6 + 2*0.625/1e6 // the push function's three invocations, $disconnect's two writes
	if got := Total(shippedCost(d, 1)); math.Abs(got-want) > 1e-9 {
		t.Errorf("500 lone events cost $%.7f, want $%.7f", got, want)
	}
	for _, l := range shippedCost(d, 1) {
		if l.Unit == "req" && l.Dollars > 0 && l.Dollars >= l.Quantity*priceHTTPRequest {
			t.Errorf("%q is priced as API Gateway requests", l.What)
		}
	}
}
