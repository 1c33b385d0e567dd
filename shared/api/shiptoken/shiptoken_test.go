package shiptoken

import (
	"encoding/base64"
	"errors"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	key   = []byte("0123456789abcdef0123456789abcdef")
	other = []byte("fedcba9876543210fedcba9876543210")
	t0    = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
)

func claims() Claims {
	return Claims{Tenant: "acme", RunID: "run-1", Epoch: 3, Expires: t0.Add(time.Minute), Next: 7, Src: 120, Cancel: true}
}

func TestRoundTrip(t *testing.T) {
	tok := Mint(key, claims())
	if !Looks(tok) {
		t.Fatalf("token %q lacks the prefix", tok)
	}
	got, err := Verify(key, tok, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !(got.Tenant == "acme" && got.RunID == "run-1" && got.Epoch == 3 && got.Expires.Equal(t0.Add(time.Minute)) &&
		got.Next == 7 && got.Src == 120 && got.Cancel) {
		t.Fatalf("claims %+v, want %+v", got, claims())
	}
}

func TestExpired(t *testing.T) {
	tok := Mint(key, claims())
	if _, err := Verify(key, tok, t0.Add(time.Minute-time.Millisecond)); err != nil {
		t.Fatalf("a millisecond before expiry: %v", err)
	}
	for _, at := range []time.Time{t0.Add(time.Minute), t0.Add(time.Hour)} {
		c, err := Verify(key, tok, at)
		if !errors.Is(err, ErrExpired) {
			t.Fatalf("at %v: err %v, want ErrExpired", at, err)
		}
		if c.RunID != "run-1" {
			t.Fatalf("expired claims %+v: the run is still named", c)
		}
	}
}

func TestOtherKey(t *testing.T) {
	if _, err := Verify(other, Mint(key, claims()), t0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("another key's token: %v, want ErrInvalid", err)
	}
}

// TestForged: claims signed with no key, a cursor-domain MAC and a tampered payload are all
// refused, and every byte flip of a genuine token is refused.
func TestForged(t *testing.T) {
	good := Mint(key, claims())
	body := strings.TrimPrefix(good, Prefix)
	payload, sig, _ := strings.Cut(body, ".")

	forged := base64.RawURLEncoding.EncodeToString([]byte(`{"t":"acme","r":"run-2","e":3,"x":9999999999999}`))
	cases := map[string]string{
		"empty":          "",
		"prefix only":    Prefix,
		"no signature":   Prefix + payload,
		"no prefix":      body,
		"other payload":  Prefix + forged + "." + sig,
		"empty sig":      Prefix + payload + ".",
		"long":           Prefix + strings.Repeat("a", MaxLen) + "." + sig,
		"padded sig":     good + "=",
		"two dots":       good + ".x",
		"cursor-shaped":  payload + "." + sig,
		"not base64 sig": Prefix + payload + ".!!!",
	}
	for name, tok := range cases {
		if _, err := Verify(key, tok, t0); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err %v, want ErrInvalid", name, err)
		}
	}
	for i := len(Prefix); i < len(good); i++ {
		b := []byte(good)
		b[i] ^= 1
		if _, err := Verify(key, string(b), t0); err == nil {
			t.Fatalf("flipping byte %d verified", i)
		}
	}
}

// TestDomainSeparated: the same key MACing the same payload under the cursor's domain (as
// shared/api/httpapi's cursor codec does) never yields a ship token's signature.
func TestDomainSeparated(t *testing.T) {
	tok := Mint(key, claims())
	payload, _, _ := strings.Cut(strings.TrimPrefix(tok, Prefix), ".")
	m := cursorMAC(key, payload)
	if _, err := Verify(key, Prefix+payload+"."+base64.RawURLEncoding.EncodeToString(m), t0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a cursor-domain MAC verified as a ship token: %v", err)
	}
}

// TestClaimsRequired: a genuine MAC over claims naming no tenant, no run or no epoch is
// still refused (a minting bug never yields a token for "any run").
func TestClaimsRequired(t *testing.T) {
	for _, c := range []Claims{
		{RunID: "r", Epoch: 1, Expires: t0.Add(time.Hour)},
		{Tenant: "a", Epoch: 1, Expires: t0.Add(time.Hour)},
		{Tenant: "a", RunID: "r", Expires: t0.Add(time.Hour)},
		{Tenant: "a", RunID: "r", Epoch: 1, Src: -1, Expires: t0.Add(time.Hour)},
	} {
		if _, err := Verify(key, Mint(key, c), t0); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: err %v, want ErrInvalid", c, err)
		}
	}
}

// TestLeaf: the package imports only the standard library (the shipper's side links it).
func TestLeaf(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("glob: %v %v", files, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if first, _, _ := strings.Cut(p, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: not the standard library", f, p)
			}
		}
	}
}
