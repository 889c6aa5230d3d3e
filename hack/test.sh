#!/usr/bin/env bash
# Runs every test of the project, starting what they need:
#   1. formatting and lints;
#   2. the pinned control-plane tools (built once, cached), then the Rust test binaries, so that
#      no build runs while tests do;
#   3. the local control plane and AWS emulator (hack/cluster-up.sh);
#   4. all Rust tests, including those that need the control plane; the emulator, Helm chart and
#      Dockerfile tests;
#   5. the build commands of the container image's builder stage (a release build).
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

start=$(now_s)
step() { log "== $*"; }

step "rustfmt"
cargo fmt --check

step "tools (cached by version)"
"$HACK_DIR/tools.sh" >&2

step "clippy"
cargo clippy --all-targets --locked -- -D warnings

step "build test binaries"
cargo test --locked --no-run

step "local control plane and AWS emulator"
eval "$("$HACK_DIR/cluster-up.sh")"

# The end-to-end tests run their own controllers; the demo's must not act alongside them.
"$HACK_DIR/controller-down.sh" >&2

step "Rust tests (unit, CRD drift, API server validation, leader election, end to end)"
cargo test --locked -- --include-ignored

step "AWS emulator, Helm chart and Dockerfile tests"
"$("$HACK_DIR/moto-up.sh" --venv)/bin/python" -m pytest -q -p no:cacheprovider tests/aws_emulator tests/chart

step "container image builder stage (release build)"
"$HACK_DIR/docker-build-stage.sh"

log "all tests passed in $(elapsed "$start")"
