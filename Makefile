# karpenter-rs: the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

.PHONY: help demo test bench chaos cluster-up cluster-down tools build crds fmt lint unit

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  %-14s %s\n", $$1, $$2}'

demo: ## Bring up the local control plane and AWS emulator, install the CRDs and examples
	@hack/demo.sh

test: ## Run every test (starts the local control plane and AWS emulator as needed)
	@hack/test.sh

bench: ## The benchmarks of docs/benchmarks.md (release build; scheduling, 1000 pods, 500 to 2,000 nodes)
	@hack/bench.sh

chaos: ## The fault-injection run of docs/reliability.md (leader kills, API server restart, EC2 faults, SQS duplicates)
	@hack/chaos.sh

cluster-up: ## Start the local control plane + AWS emulator; prints export lines: eval "$$(make -s cluster-up)"
	@hack/cluster-up.sh

cluster-down: ## Stop and delete the local control plane and AWS emulator
	@hack/cluster-down.sh

tools: ## Build and cache the pinned etcd, Kubernetes, kwok and helm binaries
	@hack/tools.sh

build: ## Build the karpenter binary
	cargo build

crds: ## Regenerate crds/ from the Rust types, and the charts' copies
	cargo run --quiet --locked --bin karpenter -- crds --output-dir crds
	hack/sync-chart-crds.sh

fmt: ## Format the code
	cargo fmt

lint: ## rustfmt, layering and clippy checks
	cargo fmt --check
	python3 hack/layering.py
	cargo clippy --all-targets -- -D warnings

unit: ## Tests that need no cluster
	cargo test
