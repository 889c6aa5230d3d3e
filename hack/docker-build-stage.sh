#!/usr/bin/env bash
# Runs the Dockerfile's builder stage without a container engine, so that CI proves the image
# build: the stage's own COPY and RUN instructions, read from the Dockerfile by
# hack/dockerfile_stage.py, in a working directory that stands for its WORKDIR, from the build
# context .dockerignore lets through. Then checks the binary the runtime stage copies out.
#
#   hack/docker-build-stage.sh            the release profile as Cargo.toml sets it (as `docker build`)
#   hack/docker-build-stage.sh --quick    the same commands with the release profile made cheap
#                                         through cargo's environment (no LTO, no optimisation):
#                                         what `make test` runs, to prove the steps in minutes
#
# The toolchain is the one on PATH (the Dockerfile pins rust:1.95-bookworm; Cargo.toml's
# rust-version is the floor). The stage's target/ directory is kept between runs under
# $KARPENTER_RS_HOME/image-stage/, so dependencies are compiled once.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

env_args=()
workdir=$KRS_HOME/image-stage/builder
if [[ "${1:-}" == "--quick" ]]; then
  env_args=(
    --env CARGO_PROFILE_RELEASE_OPT_LEVEL=0
    --env CARGO_PROFILE_RELEASE_LTO=off
    --env CARGO_PROFILE_RELEASE_CODEGEN_UNITS=256
    --env CARGO_PROFILE_RELEASE_DEBUG=false
  )
  workdir=$KRS_HOME/image-stage/builder-quick
fi

python3 "$HACK_DIR/dockerfile_stage.py" --stage builder --workdir "$workdir" "${env_args[@]}"

binary=$workdir/target/release/karpenter
version=$("$binary" --version)
expected=$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$REPO_ROOT/Cargo.toml" | head -n1)
log "built: $version"
if [[ "$version" != "karpenter $expected" ]]; then
  die "expected 'karpenter $expected' from --version, got '$version'"
fi
