# plimsoll: the two commands a newcomer runs are `make demo` and `make test`.
# Each installs and builds what it needs.

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: demo test deps build images vm-assets lint unit independent client-python client-go bench clean

## demo: build, then run the oracle: plimsolld at the strongest sandbox available runs an
## accepted cart-pole controller twice and a falling draft; the fingerprints are checked and
## the report is written, and make prints its path. The smallest example, one snippet at the
## process tier: ./target/debug/plimsoll-example-minimal
demo: deps build images
	./target/debug/plimsoll-example-oracle --out target/oracle
	@echo "demo: the report is $(CURDIR)/target/oracle/report.html (open it in a browser)"

## test: everything CI runs (CI=true turns every skip into a failure)
test: deps build images vm-assets lint unit independent client-python client-go

deps:
	@scripts/install-deps

build:
	$(CARGO) build --workspace --all-targets --locked

## images: the sandbox image (root filesystem + manifest) used by the container and kernel tiers
images:
	scripts/build-image

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
client-python:
	clients/python/scripts/venv $(PYTHON_VENV) >/dev/null
	cd clients/python && $(PYTHON_VENV)/bin/python -m pytest -q -rs -p no:cacheprovider

## client-go: the Go client (clients/go) against a real plimsolld: go vet, then go test.
## Debian's golang-go (1.19), standard library only: nothing is downloaded (GOPROXY=off), no
## other toolchain is fetched (GOTOOLCHAIN=local). CI=true turns every skip into a failure.
GO ?= /usr/bin/go
GO_ENV = GOPROXY=off GOTOOLCHAIN=local GOFLAGS= GOWORK=off
client-go: deps
	cd clients/go && $(GO_ENV) $(GO) vet ./...
	cd clients/go && $(GO_ENV) $(GO) test -count=1 ./...

## bench: startup medians per provider, engine and daemon, beside bare node and python
bench: build
	$(CARGO) build --release --workspace
	./target/release/plimsoll bench

clean:
	$(CARGO) clean
	rm -rf build
