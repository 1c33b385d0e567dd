# sandkeep: `make test` is the single entry point for every test (CI runs it via .ci/run).
GO ?= go

.PHONY: test vet
# test = vet + all tests against a local dynalite (scripts/test.sh); ARGS go to go test.
test:
	GO=$(GO) bash scripts/test.sh $(ARGS)

vet:
	$(GO) vet ./...

.PHONY: bench
# bench = the §11 benchmark report (docs/bench.md) against a local dynalite started like
# `make test` (scripts/bench.sh); ARGS go to `sandkeep bench`, e.g. ARGS="--ops 500 --reap 0".
bench:
	GO=$(GO) bash scripts/bench.sh $(ARGS)

# SAM builds (BuildMethod: makefile): `sam build` runs build-<LogicalId> with ARTIFACTS_DIR
# set; the same targets build without SAM (e.g. make build-ResolveFunction ARTIFACTS_DIR=/tmp/x).
LAMBDA_BUILD = CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -tags lambda.norpc -trimpath -ldflags "-s -w" -o $(ARTIFACTS_DIR)/bootstrap

.PHONY: build-ResolveFunction build-DetachFunction build-CancelFunction build-LogFunction build-ReaperFunction
build-ResolveFunction:
	$(LAMBDA_BUILD) ./functions/resolve
build-DetachFunction:
	$(LAMBDA_BUILD) ./functions/detach
build-CancelFunction:
	$(LAMBDA_BUILD) ./functions/cancel
build-LogFunction:
	$(LAMBDA_BUILD) ./functions/log
build-ReaperFunction:
	$(LAMBDA_BUILD) ./functions/reaper
