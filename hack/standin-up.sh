#!/usr/bin/env bash
# Starts the kubelet stand-in (hack/kubelet-standin.py) in the background: it
# registers a Node for every running instance of the AWS emulator and deletes
# the Nodes of terminated ones (see docs/local-cluster.md). Idempotent: a
# stand-in already running for $CLUSTER_NAME is left alone.
#
#   hack/standin-up.sh [ARG...]    ARGs go to kubelet-standin.py (e.g. --interval 0.5)
#
# hack/cluster-up.sh does not start it; tests that need it do. Stop it with
# hack/standin-down.sh.
#
# Environment:
#   CLUSTER_NAME        cluster whose instances get Nodes (default karpenter-demo)
#   KUBECONFIG          default $KRS_HOME/kubeconfig (the local control plane)
#   AWS_ENDPOINT_URL    default http://127.0.0.1:$MOTO_PORT (the emulator, port 14566)
#   AWS_REGION          default us-west-2
#   KARPENTER_RS_HOME   cache root; pid file and log are in $KRS_HOME/standin/
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STATE_DIR=$KRS_HOME/standin
PID_FILE=$STATE_DIR/$CLUSTER_NAME.pid
LOG_FILE=$STATE_DIR/$CLUSTER_NAME.log
SCRIPT=$HACK_DIR/kubelet-standin.py

# standin_pid prints the pid of the running stand-in of $CLUSTER_NAME, if any.
standin_pid() {
  local pid
  [[ -f "$PID_FILE" ]] || return 1
  pid=$(<"$PID_FILE")
  pid_alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kubelet-standin\.py' || return 1
  echo "$pid"
}

mkdir -p "$STATE_DIR"
exec 9>"$STATE_DIR/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi

if pid=$(standin_pid); then
  log "standin: already running for cluster $CLUSTER_NAME (pid $pid, log $LOG_FILE)"
  exit 0
fi
rm -f "$PID_FILE"

venv=$("$HACK_DIR/moto-up.sh" --venv)
[[ -s "${KUBECONFIG:-$KRS_KUBECONFIG}" ]] ||
  die "no kubeconfig at ${KUBECONFIG:-$KRS_KUBECONFIG}; start the cluster: eval \"\$(hack/cluster-up.sh)\""

log "standin: starting for cluster $CLUSTER_NAME (log $LOG_FILE)"
(
  export KUBECONFIG=${KUBECONFIG:-$KRS_KUBECONFIG}
  export AWS_ENDPOINT_URL=${AWS_ENDPOINT_URL:-http://127.0.0.1:${MOTO_PORT:-14566}}
  export AWS_REGION=${AWS_REGION:-us-west-2}
  export AWS_ACCESS_KEY_ID=${AWS_ACCESS_KEY_ID:-testing}
  export AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY:-testing}
  export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
  exec setsid "$venv/bin/python" "$SCRIPT" --cluster "$CLUSTER_NAME" "$@" \
    </dev/null >>"$LOG_FILE" 2>&1 9>&-
) &
pid=$!
echo "$pid" >"$PID_FILE"

# Started once it has logged its start (kubeconfig read, clients made).
deadline=$((SECONDS + ${STANDIN_START_TIMEOUT:-30}))
until grep -q "kubelet stand-in started" <(tail -n 20 "$LOG_FILE" 2>/dev/null) &&
  pid_alive "$pid"; do
  if ! pid_alive "$pid"; then
    rm -f "$PID_FILE"
    tail -n 20 "$LOG_FILE" >&2 || true
    die "standin exited during start; log: $LOG_FILE"
  fi
  if ((SECONDS > deadline)); then
    die "standin did not start within ${STANDIN_START_TIMEOUT:-30}s; log: $LOG_FILE"
  fi
  sleep 0.2
done
log "standin: running (pid $pid)"
