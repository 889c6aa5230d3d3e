#!/usr/bin/env bash
# The single entry point for a local environment:
#
#   eval "$(hack/cluster-up.sh)"
#
# 1. hack/tools.sh     builds/caches the pinned binaries (once)
# 2. hack/kube-up.sh   starts the local Kubernetes control plane (idempotent)
# 3. hack/moto-up.sh   starts the AWS emulator, if that script exists
#
# stdout carries ONLY `export` lines (KUBECONFIG, CLUSTER_NAME, PATH with
# $KRS_BIN first, plus the AWS_* lines from moto-up.sh); all progress goes
# to stderr.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

start=$(now_s)
"$HACK_DIR/tools.sh" >&2
"$HACK_DIR/kube-up.sh" >&2

moto_exports=""
if [[ -f "$HACK_DIR/moto-up.sh" ]]; then
  # Only its stdout (export lines) is passed on; its stderr stays stderr.
  moto_exports=$(CLUSTER_NAME=$CLUSTER_NAME bash "$HACK_DIR/moto-up.sh")
fi

log "environment ready in $(elapsed "$start")"

printf 'export KUBECONFIG=%q\n' "$KRS_KUBECONFIG"
printf 'export CLUSTER_NAME=%q\n' "$CLUSTER_NAME"
# $KRS_BIN first, then the caller's PATH (without earlier copies of $KRS_BIN,
# so that repeated evals do not grow it).
rest=":$PATH:"
rest=${rest//":$KRS_BIN:"/:}
rest=${rest#:}
rest=${rest%:}
printf 'export PATH=%q\n' "$KRS_BIN${rest:+:$rest}"
if [[ -n "$moto_exports" ]]; then
  printf '%s\n' "$moto_exports" | grep -E '^export [A-Za-z_][A-Za-z0-9_]*=' || true
fi
