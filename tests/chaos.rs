//! The fault-injection run of `make chaos` (docs/reliability.md): disruption of every kind while
//! the controller, the API server and EC2 fail, watched by an observer of its own.
//!
//! Each test runs two `karpenter controller` replicas with leader election on one NodePool and
//! drives consolidation (a workload scaled down), node repair (a node NotReady), expiration (a
//! short `expireAfter` in the template) and drift (template changes; with the aws provider also
//! an AMI alias change), and with the aws provider interruption messages. Meanwhile:
//!
//! - the leader is killed (SIGKILL) as soon as its log shows a command at one of the kill points
//!   ([`POINTS`]: a command decided, a node tainted, a replacement created, a node draining, an
//!   instance terminating; with kwok, whose instance is its Node, there is no such moment), and a
//!   new standby is started for every replica that goes, so that two
//!   are always there;
//! - the kube-apiserver is killed and started again in the middle of a replacement
//!   (`hack/chaos.sh restart-apiserver`);
//! - with the aws provider, EC2 calls fail through the emulator's fault endpoint
//!   (`POST /_karpenter-rs/faults`: CreateFleet without capacity, throttled, failing, stalled or
//!   losing its answer; TerminateInstances and DescribeInstances failing), and interruption
//!   messages are sent twice, out of order, and again once handled.
//!
//! The observer has its own client and watches (Pods, Nodes, NodeClaims and the NodePool) and
//! nothing of the controller's code. It counts what must never happen (docs/reliability.md
//! explains each counter); every counter is asserted 0 at the end, with its evidence printed,
//! and one `CHAOS RESULT` line sums the run up.
//!
//! Needs the local control plane and the AWS emulator, and a kube-apiserver it may restart: run
//! through `make chaos` (hack/chaos.sh); ignored otherwise.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "e2e/support.rs"]
#[allow(dead_code)]
mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use karpenter::apis::{EC2NodeClass, NodeClaim, NodePool};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use support::*;

/// The kill points: what the leader's log says when it is killed. A line is matched by its
/// message (a replacement's `created nodeclaim` only from the disruption controller; `draining`
/// also when the drain deletes pods at the end of the grace period).
const POINTS: [&str; 5] =
    ["disrupting node(s)", "tainted node", "created nodeclaim", "draining", "terminating instance"];
/// The kill points a provider has: with kwok the instance is its Node, gone once the Node's
/// deletion is accepted, so there is no `terminating instance` moment between the instance's
/// termination and the finalizer's removal.
fn points_of(provider: &str) -> &'static [&'static str] {
    if provider == "kwok" { &POINTS[..4] } else { &POINTS }
}

/// At most this many kills at one point, so that they spread over all of them.
const PER_POINT: usize = 6;
/// A new leader is not killed before it has led this long (so that it gets some work done).
const MIN_LEAD: Duration = Duration::from_secs(4);
/// Nor sooner than this after the previous kill (the standby takes over 15-17 s after a kill,
/// when the Lease has expired).
const MIN_GAP: Duration = Duration::from_secs(12);
/// The gap during the AMI rollout, so that a replacement can finish between two kills: a kill
/// mid-command leaves an empty replacement that consolidation removes, and the drifted node is
/// tried again; at [`MIN_GAP`] nearly every command of the rollout would be killed.
const ROLLOUT_GAP: Duration = Duration::from_secs(60);
/// How long the kube-apiserver stays down in its restart.
const APISERVER_DOWN: Duration = Duration::from_secs(5);
/// How often the replicas' logs are read.
const POLL: Duration = Duration::from_millis(100);
/// A replica that went by itself is replaced at most this often.
const RESTART_GAP: Duration = Duration::from_secs(2);

/// Each pod asks for this much CPU: two share a 2-vCPU node.
const POD_CPU: &str = "900m";
/// Every pod's own grace period. A deletion with a grace period of 0 is then always someone's
/// choice, never the pod's default.
const POD_GRACE: i64 = 5;
/// The Deployment under a PodDisruptionBudget that allows one disruption.
const GUARDED: &str = "guarded";
/// The Deployment whose pods are annotated `karpenter.sh/do-not-disrupt: "true"`.
const PRECIOUS: &str = "precious";
/// The Deployment scaled down and up to drive consolidation.
const FILLER: &str = "filler";
/// The NodePool's `terminationGracePeriod`.
const TERMINATION_GRACE: &str = "30s";

const DISRUPTED_TAINT: &str = "karpenter.sh/disrupted";
const TERMINATION_TIMESTAMP: &str = "karpenter.sh/nodeclaim-termination-timestamp";
const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// The `DisruptionReason`s of voluntary disruption, which budgets limit (expiration,
/// interruption and repair are not budgeted, as upstream).
const VOLUNTARY: [&str; 3] = ["Underutilized", "Empty", "Drifted"];
const COMMAND: &str = "disrupting node(s)";
const EXPIRED: &str = "deleting expired nodeclaim";

/// A pod pending longer than this while Karpenter could act is counted.
const PENDING_LIMIT: SignedDuration = SignedDuration::from_secs(120);
/// A NodeClaim terminating longer than this is counted.
const TERMINATING_LIMIT: SignedDuration = SignedDuration::from_secs(300);
/// How long the observer waits for its other watches before judging a deletion.
const LAG: Duration = Duration::from_secs(5);
/// A budget overrun counts once it has lasted this long (shorter ones are the watches' skew).
const PERSIST: Duration = Duration::from_secs(2);
/// A percentage budget is judged against the largest it was within this long.
const BUDGET_MEMORY: Duration = Duration::from_secs(30);
/// Slack on the do-not-disrupt and PodDisruptionBudget deadlines (clocks and requests).
const SLACK: SignedDuration = SignedDuration::from_secs(2);

/// What one run does with one provider.
struct Shape {
    provider: &'static str,
    guarded: usize,
    precious: usize,
    filler: usize,
    filler_low: usize,
    budget: &'static str,
    instance_types: &'static [&'static str],
    capacity_types: &'static [&'static str],
    expire_after: &'static str,
    /// Leader kills the run must reach.
    min_kills: usize,
    /// When the run stops injecting faults and settles, from its start.
    chaos_for: Duration,
}

/// kwok provider: six nodes of one 2-vCPU type, a `20%` budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault injection on the local control plane: make chaos"]
async fn chaos_with_kwok() {
    run_chaos(Shape {
        provider: "kwok",
        guarded: 4,
        precious: 2,
        filler: 6,
        filler_low: 2,
        budget: "20%",
        instance_types: &["c6a.large"],
        capacity_types: &["on-demand"],
        expire_after: "4m",
        min_kills: 20,
        chaos_for: Duration::from_secs(840),
    })
    .await;
}

/// aws provider against the emulator and the kubelet stand-in: five nodes of four 2-vCPU types,
/// spot or on-demand, a budget of one node, EC2 faults and interruption messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fault injection on the local control plane and the AWS emulator: make chaos"]
async fn chaos_with_aws() {
    run_chaos(Shape {
        provider: "aws",
        guarded: 4,
        precious: 2,
        filler: 4,
        filler_low: 1,
        budget: "1",
        instance_types: &["c6a.large", "c6i.large", "m6a.large", "m6i.large"],
        capacity_types: &["spot", "on-demand"],
        expire_after: "3m",
        min_kills: 10,
        chaos_for: Duration::from_secs(540),
    })
    .await;
}

async fn run_chaos(shape: Shape) {
    let _alone = alone().await;
    let aws = shape.provider == "aws";
    let f = Fixture::new(&format!("chaos-{}", shape.provider)).await;
    let _standin = aws.then(Standin::start);
    let ec2 = if aws { Some(ec2().await) } else { None };
    let mut faults_before = String::new();
    if aws {
        // The faults of an earlier run that it did not use.
        let (code, body) = http_request("DELETE", &faults_url(), None).await;
        assert_eq!(
            code, 200,
            "the emulator's fault endpoint (hack/chaos.sh restarts an older emulator): {body}"
        );
        faults_before = http_request("GET", &faults_url(), None).await.1;
    }
    let mut env: Vec<(String, String)> = if aws { aws_controller_env(None) } else { Vec::new() };
    for (k, v) in [
        ("DISABLE_LEADER_ELECTION", "false"),
        ("SYSTEM_NAMESPACE", f.ns.as_str()),
        ("FEATURE_GATES", "NodeRepair=true"),
    ] {
        env.push((k.to_string(), v.to_string()));
    }
    if aws {
        env.push(("NODECLASS_REFRESH_INTERVAL".into(), "5s".into()));
        env.push(("INTERRUPTION_QUEUE".into(), cluster_name()));
    } else {
        env.push(("KWOK_REGISTRATION_DELAY".into(), "2s".into()));
    }

    let pauses: Windows = Arc::default();
    let restarting = Arc::new(AtomicBool::new(false));
    let sup: Shared =
        Arc::new(Mutex::new(Supervisor::new(shape.provider, env, pauses.clone(), restarting.clone())));
    let supervising = tokio::spawn(supervise(sup.clone()));

    f.apply_class_and_pool(1000).await;
    let requirements = json!([
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": shape.instance_types},
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": shape.capacity_types},
    ]);
    f.patch_pool(json!({"spec": {
        "template": {
            "metadata": {"labels": {"chaos-round": "r0"}},
            "spec": {"requirements": requirements, "terminationGracePeriod": TERMINATION_GRACE, "expireAfter": shape.expire_after},
        },
        "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "0s", "budgets": [{"nodes": shape.budget}]},
    }}))
    .await;
    let min_available = shape.guarded - 1;
    let observer = Observer::start(&f.pool, &f.ns, min_available, pauses.clone()).await;
    let deployments: Api<Deployment> = Api::namespaced(f.client.clone(), &f.ns);
    for (name, replicas, do_not_disrupt) in
        [(GUARDED, shape.guarded, false), (PRECIOUS, shape.precious, true), (FILLER, shape.filler, false)]
    {
        deployments
            .create(&PostParams::default(), &workload(&f.ns, &f.pool, name, replicas, do_not_disrupt))
            .await
            .unwrap();
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": GUARDED, "namespace": f.ns},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": GUARDED}}},
    }))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(f.client.clone(), &f.ns);
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();

    let by_pool = ListParams::default().labels(&format!("karpenter.sh/nodepool={}", f.pool));
    let run = Run {
        claims_api: Api::all(f.client.clone()),
        nodes_api: Api::all(f.client.clone()),
        pods_api: Api::namespaced(f.client.clone(), &f.ns),
        deployments,
        by_pool,
        f,
        sup: sup.clone(),
        restarting,
        observer,
        started: Instant::now(),
        unfinished: Mutex::new(Vec::new()),
    };
    let expected = shape.guarded + shape.precious + shape.filler;
    if aws {
        run.until("the EC2NodeClass Ready", Duration::from_secs(90), || async { run.class_ready().await })
            .await;
    }
    run.until("every pod Running", Duration::from_secs(240), || async { run.all_running(expected).await })
        .await;
    run.observer.seen.lock().unwrap().tracking = true;
    with(&sup, |s| s.armed = true);
    let mut sent = Vec::new();

    // 1. Consolidation: the filler scaled down leaves nodes to remove. Each kill in the middle of
    // a command costs the Lease's 15 s and a new decision, so the wait allows for two or three.
    run.note("consolidation: the filler scaled down");
    let before = run.live_claims().await.map(|c| c.len()).unwrap_or_default();
    run.scale(FILLER, shape.filler_low).await;
    let fewer = expected - shape.filler + shape.filler_low;
    run.until("consolidation removed a node", Duration::from_secs(240), || async {
        run.live_claims().await.is_some_and(|c| c.len() < before) && run.all_running(fewer).await
    })
    .await;
    run.scale(FILLER, shape.filler).await;
    run.until("the filler back", Duration::from_secs(150), || async { run.all_running(expected).await })
        .await;

    // 2. Repair of a node NotReady for 31 minutes, and the first NodeClaims expiring.
    run.note("repair of a NotReady node; expiry of the first NodeClaims");
    let sick = run.repair_victim().await;
    if let Some(node) = &sick {
        run.set_not_ready(node).await;
    }
    run.until("the NotReady node replaced and two NodeClaims expired", Duration::from_secs(270), || async {
        let repaired = match &sick {
            Some(node) => run.node_gone(node).await,
            None => true,
        };
        repaired && run.count(EXPIRED) >= 2 && run.all_running(expected).await
    })
    .await;

    // 3. Interruption messages (aws): twice, out of order, and again once handled.
    if aws {
        run.note("interruption: messages duplicated, out of order, redelivered");
        sent = interruptions(&run, expected).await;
    }

    // 4. Drift: a template change (labels, expireAfter back to Never). The kube-apiserver is
    // restarted when the first replacement is created; with aws, CreateFleet fails meanwhile.
    run.note("drift: template labels and expireAfter changed; kube-apiserver restart armed");
    with(&sup, |s| s.restart_at = Some(POINTS[2]));
    if aws {
        for fault in [
            json!({"action": "CreateFleet", "error": "InsufficientInstanceCapacity", "overrides": 1, "count": 2}),
            json!({"action": "CreateFleet", "error": "RequestLimitExceeded", "count": 2}),
            json!({"action": "CreateFleet", "error": "InternalError"}),
            json!({"action": "CreateFleet", "error": "InternalError", "after": true}),
            json!({"action": "CreateFleet", "error": "stall", "seconds": 20}),
        ] {
            arm(&fault).await;
        }
    }
    run.drift_round(1, Some("Never"), expected, None).await;

    // 5. AMI drift (aws): the class moves to AL2 while TerminateInstances and DescribeInstances
    // fail now and then.
    if aws {
        run.note("drift: the EC2NodeClass's AMI alias changed to al2@latest");
        for fault in [
            json!({"action": "TerminateInstances", "error": "InternalError", "count": 2}),
            json!({"action": "TerminateInstances", "error": "RequestLimitExceeded"}),
            json!({"action": "DescribeInstances", "error": "InternalError", "count": 2}),
            json!({"action": "DescribeInstances", "error": "RequestLimitExceeded", "count": 2}),
        ] {
            arm(&fault).await;
        }
        let old = run.claim_names().await;
        with(&sup, |s| s.gap = ROLLOUT_GAP);
        set_ami_alias(&run.f, "al2@latest").await;
        run.until("every node replaced onto AL2", Duration::from_secs(420), || async {
            run.replaced(&old, expected).await
        })
        .await;
        with(&sup, |s| s.gap = MIN_GAP);
    }

    // 6. More drift rounds until the kills are there (or the time is up).
    let mut round = 2;
    while !with(&sup, |s| s.kills_done(shape.min_kills)) && run.started.elapsed() < shape.chaos_for {
        run.note(&format!("drift round {round} (kills so far: {})", with(&sup, |s| s.kills_total())));
        run.drift_round(round, None, expected, Some(run.started + shape.chaos_for)).await;
        round += 1;
    }

    // 7. Settle: no more faults; the cluster must come to rest with nothing left behind.
    with(&sup, |s| {
        s.armed = false;
        s.restart_at = None;
    });
    let mut faults = "none (kwok)".to_string();
    if aws {
        let (_, status) = http_request("GET", &faults_url(), None).await;
        http_request("DELETE", &faults_url(), None).await;
        faults = describe_faults(&status, &faults_before);
    }
    run.note("settling");
    let settled = run.settle(expected).await;
    if !settled {
        run.unfinished.lock().unwrap().push("the cluster did not settle within 180 s".to_string());
    }
    // Two idle passes of the disruption controller heal what a crash left.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let (stale_taints, stale_reasons) = run.leftovers().await;
    let (orphans, bare) = run.consistency(ec2.as_ref()).await;
    let logs = with(&sup, |s| s.logs());
    let (extra, extra_evidence) = extra_replacements(&logs);
    let report = run.observer.report();
    run.observer.stop();

    let restarts = with(&sup, |s| std::mem::take(&mut s.restarts));
    let mut restarted = Vec::new();
    for restart in restarts {
        restarted.push(restart.await.unwrap());
    }
    let (kills, exits) = with(&sup, |s| (s.kills.clone(), s.exits));
    let total_kills: usize = kills.values().sum();
    let unfinished = std::mem::take(&mut *run.unfinished.lock().unwrap());
    let counters: [(&str, usize, Vec<String>); 12] = [
        ("over budget", report.found.over_budget.len(), report.found.over_budget.clone()),
        ("PDB breaches", report.found.pdb.len(), report.found.pdb.clone()),
        (
            "do-not-disrupt evicted early",
            report.found.do_not_disrupt.len(),
            report.found.do_not_disrupt.clone(),
        ),
        ("grace-0 deletions", report.found.grace_zero.len(), report.found.grace_zero.clone()),
        ("pending > 2 min", report.found.pending.len(), report.found.pending.clone()),
        ("instances without NodeClaim", orphans.len(), orphans),
        ("NodeClaims without instance", bare.len(), bare),
        ("extra replacements", extra, extra_evidence),
        ("stale disrupted taints", stale_taints.len(), stale_taints),
        ("stale DisruptionReason", stale_reasons.len(), stale_reasons),
        ("terminating > 5 min", report.found.terminating.len(), report.found.terminating.clone()),
        ("unfinished phases", unfinished.len(), unfinished),
    ];
    let kill_text = points_of(shape.provider)
        .iter()
        .map(|p| format!("{p} {}", kills.get(p).copied().unwrap_or(0)))
        .collect::<Vec<_>>();
    let counter_text = counters.iter().map(|(name, n, _)| format!("{name} {n}")).collect::<Vec<_>>();
    let restart_text = restarted
        .iter()
        .map(|r| match r {
            Ok(took) => format!("{:.0} s", took.as_secs_f64()),
            Err(e) => format!("failed: {e}"),
        })
        .collect::<Vec<_>>();
    eprintln!(
        "CHAOS RESULT: {}: 1 run of {:.1} min; {total_kills} leader kills ({}); {exits} replica(s) exited on their own; \
         {} kube-apiserver restart(s) ({}); EC2 faults injected: {faults}; interruption messages: {}; \
         most nodes in voluntary disruption at once {} (budget {}), fewest guarded replicas Ready {} (minAvailable {min_available}); \
         watch errors {}; deleted by the taint manager {}; counters: {}",
        shape.provider,
        run.started.elapsed().as_secs_f64() / 60.0,
        kill_text.join(", "),
        restarted.len(),
        restart_text.join(", "),
        if sent.is_empty() { "none".to_string() } else { sent.join(", ") },
        report.most_disrupting,
        report.budget_then,
        report.fewest_ready.map_or("-".to_string(), |n| n.to_string()),
        report.watch_errors,
        report.found.taint_manager.len(),
        counter_text.join(", "),
    );
    for line in &report.found.taint_manager {
        eprintln!("CHAOS TAINT MANAGER {line}");
    }
    for (name, n, evidence) in &counters {
        if *n > 0 {
            eprintln!("CHAOS EVIDENCE {name} ({n}):");
            for line in evidence {
                eprintln!("  - {line}");
            }
        }
    }
    for line in with(&sup, |s| s.record.clone()) {
        eprintln!("CHAOS LOG {line}");
    }

    // Cleanup before the verdict, so that a failed run leaves nothing running.
    run.deployments.delete_collection(&DeleteParams::default(), &ListParams::default()).await.unwrap();
    pdbs.delete(GUARDED, &DeleteParams::default()).await.unwrap();
    run.f.cleanup().await;
    supervising.abort();
    let replicas = with(&sup, |s| (std::mem::take(&mut s.live), std::mem::take(&mut s.gone)));
    drop(replicas);

    let failed: Vec<String> =
        counters.iter().filter(|(_, n, _)| *n > 0).map(|(name, n, _)| format!("{name}: {n}")).collect();
    assert!(failed.is_empty(), "counters not 0 (evidence above): {}", failed.join(", "));
    assert!(
        total_kills >= shape.min_kills,
        "{total_kills} leader kills, fewer than the {} the run is for",
        shape.min_kills
    );
    for point in points_of(shape.provider) {
        assert!(kills.get(point).copied().unwrap_or(0) >= 1, "no kill at {point:?}: {kills:?}");
    }
    assert!(!restarted.is_empty(), "the kube-apiserver was never restarted in the middle of a command");
    assert!(restarted.iter().all(Result::is_ok), "the kube-apiserver restart failed: {restart_text:?}");
}

// -------------------------------------------------------------------------------------------
// The workloads

fn workload(ns: &str, pool: &str, name: &str, replicas: usize, do_not_disrupt: bool) -> Deployment {
    let mut template = json!({
        "metadata": {"labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": POD_GRACE,
            "nodeSelector": {"karpenter.sh/nodepool": pool},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": POD_CPU}}}],
        },
    });
    if do_not_disrupt {
        template["metadata"]["annotations"] = json!({DO_NOT_DISRUPT: "true"});
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template},
    }))
    .unwrap()
}

// -------------------------------------------------------------------------------------------
// The replicas and the faults done to them

/// Time windows in which Karpenter could not act: no leader (a replica killed, until another
/// leads) or no kube-apiserver. Pending pods and terminating NodeClaims are timed without them.
type Windows = Arc<Mutex<Vec<(Timestamp, Option<Timestamp>)>>>;
type Shared = Arc<Mutex<Supervisor>>;

fn with<T>(sup: &Shared, f: impl FnOnce(&mut Supervisor) -> T) -> T {
    f(&mut sup.lock().unwrap())
}

/// One `karpenter controller` process and how far its log has been read.
struct Replica {
    controller: Controller,
    /// The log file, for reading it from where the last read stopped.
    path: Option<PathBuf>,
    scanned: u64,
    leading_since: Option<Instant>,
}

impl Replica {
    fn start(provider: &str, env: &[(String, String)]) -> Self {
        let controller = Controller::start(provider, &env_refs(env));
        // The log's path, as `log_tail` names it.
        let tail = controller.log_tail();
        let path = tail
            .strip_prefix("--- controller log (")
            .and_then(|rest| rest.split_once(") ---"))
            .map(|(path, _)| PathBuf::from(path));
        Replica { controller, path, scanned: 0, leading_since: None }
    }

    /// The complete lines logged since the last call.
    fn new_lines(&mut self) -> Vec<String> {
        let mut bytes = Vec::new();
        match &self.path {
            Some(path) => {
                let Ok(mut file) = std::fs::File::open(path) else { return Vec::new() };
                if file.seek(SeekFrom::Start(self.scanned)).is_err() || file.read_to_end(&mut bytes).is_err()
                {
                    return Vec::new();
                }
            }
            None => {
                let log = self.controller.log();
                bytes = log.as_bytes().get(self.scanned as usize..).unwrap_or_default().to_vec();
            }
        }
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else { return Vec::new() };
        self.scanned += end as u64 + 1;
        String::from_utf8_lossy(&bytes[..end]).lines().map(str::to_string).collect()
    }
}

/// The two replicas, what is done to them, and what they did.
struct Supervisor {
    provider: &'static str,
    env: Vec<(String, String)>,
    live: Vec<Replica>,
    /// Killed or exited: their logs are read at the end.
    gone: Vec<Replica>,
    armed: bool,
    kills: BTreeMap<&'static str, usize>,
    exits: usize,
    last_kill: Option<Instant>,
    /// The least time between two kills.
    gap: Duration,
    last_start: Option<Instant>,
    leaderless_since: Option<Timestamp>,
    pauses: Windows,
    /// The kill point at which the kube-apiserver is restarted (once) instead.
    restart_at: Option<&'static str>,
    restarting: Arc<AtomicBool>,
    restarts: Vec<tokio::task::JoinHandle<Result<Duration, String>>>,
    /// What was done, with times.
    record: Vec<String>,
}

impl Supervisor {
    fn new(
        provider: &'static str,
        env: Vec<(String, String)>,
        pauses: Windows,
        restarting: Arc<AtomicBool>,
    ) -> Self {
        Supervisor {
            provider,
            env,
            live: Vec::new(),
            gone: Vec::new(),
            armed: false,
            kills: BTreeMap::new(),
            exits: 0,
            last_kill: None,
            gap: MIN_GAP,
            last_start: None,
            leaderless_since: None,
            pauses,
            restart_at: None,
            restarting,
            restarts: Vec::new(),
            record: Vec::new(),
        }
    }

    fn note(&mut self, what: String) {
        eprintln!("CHAOS {what}");
        self.record.push(format!("{} {what}", Timestamp::now()));
    }

    fn kills_total(&self) -> usize {
        self.kills.values().sum()
    }

    /// Enough kills, at every point.
    fn kills_done(&self, min: usize) -> bool {
        self.kills_total() >= min
            && points_of(self.provider).iter().all(|p| self.kills.get(p).copied().unwrap_or(0) >= 1)
    }

    /// Whether a kill at `point` is wanted: fewer than [`PER_POINT`] there, and while some point
    /// has none, fewer than two (so that the rarer points get their turn).
    fn wants_kill_at(&self, point: &str) -> bool {
        let done = self.kills.get(point).copied().unwrap_or(0);
        let all_hit = points_of(self.provider).iter().all(|p| self.kills.get(p).copied().unwrap_or(0) >= 1);
        done < PER_POINT && (done < 2 || all_hit)
    }

    /// Every replica's whole log.
    fn logs(&self) -> Vec<String> {
        self.live.iter().chain(&self.gone).map(|r| r.controller.log()).collect()
    }

    /// Lines with `message` in every replica's log.
    fn count(&self, message: &str) -> usize {
        let needle = format!("\"message\":\"{message}\"");
        self.live.iter().chain(&self.gone).map(|r| r.controller.log().matches(&needle).count()).sum()
    }

    fn leader_tail(&self) -> String {
        let leader = self.live.iter().find(|r| r.leading_since.is_some()).or(self.live.first());
        leader.map(|r| r.controller.log_tail()).unwrap_or_default()
    }

    /// Replaces replicas that went, notes a new leader, and kills the leader (or restarts the
    /// kube-apiserver) when its log shows a kill point.
    fn tick(&mut self) {
        let now = Instant::now();
        let (alive, exited): (Vec<Replica>, Vec<Replica>) =
            std::mem::take(&mut self.live).into_iter().partition(|r| pid_alive(r.controller.pid()));
        self.live = alive;
        for replica in exited {
            if replica.leading_since.is_some() && self.leaderless_since.is_none() {
                self.leaderless_since = Some(Timestamp::now());
            }
            self.exits += 1;
            self.note(format!("replica {} exited by itself", replica.controller.pid()));
            self.gone.push(replica);
        }
        // A replica that exits at once (no API server) is not restarted in a tight loop.
        if self.live.len() < 2 && self.last_start.is_none_or(|t| now.duration_since(t) >= RESTART_GAP) {
            self.start_replica(now);
        }
        let mut fresh = Vec::new();
        for (i, replica) in self.live.iter_mut().enumerate() {
            let lines = replica.new_lines();
            if replica.leading_since.is_none()
                && lines.iter().any(|l| l.contains("\"message\":\"starting controllers\""))
            {
                replica.leading_since = Some(now);
                if let Some(since) = self.leaderless_since.take() {
                    self.pauses.lock().unwrap().push((since, Some(Timestamp::now())));
                }
            }
            fresh.push((i, lines));
        }
        if !self.armed || self.restarting.load(Ordering::SeqCst) {
            return;
        }
        // The restart point wins; otherwise the kill goes to the point of the batch with the
        // fewest kills (a command's lines often arrive in one batch, and the first of them would
        // otherwise take every kill).
        let mut kill: Option<(usize, usize, &'static str, String)> = None;
        let mut restart: Option<String> = None;
        'scan: for (i, lines) in &fresh {
            let Some(since) = self.live[*i].leading_since else { continue };
            for line in lines {
                let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else { continue };
                let Some(point) = kill_point(&value) else { continue };
                if self.restart_at == Some(point) {
                    restart = Some(brief(&value));
                    break 'scan;
                }
                let done = self.kills.get(point).copied().unwrap_or(0);
                let gap = self.last_kill.is_none_or(|t| now.duration_since(t) >= self.gap);
                if self.wants_kill_at(point)
                    && gap
                    && now.duration_since(since) >= MIN_LEAD
                    && kill.as_ref().is_none_or(|(fewest, ..)| done < *fewest)
                {
                    kill = Some((done, *i, point, brief(&value)));
                }
            }
        }
        if let Some(line) = restart {
            self.restart_at = None;
            self.restarting.store(true, Ordering::SeqCst);
            self.note(format!("restarting the kube-apiserver at: {line}"));
            let (restarting, pauses) = (self.restarting.clone(), self.pauses.clone());
            let n = self.restarts.len();
            self.restarts.push(tokio::task::spawn_blocking(move || {
                let started = Timestamp::now();
                let result = restart_apiserver(n);
                pauses.lock().unwrap().push((started, Some(Timestamp::now())));
                restarting.store(false, Ordering::SeqCst);
                result
            }));
        } else if let Some((_, i, point, line)) = kill {
            let replica = self.live.remove(i);
            let pid = replica.controller.pid();
            let killed = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            assert!(killed.is_ok_and(|s| s.success()), "kill -KILL {pid}");
            self.leaderless_since = Some(Timestamp::now());
            *self.kills.entry(point).or_default() += 1;
            self.last_kill = Some(now);
            self.note(format!("killed the leader (pid {pid}) at {point:?}: {line}"));
            self.gone.push(replica);
            self.start_replica(now);
        }
    }

    fn start_replica(&mut self, now: Instant) {
        self.live.push(Replica::start(self.provider, &self.env));
        self.last_start = Some(now);
    }
}

async fn supervise(sup: Shared) {
    loop {
        with(&sup, Supervisor::tick);
        tokio::time::sleep(POLL).await;
    }
}

/// The kill point a log line is at, if any.
fn kill_point(line: &serde_json::Value) -> Option<&'static str> {
    match line["message"].as_str()? {
        "disrupting node(s)" => Some(POINTS[0]),
        "tainted node" => Some(POINTS[1]),
        "created nodeclaim" if line["controller"] == "disruption" => Some(POINTS[2]),
        "draining node" | "deleting pod before the node's termination grace period expires" => {
            Some(POINTS[3])
        }
        "terminating instance" => Some(POINTS[4]),
        _ => None,
    }
}

/// A log line in short: its message and what it names.
fn brief(line: &serde_json::Value) -> String {
    let mut out = line["message"].as_str().unwrap_or_default().to_string();
    for key in ["command", "node", "NodeClaim", "nodeclaim", "pod"] {
        if let Some(v) = line[key].as_str() {
            out.push_str(&format!(" {key}={v}"));
        }
    }
    out
}

/// The process exists and is not a zombie.
fn pid_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
    !matches!(state, None | Some('Z' | 'X'))
}

/// `hack/chaos.sh restart-apiserver`: the local control plane's kube-apiserver SIGKILLed, down
/// for [`APISERVER_DOWN`], then started again by `kwokctl start cluster` (which starts the
/// components whose recorded process is not running, here only the kube-apiserver) and ready.
/// Returns how long it took.
fn restart_apiserver(n: usize) -> Result<Duration, String> {
    let started = Instant::now();
    let dir = repo().join("target").join("e2e-logs");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let log = dir.join(format!("chaos-apiserver-restart-{}-{n}.log", std::process::id()));
    let file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    // Output to a file, not a pipe: a daemon kwokctl starts must not hold our pipe open.
    let status = std::process::Command::new(repo().join("hack/chaos.sh"))
        .args(["restart-apiserver", &APISERVER_DOWN.as_secs().to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(file)
        .status()
        .map_err(|e| format!("hack/chaos.sh restart-apiserver: {e}"))?;
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    eprintln!("CHAOS {}", output.trim_end().replace('\n', "\nCHAOS "));
    if status.success() { Ok(started.elapsed()) } else { Err(format!("{status}: {}", output.trim_end())) }
}

// -------------------------------------------------------------------------------------------
// The driver

struct Run {
    f: Fixture,
    sup: Shared,
    restarting: Arc<AtomicBool>,
    observer: Observer,
    started: Instant,
    unfinished: Mutex<Vec<String>>,
    claims_api: Api<NodeClaim>,
    nodes_api: Api<Node>,
    pods_api: Api<Pod>,
    deployments: Api<Deployment>,
    by_pool: ListParams,
}

impl Run {
    fn note(&self, what: &str) {
        eprintln!("CHAOS [{:>4.0} s] {what}", self.started.elapsed().as_secs_f64());
    }

    /// Waits until `check` holds (not asked while the kube-apiserver restarts); after `timeout`,
    /// notes the phase as unfinished and goes on.
    async fn until<F, Fut>(&self, what: &str, timeout: Duration, check: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        if self.wait(what, timeout, check).await {
            return true;
        }
        let tail = with(&self.sup, |s| s.leader_tail());
        self.note(&format!("{what}: not within {timeout:?}\n{tail}"));
        self.unfinished.lock().unwrap().push(format!("{what} (not within {timeout:?})"));
        false
    }

    /// Waits until `check` holds (not asked while the kube-apiserver restarts), at most
    /// `timeout`.
    async fn wait<F, Fut>(&self, what: &str, timeout: Duration, mut check: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let start = Instant::now();
        loop {
            if !self.restarting.load(Ordering::SeqCst) && check().await {
                self.note(&format!("{what} ({:.0} s)", start.elapsed().as_secs_f64()));
                return true;
            }
            if start.elapsed() >= timeout {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    fn count(&self, message: &str) -> usize {
        with(&self.sup, |s| s.count(message))
    }

    async fn claims(&self) -> Option<Vec<NodeClaim>> {
        self.claims_api.list(&self.by_pool).await.ok().map(|l| l.items)
    }

    /// The pool's NodeClaims not being deleted.
    async fn live_claims(&self) -> Option<Vec<NodeClaim>> {
        let claims = self.claims().await?;
        Some(claims.into_iter().filter(|c| c.metadata.deletion_timestamp.is_none()).collect())
    }

    async fn claim_names(&self) -> HashSet<String> {
        loop {
            if let Some(claims) = self.claims().await {
                return claims.iter().map(|c| c.name_any()).collect();
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn nodes(&self) -> Option<Vec<Node>> {
        self.nodes_api.list(&self.by_pool).await.ok().map(|l| l.items)
    }

    async fn pods(&self) -> Option<Vec<Pod>> {
        self.pods_api.list(&ListParams::default()).await.ok().map(|l| l.items)
    }

    /// Exactly `n` pods not being deleted, all Running on a node.
    async fn all_running(&self, n: usize) -> bool {
        let Some(pods) = self.pods().await else { return false };
        let live: Vec<&Pod> = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        live.len() == n && live.iter().all(|p| is_running(p))
    }

    async fn node_gone(&self, name: &str) -> bool {
        matches!(self.nodes_api.get_opt(name).await, Ok(None))
    }

    /// No NodeClaim and no Node of the pool being deleted.
    async fn nothing_going(&self) -> bool {
        let (Some(claims), Some(nodes)) = (self.claims().await, self.nodes().await) else { return false };
        claims.iter().all(|c| c.metadata.deletion_timestamp.is_none())
            && nodes.iter().all(|n| n.metadata.deletion_timestamp.is_none())
    }

    /// Every NodeClaim of `old` gone, the new ones Ready, and every pod Running.
    async fn replaced(&self, old: &HashSet<String>, expected: usize) -> bool {
        let Some(claims) = self.claims().await else { return false };
        claims
            .iter()
            .all(|c| !old.contains(&c.name_any()) && condition(c, "Ready").as_deref() == Some("True"))
            && self.all_running(expected).await
    }

    async fn class_ready(&self) -> bool {
        let classes: Api<EC2NodeClass> = Api::all(self.f.client.clone());
        let Ok(class) = classes.get(&self.f.class).await else { return false };
        class.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && serde_json::to_value(c.status).is_ok_and(|v| v == "True"))
        })
    }

    async fn scale(&self, name: &str, replicas: usize) {
        patch_until_done(&self.deployments, name, &json!({"spec": {"replicas": replicas}})).await;
    }

    async fn patch_pool(&self, patch: &serde_json::Value) {
        patch_until_done(&Api::<NodePool>::all(self.f.client.clone()), &self.f.pool, patch).await;
    }

    /// A template change (a label, and `expireAfter` when given): every NodeClaim drifts; waits
    /// until each is replaced, or only until `deadline` when given (the settling waits for the
    /// rest).
    async fn drift_round(
        &self,
        round: usize,
        expire_after: Option<&str>,
        expected: usize,
        deadline: Option<Instant>,
    ) {
        let old = self.claim_names().await;
        let mut template = json!({"metadata": {"labels": {"chaos-round": format!("r{round}")}}});
        if let Some(expire_after) = expire_after {
            template["spec"] = json!({"expireAfter": expire_after});
        }
        self.patch_pool(&json!({"spec": {"template": template}})).await;
        let what = format!("drift round {round}: every node replaced");
        let check = || async { self.replaced(&old, expected).await };
        match deadline {
            None => {
                self.until(&what, Duration::from_secs(300), check).await;
            }
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(30));
                self.wait(&what, left, check).await;
            }
        }
    }

    /// The node to make NotReady: one without guarded or do-not-disrupt pods if there is one.
    async fn repair_victim(&self) -> Option<String> {
        let (nodes, pods) = (self.nodes().await?, self.pods().await?);
        let runs = |node: &str, app: &str| {
            pods.iter().any(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    && p.labels().get("app").is_some_and(|a| a == app)
            })
        };
        let mut names: Vec<String> =
            nodes.iter().filter(|n| n.metadata.deletion_timestamp.is_none()).map(|n| n.name_any()).collect();
        names.sort();
        names
            .iter()
            .find(|n| !runs(n.as_str(), GUARDED) && !runs(n.as_str(), PRECIOUS))
            .or_else(|| names.iter().find(|n| !runs(n.as_str(), GUARDED)))
            .or(names.first())
            .cloned()
    }

    /// Makes the node report `Ready=False` since 31 minutes, longer than repair tolerates. kwok
    /// is told to leave its status alone (the local control plane's kwok disregards the status
    /// of nodes annotated `kwok.x-k8s.io/status=custom`).
    async fn set_not_ready(&self, name: &str) {
        self.note(&format!("node {name} NotReady since 31 minutes"));
        let custom = json!({"metadata": {"annotations": {"kwok.x-k8s.io/status": "custom"}}});
        patch_until_done(&self.nodes_api, name, &custom).await;
        let since = Timestamp::now() - SignedDuration::from_mins(31);
        let condition = json!({"status": {"conditions": [{"type": "Ready", "status": "False",
            "reason": "KubeletNotReady", "message": "container runtime is down",
            "lastTransitionTime": since.to_string(), "lastHeartbeatTime": Timestamp::now().to_string()}]}});
        for _ in 0..30 {
            if self
                .nodes_api
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(&condition))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        self.unfinished.lock().unwrap().push(format!("node {name} could not be made NotReady"));
    }

    /// Waits until every pod runs and nothing has been going away, nor any command started, for
    /// 30 s (consolidation of underutilized nodes off first: `WhenEmpty`).
    async fn settle(&self, expected: usize) -> bool {
        self.patch_pool(&json!({"spec": {"disruption": {"consolidationPolicy": "WhenEmpty"}}})).await;
        let start = Instant::now();
        let mut commands = self.count(COMMAND);
        let mut quiet_since: Option<Instant> = None;
        while start.elapsed() < Duration::from_secs(180) {
            let now_commands = self.count(COMMAND);
            let calm = !self.restarting.load(Ordering::SeqCst)
                && now_commands == commands
                && self.all_running(expected).await
                && self.nothing_going().await;
            commands = now_commands;
            if calm {
                if quiet_since.get_or_insert_with(Instant::now).elapsed() >= Duration::from_secs(30) {
                    self.note("settled");
                    return true;
                }
            } else {
                quiet_since = None;
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        false
    }

    /// `karpenter.sh/disrupted` taints on nodes, and `DisruptionReason` conditions on NodeClaims,
    /// that nothing is deleting.
    async fn leftovers(&self) -> (Vec<String>, Vec<String>) {
        let claims = self.claims().await.unwrap_or_default();
        let nodes = self.nodes().await.unwrap_or_default();
        let claim_going = |node: &str| {
            claims.iter().any(|c| {
                c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    && c.metadata.deletion_timestamp.is_some()
            })
        };
        let taints = nodes
            .iter()
            .filter(|n| {
                has_disrupted_taint(n)
                    && n.metadata.deletion_timestamp.is_none()
                    && !claim_going(n.name_any().as_str())
            })
            .map(|n| format!("node {} keeps the {DISRUPTED_TAINT} taint", n.name_any()))
            .collect();
        let reasons = claims
            .iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| {
                Some(format!("nodeclaim {} keeps DisruptionReason {}", c.name_any(), disruption_reason(c)?))
            })
            .collect();
        (taints, reasons)
    }

    /// Instances (Nodes with kwok; EC2 instances and Nodes with aws) without a NodeClaim, and
    /// NodeClaims without an instance, once the garbage collection has had up to 3 minutes.
    async fn consistency(&self, ec2: Option<&aws_sdk_ec2::Client>) -> (Vec<String>, Vec<String>) {
        let start = Instant::now();
        loop {
            let found = self.inconsistencies(ec2).await;
            if (found.0.is_empty() && found.1.is_empty()) || start.elapsed() >= Duration::from_secs(180) {
                return found;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    }

    async fn inconsistencies(&self, ec2: Option<&aws_sdk_ec2::Client>) -> (Vec<String>, Vec<String>) {
        let claims = self.claims().await.unwrap_or_default();
        let nodes = self.nodes().await.unwrap_or_default();
        let claim_ids: HashSet<String> =
            claims.iter().filter_map(|c| c.status.as_ref()?.provider_id.clone()).collect();
        let node_ids: HashSet<String> =
            nodes.iter().filter_map(|n| n.spec.as_ref()?.provider_id.clone()).collect();
        let mut orphans: Vec<String> = nodes
            .iter()
            .filter(|n| {
                n.spec.as_ref().and_then(|s| s.provider_id.as_ref()).is_none_or(|p| !claim_ids.contains(p))
            })
            .map(|n| format!("node {} has no NodeClaim", n.name_any()))
            .collect();
        let mut bare = Vec::new();
        for claim in &claims {
            match claim.status.as_ref().and_then(|s| s.provider_id.as_ref()) {
                None => bare.push(format!("nodeclaim {} was never launched", claim.name_any())),
                Some(id) if !node_ids.contains(id) => {
                    bare.push(format!("nodeclaim {} ({id}) has no node", claim.name_any()))
                }
                Some(_) => {}
            }
        }
        if let Some(ec2) = ec2 {
            let live: Vec<Ec2Instance> =
                pool_instances(ec2, &self.f.pool).await.into_iter().filter(Ec2Instance::is_live).collect();
            for instance in &live {
                if !claim_ids.iter().any(|id| id.ends_with(&format!("/{}", instance.id))) {
                    orphans.push(format!(
                        "instance {} ({}, tagged for nodeclaim {:?}) has no NodeClaim",
                        instance.id, instance.state, instance.claim
                    ));
                }
            }
            for id in &claim_ids {
                let instance = id.rsplit('/').next().unwrap_or_default();
                if !live.iter().any(|i| i.id == instance) {
                    bare.push(format!("the instance {id} of a NodeClaim is not running"));
                }
            }
        }
        (orphans, bare)
    }
}

async fn patch_until_done<K>(api: &Api<K>, name: &str, patch: &serde_json::Value)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match api.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await {
            Ok(_) => return,
            Err(e) => assert!(Instant::now() < deadline, "patching {name} with {patch}: {e}"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn set_ami_alias(f: &Fixture, alias: &str) {
    let classes: Api<EC2NodeClass> = Api::all(f.client.clone());
    patch_until_done(&classes, &f.class, &json!({"spec": {"amiSelectorTerms": [{"alias": alias}]}})).await;
}

fn has_disrupted_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == DISRUPTED_TAINT && t.effect == "NoSchedule"))
}

/// The reason of a NodeClaim's `DisruptionReason=True` condition.
fn disruption_reason(claim: &NodeClaim) -> Option<String> {
    let c = claim.status.as_ref()?.conditions.iter().find(|c| c.type_ == "DisruptionReason")?;
    serde_json::to_value(c.status).is_ok_and(|v| v == "True").then(|| c.reason.clone())
}

/// Replacement NodeClaims the disruption commands of a replica created beyond what the commands
/// announced. Per log: every `created nodeclaim` of the disruption controller, against the
/// `replacements` of its `disrupting node(s)` lines, less those a failed command did not create
/// (its `disruption command failed` line lists the ones it did).
fn extra_replacements(logs: &[String]) -> (usize, Vec<String>) {
    let mut extra = 0;
    let mut evidence = Vec::new();
    for log in logs {
        let mut announced: HashMap<String, usize> = HashMap::new();
        let (mut allowed, mut created) = (0usize, Vec::new());
        for line in log.lines() {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            let command = value["command"].as_str().unwrap_or_default().to_string();
            match value["message"].as_str().unwrap_or_default() {
                "disrupting node(s)" => {
                    let n = value["replacements"].as_u64().unwrap_or(0) as usize;
                    announced.insert(command, n);
                    allowed += n;
                }
                "disruption command failed, undoing it" => {
                    let made = value["replacements"].as_str().unwrap_or_default();
                    let made = made.split(", ").filter(|s| !s.is_empty()).count();
                    if let Some(n) = announced.remove(&command) {
                        allowed -= n - made.min(n);
                    }
                }
                "created nodeclaim" if value["controller"] == "disruption" => {
                    created.push(value["NodeClaim"].as_str().unwrap_or_default().to_string());
                }
                _ => {}
            }
        }
        if created.len() > allowed {
            extra += created.len() - allowed;
            evidence.push(format!(
                "a replica created {} replacement(s) ({}) for commands that announced {allowed}",
                created.len(),
                created.join(", ")
            ));
        }
    }
    (extra, evidence)
}

// -------------------------------------------------------------------------------------------
// aws: interruption messages and EC2 faults

fn faults_url() -> String {
    format!("{}/_karpenter-rs/faults", aws_var("AWS_ENDPOINT_URL"))
}

async fn arm(fault: &serde_json::Value) {
    let (code, body) = http_post_json(&faults_url(), fault).await;
    assert_eq!(code, 200, "arming {fault}: {body}");
}

/// "CreateFleet InsufficientInstanceCapacity 2, ..." from the fault endpoint's state, less its
/// counts at the run's start (`before`: the emulator counts for its whole life), with the faults
/// armed but never used.
fn describe_faults(status: &str, before: &str) -> String {
    let state: serde_json::Value = serde_json::from_str(status).unwrap_or_default();
    let before: serde_json::Value = serde_json::from_str(before).unwrap_or_default();
    let mut parts: Vec<String> = state["counts"]
        .as_object()
        .map(|counts| {
            counts
                .iter()
                .filter_map(|(k, v)| {
                    let n = v.as_u64()?.saturating_sub(before["counts"][k].as_u64().unwrap_or(0));
                    (n > 0).then(|| format!("{k} {n}"))
                })
                .collect()
        })
        .unwrap_or_default();
    parts.sort();
    let unused: usize = state["pending"]
        .as_array()
        .map(|p| p.iter().filter_map(|f| f["left"].as_u64()).sum::<u64>() as usize)
        .unwrap_or(0);
    if parts.is_empty() {
        parts.push("none".to_string());
    }
    format!("{} ({unused} armed but not used)", parts.join(", "))
}

/// An EventBridge event of the EC2 source as the interruption queue receives it.
fn eventbridge(detail_type: &str, instance_id: &str, mut detail: serde_json::Value) -> String {
    detail["instance-id"] = json!(instance_id);
    let region = aws_var("AWS_REGION");
    json!({
        "version": "0", "id": format!("chaos-{instance_id}-{}", std::process::id()), "detail-type": detail_type,
        "source": "aws.ec2", "account": "123456789012", "time": Timestamp::now().to_string(),
        "region": region, "resources": [format!("arn:aws:ec2:{region}:123456789012:instance/{instance_id}")],
        "detail": detail,
    })
    .to_string()
}

/// Two nodes interrupted through the queue: a spot interruption warning sent twice for the
/// first; for the second, its instance `terminated` then `stopping` (out of order). Once both
/// are replaced, both messages once more (a late redelivery). Returns what was sent.
async fn interruptions(run: &Run, expected: usize) -> Vec<String> {
    let sqs = sqs().await;
    let queue = sqs.get_queue_url().queue_name(cluster_name()).send().await.unwrap().queue_url.unwrap();
    let send = |body: String| {
        let (sqs, queue) = (sqs.clone(), queue.clone());
        async move { sqs.send_message().queue_url(queue).message_body(body).send().await.unwrap() }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut claims: Vec<NodeClaim> = Vec::new();
    while claims.len() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        claims = run
            .live_claims()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.status.as_ref().is_some_and(|s| s.provider_id.is_some()))
            .collect();
    }
    if claims.len() < 2 {
        run.unfinished.lock().unwrap().push("no two launched NodeClaims to interrupt".to_string());
        return Vec::new();
    }
    claims.sort_by_key(|c| c.name_any());
    let instance = |c: &NodeClaim| {
        let id = c.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
        id.rsplit('/').next().unwrap_or_default().to_string()
    };
    let (first, second) = (&claims[0], &claims[1]);
    let warning = eventbridge(
        "EC2 Spot Instance Interruption Warning",
        &instance(first),
        json!({"instance-action": "terminate"}),
    );
    let terminated = eventbridge(
        "EC2 Instance State-change Notification",
        &instance(second),
        json!({"state": "terminated"}),
    );
    let stopping = eventbridge(
        "EC2 Instance State-change Notification",
        &instance(second),
        json!({"state": "stopping"}),
    );
    send(warning.clone()).await;
    send(warning.clone()).await;
    send(terminated.clone()).await;
    send(stopping).await;
    let old: HashSet<String> = [first.name_any(), second.name_any()].into();
    run.until("both interrupted nodes replaced", Duration::from_secs(180), || async {
        run.claim_names().await.is_disjoint(&old) && run.all_running(expected).await
    })
    .await;
    let acted = run.count("initiating delete from interruption message");
    send(warning).await;
    send(terminated).await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    let late = run.count("initiating delete from interruption message") - acted;
    vec![
        "spot interruption warning x2".to_string(),
        "state change terminated then stopping".to_string(),
        format!("2 redelivered after handling (acted on: {late})"),
    ]
}

// -------------------------------------------------------------------------------------------
// The observer

/// What the observer keeps of a pod.
#[derive(Clone, Debug)]
struct PodSeen {
    name: String,
    app: String,
    node: Option<String>,
    ready: bool,
    deleting: bool,
    terminal: bool,
    grace: i64,
    do_not_disrupt: bool,
    created: Option<Timestamp>,
    /// kube-controller-manager's taint eviction deleted it (its `DisruptionTarget` condition says
    /// `DeletionByTaintManager`).
    by_taint_manager: bool,
}

impl PodSeen {
    fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        PodSeen {
            name: pod.name_any(),
            app: pod.labels().get("app").cloned().unwrap_or_default(),
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            ready: status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            terminal: matches!(status.and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")),
            grace: pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30),
            do_not_disrupt: pod.annotations().get(DO_NOT_DISRUPT).is_some_and(|v| v == "true"),
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
            by_taint_manager: status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                c.iter().any(|c| {
                    c.type_ == "DisruptionTarget"
                        && c.status == "True"
                        && c.reason.as_deref() == Some("DeletionByTaintManager")
                })
            }),
        }
    }
}

/// A deletion judged once the other watches have caught up.
enum Check {
    /// A Ready guarded pod deleted while `others` guarded pods were Ready.
    Pdb { pod: PodSeen, others: usize, at: Timestamp },
    /// A do-not-disrupt pod deleted at `at`.
    DoNotDisrupt { pod: PodSeen, at: Timestamp },
}

/// What the observer found, as evidence lines.
#[derive(Clone, Debug, Default)]
struct Found {
    over_budget: Vec<String>,
    pdb: Vec<String>,
    do_not_disrupt: Vec<String>,
    grace_zero: Vec<String>,
    pending: Vec<String>,
    terminating: Vec<String>,
    /// Deletions by kube-controller-manager's taint eviction: reported, not Karpenter's. Its known
    /// race (kubernetes/kubernetes#119862) deletes a pod bound just after a `NoExecute` taint went
    /// (here `karpenter.sh/unregistered`, on an emulated node that is Ready at once) while its
    /// cache still has the taint.
    taint_manager: Vec<String>,
}

struct Report {
    found: Found,
    most_disrupting: usize,
    budget_then: usize,
    fewest_ready: Option<usize>,
    watch_errors: usize,
}

/// The observer's view of the cluster, from its watches.
#[derive(Default)]
struct Seen {
    min_available: usize,
    /// The guarded workload's Ready pods are counted once it first ran.
    tracking: bool,
    pods: HashMap<String, Pod>,
    pods_relisting: Option<HashSet<String>>,
    nodes: HashMap<String, Node>,
    nodes_relisting: Option<HashSet<String>>,
    claims: HashMap<String, NodeClaim>,
    claims_relisting: Option<HashSet<String>>,
    /// The last state of every NodeClaim seen, those gone included.
    claims_ever: HashMap<String, NodeClaim>,
    budgets: serde_json::Value,
    budget_history: Vec<(Instant, usize)>,
    checks: Vec<(Instant, Check)>,
    /// Since when the budget has been exceeded.
    over: Option<Instant>,
    over_told: bool,
    level: Option<(usize, Instant)>,
    most_disrupting: usize,
    budget_then: usize,
    fewest_ready: Option<usize>,
    flagged: HashSet<String>,
    watch_errors: usize,
    found: Found,
}

/// What a watch event did to a cache.
enum Change<K> {
    /// Added or modified; `old` is what the cache had.
    Applied {
        old: Option<K>,
        new: K,
    },
    /// Deleted; `old` is what the cache had.
    Deleted {
        old: Option<K>,
        last: K,
    },
    Quiet,
}

/// Applies a watch event to a cache keyed by `key`; a relist's leftovers go at its end.
fn apply<K: Clone>(
    cache: &mut HashMap<String, K>,
    relisting: &mut Option<HashSet<String>>,
    event: watcher::Event<K>,
    key: fn(&K) -> String,
) -> Change<K> {
    match event {
        watcher::Event::Init => {
            *relisting = Some(HashSet::new());
            Change::Quiet
        }
        watcher::Event::InitApply(k) => {
            let name = key(&k);
            if let Some(listed) = relisting.as_mut() {
                listed.insert(name.clone());
            }
            let old = cache.insert(name, k.clone());
            Change::Applied { old, new: k }
        }
        watcher::Event::InitDone => {
            if let Some(listed) = relisting.take() {
                cache.retain(|name, _| listed.contains(name));
            }
            Change::Quiet
        }
        watcher::Event::Apply(k) => {
            let old = cache.insert(key(&k), k.clone());
            Change::Applied { old, new: k }
        }
        watcher::Event::Delete(k) => {
            let old = cache.remove(&key(&k));
            Change::Deleted { old, last: k }
        }
    }
}

fn uid_of(pod: &Pod) -> String {
    pod.uid().unwrap_or_default()
}

fn name_of<K: Resource>(k: &K) -> String {
    k.meta().name.clone().unwrap_or_default()
}

impl Seen {
    fn on_pod(&mut self, event: watcher::Event<Pod>) {
        match apply(&mut self.pods, &mut self.pods_relisting, event, uid_of) {
            Change::Applied { old: Some(old), new } => {
                if old.metadata.deletion_timestamp.is_none() && new.metadata.deletion_timestamp.is_some() {
                    let grace = new.metadata.deletion_grace_period_seconds.unwrap_or(0);
                    let requested = new
                        .metadata
                        .deletion_timestamp
                        .as_ref()
                        .map_or_else(Timestamp::now, |t| t.0 - SignedDuration::from_secs(grace));
                    let mut seen = PodSeen::of(&old);
                    seen.by_taint_manager |= PodSeen::of(&new).by_taint_manager;
                    self.first_deletion(&seen, grace, requested);
                }
            }
            // Gone without a graceful deletion the watch saw: deleted at once.
            Change::Deleted { old: Some(old), .. } if old.metadata.deletion_timestamp.is_none() => {
                self.first_deletion(&PodSeen::of(&old), 0, Timestamp::now());
            }
            Change::Applied { old: None, .. } | Change::Deleted { .. } | Change::Quiet => {}
        }
        if self.tracking {
            let ready = self.guarded_ready(None);
            self.fewest_ready = Some(self.fewest_ready.map_or(ready, |f| f.min(ready)));
        }
    }

    /// Ready guarded pods not being deleted, but `except`.
    fn guarded_ready(&self, except: Option<&str>) -> usize {
        self.pods
            .values()
            .map(PodSeen::of)
            .filter(|p| p.app == GUARDED && p.ready && !p.deleting && Some(p.name.as_str()) != except)
            .count()
    }

    /// The first deletion of a pod, asked at `at` with `grace` seconds.
    fn first_deletion(&mut self, pod: &PodSeen, grace: i64, at: Timestamp) {
        let Some(node) = pod.node.clone() else { return };
        if pod.terminal {
            return;
        }
        if pod.by_taint_manager {
            self.found
                .taint_manager
                .push(format!("{at}: pod {} on node {node} deleted by the taint manager", pod.name));
            return;
        }
        if grace == 0 {
            self.found
                .grace_zero
                .push(format!("{at}: pod {} on node {node} deleted with a grace period of 0", pod.name));
        }
        if pod.app == GUARDED && pod.ready {
            let others = self.guarded_ready(Some(&pod.name));
            if others < self.min_available {
                self.checks.push((Instant::now() + LAG, Check::Pdb { pod: pod.clone(), others, at }));
            }
        }
        if pod.do_not_disrupt {
            self.checks.push((Instant::now() + LAG, Check::DoNotDisrupt { pod: pod.clone(), at }));
        }
    }

    /// The newest NodeClaim seen on `node`.
    fn claim_of_node(&self, node: &str) -> Option<&NodeClaim> {
        self.claims_ever
            .values()
            .filter(|c| c.status.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .max_by_key(|c| c.metadata.creation_timestamp.as_ref().map(|t| t.0))
    }

    /// When Karpenter may delete the pods of `node` past their budgets and annotations: the
    /// termination deadline of its NodeClaim (its `terminationGracePeriod`, or now for repair),
    /// as annotated, else its deletion plus its `terminationGracePeriod`.
    fn deadline(&self, node: Option<&str>) -> Option<Timestamp> {
        let claim = self.claim_of_node(node?)?;
        if let Some(at) = claim.annotations().get(TERMINATION_TIMESTAMP) {
            return at.parse().ok();
        }
        let deleted = claim.metadata.deletion_timestamp.as_ref()?.0;
        Some(deleted + go_duration(claim.spec.termination_grace_period.as_deref()?)?)
    }

    /// Whether a deletion at `at` was one of those the deadline allows: the pod's own grace
    /// period before it.
    fn forced(&self, pod: &PodSeen, at: Timestamp) -> bool {
        self.deadline(pod.node.as_deref())
            .is_some_and(|d| at + SignedDuration::from_secs(pod.grace) + SLACK >= d)
    }

    fn run_checks(&mut self) {
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.checks).into_iter().partition(|(t, _)| *t <= now);
        self.checks = later;
        for (_, check) in due {
            match check {
                Check::Pdb { pod, others, at } => {
                    if !self.forced(&pod, at) {
                        self.found.pdb.push(format!(
                            "{at}: guarded pod {} on node {} deleted while {others} other replica(s) were Ready (minAvailable {})",
                            pod.name,
                            pod.node.as_deref().unwrap_or("-"),
                            self.min_available
                        ));
                    }
                }
                Check::DoNotDisrupt { pod, at } => {
                    if !self.forced(&pod, at) {
                        let deadline = self.deadline(pod.node.as_deref());
                        self.found.do_not_disrupt.push(format!(
                            "{at}: do-not-disrupt pod {} on node {} deleted before its NodeClaim's deadline ({})",
                            pod.name,
                            pod.node.as_deref().unwrap_or("-"),
                            deadline.map_or("none".to_string(), |d| d.to_string())
                        ));
                    }
                }
            }
        }
    }

    fn on_node(&mut self, event: watcher::Event<Node>) {
        apply(&mut self.nodes, &mut self.nodes_relisting, event, name_of::<Node>);
        self.eval_budget();
    }

    fn on_claim(&mut self, event: watcher::Event<NodeClaim>) {
        if let Change::Applied { new, .. } | Change::Deleted { last: new, .. } =
            apply(&mut self.claims, &mut self.claims_relisting, event, name_of::<NodeClaim>)
        {
            self.claims_ever.insert(new.name_any(), new);
        }
        self.eval_budget();
    }

    fn on_pool(&mut self, event: watcher::Event<NodePool>) {
        if let watcher::Event::Apply(pool) | watcher::Event::InitApply(pool) = event {
            let spec = serde_json::to_value(&pool.spec).unwrap_or_default();
            self.budgets = spec["disruption"]["budgets"].clone();
        }
    }

    /// Nodes in voluntary disruption: tainted `karpenter.sh/disrupted` while neither they nor
    /// their NodeClaim are being deleted (a command under way), or being deleted with a
    /// voluntary `DisruptionReason` on their NodeClaim.
    fn voluntary(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .nodes
            .values()
            .filter(|n| {
                let claim = self.claim_of_node(&n.name_any());
                let going = n.metadata.deletion_timestamp.is_some()
                    || claim.is_some_and(|c| c.metadata.deletion_timestamp.is_some());
                if going {
                    claim.and_then(disruption_reason).is_some_and(|r| VOLUNTARY.contains(&r.as_str()))
                } else {
                    has_disrupted_taint(n)
                }
            })
            .map(|n| n.name_any())
            .collect();
        out.sort();
        out
    }

    /// The pool's budget (the smallest of its budgets, a percentage of its initialized nodes
    /// rounded up), the largest it was within [`BUDGET_MEMORY`].
    fn budget(&mut self, now: Instant) -> usize {
        let total = self
            .nodes
            .values()
            .filter(|n| n.labels().get("karpenter.sh/initialized").is_some_and(|v| v == "true"))
            .count();
        let current = budget_of(&self.budgets, total);
        self.budget_history.retain(|(t, _)| now.duration_since(*t) <= BUDGET_MEMORY);
        self.budget_history.push((now, current));
        self.budget_history.iter().map(|(_, b)| *b).max().unwrap_or(current)
    }

    fn eval_budget(&mut self) {
        let now = Instant::now();
        let budget = self.budget(now);
        let going = self.voluntary();
        if self.level.is_none_or(|(n, _)| n != going.len()) {
            self.level = Some((going.len(), now));
        }
        if let Some((n, since)) = self.level
            && now.duration_since(since) >= PERSIST
            && n > self.most_disrupting
        {
            self.most_disrupting = n;
            self.budget_then = budget;
        }
        if going.len() > budget {
            let since = *self.over.get_or_insert(now);
            if !self.over_told && now.duration_since(since) >= PERSIST {
                self.found.over_budget.push(format!(
                    "{}: {} nodes in voluntary disruption at once, budget {budget}: {}",
                    Timestamp::now(),
                    going.len(),
                    going.join(", ")
                ));
                self.over_told = true;
            }
        } else {
            self.over = None;
            self.over_told = false;
        }
    }

    fn tick(&mut self, pauses: &[(Timestamp, Option<Timestamp>)]) {
        self.run_checks();
        self.eval_budget();
        let now = Timestamp::now();
        for pod in self.pods.values().map(PodSeen::of) {
            if pod.node.is_some() || pod.deleting || pod.terminal {
                continue;
            }
            let Some(created) = pod.created else { continue };
            let waited = now.duration_since(created) - paused(pauses, created, now);
            if waited > PENDING_LIMIT && self.flagged.insert(format!("pod/{}", pod.name)) {
                self.found.pending.push(format!(
                    "{now}: pod {} pending for {:.0} s (time without a leader or an API server not counted)",
                    pod.name,
                    waited.as_secs_f64()
                ));
            }
        }
        for claim in self.claims.values() {
            let Some(deleted) = claim.metadata.deletion_timestamp.as_ref().map(|t| t.0) else { continue };
            let waited = now.duration_since(deleted) - paused(pauses, deleted, now);
            if waited > TERMINATING_LIMIT && self.flagged.insert(format!("nodeclaim/{}", claim.name_any())) {
                self.found.terminating.push(format!(
                    "{now}: nodeclaim {} terminating for {:.0} s",
                    claim.name_any(),
                    waited.as_secs_f64()
                ));
            }
        }
    }
}

/// A duration as the NodeClaim API writes it (`30s`, `1m30s`, `2h`).
fn go_duration(text: &str) -> Option<SignedDuration> {
    let (mut seconds, mut number) = (0i64, String::new());
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: i64 = number.parse().ok()?;
        number.clear();
        seconds += n * match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
    }
    if number.is_empty() { Some(SignedDuration::from_secs(seconds)) } else { None }
}

/// The smallest budget of the NodePool's `spec.disruption.budgets` for `total` nodes (those
/// with a schedule are not used by the runs and left out; none: upstream's default, 10 %).
fn budget_of(budgets: &serde_json::Value, total: usize) -> usize {
    let Some(list) = budgets.as_array() else { return (total * 10).div_ceil(100) };
    list.iter()
        .filter(|b| b.get("schedule").is_none())
        .filter_map(|b| b["nodes"].as_str())
        .filter_map(|nodes| match nodes.strip_suffix('%') {
            Some(percent) => percent.parse::<usize>().ok().map(|p| (p * total).div_ceil(100)),
            None => nodes.parse().ok(),
        })
        .min()
        .unwrap_or(usize::MAX)
}

/// How much of `from..to` falls in the windows (merged, so that overlapping ones count once).
fn paused(windows: &[(Timestamp, Option<Timestamp>)], from: Timestamp, to: Timestamp) -> SignedDuration {
    let mut spans: Vec<(Timestamp, Timestamp)> = windows
        .iter()
        .map(|(start, end)| ((*start).max(from), end.unwrap_or(to).min(to)))
        .filter(|(start, end)| end > start)
        .collect();
    spans.sort();
    let mut total = SignedDuration::ZERO;
    let mut reach: Option<Timestamp> = None;
    for (start, end) in spans {
        let start = reach.map_or(start, |r| r.max(start));
        if end > start {
            total += end.duration_since(start);
            reach = Some(end);
        }
    }
    total
}

/// The observer: its own client and watches, and a clock that judges what takes too long.
struct Observer {
    seen: Arc<Mutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Observer {
    async fn start(pool: &str, ns: &str, min_available: usize, pauses: Windows) -> Self {
        let client = Client::try_default().await.expect("a kubeconfig for the observer");
        let seen = Arc::new(Mutex::new(Seen { min_available, ..Seen::default() }));
        let by_pool = format!("karpenter.sh/nodepool={pool}");
        let mut tasks = vec![
            watch(
                Api::<Pod>::namespaced(client.clone(), ns),
                watcher::Config::default(),
                &seen,
                Seen::on_pod,
            ),
            watch(
                Api::<Node>::all(client.clone()),
                watcher::Config::default().labels(&by_pool),
                &seen,
                Seen::on_node,
            ),
            watch(
                Api::<NodeClaim>::all(client.clone()),
                watcher::Config::default().labels(&by_pool),
                &seen,
                Seen::on_claim,
            ),
            watch(
                Api::<NodePool>::all(client),
                watcher::Config::default().fields(&format!("metadata.name={pool}")),
                &seen,
                Seen::on_pool,
            ),
        ];
        let ticking = seen.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let windows = pauses.lock().unwrap().clone();
                ticking.lock().unwrap().tick(&windows);
            }
        }));
        Observer { seen, tasks }
    }

    fn report(&self) -> Report {
        let mut seen = self.seen.lock().unwrap();
        // The deletions of the last seconds are judged now.
        for (due, _) in &mut seen.checks {
            *due = Instant::now();
        }
        seen.run_checks();
        Report {
            found: seen.found.clone(),
            most_disrupting: seen.most_disrupting,
            budget_then: seen.budget_then,
            fewest_ready: seen.fewest_ready,
            watch_errors: seen.watch_errors,
        }
    }

    fn stop(&self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Follows `api` with a watch of its own, handing every event to `handle`.
fn watch<K, F>(
    api: Api<K>,
    config: watcher::Config,
    seen: &Arc<Mutex<Seen>>,
    mut handle: F,
) -> tokio::task::JoinHandle<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut(&mut Seen, watcher::Event<K>) + Send + 'static,
{
    let seen = seen.clone();
    tokio::spawn(async move {
        let mut events = watcher(api, config).default_backoff().boxed();
        while let Some(event) = events.next().await {
            let mut guard = seen.lock().unwrap();
            match event {
                Ok(event) => handle(&mut guard, event),
                Err(_) => guard.watch_errors += 1,
            }
        }
    })
}
