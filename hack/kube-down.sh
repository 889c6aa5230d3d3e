#!/usr/bin/env bash
# Stops the local control plane started by hack/kube-up.sh.
#
# Usage: hack/kube-down.sh [--keep]
#   (default)  stop every component and delete the cluster (PKI, etcd data,
#              logs) and its kubeconfig (see hack/kube-up.sh)
#   --keep     only stop the processes; data and kubeconfig are kept and the
#              next hack/kube-up.sh starts the same cluster again
#
# Idempotent: does nothing if the cluster does not exist. Built binaries are
# never removed (see hack/tools.sh). All output goes to stderr.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

export KWOK_WORKDIR=$KRS_KWOK_WORKDIR
CLUSTER_DIR=$KWOK_WORKDIR/clusters/$CLUSTER_NAME
KWOKCTL_BIN=$KRS_VERSIONS/kwokctl-$KWOK_VERSION/kwokctl

keep=0
case "${1:-}" in
  "") ;;
  --keep) keep=1 ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 0
    ;;
  *) die "unknown argument: $1" ;;
esac

# stop_pids PID... stops what is still running from the cluster's pid files
# (only those pids, and only while they run a binary under $KRS_HOME):
# SIGTERM, then SIGKILL after a short grace period. Returns once all are
# gone, so their ports are free again.
stop_pids() {
  local sig pid exe
  for sig in TERM KILL; do
    for pid in "$@"; do
      pid_alive "$pid" || continue
      exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
      if [[ -n "$exe" && "$exe" == "$KRS_HOME"/* ]]; then
        log "stopping leftover ${exe##*/} (pid $pid, SIG$sig)"
        kill "-$sig" "$pid" 2>/dev/null || true
      fi
    done
    wait_pids_gone 5 "$@" 2>/dev/null && return 0
  done
  wait_pids_gone 5 "$@" || true
}

# remove_kubeconfig deletes $KRS_KUBECONFIG if it is this cluster's.
remove_kubeconfig() {
  if grep -qx "current-context: kwok-$CLUSTER_NAME" "$KRS_KUBECONFIG" 2>/dev/null; then
    rm -f "$KRS_KUBECONFIG"
  fi
}

if [[ ! -d "$CLUSTER_DIR" ]]; then
  log "cluster '$CLUSTER_NAME' does not exist; nothing to do"
  ((keep)) || remove_kubeconfig
  exit 0
fi

start=$(now_s)
mapfile -t pids < <(cluster_pids "$CLUSTER_DIR")
if ((keep)); then
  if [[ -x "$KWOKCTL_BIN" ]]; then
    "$KWOKCTL_BIN" --name "$CLUSTER_NAME" stop cluster 2>&1 | kwokctl_log_filter >&2 || true
  fi
  stop_pids "${pids[@]}"
  log "cluster '$CLUSTER_NAME' stopped in $(elapsed "$start") (data kept in $CLUSTER_DIR)"
  exit 0
fi

if [[ -x "$KWOKCTL_BIN" ]]; then
  # (--kubeconfig: the context is removed from kwokctl's own file, which is
  # deleted anyway; "" is rejected by this kwokctl version.)
  "$KWOKCTL_BIN" --name "$CLUSTER_NAME" delete cluster \
    --kubeconfig "$CLUSTER_DIR/kubeconfig.yaml" 2>&1 | kwokctl_log_filter >&2 || true
fi
stop_pids "${pids[@]}"
rm -rf "$CLUSTER_DIR"
rm -f "$KWOK_WORKDIR/karpenter-rs-$CLUSTER_NAME.yaml"
remove_kubeconfig
log "cluster '$CLUSTER_NAME' deleted in $(elapsed "$start")"
