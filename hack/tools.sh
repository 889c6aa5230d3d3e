#!/usr/bin/env bash
# Builds, once, the pinned local control-plane tools from the Go module proxy
# and caches them by version:
#
#   $KRS_HOME/versions/<name>-<version>/<name>   the binary
#   $KRS_HOME/bin/<name>                         symlink to it (put first on PATH)
#
# Tools: etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl (same version as the server, so $KRS_BIN/kubectl has no version
# skew), kwok, kwokctl, helm (versions in hack/versions.env).
#
# Go environment: a private GOPATH/GOMODCACHE/GOCACHE under $KRS_HOME/go, so
# the cache is self-contained (`rm -rf $KRS_HOME` removes everything). The
# build cache for Kubernetes is a few GiB; once all binaries exist it can be
# dropped with `hack/tools.sh --prune-go-cache`.
#
# Usage: hack/tools.sh [--force] [--prune-go-cache] [TOOL...]
#   --force            rebuild the named (default: all) tools even if cached
#   --prune-go-cache   after building, delete $KRS_HOME/go/cache (build cache)
#
# A warm run (everything cached) does not invoke go at all. Builds run
# sequentially and write to a temp file that is moved into place, so an
# interrupted run is simply re-run.
#
# Needs Go >= 1.26 (etcd, kwok and helm at the pinned versions declare
# `go 1.26.0`). GOTOOLCHAIN=local is used so that go never fetches another
# toolchain; KRS_GOTOOLCHAIN=auto allows that (from the module proxy).
# Everything comes from the Go module proxy: no other download.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

ALL_TOOLS=(kwok kwokctl etcd kube-apiserver kube-controller-manager kube-scheduler kubectl helm)
LDFLAGS_BASE="-s -w"

tool_version() {
  case "$1" in
    etcd) echo "$ETCD_VERSION" ;;
    kube-apiserver | kube-controller-manager | kube-scheduler | kubectl) echo "$K8S_VERSION" ;;
    kwok | kwokctl) echo "$KWOK_VERSION" ;;
    helm) echo "$HELM_VERSION" ;;
    *) die "unknown tool: $1 (known: ${ALL_TOOLS[*]})" ;;
  esac
}

tool_path() {
  echo "$KRS_VERSIONS/$1-$(tool_version "$1")/$1"
}

# link_tool NAME points $KRS_BIN/NAME at the cached versioned binary.
link_tool() {
  local target
  target=$(tool_path "$1")
  if [[ "$(readlink "$KRS_BIN/$1" 2>/dev/null || true)" != "$target" ]]; then
    ln -sfn "$target" "$KRS_BIN/$1"
  fi
}

# place_tool NAME FILE moves a freshly built FILE into the cache atomically.
place_tool() {
  local dest
  dest=$(tool_path "$1")
  mkdir -p "$(dirname "$dest")"
  chmod 0755 "$2"
  mv -f "$2" "$dest"
  link_tool "$1"
}

# gomod_file MODULE@VERSION downloads a module and prints its go.mod path.
gomod_file() {
  go mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p'
}

# local_replaces GOMOD PREFIX prints the module paths that GOMOD replaces
# with a local directory starting with PREFIX (e.g. ./staging/ or ../).
local_replaces() {
  awk -v prefix="$2" '
    /^replace[[:space:]]*\($/ { inblock = 1; next }
    inblock && /^\)/ { inblock = 0; next }
    {
      line = $0
      if (!inblock && line !~ /^replace[[:space:]]/) next
      sub(/^replace[[:space:]]+/, "", line)
      n = split(line, f, /[[:space:]]+/)
      for (i = 1; i <= n; i++) if (f[i] == "=>" && index(f[i+1], prefix) == 1) {
        j = (f[1] == "") ? 2 : 1
        print f[j]
      }
    }' "$1" | sort -u
}

# gomod_directive GOMOD WORD prints the first `WORD ...` line (go, godebug).
gomod_directive() {
  grep -E "^$2[[:space:]]" "$1" | head -n1 || true
}

# ---------------------------------------------------------------------------

build_kwok() {
  local tmp
  tmp=$(mktemp -d "$KRS_HOME/tmp/build.kwok.XXXXXX")
  GOBIN=$tmp GOFLAGS=-buildvcs=false go install -trimpath -ldflags "$LDFLAGS_BASE" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
  place_tool kwok "$tmp/kwok"
  place_tool kwokctl "$tmp/kwokctl"
  rm -rf "$tmp"
}

build_helm() {
  local tmp gomod kver major minor ldflags
  tmp=$(mktemp -d "$KRS_HOME/tmp/build.helm.XXXXXX")
  # Same version stamping as helm's Makefile.
  gomod=$(gomod_file "helm.sh/helm/v3@$HELM_VERSION")
  kver=$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")
  kver=${kver#v}
  major=$((${kver%%.*} + 1))
  minor=$(echo "$kver" | cut -d. -f2)
  ldflags="$LDFLAGS_BASE -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major"
  ldflags+=" -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor"
  ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major"
  ldflags+=" -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor"
  GOBIN=$tmp GOFLAGS=-buildvcs=false go install -trimpath -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  place_tool helm "$tmp/helm"
  rm -rf "$tmp"
}

# prepare_module DIR GO_MOD TOOLS_GO writes a throw-away module (go.mod and a
# tools.go importing the packages to build) and runs `go mod tidy`, unless DIR
# already holds one made from the same inputs.
prepare_module() {
  local dir=$1 spec
  spec=$(printf '%s\n--\n%s\n' "$2" "$3")
  if [[ -f "$dir/.spec" && "$(cat "$dir/.spec")" == "$spec" ]]; then
    return 0
  fi
  rm -rf "$dir"
  mkdir -p "$dir"
  printf '%s\n' "$2" >"$dir/go.mod"
  printf '%s\n' "$3" >"$dir/tools.go"
  (cd "$dir" && go mod tidy) >&2
  printf '%s' "$spec" >"$dir/.spec"
}

# k8s.io/kubernetes cannot be `go install`ed: its go.mod replaces every
# staging module (k8s.io/api, k8s.io/client-go, ...) with ./staging/src/...
# A throw-away module requires it and replaces each of those staging modules
# (the list is read from k8s.io/kubernetes's own go.mod) with the published
# k8s.io/<name> v0.<minor>.<patch>.
kube_module_dir() {
  local dir=$KRS_HOME/build/kubernetes-$K8S_VERSION
  local gomod staging_version mods m gomod_in tools_go
  gomod=$(gomod_file "k8s.io/kubernetes@$K8S_VERSION")
  [[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
  staging_version=v0.${K8S_VERSION#v1.}
  mapfile -t mods < <(local_replaces "$gomod" ./staging/)
  ((${#mods[@]} > 0)) || die "no staging replaces found in $gomod"
  log "kubernetes: replacing ${#mods[@]} staging modules with $staging_version"
  gomod_in=$(
    echo "module karpenter-rs.local/kube-build"
    echo
    gomod_directive "$gomod" go
    gomod_directive "$gomod" godebug
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in "${mods[@]}"; do
      echo "	$m => $m $staging_version"
    done
    echo ")"
  )
  tools_go='//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)'
  prepare_module "$dir" "$gomod_in" "$tools_go"
  echo "$dir"
}

build_kube() {
  local name=$1 dir info build_date tmp ldflags key val kv
  dir=$(kube_module_dir)
  # Same version stamping as upstream's hack/lib/version.sh, so that
  # `--version` and /version report the real version (not v0.0.0).
  info=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"Info": "\(.*\)",\{0,1\}$/\1/p')
  build_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info" 2>/dev/null || true)
  build_date=${build_date:-1970-01-01T00:00:00Z}
  local -a stamps=(
    "gitVersion=$K8S_VERSION"
    "gitMajor=$(echo "${K8S_VERSION#v}" | cut -d. -f1)"
    "gitMinor=$(echo "${K8S_VERSION#v}" | cut -d. -f2)"
    "gitTreeState=clean"
    "gitCommit="
    "buildDate=$build_date"
  )
  ldflags=$LDFLAGS_BASE
  for kv in "${stamps[@]}"; do
    key=${kv%%=*}
    val=${kv#*=}
    ldflags+=" -X k8s.io/component-base/version.$key=$val"
    ldflags+=" -X k8s.io/client-go/pkg/version.$key=$val"
  done
  tmp=$(mktemp "$KRS_HOME/tmp/build.$name.XXXXXX")
  (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$tmp" "k8s.io/kubernetes/cmd/$name") >&2
  place_tool "$name" "$tmp"
}

# etcd's main package is go.etcd.io/etcd/server/v3 (its main.go calls
# etcdmain.Main(os.Args)), but that module replaces its sibling modules with
# ../api, ../client/... so it cannot be `go install`ed either. Same trick:
# each locally replaced sibling is pinned to ETCD_VERSION.
etcd_module_dir() {
  local dir=$KRS_HOME/build/etcd-$ETCD_VERSION
  local gomod mods m gomod_in tools_go
  gomod=$(gomod_file "go.etcd.io/etcd/server/v3@$ETCD_VERSION")
  [[ -f "$gomod" ]] || die "could not download go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  mapfile -t mods < <(local_replaces "$gomod" ../)
  log "etcd: pinning ${#mods[@]} sibling modules to $ETCD_VERSION"
  gomod_in=$(
    echo "module karpenter-rs.local/etcd-build"
    echo
    gomod_directive "$gomod" go
    gomod_directive "$gomod" godebug
    echo
    echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    if ((${#mods[@]} > 0)); then
      echo
      echo "replace ("
      for m in "${mods[@]}"; do
        echo "	$m => $m $ETCD_VERSION"
      done
      echo ")"
    fi
  )
  tools_go='//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3"'
  prepare_module "$dir" "$gomod_in" "$tools_go"
  echo "$dir"
}

build_etcd() {
  local dir tmp
  dir=$(etcd_module_dir)
  tmp=$(mktemp "$KRS_HOME/tmp/build.etcd.XXXXXX")
  (cd "$dir" && go build -trimpath -ldflags "$LDFLAGS_BASE" -o "$tmp" go.etcd.io/etcd/server/v3) >&2
  place_tool etcd "$tmp"
}

build_tool() {
  case "$1" in
    etcd) build_etcd ;;
    kube-apiserver | kube-controller-manager | kube-scheduler | kubectl) build_kube "$1" ;;
    kwok | kwokctl) build_kwok ;;
    helm) build_helm ;;
  esac
}

# ---------------------------------------------------------------------------

main() {
  local force=0 prune=0 t
  local -a tools=()
  while (($#)); do
    case "$1" in
      --force) force=1 ;;
      --prune-go-cache) prune=1 ;;
      -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
        exit 0
        ;;
      -*) die "unknown flag: $1" ;;
      *)
        tool_version "$1" >/dev/null
        tools+=("$1")
        ;;
    esac
    shift
  done
  ((${#tools[@]})) || tools=("${ALL_TOOLS[@]}")

  mkdir -p "$KRS_BIN" "$KRS_VERSIONS"

  # Fast path: nothing to build, no go invocation.
  local -a missing=()
  for t in "${tools[@]}"; do
    if ((force)) || [[ ! -x "$(tool_path "$t")" ]]; then
      missing+=("$t")
    else
      link_tool "$t"
    fi
  done
  if ((${#missing[@]} == 0)); then
    ((prune)) && rm -rf "$KRS_HOME/go/cache"
    return 0
  fi

  # Serialize concurrent runs; re-check after acquiring the lock.
  mkdir -p "$KRS_HOME/tmp"
  exec 9>"$KRS_HOME/tmp/tools.lock"
  if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
    log "another hack/tools.sh is building; waiting for it"
    flock 9
  fi
  # Leftovers of an interrupted run (nobody else builds: we hold the lock).
  rm -rf "$KRS_HOME"/tmp/build.*
  krs_go_env
  # Run go outside of any module the caller may be in.
  cd "$KRS_HOME/tmp"
  log "go: $(go version | cut -d' ' -f3-) (GOMODCACHE=$GOMODCACHE)"
  local start total_start built=" "
  total_start=$(now_s)
  for t in "${missing[@]}"; do
    if ((!force)) && [[ -x "$(tool_path "$t")" ]]; then
      link_tool "$t"
      continue
    fi
    # kwok and kwokctl are built together.
    if [[ "$built" == *" $t "* ]]; then
      continue
    fi
    log "building $t $(tool_version "$t") ..."
    start=$(now_s)
    build_tool "$t"
    case "$t" in kwok | kwokctl) built+="kwok kwokctl " ;; *) built+="$t " ;; esac
    log "built $t $(tool_version "$t") in $(elapsed "$start") -> $(tool_path "$t")"
  done
  log "tools ready in $(elapsed "$total_start") (binaries in $KRS_BIN)"
  ((prune)) && rm -rf "$KRS_HOME/go/cache"
  return 0
}

main "$@"
