package apiclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Bearer sends a JWT (or any bearer token) in Authorization; API Gateway's JWT authorizer
// verifies it and the tenant comes from its claim.
type Bearer struct {
	// Token returns the current token (called per attempt, so a refreshed token is used).
	Token func(ctx context.Context) (string, error)
}

// StaticToken is a Bearer of one fixed token.
func StaticToken(token string) Bearer {
	return Bearer{Token: func(context.Context) (string, error) { return token, nil }}
}

// Authorize sets "Authorization: Bearer <token>".
func (b Bearer) Authorize(ctx context.Context, r *http.Request, _ []byte) error {
	t, err := b.Token(ctx)
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	t = strings.TrimSpace(t)
	if t == "" {
		return errors.New("token: empty")
	}
	r.Header.Set("Authorization", "Bearer "+t)
	return nil
}
