#!/usr/bin/env bash
# Runs every test of the project, starting what they need:
#   1. formatting, the modules' layering (hack/layering.py) and lints;
#   2. the pinned control-plane tools (built once, cached), then the Rust test binaries, so that
#      no build runs while tests do; the crate is compiled once, through clippy-driver, so that the
#      one build both lints (warnings denied) and makes the test binaries;
#   3. the local control plane and AWS emulator (hack/cluster-up.sh);
#   4. all Rust tests, including those that need the control plane; the emulator, Helm chart and
#      Dockerfile tests;
#   5. the container image's builder stage, its instructions read from the Dockerfile and run
#      without a container engine (release profile made cheap through cargo's environment).
set -euo pipefail

# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT"

start=$(now_s)
step() { log "== $*"; }

step "rustfmt"
cargo fmt --check

step "layering (imports point down: util < apis < scheduling < state < disruption < controllers, cloudprovider < operator < tools)"
python3 "$HACK_DIR/layering.py"

step "tools (cached by version)"
"$HACK_DIR/tools.sh" >&2

# clippy-driver compiles the crate's own targets like rustc and lints them as `cargo clippy
# --all-targets -- -D warnings` would; the dependencies are built once, for the tests.
export RUSTC_WORKSPACE_WRAPPER
RUSTC_WORKSPACE_WRAPPER=$(command -v clippy-driver) || die "clippy-driver not found (rustup component add clippy)"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"

# A build from nothing (CI's clean checkout) gains nothing from incremental compilation, whose
# bookkeeping costs it about a tenth of the crate's compile time. Nor need it configure and
# compile jemalloc's C sources again (about 100 s of a core): the library the tests' build made
# is kept with the cached tools, by tikv-jemalloc-sys's version, and linked from there (the
# crate's JEMALLOC_OVERRIDE), and by the configuration .cargo/config.toml builds into it. Only in
# CI: a local build would rebuild it whenever a build without the variable came between.
jemalloc_cached=
if [[ -n "${CI:-}" ]]; then
  export CARGO_INCREMENTAL=0
  jemalloc_version=$(awk '/^name = "tikv-jemalloc-sys"$/ {getline; gsub(/"/, "", $3); print $3}' Cargo.lock)
  jemalloc_conf=$(sed -n 's/^JEMALLOC_SYS_WITH_MALLOC_CONF *= *"\(.*\)"/\1/p' .cargo/config.toml | tr -c 'a-z0-9\n' '_')
  jemalloc_cached=$KARPENTER_RS_HOME/jemalloc/$jemalloc_version-$(rustc -vV | sed -n 's/^host: //p')-debug-${jemalloc_conf:-default}/libjemalloc_pic.a
  if [[ -n "$jemalloc_version" && -f "$jemalloc_cached" ]]; then
    export JEMALLOC_OVERRIDE=$jemalloc_cached
  fi
fi

step "clippy and test binaries (one build)"
cargo test --locked --all-targets --no-run
if [[ -n "$jemalloc_cached" && -z "${JEMALLOC_OVERRIDE:-}" ]]; then
  built=$(ls -t "${CARGO_TARGET_DIR:-target}"/debug/build/tikv-jemalloc-sys-*/out/build/lib/libjemalloc_pic.a 2>/dev/null | head -1 || true)
  if [[ -n "$built" ]]; then
    mkdir -p "$(dirname "$jemalloc_cached")"
    cp "$built" "$jemalloc_cached.tmp.$$" && mv "$jemalloc_cached.tmp.$$" "$jemalloc_cached"
  fi
fi

step "tmux (karpenter top is driven in a real terminal)"
ensure_tmux

step "local control plane and AWS emulator"
# The emulator records every AWS request of the controller from here on (hack/moto/call_log.py);
# tests/aws_emulator/test_controller_policy.py checks them against the IAM policy of
# docs/install.md once the Rust tests have run.
export KARPENTER_RS_MOTO_CALL_LOG=$REPO_ROOT/target/aws-calls/controller.jsonl
mkdir -p "$(dirname "$KARPENTER_RS_MOTO_CALL_LOG")"
: >"$KARPENTER_RS_MOTO_CALL_LOG"
eval "$("$HACK_DIR/cluster-up.sh")"

# The cluster tests of the library (run first) watch NodeClaims: the CRDs must be there.
install_crds

# The end-to-end tests run their own controllers; the demo's must not act alongside them.
"$HACK_DIR/controller-down.sh" >&2

step "Rust tests (unit, CRD drift, API server validation, leader election)"
# Every test target but the journeys and the AWS emulator's tests (tests/<name>.rs; tests/e2e and
# tests/aws are run next); the fault-injection run (tests/chaos.rs) is `make chaos`: not here.
suites=()
for t in tests/*.rs; do
  [[ "$(basename "$t")" == aws.rs ]] || suites+=(--test "$(basename "$t" .rs)")
done
cargo test --locked --lib --bins "${suites[@]}" -- --include-ignored --skip chaos_with_
cargo test --locked --doc
# The one AWS emulator test that also writes NodeClaims to the cluster: the journeys' controllers
# would act on them, so it runs before the journeys start.
aws_cluster_test=garbage_collection_deletes_claims_whose_instance_is_gone
cargo test --locked --test aws -- --include-ignored --exact "$aws_cluster_test"

step "end-to-end journeys (those sharing the kwok controller side by side), the AWS emulator's tests beside them"
# A thread per journey: the ones that share a controller overlap, the others wait for the cluster
# to themselves (tests/e2e/support.rs). The benchmark journeys are `make bench`. The AWS emulator's tests that need the emulator alone (no cluster)
# run meanwhile; the aws journeys, which publish node images, wait for them to end.
aws_tests_done=$REPO_ROOT/target/aws-tests.done
aws_tests_log=$REPO_ROOT/target/aws-tests.log
rm -f "$aws_tests_done"
(
  rc=0
  cargo test --locked --test aws -- --include-ignored --skip "$aws_cluster_test" >"$aws_tests_log" 2>&1 || rc=$?
  echo "$rc" >"$aws_tests_done"
) &
aws_tests=$!
# The journeys marked `#[ignore = "benchmark: ..."]` are make bench's; every other ignored journey
# must say it is make test's, so that a new journey is never left out of both, nor run here by
# accident.
bench_journeys=()
while read -r reason name; do
  case "$reason" in
    benchmark) bench_journeys+=(--skip "$name") ;;
    test) ;;
    *) die "tests/e2e: journey $name is neither make test's nor a benchmark (its #[ignore] reason)" ;;
  esac
done < <(awk '
  /^#\[ignore = "benchmark: / { reason = "benchmark"; next }
  /^#\[ignore = ".*: make test"\]/ { reason = "test"; next }
  /^#\[ignore/ { reason = "other"; next }
  /^async fn / && reason != "" { name = $3; sub(/\(.*/, "", name); print reason, name; reason = "" }
' tests/e2e/main.rs)
e2e_rc=0
KARPENTER_RS_E2E_AFTER_AWS_TESTS=$aws_tests_done cargo test --locked --test e2e -- --include-ignored --test-threads 16 --exact "${bench_journeys[@]}" || e2e_rc=$?
wait "$aws_tests" || true
log "AWS emulator's tests (tests/aws.rs):"
cat "$aws_tests_log"
[[ "$(cat "$aws_tests_done" 2>/dev/null)" == 0 ]] || die "the AWS emulator's tests failed (above)"
[[ "$e2e_rc" == 0 ]] || die "the end-to-end journeys failed (above)"

step "AWS emulator, Helm chart and Dockerfile tests"
"$("$HACK_DIR/moto-up.sh" --venv)/bin/python" -m pytest -q -p no:cacheprovider tests/aws_emulator tests/chart
# Recording off again (a demo controller started later is not logged).
KARPENTER_RS_MOTO_CALL_LOG= "$HACK_DIR/moto-up.sh" >/dev/null

step "container image builder stage (the Dockerfile's own instructions, release profile made cheap)"
# As the Dockerfile builds it: plain rustc. The optimised build is `docker build` (and `make bench`).
env -u RUSTC_WORKSPACE_WRAPPER -u CLIPPY_ARGS -u JEMALLOC_OVERRIDE -u CARGO_INCREMENTAL "$HACK_DIR/docker-build-stage.sh" --quick

log "all tests passed in $(elapsed "$start")"
