# flightlock — layer builds.
#
#   make layer            both layer zips: target/layer/flightlock-layer-{x86_64,arm64}.zip
#                         (arm64 is skipped, with the reason, if its Rust target cannot be added)
#   make layer-x86_64     the x86_64 zip only
#   make layer-arm64      the arm64 zip only
#   make cleanup-arm64    the cleanup function for the CDK construct (cdk/), likewise cleanup-x86_64:
#                         target/lambda/<arch>/flightlock-cleanup/bootstrap
#
# SAM (`BuildMethod: makefile`, ContentUri: extension/layer, the Makefile found through
# `ContextPath: .`) calls build-FlightlockLayerX86 and
# build-FlightlockLayerArm64 with ARTIFACTS_DIR set; they lay out the layer there:
#   $(ARTIFACTS_DIR)/extensions/flightlock   the extension (cargo bin flightlock-extension, renamed)
#   $(ARTIFACTS_DIR)/flightlock-wrapper      the exec wrapper (extension/layer/flightlock-wrapper)
#   $(ARTIFACTS_DIR)/python/flightlock/...   the Python client (clients/python/src/flightlock)
#   $(ARTIFACTS_DIR)/nodejs/node_modules/flightlock/...  the Node.js client (clients/node: its
#                                            package.json and the files its "files" names)
# which Lambda mounts under /opt; it puts /opt/python on sys.path and /opt/nodejs/node_modules on
# NODE_PATH, so a function with the layer imports `flightlock` with nothing installed. The zips
# (zip_layer) hold the same; release/pack.py lists the clients' files for both (`clients`).
#
# cargo-lambda (with zig) comes from scripts/install-cargo-lambda (PyPI, into .tools/, idempotent).
# Each architecture builds into its own --lambda-dir: target/lambda/{x86_64,arm64}.

ROOT := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
LAMBDA_DIR := $(ROOT)/target/lambda
LAYER_DIR := $(ROOT)/target/layer
WRAPPER := $(ROOT)/extension/layer/flightlock-wrapper
CARGO_LAMBDA_BIN = $(shell $(ROOT)/scripts/install-cargo-lambda)

.PHONY: layer layer-x86_64 layer-arm64 extension-x86_64 extension-arm64 \
	build-FlightlockLayerX86 build-FlightlockLayerArm64 clean-layer cleanup-x86_64 cleanup-arm64

layer: layer-x86_64
	@$(MAKE) --no-print-directory -f $(ROOT)/Makefile layer-arm64 || \
		echo "make layer: arm64 layer NOT built (see the error above); the x86_64 layer is in $(LAYER_DIR)" >&2

# --- the extension binary, per architecture -------------------------------------------------

extension-x86_64:
	cd $(ROOT) && PATH="$(CARGO_LAMBDA_BIN):$$PATH" cargo lambda build --release --extension \
		-p flightlock-extension --bin flightlock-extension --x86-64 --lambda-dir $(LAMBDA_DIR)/x86_64

extension-arm64:
	@rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu || \
		rustup target add aarch64-unknown-linux-gnu || { \
		echo "arm64 layer SKIPPED: the Rust target aarch64-unknown-linux-gnu is not installed and 'rustup target add aarch64-unknown-linux-gnu' failed (offline, or no rustup). Install it and re-run 'make layer-arm64'." >&2; \
		exit 1; }
	cd $(ROOT) && PATH="$(CARGO_LAMBDA_BIN):$$PATH" cargo lambda build --release --extension \
		-p flightlock-extension --bin flightlock-extension --arm64 --lambda-dir $(LAMBDA_DIR)/arm64

# --- the cleanup function, per architecture (the CDK construct takes it as lambda.Code) -----------

cleanup-x86_64:
	cd $(ROOT) && PATH="$(CARGO_LAMBDA_BIN):$$PATH" cargo lambda build --release \
		-p flightlock-cleanup --bin flightlock-cleanup --x86-64 --lambda-dir $(LAMBDA_DIR)/x86_64

cleanup-arm64:
	@rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu || \
		rustup target add aarch64-unknown-linux-gnu
	cd $(ROOT) && PATH="$(CARGO_LAMBDA_BIN):$$PATH" cargo lambda build --release \
		-p flightlock-cleanup --bin flightlock-cleanup --arm64 --lambda-dir $(LAMBDA_DIR)/arm64

# --- layer zips ----------------------------------------------------------------------------------

# $(1): architecture (x86_64 | arm64)
define zip_layer
	rm -rf $(LAYER_DIR)/$(1) $(LAYER_DIR)/flightlock-layer-$(1).zip
	mkdir -p $(LAYER_DIR)/$(1)/extensions
	cp $(LAMBDA_DIR)/$(1)/extensions/flightlock-extension $(LAYER_DIR)/$(1)/extensions/flightlock
	cp $(WRAPPER) $(LAYER_DIR)/$(1)/flightlock-wrapper
	chmod 755 $(LAYER_DIR)/$(1)/extensions/flightlock $(LAYER_DIR)/$(1)/flightlock-wrapper
	python3 $(ROOT)/release/pack.py clients --into $(LAYER_DIR)/$(1)
	cd $(LAYER_DIR)/$(1) && zip -q -X -r ../flightlock-layer-$(1).zip extensions flightlock-wrapper python nodejs
	@echo "layer $(1): $(LAYER_DIR)/flightlock-layer-$(1).zip ($$(stat -c %s $(LAYER_DIR)/flightlock-layer-$(1).zip) bytes)"
endef

layer-x86_64: extension-x86_64
	$(call zip_layer,x86_64)

layer-arm64: extension-arm64
	$(call zip_layer,arm64)

# --- SAM BuildMethod: makefile --------------------------------------------------------------------

# $(1): architecture
define sam_layer
	@test -n "$(ARTIFACTS_DIR)" || { echo "ARTIFACTS_DIR is not set (SAM sets it)" >&2; exit 1; }
	mkdir -p $(ARTIFACTS_DIR)/extensions
	cp $(LAMBDA_DIR)/$(1)/extensions/flightlock-extension $(ARTIFACTS_DIR)/extensions/flightlock
	cp $(WRAPPER) $(ARTIFACTS_DIR)/flightlock-wrapper
	chmod 755 $(ARTIFACTS_DIR)/extensions/flightlock $(ARTIFACTS_DIR)/flightlock-wrapper
	python3 $(ROOT)/release/pack.py clients --into $(ARTIFACTS_DIR)
endef

build-FlightlockLayerX86: extension-x86_64
	$(call sam_layer,x86_64)

build-FlightlockLayerArm64: extension-arm64
	$(call sam_layer,arm64)

clean-layer:
	rm -rf $(LAMBDA_DIR) $(LAYER_DIR)
