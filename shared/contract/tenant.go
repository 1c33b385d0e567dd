package contract

import (
	"context"
	"unicode/utf8"
)

type tenantKey struct{}

// MaxTenantLen is the longest tenant accepted (docs/design.md §2.0).
const MaxTenantLen = 64

// WithTenant returns ctx scoped to tenant t; every store call under it reads and writes
// only t's keys. An invalid t is reported by the store call, as ErrInvalid. The empty
// tenant "" is a tenant of its own (single-tenant deployments), chosen only this way:
// a context that never got a tenant is refused with ErrNoTenant, never taken for "".
func WithTenant(ctx context.Context, t string) context.Context {
	return context.WithValue(ctx, tenantKey{}, t)
}

// Tenant returns the validated tenant of ctx: ErrNoTenant when ctx carries none (the
// caller forgot WithTenant), ErrInvalid for an invalid one, so a tenant can never forge a
// key separator. Every tenant-scoped store call starts with it.
func Tenant(ctx context.Context) (string, error) {
	t, ok := ctx.Value(tenantKey{}).(string)
	if !ok {
		return "", ErrNoTenant
	}
	if err := CheckTenant(t); err != nil {
		return "", err
	}
	return t, nil
}

// Scope is the check of every tenant-scoped store call (shared/store's scoped faces make
// it for every backend): the validated tenant of ctx (Tenant) and id checked as the store
// id named field (CheckStoreID). A backend keys what it stores by the pair.
func Scope(ctx context.Context, field, id string) (tenant string, err error) {
	if tenant, err = Tenant(ctx); err != nil {
		return "", err
	}
	if err := CheckStoreID(field, id); err != nil {
		return "", err
	}
	return tenant, nil
}

// CheckTenant reports whether t is 0–64 chars of [A-Za-z0-9._-].
func CheckTenant(t string) error {
	if len(t) > MaxTenantLen {
		return Invalid("tenant", "longer than %d characters", MaxTenantLen)
	}
	for i := 0; i < len(t); i++ {
		if !isTenantByte(t[i]) {
			return Invalid("tenant", "character %q outside [A-Za-z0-9._-]", t[i])
		}
	}
	return nil
}

func isTenantByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-'
}

// MaxIDLen bounds ids at the library level; the HTTP layer is stricter (CheckID).
const MaxIDLen = 1024

// CheckStoreID is the stores' check of a run id, thread id or sandbox key: non-empty,
// valid UTF-8, no NUL, at most MaxIDLen bytes.
func CheckStoreID(field, id string) error {
	switch {
	case id == "":
		return Invalid(field, "empty")
	case len(id) > MaxIDLen:
		return Invalid(field, "longer than %d bytes", MaxIDLen)
	case !utf8.ValidString(id):
		return Invalid(field, "not valid UTF-8")
	}
	for i := 0; i < len(id); i++ {
		if id[i] == 0 {
			return Invalid(field, "contains NUL")
		}
	}
	return nil
}

// MaxAPIIDLen is the longest id the HTTP API accepts (docs/design.md §8).
const MaxAPIIDLen = 256

// CheckID is the HTTP API's id rule: 1–256 chars of [A-Za-z0-9._:-], and neither "." nor
// ".." (ids travel as path segments, where those two name no segment of their own).
func CheckID(field, id string) error {
	if id == "" || len(id) > MaxAPIIDLen {
		return Invalid(field, "must be 1-%d characters", MaxAPIIDLen)
	}
	if id == "." || id == ".." {
		return Invalid(field, "must not be %q (a path cannot address it)", id)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !isTenantByte(c) && c != ':' {
			return Invalid(field, "character %q outside [A-Za-z0-9._:-]", c)
		}
	}
	return nil
}
