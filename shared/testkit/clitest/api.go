package clitest

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"testing"

	"github.com/sandkeep/sandkeep/shared/api/httpapi"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
	"github.com/sandkeep/sandkeep/shared/store/memstore"
)

// ServeAPI serves the whole HTTP API in this test process (dev authentication, the
// in-memory backend, prov as the only provider) and returns its base URL: the provider's
// fake and key stay here, and a host process is given only the URL.
func ServeAPI(t testing.TB, prov contract.Provider) string {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	k, err := keeper.New(keeper.Config{Backend: memstore.New(), Providers: []contract.Provider{prov}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(httpapi.New(httpapi.Config{Keeper: k, Auth: httpapi.DevAuth{},
		CursorKey: []byte("clitest-cursor-key-0123456789abcdef"), Logger: quiet}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// HostEnv is the environment of a host process that knows only the API: SANDKEEP_API set,
// every provider key emptied.
func HostEnv(apiURL string) []string {
	return []string{"SANDKEEP_API=" + apiURL, "SANDKEEP_DAYTONA_API_KEY=", "SANDKEEP_E2B_API_KEY=", "SANDKEEP_PROVIDER_API_KEY="}
}
