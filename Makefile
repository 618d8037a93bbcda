# plimsoll: the two commands a newcomer runs are `make demo` and `make test`.
# Each installs and builds what it needs.

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: demo test deps build images vm-assets lint unit independent client-typescript bench clean

## demo: build, then run the oracle: plimsolld at the strongest sandbox available runs an
## accepted cart-pole controller twice and a falling draft; the fingerprints are checked and
## the report is written, and make prints its path. The smallest example, one snippet at the
## process tier: ./target/debug/plimsoll-example-minimal
demo: deps build images
	./target/debug/plimsoll-example-oracle --out target/oracle
	@echo "demo: the report is $(CURDIR)/target/oracle/report.html (open it in a browser)"

## test: everything CI runs (CI=true turns every skip into a failure)
test: deps build images vm-assets lint unit independent client-typescript

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

## client-typescript: the TypeScript client (clients/typescript): npm ci when the lockfile
## changed, tsc, then its node:test suite against a real plimsolld (process and crun).
## NODE_EXTRA_CA_CERTS is dropped for the build and tests: it slows every node start by 60 ms.
TS_CLIENT := clients/typescript
client-typescript: build images $(TS_CLIENT)/node_modules/.installed
	@env -u NODE_EXTRA_CA_CERTS node -e 'if (+process.versions.node.split(".")[0] < 20) { console.error("client-typescript: node " + process.version + " is too old: the client needs node 20 or later (Debian 12 ships 18; install 20)"); process.exit(1) }'
	cd $(TS_CLIENT) && rm -rf dist build \
		&& env -u NODE_EXTRA_CA_CERTS ./node_modules/.bin/tsc -p tsconfig.json \
		&& env -u NODE_EXTRA_CA_CERTS ./node_modules/.bin/tsc -p tsconfig.test.json \
		&& env -u NODE_EXTRA_CA_CERTS node --test build/test/*.test.js

$(TS_CLIENT)/node_modules/.installed: $(TS_CLIENT)/package-lock.json $(TS_CLIENT)/package.json
	cd $(TS_CLIENT) && npm ci --ignore-scripts --no-audit --no-fund
	touch $@

## bench: startup medians per provider, engine and daemon, beside bare node and python
bench: build
	$(CARGO) build --release --workspace
	./target/release/plimsoll bench

clean:
	$(CARGO) clean
	rm -rf build
