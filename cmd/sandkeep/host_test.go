package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/testkit/clitest"
)

// TestDevRefusesForeignHosts: a `sandkeep dev` process answers only requests whose Host is
// its own loopback address (127.0.0.1, localhost or [::1] with its port). A DNS-rebinding
// page (Host and Origin both rebind.attacker.example:PORT) gets 403 problem+json and its
// cancel changes nothing; the loopback names are served.
func TestDevRefusesForeignHosts(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, dev *clitest.Dev) {
		u, err := url.Parse(dev.URL)
		if err != nil {
			t.Fatal(err)
		}
		port := u.Port()
		send := func(method, path, host, origin, body string) (int, http.Header, []byte) {
			t.Helper()
			r, err := http.NewRequest(method, dev.URL+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			r.Host = host
			if origin != "" {
				r.Header.Set("Origin", origin)
			}
			res, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return res.StatusCode, res.Header, b
		}
		own := "127.0.0.1:" + port
		if st, _, b := send(http.MethodPost, "/v1/runs", own, "",
			`{"runId":"run-h","threadId":"thread-h","sandbox":{"id":"default","provider":"local-process"}}`); st != http.StatusOK {
			t.Fatalf("start: status %d: %s", st, b)
		}
		for _, host := range []string{
			"rebind.attacker.example:" + port, "rebind.attacker.example", "127.0.0.1.nip.io:" + port,
			"127.0.0.1:1", "localhost", "localhost.:" + port, "[::1]", "0.0.0.0:" + port,
		} {
			st, h, b := send(http.MethodPost, "/v1/runs/run-h/cancel", host, "http://"+host, "")
			if st != http.StatusForbidden || h.Get("Content-Type") != wire.ProblemContentType {
				t.Errorf("cancel with Host %q: status %d %s: %s", host, st, h.Get("Content-Type"), b)
				continue
			}
			var p wire.Problem
			if err := json.Unmarshal(b, &p); err != nil || p.Code != "forbidden-host" || p.Status != st {
				t.Errorf("cancel with Host %q: problem %s", host, b)
			}
		}
		st, _, b := send(http.MethodGet, "/v1/runs/run-h", own, "", "")
		if st != http.StatusOK {
			t.Fatalf("get: status %d: %s", st, b)
		}
		var got wire.RunResponse
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Run.Cancelled() {
			t.Fatal("a request for a foreign Host cancelled the run")
		}
		for _, host := range []string{own, "localhost:" + port, "LocalHost:" + port, "[::1]:" + port} {
			if st, _, b := send(http.MethodGet, "/v1/runs/run-h", host, "http://"+host, ""); st != http.StatusOK {
				t.Errorf("get with Host %q: status %d: %s", host, st, b)
			}
		}
	})
}
