# sandkeep: `make test` is the single entry point for every test (CI runs it via .ci/run).
GO ?= go

.PHONY: test vet
# test = vet + all tests against a local dynalite (scripts/test.sh); ARGS go to go test.
test:
	GO=$(GO) bash scripts/test.sh $(ARGS)

vet:
	$(GO) vet ./...
