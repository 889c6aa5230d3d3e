#!/usr/bin/env bash
# Starts the local AWS emulator (moto, seeded like an EKS account running
# Karpenter: see hack/moto/server.py) unless it already answers, and prints the
# environment to use it, on stdout and nothing else:
#
#   eval "$(hack/moto-up.sh)"
#
# Idempotent and cheap when the emulator is up (it then only makes sure the
# clusters of $CLUSTER_NAMES are seeded, e.g. after POST /moto-api/reset).
# Progress and errors go to stderr.
#
# Options:
#   --restart   stop a running emulator first (fresh state, fresh seed)
#   --venv      only make sure the Python venv exists and print its path
#
# Environment:
#   MOTO_PORT           port on 127.0.0.1 (default 14566)
#   AWS_REGION          region to seed and export (default us-west-2)
#   CLUSTER_NAMES       clusters to seed, space or comma separated
#                       (default $CLUSTER_NAME, default karpenter-demo)
#   EKS_CLUSTER_VERSION Kubernetes version of the EKS cluster records
#                       (default: minor of K8S_VERSION in hack/versions.env, else 1.34)
#   PYTHON              interpreter for the venv (default python3)
#   KARPENTER_RS_MOTO_CALL_LOG
#                       call log of the controller's AWS requests (see hack/moto/server.py):
#                       a file path records to it (a running emulator is switched over),
#                       empty switches recording off, unset leaves it as it is (off at start)
#   KARPENTER_RS_HOME   cache root (default ~/.cache/karpenter-rs); the venv is
#                       $KRS_HOME/venv-moto-$MOTO_VERSION, pid file and log are
#                       in $KRS_HOME/moto/
set -euo pipefail

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -f "$HACK_DIR/lib.sh" ]]; then
  # shellcheck source=hack/lib.sh
  source "$HACK_DIR/lib.sh" >&2
fi
if [[ -z "${MOTO_VERSION:-}" && -f "$HACK_DIR/versions.env" ]]; then
  # shellcheck source=hack/versions.env
  source "$HACK_DIR/versions.env"
fi
KRS_HOME=${KRS_HOME:-${KARPENTER_RS_HOME:-$HOME/.cache/karpenter-rs}}
declare -F log >/dev/null || log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
declare -F die >/dev/null || die() { log "ERROR: $*"; exit 1; }

MOTO_VERSION=${MOTO_VERSION:-5.2.5}
MOTO_DIR=$HACK_DIR/moto
REQUIREMENTS=$MOTO_DIR/requirements.txt
VENV=$KRS_HOME/venv-moto-$MOTO_VERSION
STATE_DIR=$KRS_HOME/moto
PORT=${MOTO_PORT:-14566}
REGION=${AWS_REGION:-us-west-2}
CLUSTER_NAMES=${CLUSTER_NAMES:-${CLUSTER_NAME:-karpenter-demo}}
if [[ -z "${EKS_CLUSTER_VERSION:-}" ]]; then
  if [[ "${K8S_VERSION:-}" =~ ^v?([0-9]+\.[0-9]+) ]]; then
    EKS_CLUSTER_VERSION=${BASH_REMATCH[1]}
  else
    EKS_CLUSTER_VERSION=1.34
  fi
fi
PID_FILE=$STATE_DIR/server-$PORT.pid
# The emulator runs in another directory: an absolute path for its call log.
if [[ -n "${KARPENTER_RS_MOTO_CALL_LOG:-}" && "$KARPENTER_RS_MOTO_CALL_LOG" != /* ]]; then
  KARPENTER_RS_MOTO_CALL_LOG=$PWD/$KARPENTER_RS_MOTO_CALL_LOG
fi
LOG_FILE=$STATE_DIR/server-$PORT.log
URL=http://127.0.0.1:$PORT

restart=false
venv_only=false
for arg in "$@"; do
  case $arg in
    --restart) restart=true ;;
    --venv) venv_only=true ;;
    -h | --help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 0 ;;
    *) die "unknown argument: $arg (see --help)" ;;
  esac
done

grep -q "^moto\[server\]==$MOTO_VERSION\$" "$REQUIREMENTS" ||
  die "MOTO_VERSION=$MOTO_VERSION (hack/versions.env) does not match the moto pin in $REQUIREMENTS"

mkdir -p "$STATE_DIR"
# One moto-up at a time (venv creation, start of the server).
exec 9>"$STATE_DIR/.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
fi

# ensure_venv creates $VENV from requirements.txt unless it already matches.
ensure_venv() {
  local want have=""
  want=$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)
  [[ -f "$VENV/.requirements.sha256" ]] && have=$(<"$VENV/.requirements.sha256")
  if [[ "$want" == "$have" && -x "$VENV/bin/python" ]]; then
    return 0
  fi
  local py=${PYTHON:-python3} t0=$SECONDS pid_file
  command -v "$py" >/dev/null 2>&1 || die "$py not found (need Python >= 3.11 with pip)"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$py is $("$py" -V 2>&1); the pinned requirements need Python >= 3.11 (set PYTHON)"
  # Emulators running from the old venv would break once it is gone.
  for pid_file in "$STATE_DIR"/server-*.pid; do
    [[ -e "$pid_file" ]] || continue
    pid_file=${pid_file##*/server-}
    MOTO_PORT=${pid_file%.pid} "$HACK_DIR/moto-down.sh"
  done
  log "moto: creating venv $VENV (requirements changed or venv missing)"
  rm -rf "$VENV"
  local pip
  if "$py" -m venv "$VENV" >&2 2>/dev/null; then
    pip=("$VENV/bin/python" -m pip)
  else
    # No ensurepip (e.g. Debian without python3-venv): venv without pip,
    # filled by the interpreter's own pip.
    rm -rf "$VENV"
    "$py" -m venv --without-pip "$VENV" >&2 ||
      die "cannot create a venv with $py"
    "$py" -m pip --version >/dev/null 2>&1 || die "$py has neither venv+ensurepip nor pip"
    pip=("$py" -m pip --python "$VENV/bin/python")
  fi
  log "moto: installing $(grep -c '^[A-Za-z]' "$REQUIREMENTS") pinned packages (about a minute)"
  "${pip[@]}" install --disable-pip-version-check --no-input --progress-bar off -q \
    -r "$REQUIREMENTS" >&2 || { rm -rf "$VENV"; die "pip install -r $REQUIREMENTS failed"; }
  echo "$want" >"$VENV/.requirements.sha256"
  log "moto: venv ready in $((SECONDS - t0))s"
}

# http METHOD PATH [JSON]: request to the emulator's own endpoints; prints the
# body; fails when the emulator does not answer.
http() {
  "$VENV/bin/python" - "$URL" "$@" <<'PY'
import sys, urllib.request
url, method, path = sys.argv[1:4]
data = sys.argv[4].encode() if len(sys.argv) > 4 else None
req = urllib.request.Request(url + path, data=data, method=method,
                             headers={"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
try:
    with opener.open(req, timeout=float(120 if data else 2)) as resp:
        sys.stdout.write(resp.read().decode())
except Exception as exc:
    body = getattr(exc, "read", lambda: b"")().decode()
    sys.stderr.write(f"{method} {url}{path}: {exc} {body}\n")
    sys.exit(1)
PY
}

# ready_pid prints the pid of our emulator answering on the port, if any.
# Returns 1 if nothing answers, 2 if something else does.
ready_pid() {
  local body
  body=$(http GET /_karpenter-rs/ready 2>/dev/null) || {
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then return 2; fi
    return 1
  }
  [[ "$body" == *'"karpenter-rs-moto"'* ]] || return 2
  sed -n 's/^ *"pid": \([0-9]*\).*/\1/p' <<<"$body"
}

print_env() {
  cat <<EOF
export AWS_ENDPOINT_URL=$URL
export AWS_REGION=$REGION
export AWS_DEFAULT_REGION=$REGION
export AWS_ACCESS_KEY_ID=testing
export AWS_SECRET_ACCESS_KEY=testing
EOF
}

ensure_venv
if $venv_only; then
  echo "$VENV"
  exit 0
fi

if $restart; then
  "$HACK_DIR/moto-down.sh"
fi

rc=0
pid=$(ready_pid) || rc=$?
if [[ $rc -eq 2 ]]; then
  die "port $PORT answers but is not the karpenter-rs AWS emulator (set MOTO_PORT)"
fi

if [[ $rc -eq 0 ]]; then
  # Up already: make sure the wanted clusters are (still) seeded.
  # shellcheck disable=SC2046 # split the list on purpose
  clusters_json=$(printf '"%s",' $(tr ',' ' ' <<<"$CLUSTER_NAMES"))
  http POST /_karpenter-rs/seed "{\"clusters\": [${clusters_json%,}], \"region\": \"$REGION\"}" >/dev/null ||
    die "seeding $CLUSTER_NAMES failed; see $LOG_FILE"
  if [[ -n "${KARPENTER_RS_MOTO_CALL_LOG+set}" ]]; then
    call_log=null
    [[ -n "$KARPENTER_RS_MOTO_CALL_LOG" ]] && call_log="\"$KARPENTER_RS_MOTO_CALL_LOG\""
    http POST /_karpenter-rs/call-log "{\"path\": $call_log}" >/dev/null ||
      die "switching the call log to ${KARPENTER_RS_MOTO_CALL_LOG:-off} failed; see $LOG_FILE"
    log "moto: call log ${KARPENTER_RS_MOTO_CALL_LOG:-off}"
  fi
  log "moto: emulator already up at $URL (pid $pid, log $LOG_FILE)"
  print_env
  exit 0
fi

# A stale pid file of a server that died: forget it.
rm -f "$PID_FILE"

log "moto: starting emulator on $URL, region $REGION, clusters: $CLUSTER_NAMES (log $LOG_FILE)"
t0=$SECONDS
(
  cd "$MOTO_DIR"
  export MOTO_PORT=$PORT AWS_REGION=$REGION CLUSTER_NAMES EKS_CLUSTER_VERSION
  if [[ -n "${KARPENTER_RS_MOTO_CALL_LOG:-}" ]]; then export KARPENTER_RS_MOTO_CALL_LOG; fi
  export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
  exec setsid "$VENV/bin/python" "$MOTO_DIR/server.py" --port "$PORT" --region "$REGION" \
    --pid-file "$PID_FILE" </dev/null >"$LOG_FILE" 2>&1 9>&-
) &
child=$!

deadline=$((SECONDS + ${MOTO_START_TIMEOUT:-120}))
until pid=$(ready_pid); do
  if ! kill -0 "$child" 2>/dev/null; then
    tail -n 30 "$LOG_FILE" >&2 || true
    die "emulator exited during start; log: $LOG_FILE"
  fi
  if ((SECONDS > deadline)); then
    tail -n 30 "$LOG_FILE" >&2 || true
    die "emulator did not answer on $URL within ${MOTO_START_TIMEOUT:-120}s; log: $LOG_FILE"
  fi
  sleep 0.2
done
log "moto: emulator up at $URL in $((SECONDS - t0))s (pid $pid, log $LOG_FILE)"
print_env
