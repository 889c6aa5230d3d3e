#!/usr/bin/env bash
# Copies the generated CRDs (crds/*.yaml) into both Helm charts:
#   charts/karpenter/crds/          installed by Helm before the chart (never upgraded by Helm)
#   charts/karpenter-crd/templates/ regular templates, upgraded with the release (GitOps)
# The copies are byte-identical; files there that crds/ no longer has are removed.
#
#   hack/sync-chart-crds.sh           copy
#   hack/sync-chart-crds.sh --check   only report drift (exit 1 when a copy differs)
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$REPO_ROOT/crds
DESTS=("$REPO_ROOT/charts/karpenter/crds" "$REPO_ROOT/charts/karpenter-crd/templates")

check=false
case "${1:-}" in
  "") ;;
  --check) check=true ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

shopt -s nullglob
sources=("$SRC"/*.yaml)
if [[ ${#sources[@]} -eq 0 ]]; then
  echo "no CRDs in $SRC: generate them first (make crds)" >&2
  exit 1
fi

drift=0
for dest in "${DESTS[@]}"; do
  rel=${dest#"$REPO_ROOT"/}
  $check || mkdir -p "$dest"
  for src in "${sources[@]}"; do
    name=$(basename "$src")
    if ! cmp -s "$src" "$dest/$name"; then
      if $check; then
        echo "$rel/$name differs from crds/$name" >&2
        drift=1
      else
        cp "$src" "$dest/$name"
        echo "updated $rel/$name" >&2
      fi
    fi
  done
  for existing in "$dest"/*.yaml; do
    name=$(basename "$existing")
    if [[ ! -f "$SRC/$name" ]]; then
      if $check; then
        echo "$rel/$name has no counterpart in crds/" >&2
        drift=1
      else
        rm "$existing"
        echo "removed $rel/$name" >&2
      fi
    fi
  done
done

if $check && [[ $drift -ne 0 ]]; then
  echo "chart CRDs are out of date: run hack/sync-chart-crds.sh" >&2
  exit 1
fi
