# sandkeep: `make test` is the single entry point for every test (CI runs it via .ci/run).
GO ?= go

.PHONY: test vet
test: vet
	$(GO) test -race ./...

vet:
	$(GO) vet ./...
