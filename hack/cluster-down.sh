#!/usr/bin/env bash
# Tears down what hack/cluster-up.sh started: the local Kubernetes control
# plane (hack/kube-down.sh, arguments are passed on, e.g. --keep) and the AWS
# emulator (hack/moto-down.sh, if that script exists), and stops the demo's
# controller and the kubelet stand-in of $CLUSTER_NAME if they run. Idempotent.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

rc=0
# The demo's controller first, while the API server can still answer its shutdown.
"$HACK_DIR/controller-down.sh" >&2 || rc=$?
# The kubelet stand-in (if started) would only log errors once the cluster is gone.
if [[ -f "$HACK_DIR/standin-down.sh" ]]; then
  "$HACK_DIR/standin-down.sh" >&2 || rc=$?
fi
"$HACK_DIR/kube-down.sh" "$@" >&2 || rc=$?
if [[ -f "$HACK_DIR/moto-down.sh" ]]; then
  CLUSTER_NAME=$CLUSTER_NAME bash "$HACK_DIR/moto-down.sh" >&2 || rc=$?
fi
exit "$rc"
