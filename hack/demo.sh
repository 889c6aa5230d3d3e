#!/usr/bin/env bash
# The demo: a local control plane and AWS emulator, the Karpenter CRDs, and the example
# NodePools and EC2NodeClass applied to it.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

start=$(now_s)
"$HACK_DIR/tools.sh" >&2
log "building karpenter"
cargo build --locked --bin karpenter >&2
eval "$("$HACK_DIR/cluster-up.sh")"

log "installing the CRDs"
# Through cargo, so that a CARGO_TARGET_DIR elsewhere works too.
cargo run --quiet --locked --bin karpenter -- crds | kubectl apply --server-side --force-conflicts -f - >&2
kubectl wait --for condition=established --timeout=60s \
  crd/nodepools.karpenter.sh crd/nodeclaims.karpenter.sh crd/ec2nodeclasses.karpenter.k8s.aws >&2

log "applying examples/"
kubectl apply -f examples/ >&2

log "demo ready in $(elapsed "$start"); to use this cluster from your shell:"
log "  eval \"\$(make -s cluster-up)\""
echo
kubectl get nodepools,ec2nodeclasses
echo
kubectl get nodeclaim -o wide
