package httpapi

import "github.com/sandkeep/sandkeep/shared/api/wire"

// The tests name the documents as the handlers once did; they are shared/api/wire's now.
type (
	appendRequest     = wire.AppendRequest
	runResponse       = wire.RunResponse
	startResponse     = wire.StartResponse
	attachResponse    = wire.AttachResponse
	sandboxResponse   = wire.SandboxResponse
	heartbeatResponse = wire.HeartbeatResponse
	appendResponse    = wire.AppendResponse
	readResponse      = wire.ReadResponse
)
