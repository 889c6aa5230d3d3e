#!/usr/bin/env bash
# The benchmarks of docs/benchmarks.md, with the release build:
#   1. the scheduling simulation (criterion, `cargo bench --bench scheduling`) and consolidation
#      decisions over 500 and 2000 nodes (`cargo bench --bench disruption`), and the full cost of
#      plans (`cargo bench --bench nodecost`), and the bytes held per cached pod and NodeClaim and
#      per node view (`cargo bench --bench memory`);
#   2. on the local control plane with the kwok provider: 1000 pods of two Deployments, 500 pods
#      that each need a node of their own (a leader and a standby replica run), 200 nodes left
#      at 25 % CPU consolidating under a 10 % budget, and 50 drifted nodes replaced under a 10 %
#      budget; then 2,000 pods that each need a node (a leader and a standby), and the same with
#      the leader killed half way, the standby taking over; then 20,000 pods of six Deployments,
#      2,000 nodes consolidating and 1,000 drifted nodes replaced.
# Each prints its figures. The scale runs' summary lines (`SCALE RESULT`) are appended to
# docs/benchmarks.md ("Runs recorded by make bench") with the command, the commit and the machine;
# the rest are recorded in its sections by hand, with the date and the machine's load.
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

start=$(now_s)
log "== scheduling simulation (cargo bench --bench scheduling)"
cargo bench --locked --bench scheduling
log "== consolidation decisions (cargo bench --bench disruption)"
cargo bench --locked --bench disruption
log "== full cost of plans (cargo bench --bench nodecost)"
cargo bench --locked --bench nodecost
log "== bytes per cached pod and NodeClaim, per node view (cargo bench --bench memory)"
cargo bench --locked --bench memory

log "== release binary, local control plane"
cargo build --locked --release --bin karpenter
eval "$("$HACK_DIR/cluster-up.sh")"
"$HACK_DIR/controller-down.sh" >&2
export KARPENTER_BIN=$REPO_ROOT/target/release/karpenter

# scale_runs TEST... runs those journeys one after the other, shows their figures as they come and
# records them (record_scale_results); fails as the journeys do.
scale_runs() {
  local output status
  output=$(mktemp)
  set +e
  cargo test --locked --test e2e -- --ignored --nocapture --test-threads 1 "$@" 2>&1 | tee "$output" |
    grep --line-buffered -E 'SCALE RESULT|^test |test result'
  status=${PIPESTATUS[0]}
  set -e
  record_scale_results "# make bench, with the release build and the local control plane up:
KARPENTER_BIN=\$PWD/target/release/karpenter cargo test --test e2e -- --ignored --nocapture --test-threads 1 $*" "$output"
  rm -f "$output"
  return "$status"
}

log "== 1000 pods, then 500 nodes, then consolidating 200 nodes, then rolling 50 drifted nodes (kwok)"
scale_runs a_thousand_pods_with_kwok five_hundred_nodes_with_kwok consolidating_two_hundred_nodes_with_kwok \
  rolling_fifty_drifted_nodes_with_kwok

log "== 2,000 nodes, then a standby taking over half way through 2,000 (kwok)"
scale_runs two_thousand_nodes_with_kwok standby_takes_over_at_two_thousand_nodes_with_kwok

log "== 20,000 pods, then consolidating 2,000 nodes, then rolling 1,000 drifted nodes (kwok)"
scale_runs twenty_thousand_pods_with_kwok consolidating_two_thousand_nodes_with_kwok \
  rolling_a_thousand_drifted_nodes_with_kwok

log "benchmarks done in $(elapsed "$start")"
