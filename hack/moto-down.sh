#!/usr/bin/env bash
# Stops the local AWS emulator started by hack/moto-up.sh (same MOTO_PORT).
# Idempotent: nothing running is fine.
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f "$HACK_DIR/lib.sh" ]]; then
  # shellcheck source=hack/lib.sh
  source "$HACK_DIR/lib.sh" >&2
fi
KRS_HOME=${KRS_HOME:-${KARPENTER_RS_HOME:-$HOME/.cache/karpenter-rs}}
declare -F log >/dev/null || log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
declare -F die >/dev/null || die() { log "ERROR: $*"; exit 1; }

PORT=${MOTO_PORT:-14566}
STATE_DIR=$KRS_HOME/moto
PID_FILE=$STATE_DIR/server-$PORT.pid

# is_ours PID: the process is our emulator (hack/moto/server.py).
is_ours() {
  [[ -r "/proc/$1/cmdline" ]] && tr '\0' ' ' <"/proc/$1/cmdline" | grep -q 'moto/server\.py'
}

# alive PID: the process exists and is not a zombie waiting to be reaped.
alive() {
  kill -0 "$1" 2>/dev/null && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

pids=()
if [[ -f "$PID_FILE" ]]; then
  pid=$(<"$PID_FILE")
  if [[ "$pid" =~ ^[0-9]+$ ]] && is_ours "$pid"; then
    pids+=("$pid")
  fi
fi
# No (valid) pid file: ask the emulator on the port for its pid.
if [[ ${#pids[@]} -eq 0 ]]; then
  pid=$(${PYTHON:-python3} - "http://127.0.0.1:$PORT/_karpenter-rs/ready" 2>/dev/null <<'PY'
import json, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
with opener.open(sys.argv[1], timeout=2) as resp:
    info = json.load(resp)
if info.get("service") == "karpenter-rs-moto":
    print(info["pid"])
PY
  ) || true
  if [[ -n "${pid:-}" ]] && is_ours "$pid"; then
    pids+=("$pid")
  fi
fi

if [[ ${#pids[@]} -eq 0 ]]; then
  rm -f "$PID_FILE"
  log "moto: emulator on port $PORT is not running"
  exit 0
fi

pid=${pids[0]}
log "moto: stopping emulator on port $PORT (pid $pid)"
kill -TERM "$pid" 2>/dev/null || true
for _ in $(seq 1 100); do
  alive "$pid" || break
  sleep 0.1
done
if alive "$pid"; then
  log "moto: pid $pid did not stop after 10s, killing it"
  kill -KILL "$pid" 2>/dev/null || true
fi
rm -f "$PID_FILE"
log "moto: stopped"
