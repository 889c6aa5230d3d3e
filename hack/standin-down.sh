#!/usr/bin/env bash
# Stops the kubelet stand-in of $CLUSTER_NAME started by hack/standin-up.sh.
# Idempotent: nothing running is fine. The Nodes it registered stay.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PID_FILE=$KRS_HOME/standin/$CLUSTER_NAME.pid

pid=""
[[ -f "$PID_FILE" ]] && pid=$(<"$PID_FILE")
if ! pid_alive "$pid" || ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kubelet-standin\.py'; then
  rm -f "$PID_FILE"
  log "standin: not running for cluster $CLUSTER_NAME"
  exit 0
fi

log "standin: stopping (pid $pid)"
kill -TERM "$pid" 2>/dev/null || true
if ! wait_pids_gone 10 "$pid"; then
  log "standin: pid $pid did not stop after 10s, killing it"
  kill -KILL "$pid" 2>/dev/null || true
fi
rm -f "$PID_FILE"
log "standin: stopped"
