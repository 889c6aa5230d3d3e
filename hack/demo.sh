#!/usr/bin/env bash
# The demo, the getting-started journey on a local control plane: the Karpenter CRDs, the
# controller (kwok cloud provider by default; DEMO_CLOUD_PROVIDER=aws for the AWS emulator), the
# example NodePools, EC2NodeClass and inflate Deployment; then inflate is scaled to 6 replicas
# and the NodeClaims launched for them are shown.
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
install_crds

log "starting the controller"
"$HACK_DIR/controller-up.sh" "${DEMO_CLOUD_PROVIDER:-kwok}" >&2

log "applying examples/"
# The examples name the cluster karpenter-demo (discovery tags, node role): use ours.
for f in examples/*.yaml; do
  sed "s/karpenter-demo/$CLUSTER_NAME/g" "$f"
  echo "---"
done | kubectl apply -f - >&2

log "kubectl scale deployment karpenter-inflate --replicas 6"
kubectl scale deployment karpenter-inflate --replicas 6 >&2
kubectl rollout status deployment karpenter-inflate --timeout=180s >&2 || {
  tail -n 30 "$KRS_HOME/controller/$CLUSTER_NAME.log" >&2
  die "inflate did not become available; controller log: $KRS_HOME/controller/$CLUSTER_NAME.log"
}
kubectl wait nodeclaim -l karpenter.sh/nodepool=default --for=condition=Ready --timeout=60s >&2

log "demo ready in $(elapsed "$start"); to use this cluster from your shell:"
log "  eval \"\$(make -s cluster-up)\""
log "controller log: $KRS_HOME/controller/$CLUSTER_NAME.log; stop everything with: make cluster-down"
echo
kubectl get nodepools,ec2nodeclasses
echo
kubectl get nodeclaim -o wide
