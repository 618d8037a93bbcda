# plimsoll: the two commands a newcomer runs are `make demo` and `make test`.
# Each installs and builds what it needs.

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: demo test deps deny build images vm-assets lint unit independent client-python client-python-router client-go client-go-router client-typescript openapi kubernetes pyenv package package-test readme-test mcp bench clean

## demo: build, then run the oracle: plimsolld at the strongest sandbox available runs an
## accepted cart-pole controller twice and a falling draft; the fingerprints are checked and
## the report is written, and make prints its path. The smallest example, one snippet at the
## process tier: ./target/debug/plimsoll-example-minimal
demo: deps build images
	./target/debug/plimsoll-example-oracle --out target/oracle
	@echo "demo: the report is $(CURDIR)/target/oracle/report.html (open it in a browser)"

## test: everything CI runs (CI=true turns every skip into a failure)
test: deps deny build images vm-assets lint unit independent client-python client-python-router client-go client-go-router client-typescript openapi kubernetes package-test readme-test mcp

deps:
	@scripts/install-deps

## deny: the dependency tree against deny.toml (licenses, bans, sources), with the cargo-deny
## that scripts/install-deps installs. The crates for this target are fetched first (from
## crates.io; nothing when they are already here); cargo-deny itself runs --offline, so it
## fetches nothing, and the advisories check, whose database cannot be fetched here, is left out.
## Duplicate versions are warnings, printed without the crates that pull them in (thousands of
## lines): `cargo deny --offline check bans` shows those.
deny: deps
	$(CARGO) fetch --locked --target x86_64-unknown-linux-gnu
	$(CARGO) deny --offline --locked check --hide-inclusion-graph licenses bans sources

build:
	$(CARGO) build --workspace --all-targets --locked

## images: the image store build/images/ (scripts/build-image NAME, recipe images/NAME/): sandbox,
## the default image of the container and kernel tiers (its VM disk is vm-assets'), and
## python-data, sandbox plus numpy, pandas and matplotlib, with its own VM disk; egress-test,
## sandbox plus pip, npm and the egress tests' CA (tests/fixtures/egress)
images:
	scripts/build-image && scripts/build-image python-data && scripts/build-image egress-test

## vm-assets: the kernel, initramfs and image disk the VM provider boots (builds the image first)
vm-assets:
	scripts/build-vm-assets

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

unit:
	$(CARGO) nextest run --workspace --locked --no-fail-fast

## independent: implementations in another language check our golden vectors
independent:
	/usr/bin/python3 tests/independent/digests.py

## client-python: the Python client (clients/python) against a real plimsolld started by its
## tests (target/debug/plimsolld, build/images/sandbox: run `make build images` first); its venv,
## build/venv-client-python, holds the pinned clients/python/requirements.txt
PYTHON_VENV ?= $(CURDIR)/build/venv-client-python
client-python: build images
	clients/python/scripts/venv $(PYTHON_VENV) >/dev/null
	cd clients/python && $(PYTHON_VENV)/bin/python -m pytest -q -rs -p no:cacheprovider

## client-python-router: the same suite with a plimsoll-router in front of every daemon it
## starts (PLIMSOLL_TEST_ROUTER=1, docs/cluster.md): the router must pass every answer on so
## that the client verifies it exactly as it verifies the daemon's
client-python-router: build images
	clients/python/scripts/venv $(PYTHON_VENV) >/dev/null
	cd clients/python && PLIMSOLL_TEST_ROUTER=1 $(PYTHON_VENV)/bin/python -m pytest -q -rs -p no:cacheprovider

## client-go: the Go client (clients/go) against a real plimsolld: go vet, then go test.
## Debian's golang-go (1.19), standard library only: nothing is downloaded (GOPROXY=off), no
## other toolchain is fetched (GOTOOLCHAIN=local). CI=true turns every skip into a failure.
GO ?= /usr/bin/go
GO_ENV = GOPROXY=off GOTOOLCHAIN=local GOFLAGS= GOWORK=off
client-go: deps build images
	cd clients/go && $(GO_ENV) $(GO) vet ./...
	cd clients/go && $(GO_ENV) $(GO) test -count=1 ./...

## client-go-router: the Go suite with a plimsoll-router in front of every daemon it starts
## (PLIMSOLL_TEST_ROUTER=1, docs/cluster.md)
client-go-router: deps build images
	cd clients/go && PLIMSOLL_TEST_ROUTER=1 $(GO_ENV) $(GO) test -count=1 ./...

## client-typescript: the TypeScript client (clients/typescript): npm ci when the lockfile
## changed, tsc, then its node:test suite against a real plimsolld (process and crun) started
## by its tests (target/debug/plimsolld, build/images/sandbox: run `make build images` first).
## NODE_EXTRA_CA_CERTS is dropped for the build and tests: it slows every node start by 60 ms.
TS_CLIENT := clients/typescript
client-typescript: build images $(TS_CLIENT)/node_modules/.installed
	@env -u NODE_EXTRA_CA_CERTS node -e 'if (+process.versions.node.split(".")[0] < 20) { console.error("client-typescript: node " + process.version + " is too old: the client needs node 20 or later (Debian 12 ships 18; install 20)"); process.exit(1) }'
	cd $(TS_CLIENT) && rm -rf dist build \
		&& env -u NODE_EXTRA_CA_CERTS ./node_modules/.bin/tsc -p tsconfig.json \
		&& env -u NODE_EXTRA_CA_CERTS ./node_modules/.bin/tsc -p tsconfig.test.json \
		&& env -u NODE_EXTRA_CA_CERTS node --test build/test/*.test.js \
		&& echo "client-typescript: again, through a plimsoll-router (PLIMSOLL_TEST_ROUTER=1, docs/cluster.md)" \
		&& PLIMSOLL_TEST_ROUTER=1 env -u NODE_EXTRA_CA_CERTS node --test build/test/*.test.js

$(TS_CLIENT)/node_modules/.installed: $(TS_CLIENT)/package-lock.json $(TS_CLIENT)/package.json
	cd $(TS_CLIENT) && npm ci --ignore-scripts --no-audit --no-fund
	touch $@

## pyenv: the Python venv the tests use (build/pyenv, from tests/python/requirements.txt)
pyenv:
	@scripts/python-env >/dev/null

## openapi: docs/openapi.json is a valid OpenAPI document (openapi-spec-validator) whose schemas
## accept the golden vectors and refuse what the daemon refuses (tests/openapi/refused.json)
openapi: pyenv
	build/pyenv/bin/python3 tests/openapi/check.py

## kubernetes: deploy/kubernetes validated offline against the Kubernetes OpenAPI schemas of
## three releases (kubernetes-validate, strict) and checked for consistency (tests/kubernetes)
kubernetes: pyenv
	build/pyenv/bin/python3 tests/kubernetes/check.py

## package: the Debian package (release binaries, the systemd unit, man pages, completions,
## docs) in target/package/; scripts/build-package says what goes where
package:
	scripts/build-package

## package-test: builds the package from the debug binaries, installs it into a scratch root,
## and runs init, plimsolld and one run from there (about 1 min)
package-test: build
	tests/package/check

## readme-test: runs the README's daemon lines verbatim, in a private mount and network
## namespace (so /etc/plimsoll and port 7878 are the test's own)
readme-test: build images vm-assets
	tests/readme/check

## mcp: the MCP server checked by clients no one here wrote: the official Python SDK (stdio and
## streamable HTTP against a real plimsolld) and the MCP Inspector's CLI (scripts/mcp-test-env
## installs both, pinned)
mcp: build images
	scripts/mcp-test-env
	build/mcp/venv/bin/python tests/mcp/test_mcp.py

## bench: startup medians per provider, engine and daemon, beside bare node and python
bench: build
	$(CARGO) build --release --workspace
	./target/release/plimsoll bench

clean:
	$(CARGO) clean
	rm -rf build
