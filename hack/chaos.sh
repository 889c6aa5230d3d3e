#!/usr/bin/env bash
# The fault-injection run of docs/reliability.md (`make chaos`), with the debug build `make test` makes:
#   1. the local control plane and the AWS emulator (hack/cluster-up.sh); an emulator older than
#      its fault endpoint (POST /_karpenter-rs/faults) is restarted;
#   2. tests/chaos.rs: two controller replicas with leader election drive consolidation, repair,
#      expiry and drift (and, with the aws provider, interruption and an AMI alias change) on one
#      NodePool, while the leader is SIGKILLed at the kill points, the kube-apiserver is restarted
#      in the middle of a replacement, EC2 fails through the emulator and interruption messages
#      come twice, out of order and late; an observer of its own counts what must never happen.
# Each test prints one `CHAOS RESULT` line; record them in docs/reliability.md with the date, the
# machine's load and the command. The whole output is kept in target/chaos/.
#
#   hack/chaos.sh                        the run (about 30 minutes)
#   hack/chaos.sh restart-apiserver [S]  SIGKILL the local control plane's kube-apiserver, leave it
#                                        down S seconds (default 5), start it again and wait until
#                                        it is ready (tests/chaos.rs calls this)
#
# The restart: the kube-apiserver is a process of `kwokctl --runtime binary`, whose pid kwokctl
# records in <cluster dir>/pids/kube-apiserver.pid. It is killed with SIGKILL (a crash: no
# graceful shutdown, every connection and watch cut), then `kwokctl start cluster` starts the
# components whose recorded process is not running (only the kube-apiserver: etcd, the
# controller manager, the scheduler and kwok keep running) and waits until the cluster serves.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

restart_apiserver() {
  local down=${1:-5}
  [[ "$down" =~ ^[0-9]+$ ]] || die "restart-apiserver: seconds, not '$down'"
  export KWOK_WORKDIR=$KRS_KWOK_WORKDIR
  local dir=$KWOK_WORKDIR/clusters/$CLUSTER_NAME
  local kwokctl=$KRS_VERSIONS/kwokctl-$KWOK_VERSION/kwokctl
  local pid exe start deadline
  [[ -x "$kwokctl" ]] || die "no kwokctl at $kwokctl (run hack/tools.sh)"
  pid=$(cat "$dir/pids/kube-apiserver.pid" 2>/dev/null || true)
  pid_alive "$pid" || die "the kube-apiserver of cluster '$CLUSTER_NAME' is not running"
  # Only the local control plane's own binary.
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  [[ "$exe" == "$KRS_HOME"/* ]] || die "pid $pid is not the local control plane's kube-apiserver ($exe)"
  start=$(now_s)
  log "kube-apiserver of '$CLUSTER_NAME': SIGKILL (pid $pid), down for ${down}s"
  kill -KILL "$pid"
  wait_pids_gone 10 "$pid" || die "kube-apiserver pid $pid still running after SIGKILL"
  sleep "$down"
  # kwokctl runs `kubectl` from PATH to probe the cluster; make it ours.
  PATH="$KRS_BIN:$PATH" run_fds_closed "$kwokctl" --name "$CLUSTER_NAME" start cluster --timeout 2m 2>&1 |
    kwokctl_log_filter >&2
  deadline=$((SECONDS + 90))
  until krs_kubectl --request-timeout=5s get --raw /readyz >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "kube-apiserver not ready 90s after its restart; see $dir/logs/kube-apiserver.log"
    sleep 0.3
  done
  log "kube-apiserver of '$CLUSTER_NAME' back (pid $(cat "$dir/pids/kube-apiserver.pid")) after $(elapsed "$start")"
}

case "${1:-}" in
  "") ;;
  restart-apiserver)
    restart_apiserver "${2:-5}"
    exit 0
    ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
    exit 0
    ;;
  *) die "unknown argument: $1 (see --help)" ;;
esac

# fault_endpoint_answers: the AWS emulator of $AWS_ENDPOINT_URL answers GET /_karpenter-rs/faults.
fault_endpoint_answers() {
  local port=${AWS_ENDPOINT_URL##*:} answer
  answer=$(
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    printf 'GET /_karpenter-rs/faults HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
    head -n1 <&3
  ) 2>/dev/null || return 1
  [[ "$answer" == *" 200 "* ]]
}

start=$(now_s)
log "== local control plane and AWS emulator"
eval "$("$HACK_DIR/cluster-up.sh")"
if ! fault_endpoint_answers; then
  log "the AWS emulator predates its fault endpoint; restarting it"
  eval "$("$HACK_DIR/moto-up.sh" --restart)"
fi
# The run starts its own controllers; the demo's must not act alongside them.
"$HACK_DIR/controller-down.sh" >&2

out_dir=$REPO_ROOT/target/chaos
mkdir -p "$out_dir"
out=$out_dir/chaos-$(date -u +%Y%m%dT%H%M%SZ).log
log "== chaos: kwok provider, then aws provider against the emulator (debug build, as make test builds it; output in $out)"
set +e
cargo test --locked --test chaos -- --ignored --nocapture --test-threads 1 2>&1 |
  tee "$out" | grep --line-buffered -E '^CHAOS |^  - |^test |test result|panicked' |
  grep --line-buffered -v '^CHAOS LOG '
rc=${PIPESTATUS[0]}
set -e

log "chaos run done in $(elapsed "$start"); record these lines in docs/reliability.md (command: make chaos):"
grep -E '^CHAOS RESULT' "$out" >&2 || log "(no CHAOS RESULT line)"
((rc == 0)) || die "the chaos run failed (exit status $rc); the whole output is in $out"
