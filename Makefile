# plimsoll: the two commands a newcomer runs are `make demo` and `make test`.
# Each installs and builds what it needs.

CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: demo test deps build images vm-assets lint unit independent bench clean

## demo: build, then run the minimal example (one JavaScript snippet; prints its tier)
demo: deps build
	./target/debug/plimsoll-example-minimal

## test: everything CI runs (CI=true turns every skip into a failure)
test: deps build images vm-assets lint unit independent

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

## bench: startup medians per provider, engine and daemon, beside bare node and python
bench: build
	$(CARGO) build --release --workspace
	./target/release/plimsoll bench

clean:
	$(CARGO) clean
	rm -rf build
