#!/usr/bin/env bash
# Starts `karpenter controller` in the background against the local control plane, the way the
# demo runs it: out of cluster, with the kwok cloud provider by default (nodes are Node objects
# kwok keeps Ready), or with the aws provider against the AWS emulator plus the kubelet stand-in.
# Idempotent: a controller already running for $CLUSTER_NAME is restarted with the new binary.
#
#   hack/controller-up.sh [kwok|aws]
#
# Environment:
#   CLUSTER_NAME        default karpenter-demo
#   METRICS_PORT        default 18080; HEALTH_PROBE_PORT default 18081
#   KARPENTER_BIN       the binary (default target/debug/karpenter, built by the caller)
#   INTERRUPTION_QUEUE  with aws, default $CLUSTER_NAME (the queue the emulator seeds); set it
#                       empty to run without interruption handling
#   KARPENTER_RS_HOME   cache root; pid file and log are in $KRS_HOME/controller/
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

provider=${1:-kwok}
case "$provider" in kwok | aws) ;; *) die "usage: $0 [kwok|aws]" ;; esac

STATE_DIR=$KRS_HOME/controller
PID_FILE=$STATE_DIR/$CLUSTER_NAME.pid
LOG_FILE=$STATE_DIR/$CLUSTER_NAME.log
METRICS_PORT=${METRICS_PORT:-18080}
HEALTH_PROBE_PORT=${HEALTH_PROBE_PORT:-18081}
BIN=${KARPENTER_BIN:-${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug/karpenter}
[[ -x "$BIN" ]] || die "no karpenter binary at $BIN; run: cargo build --bin karpenter"
[[ -s "${KUBECONFIG:-$KRS_KUBECONFIG}" ]] ||
  die "no kubeconfig at ${KUBECONFIG:-$KRS_KUBECONFIG}; start the cluster: eval \"\$(hack/cluster-up.sh)\""

"$HACK_DIR/controller-down.sh" >&2
mkdir -p "$STATE_DIR"

if [[ $provider == aws ]]; then
  "$HACK_DIR/standin-up.sh" >&2
fi

log "controller: starting with the $provider cloud provider (log $LOG_FILE)"
(
  export KUBECONFIG=${KUBECONFIG:-$KRS_KUBECONFIG}
  export CLOUD_PROVIDER=$provider
  export CLUSTER_NAME
  export DISABLE_LEADER_ELECTION=${DISABLE_LEADER_ELECTION:-true}
  export METRICS_PORT HEALTH_PROBE_PORT
  if [[ $provider == aws ]]; then
    export AWS_ENDPOINT_URL=${AWS_ENDPOINT_URL:-http://127.0.0.1:${MOTO_PORT:-14566}}
    export AWS_REGION=${AWS_REGION:-us-west-2}
    export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-testing}
    export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-testing}
    export INTERRUPTION_QUEUE=${INTERRUPTION_QUEUE-$CLUSTER_NAME}
  fi
  exec setsid "$BIN" controller </dev/null >>"$LOG_FILE" 2>&1
) &
pid=$!
echo "$pid" >"$PID_FILE"

# Ready once /readyz answers (its caches have synced).
deadline=$((SECONDS + ${CONTROLLER_START_TIMEOUT:-60}))
until curl -fsS "http://127.0.0.1:$HEALTH_PROBE_PORT/readyz" >/dev/null 2>&1; do
  if ! pid_alive "$pid"; then
    rm -f "$PID_FILE"
    tail -n 20 "$LOG_FILE" >&2 || true
    die "the controller exited during start; log: $LOG_FILE"
  fi
  ((SECONDS < deadline)) || die "the controller was not ready within ${CONTROLLER_START_TIMEOUT:-60}s; log: $LOG_FILE"
  sleep 0.2
done
log "controller: ready (pid $pid; metrics on http://127.0.0.1:$METRICS_PORT/metrics)"
