#!/usr/bin/env bash
# Stops the controller of $CLUSTER_NAME started by hack/controller-up.sh (SIGTERM, then SIGKILL
# after 20 s). Idempotent. Its NodeClaims and Nodes stay.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

PID_FILE=$KRS_HOME/controller/$CLUSTER_NAME.pid

pid=""
[[ -f "$PID_FILE" ]] && pid=$(<"$PID_FILE")
if ! pid_alive "$pid" || ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'karpenter'; then
  rm -f "$PID_FILE"
  exit 0
fi
log "controller: stopping (pid $pid)"
kill -TERM "$pid" 2>/dev/null || true
if ! wait_pids_gone 20 "$pid"; then
  log "controller: pid $pid did not stop after 20s, killing it"
  kill -KILL "$pid" 2>/dev/null || true
fi
rm -f "$PID_FILE"
log "controller: stopped"
