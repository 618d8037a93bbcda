# plimsoll: the two commands a newcomer runs are `make demo` and `make test`.
# Each installs and builds what it needs.

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: demo test deps build images vm-assets lint unit independent mcp bench clean

## demo: build, then run the oracle: plimsolld at the strongest sandbox available runs an
## accepted cart-pole controller twice and a falling draft; the fingerprints are checked and
## the report is written, and make prints its path. The smallest example, one snippet at the
## process tier: ./target/debug/plimsoll-example-minimal
demo: deps build images
	./target/debug/plimsoll-example-oracle --out target/oracle
	@echo "demo: the report is $(CURDIR)/target/oracle/report.html (open it in a browser)"

## test: everything CI runs (CI=true turns every skip into a failure)
test: deps build images vm-assets lint unit independent mcp

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
