# shellcheck shell=bash disable=SC2034  # variables are used by the sourcing scripts
# Common helpers for the hack/ scripts. Source it; do not execute it.
#
#   KRS_HOME   cache/state root: ${KARPENTER_RS_HOME:-$HOME/.cache/karpenter-rs}
#   KRS_BIN    $KRS_HOME/bin, symlinks to the pinned tool versions (put it first on PATH)
#   log/die    progress and errors, always on stderr (stdout is reserved for
#              the `export` lines printed by cluster-up.sh)

HACK_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$HACK_DIR/.." && pwd)

# shellcheck source=hack/versions.env
source "$HACK_DIR/versions.env"

KRS_HOME=${KARPENTER_RS_HOME:-$HOME/.cache/karpenter-rs}
KRS_BIN=$KRS_HOME/bin
KRS_VERSIONS=$KRS_HOME/versions
# kwokctl keeps clusters, PKI, etcd data and component logs here.
KRS_KWOK_WORKDIR=$KRS_HOME/kwok
CLUSTER_NAME=${CLUSTER_NAME:-karpenter-demo}
# Stable kubeconfig path for the local cluster: $KRS_HOME/kubeconfig for the default
# cluster, $KRS_HOME/kubeconfig-$CLUSTER_NAME for any other, so that a second cluster never
# takes over the kubeconfig of the first.
if [[ $CLUSTER_NAME == karpenter-demo ]]; then
  KRS_KUBECONFIG=$KRS_HOME/kubeconfig
else
  KRS_KUBECONFIG=$KRS_HOME/kubeconfig-$CLUSTER_NAME
fi
export KARPENTER_RS_HOME=$KRS_HOME CLUSTER_NAME

log() {
  printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

die() {
  log "ERROR: $*"
  exit 1
}

# now_s prints a monotonic-enough timestamp in seconds (with ms).
now_s() {
  date +%s.%N | cut -c1-14
}

# elapsed START prints the seconds since START (from now_s).
elapsed() {
  awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.1fs", b - a }'
}

# record_scale_results COMMAND OUTPUT [DOC] appends the `SCALE RESULT` lines of a scale run's
# OUTPUT to the "Runs recorded by make bench" section at the end of DOC (docs/benchmarks.md),
# under the date, the commit, the machine and COMMAND. A run that printed none appends nothing.
record_scale_results() {
  local command=$1 output=$2 doc=${3:-$REPO_ROOT/docs/benchmarks.md}
  local results commit
  results=$(sed -nE 's/^(test [A-Za-z0-9_]+ \.\.\. )?(SCALE RESULT: .*)$/- \2/p' "$output")
  [ -n "$results" ] || return 0
  commit=$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo "an unknown commit")
  git -C "$REPO_ROOT" diff --quiet HEAD -- src tests hack 2>/dev/null || commit="$commit with local changes"
  {
    printf '\n### %s, %s, %s cores, %s GiB\n\n' "$(date -u '+%Y-%m-%d %H:%M UTC')" "$commit" \
      "$(nproc)" "$(awk '/^MemTotal:/ { printf "%.0f", $2 / 1048576 }' /proc/meminfo)"
    printf '```sh\n%s\n```\n\n%s\n' "$command" "$results"
  } >>"$doc"
}

# krs_go_env sets up a self-contained Go environment under $KRS_HOME/go:
# module cache, build cache and GOPATH are private to this project so that
# removing $KRS_HOME removes everything the scripts downloaded or built.
krs_go_env() {
  if ! command -v go >/dev/null 2>&1; then
    if [[ -x /usr/local/go/bin/go ]]; then
      PATH=/usr/local/go/bin:$PATH
    else
      die "go not found on PATH (need Go >= 1.26)"
    fi
  fi
  export GOPATH=$KRS_HOME/go
  export GOMODCACHE=$KRS_HOME/go/pkg/mod
  export GOCACHE=$KRS_HOME/go/cache
  # Never download another Go toolchain behind our back.
  export GOTOOLCHAIN=${KRS_GOTOOLCHAIN:-local}
  export GOFLAGS="-mod=mod -buildvcs=false"
  export CGO_ENABLED=0
  export GOWORK=off
  unset GOBIN
}

# pid_alive PID: the process exists and is not a zombie.
pid_alive() {
  local state
  [[ "${1:-}" =~ ^[0-9]+$ ]] || return 1
  state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
  [[ -n "$state" && "$state" != Z && "$state" != X ]]
}

# wait_pids_gone TIMEOUT PID...: wait until none of the PIDs is alive.
wait_pids_gone() {
  local timeout=$1 deadline=$((SECONDS + $1)) p alive
  shift
  while :; do
    alive=""
    for p in "$@"; do
      pid_alive "$p" && alive+=" $p"
    done
    [[ -z "$alive" ]] && return 0
    if ((SECONDS >= deadline)); then
      log "still running after ${timeout}s:$alive"
      return 1
    fi
    sleep 0.1
  done
}

# cluster_pids DIR prints the pids recorded in DIR/pids/*.pid, one a line.
cluster_pids() {
  local f
  for f in "$1"/pids/*.pid; do
    [[ -f "$f" ]] && echo "$(<"$f")"
  done
  return 0
}

# run_fds_closed CMD...: runs CMD with only stdin/stdout/stderr open. kwokctl
# forks the cluster's daemons, which would otherwise inherit (and keep open
# forever) any other descriptor of our caller, e.g. a CI runner's pipe.
run_fds_closed() {
  (
    local fd
    for fd in /proc/"$BASHPID"/fd/*; do
      fd=${fd##*/}
      if [[ "$fd" =~ ^[0-9]+$ ]] && ((fd > 2)); then
        eval "exec $fd>&-" 2>/dev/null || true
      fi
    done
    exec "$@"
  )
}

# kwokctl_log_filter shortens kwokctl's JSON log lines at INFO level to
# "  kwokctl: <msg> (<elapsed>)"; anything else (warnings, errors) is kept whole.
kwokctl_log_filter() {
  sed -u -E \
    -e 's/^\{"time":"[^"]*","level":"INFO".*"msg":"([^"]*)".*"human":"([^"]*)".*$/  kwokctl: \1 (\2)/' \
    -e 's/^\{"time":"[^"]*","level":"INFO".*"msg":"([^"]*)".*$/  kwokctl: \1/'
}

# krs_kubectl runs kubectl (the pinned one if built) against the local cluster.
krs_kubectl() {
  local k=kubectl
  [[ -x "$KRS_BIN/kubectl" ]] && k=$KRS_BIN/kubectl
  "$k" --kubeconfig "$KRS_KUBECONFIG" "$@"
}

# ensure_tmux: `karpenter top` is tested in a real terminal (tmux); install it from the
# distribution's packages when it is missing and this is a Debian-like machine run as root.
ensure_tmux() {
  command -v tmux >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing tmux (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >&2 \
      || { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >&2; }
  fi
  command -v tmux >/dev/null || die "tmux is needed by the tests of karpenter top; install it (apt-get install tmux)"
}

# install_crds: applies the CRDs of crds/ (generated from the Rust types; a test fails when they
# drift) to the cluster of KUBECONFIG and waits until they are established.
install_crds() {
  kubectl apply --server-side --force-conflicts -f "$REPO_ROOT/crds/" >&2
  kubectl wait --for condition=established --timeout=60s \
    crd/nodepools.karpenter.sh crd/nodeclaims.karpenter.sh crd/ec2nodeclasses.karpenter.k8s.aws \
    crd/nodeoverlays.karpenter.sh crd/capacitybuffers.autoscaling.x-k8s.io >&2
}
