package shipped

import (
	"slices"
	"strings"
	"testing"
)

// The API's packages are leaves (docs/design.md §1): a program built on the wire documents
// and the Go client alone — a shipper (docs/design.md §8.2), a bench, another team's
// service — links no operation (keeper, reaper, driver, journal), no backend or store
// plumbing (memstore, dynamostore, storecall, lease, wakeset, refstore), no provider and
// no AWS package. Of this module they link only the contract's records and sentinels
// (shared/contract, the standard library alone) and each other; AWS code comes only with
// the opt-in signer, and the client's push subscription brings the one WebSocket library
// (docs/design.md §8.1).
var apiLeaves = []struct {
	pattern string
	own     []string // the module's packages it may link
	aws     bool     // whether it may link AWS SDK packages
	ws      bool     // whether it may link github.com/coder/websocket (nothing else third-party)
}{
	{"./shared/api/wire", []string{"shared/api/wire", "shared/contract"}, false, false},
	{"./shared/api/apiclient", []string{"shared/api/apiclient", "shared/api/wire", "shared/contract"}, false, true},
	{"./shared/api/apiclient/sigv4auth", []string{"shared/api/apiclient/sigv4auth"}, true, false},
}

// webSocket is the module of the push subscription's WebSocket library.
const webSocket = "github.com/coder/websocket"

// leafBreaches returns the packages of ps a leaf with these allowances must not link.
func leafBreaches(ps []pkg, own []string, aws, ws bool) []string {
	var bad []string
	for _, p := range ps {
		switch {
		case p.standard:
		case strings.HasPrefix(p.path, module+"/"):
			if !slices.Contains(own, strings.TrimPrefix(p.path, module+"/")) {
				bad = append(bad, p.path)
			}
		case aws && (strings.HasPrefix(p.path, "github.com/aws/aws-sdk-go-v2") || strings.HasPrefix(p.path, "github.com/aws/smithy-go")):
		case ws && (p.path == webSocket || strings.HasPrefix(p.path, webSocket+"/")):
		default:
			bad = append(bad, p.path)
		}
	}
	return bad
}

// TestAPIPackagesAreLeaves: wire and apiclient link nothing of the operations, the
// backends, the providers or AWS; the SigV4 signer links AWS and nothing of this module.
func TestAPIPackagesAreLeaves(t *testing.T) {
	for _, l := range apiLeaves {
		ps := deps(t, l.pattern)
		if bad := leafBreaches(ps, l.own, l.aws, l.ws); len(bad) > 0 {
			t.Errorf("%s links %d packages it must not: %v", l.pattern, len(bad), bad)
		}
		t.Logf("%s: %d packages (go list -deps)", l.pattern, len(ps))
	}
}

// TestLeafBreachesAreRecognised is the negative control: the API transport (which sits on
// the driver's side on purpose) breaches the client's allowance through keeper, the
// driver, the journal and the store plumbing, and the signer breaches it through AWS.
func TestLeafBreachesAreRecognised(t *testing.T) {
	client := apiLeaves[1]
	bad := leafBreaches(deps(t, "./shared/host/driver/apitransport"), client.own, client.aws, client.ws)
	for _, want := range []string{"shared/ops/keeper", "shared/host/driver", "shared/host/journal", "shared/store/storecall"} {
		if !slices.Contains(bad, module+"/"+want) {
			t.Errorf("%s not flagged in apitransport's dependencies (flagged: %v)", want, bad)
		}
	}
	bad = leafBreaches(deps(t, "./shared/api/apiclient/sigv4auth"), client.own, client.aws, client.ws)
	if !slices.ContainsFunc(bad, func(p string) bool { return strings.HasPrefix(p, "github.com/aws/aws-sdk-go-v2/config") }) {
		t.Errorf("the AWS config chain not flagged in sigv4auth's dependencies (flagged: %v)", bad)
	}
}
