# sandkeep: `make test` is the single entry point for every test (CI runs it via .ci/run).
GO ?= go

.PHONY: test vet
# test = vet + lint + all tests against a local dynalite (scripts/test.sh); ARGS go to go test.
test:
	GO=$(GO) bash scripts/test.sh $(ARGS)

vet:
	$(GO) vet ./...

.PHONY: lint
# lint = gofmt and staticcheck (pinned in scripts/lint.sh); `make test` runs it too.
lint:
	GO=$(GO) bash scripts/lint.sh

.PHONY: fuzz
# fuzz = every go fuzz target, FUZZTIME each (default 2m; e.g. make fuzz FUZZTIME=20s); prints
# each target's executions and copies the grown corpus from the go cache into the package's
# testdata/fuzz, where plain `go test` (so `make test`) replays it. Commit what it adds.
FUZZTIME ?= 2m
FUZZ_TARGETS = \
	./shared/contract:FuzzParseRunStatus ./shared/contract:FuzzFieldJSON ./shared/contract:FuzzTenantAndID \
	./shared/host/journal:FuzzEncodeRoundTrip ./shared/host/journal:FuzzDecode ./shared/host/journal:FuzzSentinel \
	./shared/api/httpapi:FuzzHandler ./shared/api/httpapi:FuzzCursorOpen ./shared/api/httpapi:FuzzCursorTamper \
	./shared/api/httpapi:FuzzMapTenant
fuzz:
	@set -e; cache="$$($(GO) env GOCACHE)/fuzz"; out="$$(mktemp)"; trap 'rm -f "$$out"' EXIT; \
	for pt in $(FUZZ_TARGETS); do \
		pkg="$${pt%%:*}"; fn="$${pt##*:}"; \
		if ! $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime "$(FUZZTIME)" "$$pkg" >"$$out" 2>&1; then \
			cat "$$out"; echo "fuzz: $$pkg $$fn FAILED (the failing input is under $$pkg/testdata/fuzz/$$fn)"; exit 1; \
		fi; \
		src="$$cache/$$($(GO) list "$$pkg")/$$fn"; dst="$$pkg/testdata/fuzz/$$fn"; \
		if [ -d "$$src" ]; then mkdir -p "$$dst"; cp -n "$$src"/* "$$dst"/ 2>/dev/null || true; fi; \
		execs="$$(grep -o 'execs: [0-9]*' "$$out" | tail -n 1)"; \
		echo "fuzz: $$pkg $$fn ($(FUZZTIME)): $${execs:-execs: ?}, corpus $$(ls "$$dst" 2>/dev/null | wc -l) files in $$dst"; \
	done

.PHONY: bench
# bench = the docs/design.md §11 benchmark report (docs/bench.md) against a local dynalite started like
# `make test` (scripts/bench.sh); ARGS go to `sandkeep bench`, e.g. ARGS="--ops 500 --reap 0".
bench:
	GO=$(GO) bash scripts/bench.sh $(ARGS)

# SAM builds (BuildMethod: makefile): `sam build` runs build-<LogicalId> with ARTIFACTS_DIR
# set; the same targets build without SAM (e.g. make build-ResolveFunction ARTIFACTS_DIR=/tmp/x).
LAMBDA_BUILD = CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build -tags lambda.norpc -trimpath -ldflags "-s -w" -o $(ARTIFACTS_DIR)/bootstrap

.PHONY: build-ResolveFunction build-DetachFunction build-CancelFunction build-LogFunction build-WaitFunction build-ReaperFunction build-PushFunction build-ShipFunction
build-ResolveFunction:
	$(LAMBDA_BUILD) ./functions/resolve
build-DetachFunction:
	$(LAMBDA_BUILD) ./functions/detach
build-CancelFunction:
	$(LAMBDA_BUILD) ./functions/cancel
build-LogFunction:
	$(LAMBDA_BUILD) ./functions/log
build-WaitFunction:
	$(LAMBDA_BUILD) ./functions/wait
build-ReaperFunction:
	$(LAMBDA_BUILD) ./functions/reaper
build-PushFunction:
	$(LAMBDA_BUILD) ./functions/push
build-ShipFunction:
	$(LAMBDA_BUILD) ./functions/ship
