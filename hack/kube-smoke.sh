#!/usr/bin/env bash
# Smoke test of the local control plane started by hack/kube-up.sh:
#
#   - /readyz answers and the server reports $K8S_VERSION
#   - a hand-made Node (cpu 4, memory 8Gi, pods 110) becomes Ready (kwok)
#   - a Deployment with a nodeSelector for it gets a Running pod on it
#     (kube-controller-manager + kube-scheduler + kwok)
#   - a CRD with an x-kubernetes-validations (CEL) rule rejects a bad object
#
# Everything it creates is deleted again. Output on stderr; exit 0 = pass.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

NODE=krs-smoke-node
DEPLOY=krs-smoke
NS=default
CRD=widgets.smoke.karpenter-rs.dev
TIMEOUT=${SMOKE_TIMEOUT:-60}

k() {
  krs_kubectl --request-timeout=10s "$@"
}

cleanup() {
  k -n "$NS" delete deployment "$DEPLOY" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  k -n "$NS" delete widgets.smoke.karpenter-rs.dev --all --ignore-not-found >/dev/null 2>&1 || true
  k delete crd "$CRD" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  k -n "$NS" delete pod -l app="$DEPLOY" --ignore-not-found --grace-period=0 --force >/dev/null 2>&1 || true
  k delete node "$NODE" --ignore-not-found >/dev/null 2>&1 || true
}

fail() {
  log "FAIL: $*"
  k get nodes -o wide >&2 || true
  k -n "$NS" get pods -o wide >&2 || true
  cleanup
  exit 1
}

# wait_for DESCRIPTION COMMAND...: retry COMMAND until it succeeds.
wait_for() {
  local what=$1 deadline=$((SECONDS + TIMEOUT))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || fail "timed out after ${TIMEOUT}s waiting for $what"
    sleep 0.5
  done
}

[[ -s "$KRS_KUBECONFIG" ]] || die "no kubeconfig at $KRS_KUBECONFIG; run hack/kube-up.sh first"
start=$(now_s)
cleanup

# 1. health and version
[[ "$(k get --raw /readyz)" == ok ]] || fail "/readyz is not ok"
server_version=$(k get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
[[ "$server_version" == "$K8S_VERSION" ]] || fail "server version is '$server_version', want $K8S_VERSION"
log "ok: /readyz, server version $server_version"

# 2. a Node made by hand becomes Ready
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $NODE
  labels:
    kubernetes.io/hostname: $NODE
    karpenter-rs.dev/smoke: "true"
status:
  capacity:
    cpu: "4"
    memory: 8Gi
    pods: "110"
  allocatable:
    cpu: "4"
    memory: 8Gi
    pods: "110"
EOF
node_ready() {
  [[ "$(k get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}
wait_for "node $NODE to be Ready" node_ready
log "ok: node $NODE is Ready (allocatable cpu=$(k get node "$NODE" -o jsonpath='{.status.allocatable.cpu}'))"

# 3. a Deployment lands on it and its pod runs
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata:
  name: $DEPLOY
spec:
  replicas: 1
  selector:
    matchLabels:
      app: $DEPLOY
  template:
    metadata:
      labels:
        app: $DEPLOY
    spec:
      nodeSelector:
        karpenter-rs.dev/smoke: "true"
      containers:
      - name: pause
        image: registry.k8s.io/pause:3.10
        resources:
          requests:
            cpu: 500m
            memory: 128Mi
EOF
pod_running() {
  local out
  out=$(k -n "$NS" get pods -l app="$DEPLOY" -o jsonpath='{range .items[*]}{.status.phase} {.spec.nodeName}{"\n"}{end}')
  [[ "$out" == "Running $NODE" ]]
}
wait_for "a Running pod of deployment $DEPLOY on $NODE" pod_running
log "ok: deployment $DEPLOY has a Running pod on $NODE"

# 4. CEL validation rules in CRDs are enforced
k apply -f - >/dev/null <<EOF
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: $CRD
spec:
  group: smoke.karpenter-rs.dev
  scope: Namespaced
  names:
    kind: Widget
    plural: widgets
    singular: widget
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            x-kubernetes-validations:
            - rule: self.min <= self.max
              message: min must not exceed max
            properties:
              min:
                type: integer
              max:
                type: integer
EOF
wait_for "CRD $CRD to be Established" k wait --for=condition=Established "crd/$CRD" --timeout=5s
widget() {
  k -n "$NS" apply -f - 2>&1 <<EOF
apiVersion: smoke.karpenter-rs.dev/v1
kind: Widget
metadata:
  name: $1
spec:
  min: $2
  max: $3
EOF
}
# The new resource may take a moment to be served.
wait_for "widgets to be served" widget good 1 2
if out=$(widget bad 3 2); then
  fail "a Widget with min > max was accepted: $out"
fi
[[ "$out" == *"min must not exceed max"* ]] || fail "unexpected rejection: $out"
log "ok: CEL rule rejected a bad object: ${out##*: }"

cleanup
node_gone() {
  ! k get node "$NODE" >/dev/null 2>&1
}
wait_for "node $NODE to be deleted" node_gone
log "PASS: smoke test in $(elapsed "$start")"
