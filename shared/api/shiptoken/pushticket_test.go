package shiptoken

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

// TestPushTicket: a ticket names its tenant until it expires; one of another key, a
// tampered one, a ship token and a cursor-shaped text are not tickets, and a ticket is not
// a ship token.
func TestPushTicket(t *testing.T) {
	t.Parallel()
	tk := MintPushTicket(key, "acme", t0.Add(PushTicketTTL))
	if got, err := VerifyPushTicket(key, tk, t0); err != nil || got != "acme" {
		t.Fatalf("VerifyPushTicket = %q, %v; want acme", got, err)
	}
	if _, err := VerifyPushTicket(key, tk, t0.Add(PushTicketTTL)); !errors.Is(err, ErrExpired) {
		t.Errorf("at its expiry: %v, want ErrExpired", err)
	}
	payload, sig, _ := strings.Cut(strings.TrimPrefix(tk, PushPrefix), ".")
	evil := base64.RawURLEncoding.EncodeToString([]byte(`{"t":"other","x":` + "9999999999999" + `}`))
	for name, bad := range map[string]string{
		"another key":    MintPushTicket(other, "acme", t0.Add(PushTicketTTL)),
		"another tenant": PushPrefix + evil + "." + sig,
		"tampered mac":   PushPrefix + payload + "." + sig[:len(sig)-2] + "AA",
		"a ship token":   Mint(key, claims()),
		"no prefix":      strings.TrimPrefix(tk, PushPrefix),
		"empty":          "",
		"overlong":       PushPrefix + strings.Repeat("a", MaxLen),
		"ship-prefixed":  Prefix + strings.TrimPrefix(tk, PushPrefix),
		"no signature":   PushPrefix + payload,
		"empty tenant":   MintPushTicket(key, "", t0.Add(PushTicketTTL)),
	} {
		if got, err := VerifyPushTicket(key, bad, t0); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: VerifyPushTicket = %q, %v; want ErrInvalid", name, got, err)
		}
	}
	if _, err := Verify(key, tk, t0); !errors.Is(err, ErrInvalid) {
		t.Errorf("a push ticket verified as a ship token: %v", err)
	}
	if _, err := Verify(key, Prefix+strings.TrimPrefix(tk, PushPrefix), t0); !errors.Is(err, ErrInvalid) {
		t.Errorf("a push ticket's payload and MAC verified as a ship token: %v", err)
	}
}
