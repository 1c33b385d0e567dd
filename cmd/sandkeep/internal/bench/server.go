package bench

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// loopbackServer serves h on a free 127.0.0.1 port, as `sandkeep dev` serves the API, and
// returns its base URL and a stop function. The benchmark ships in the operator binary,
// so it serves with net/http rather than the test support of net/http/httptest.
func loopbackServer(h http.Handler) (base string, stop func(), err error) {
	ln, base, err := loopbackListener()
	if err != nil {
		return "", nil, err
	}
	return base, serveOn(ln, h), nil
}

// loopbackListener listens on a free 127.0.0.1 port first, for a handler that must know
// its own address (the public URL a shipper is given).
func loopbackListener() (net.Listener, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", fmt.Errorf("bench: listen: %w", err)
	}
	return ln, "http://" + ln.Addr().String(), nil
}

// serveOn serves h on ln until the returned stop is called.
func serveOn(ln net.Listener, h http.Handler) (stop func()) {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }() // returns once Close is called
	return func() { _ = srv.Close() }
}
