package httpapi

import (
	"context"
	"fmt"
	"net/http"

	"github.com/sandkeep/sandkeep/shared/api/shiptoken"
	"github.com/sandkeep/sandkeep/shared/api/wire"
	"github.com/sandkeep/sandkeep/shared/contract"
	"github.com/sandkeep/sandkeep/shared/ops/keeper"
)

// pushTicket issues a push ticket for the caller's tenant (docs/design.md §8.1): the
// JWT-authorized HTTP API stays the only JWT verifier, and the push function's $connect
// checks the ticket's MAC. 501 where this server names no push endpoint that takes
// tickets (the dev server, whose upgrade takes the tenant header; an IAM deployment,
// whose $connect is signed).
func (h *handler) pushTicket(ctx context.Context, c *call) (int, any, error) {
	if err := decodeBody(c.w, c.r, MaxBodyBytes, &wire.Empty{}, true); err != nil {
		return 0, nil, err
	}
	if h.pushTicketURL == "" {
		return 0, nil, fmt.Errorf("%w: this API issues no push tickets (a JWT deployment's push does; the dev server's upgrade takes the tenant header, an IAM deployment's is signed)", keeper.ErrUnsupported)
	}
	tenant, err := contract.Tenant(ctx)
	if err != nil {
		return 0, nil, err
	}
	exp := h.now().Add(shiptoken.PushTicketTTL)
	return http.StatusOK, wire.PushTicketResponse{Ticket: shiptoken.MintPushTicket(h.cursors.key, tenant, exp),
		ExpiresAt: exp.UnixMilli(), PushURL: h.pushTicketURL}, nil
}
