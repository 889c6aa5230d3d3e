#!/usr/bin/env bash
# Runs the build commands of the Dockerfile's builder stage directly, without
# a container engine, so that CI proves the image build would succeed:
#
#   cargo build --release --locked --bin karpenter
#   karpenter --version
#
# Like the image build, it sees only what .dockerignore lets into the build
# context (Cargo.toml, Cargo.lock, src/, benches/): those are copied into a scratch
# directory and built there. The target directory is the repository's own
# (target/), so dependencies compiled before are reused.
#
# The toolchain is the one on PATH (the Dockerfile pins rust:1.95-bookworm;
# Cargo.toml's rust-version is the floor). Takes several minutes from scratch.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

context=$(mktemp -d "${TMPDIR:-/tmp}/karpenter-image-context.XXXXXX")
trap 'rm -rf "$context"' EXIT
for needed in Cargo.toml Cargo.lock src benches; do
  [[ -e "$REPO_ROOT/$needed" ]] || { log "ERROR: $needed is missing"; exit 1; }
  cp -R "$REPO_ROOT/$needed" "$context/"
done

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
log "cargo build --release --locked --bin karpenter (context: Cargo.toml Cargo.lock src/ benches/)"
(cd "$context" && cargo build --release --locked --bin karpenter)

binary=$CARGO_TARGET_DIR/release/karpenter
version=$("$binary" --version)
expected=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$REPO_ROOT/Cargo.toml" | head -n1)
log "built: $version"
if [[ "$version" != "karpenter $expected" ]]; then
  log "ERROR: expected 'karpenter $expected' from --version, got '$version'"
  exit 1
fi
