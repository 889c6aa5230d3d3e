//! Consolidation at scale, pure (no API server): how long one disruption pass takes to decide
//! over a large cluster, and what the decision saves.
//!
//! The cluster: `n` nodes of an 8-vCPU on-demand type, each running four 500m pods of one
//! Deployment (25 % of its CPU), in one NodePool (`WhenEmptyOrUnderutilized`, budget 100 %), over
//! a catalog of 2-, 4-, 8- and 16-vCPU types priced per vCPU as the EC2 `m` family is. Timed:
//!
//! - `multi/<n>`: a whole pass (the simulations' base, then [`decide`]): candidates, budgets,
//!   emptiness, then multi-node consolidation's search over every candidate (no cap of 100),
//!   which acts;
//! - `single-sweep/<n>`: the base, then single-node consolidation's evaluation of every candidate
//!   in turn (what a pass costs when no multi-node move exists and each candidate must be
//!   simulated).
//!
//! Each is run three times; the median is printed with the plan: nodes removed, replacement,
//! $/h before and after, and the per-resource lower bound (every pod's CPU at the cheapest
//! price per vCPU).
//!
//! Then a scale-up under way (`during-scale-up/<n>`): `n` nodes of the 2-vCPU type each running
//! one 100m pod of a Deployment whose pods keep apart by host name (required anti-affinity), and
//! `n / 2` more of its pods pending. Each single-node simulation places the pending pods too (as
//! upstream's does), trying them on every other node: timed over the first 20 candidates (each
//! finds no move), median of 3, per candidate.
//!
//! `cargo bench --bench disruption` (sizes: `DISRUPTION_BENCH_NODES=500,2000`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use karpenter::apis::pod::Pod;
use karpenter::apis::{NodeClaim, NodePool};
use karpenter::disruption::consolidation::{self, Setting, World};
use karpenter::disruption::decide::decide;
use karpenter::scheduling::{InstanceType, Offering, Requirements, Resources, SchedulerOptions};
use karpenter::state::input::nodepools_by_name;
use karpenter::state::snapshot::Snapshot;
use karpenter::state::statenode::state_nodes;
use serde_json::json;

const VCPU_PRICE: f64 = 0.048;
const NODE_CPU: i64 = 8;
const PODS_PER_NODE: usize = 4;

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
    Arc::new(serde_json::from_value(v).expect("valid object"))
}

fn catalog() -> Vec<Arc<InstanceType>> {
    [2, 4, 8, 16]
        .into_iter()
        .map(|cpu: i64| {
            Arc::new(InstanceType::new(
                format!("m.{cpu}x"),
                Requirements::new(),
                Resources::from_pairs([("cpu", cpu * 1000), ("memory", (cpu * 4) << 30), ("pods", 110)]),
                Default::default(),
                vec![Offering::new("z1", "on-demand", VCPU_PRICE * cpu as f64, true)],
            ))
        })
        .collect()
}

/// `n` nodes of the `m.{NODE_CPU}x` type, each running four 500m pods of one Deployment.
fn cluster(n: usize) -> Snapshot {
    cluster_of(n, NODE_CPU, |i, node| {
        (0..PODS_PER_NODE)
            .map(|p| {
                let pod = format!("web-{i:05}-{p}");
                obj(json!({"metadata": {"name": pod, "namespace": "ns", "uid": pod, "labels": {"app": "web"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "web", "controller": true}]},
                    "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]},
                    "status": {"phase": "Running", "startTime": "2026-11-24T11:00:00Z", "conditions": [{"type": "Ready", "status": "True"}]}}))
            })
            .collect()
    })
}

/// `n` initialized nodes of the `m.{cpu}x` type in one NodePool, node `i` running `pods(i, name)`.
fn cluster_of(n: usize, cpu: i64, pods_of: impl Fn(usize, &str) -> Vec<Arc<Pod>>) -> Snapshot {
    let pool: Arc<NodePool> = obj(
        json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "p"},
        "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"},
            "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]}]}},
            "disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "30s", "budgets": [{"nodes": "100%"}]}}}),
    );
    let mut nodes: Vec<Arc<Node>> = Vec::with_capacity(n);
    let mut claims: Vec<Arc<NodeClaim>> = Vec::with_capacity(n);
    let mut pods: Vec<Arc<Pod>> = Vec::with_capacity(n * PODS_PER_NODE);
    let it = format!("m.{cpu}x");
    for i in 0..n {
        let name = format!("node-{i:05}");
        let labels = json!({"karpenter.sh/nodepool": "p", "karpenter.sh/initialized": "true",
            "node.kubernetes.io/instance-type": it, "karpenter.sh/capacity-type": "on-demand",
            "topology.kubernetes.io/zone": "z1", "kubernetes.io/hostname": name});
        let resources = json!({"cpu": format!("{cpu}"), "memory": format!("{}Gi", cpu * 4), "pods": "110"});
        nodes.push(obj(json!({"metadata": {"name": name, "labels": labels},
            "spec": {"providerID": format!("kwok://{name}")},
            "status": {"allocatable": resources, "capacity": resources, "conditions": [{"type": "Ready", "status": "True"}]}})));
        claims.push(obj(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": name, "labels": labels},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []},
            "status": {"providerID": format!("kwok://{name}"), "nodeName": name,
                "conditions": [{"type": "Initialized", "status": "True", "reason": "Initialized", "message": "",
                    "lastTransitionTime": "2026-11-24T11:00:00Z"}]}})));
        pods.extend(pods_of(i, &name));
    }
    Snapshot { nodes, nodeclaims: claims, pods, nodepools: vec![pool], ..Default::default() }
        .with_instance_types(BTreeMap::from([("p".to_string(), catalog())]))
}

/// A pod of the Deployment `spread` (100m, required anti-affinity by host name on its own
/// pods), bound to `node` or pending.
fn spread_pod(name: &str, node: Option<&str>) -> Arc<Pod> {
    let anti = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "spread"}}}]}});
    let status = match node {
        Some(_) => {
            json!({"phase": "Running", "startTime": "2026-11-24T11:00:00Z", "conditions": [{"type": "Ready", "status": "True"}]})
        }
        None => {
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]})
        }
    };
    obj(json!({"metadata": {"name": name, "namespace": "ns", "uid": name, "labels": {"app": "spread"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "spread", "uid": "spread", "controller": true}]},
        "spec": {"nodeName": node, "affinity": anti,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
        "status": status}))
}

/// `n` 2-vCPU nodes, each running one pod of `spread`, and `n / 2` more of its pods pending.
fn scaling_up(n: usize) -> (Snapshot, Vec<Arc<Pod>>) {
    let mut snapshot = cluster_of(n, 2, |i, node| vec![spread_pod(&format!("spread-{i:05}"), Some(node))]);
    let pending: Vec<Arc<Pod>> = (0..n / 2).map(|i| spread_pod(&format!("pending-{i:05}"), None)).collect();
    snapshot.pods.extend(pending.iter().cloned());
    (snapshot, pending)
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is understood.
    let sizes: Vec<usize> = std::env::var("DISRUPTION_BENCH_NODES")
        .ok()
        .map(|v| v.split(',').filter_map(|s| s.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![500, 2000]);
    let now: Timestamp = "2026-11-24T12:00:00Z".parse().expect("a timestamp");
    println!(
        "| nodes | pods | pass (multi-node) | plan | $/h before | after | lower bound | single-node sweep | per candidate |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for &n in &sizes {
        let snapshot = cluster(n);
        let nodes = state_nodes(&snapshot);
        let pools = nodepools_by_name(&snapshot);
        let world = || {
            World::new(
                &snapshot,
                Setting {
                    nodes: &nodes,
                    pending: vec![],
                    options: SchedulerOptions::default(),
                    spot_to_spot: false,
                    pools: &pools,
                    now,
                    young: HashSet::new(),
                },
            )
        };
        let before: f64 = nodes.iter().filter_map(|n| n.price).sum();
        let bound = (n * PODS_PER_NODE) as f64 * 0.5 * VCPU_PRICE;

        let mut times = Vec::new();
        let mut pass = None;
        for _ in 0..3 {
            let start = Instant::now();
            pass = Some(black_box(decide(&world(), &HashSet::new())));
            times.push(start.elapsed());
        }
        let multi = median(times);
        let command = pass.and_then(|p| p.command).expect("a consolidation command");
        let plan = &command.plan;
        let replacement = plan.replacement_types().first().cloned().unwrap_or_else(|| "none".into());
        let after = before - plan.savings;

        let mut candidates: Vec<&karpenter::state::StateNode> = nodes.iter().collect();
        consolidation::sort_candidates(&mut candidates);
        let mut times = Vec::new();
        for _ in 0..3 {
            let start = Instant::now();
            let world = world();
            for c in &candidates {
                let _ = black_box(consolidation::evaluate(&world, std::slice::from_ref(c), true));
            }
            times.push(start.elapsed());
        }
        let sweep = median(times);
        println!(
            "| {n} | {} | {:.2} s | {} nodes {} → {replacement} | {before:.2} | {after:.2} | {bound:.2} | {:.2} s | {:.2} ms |",
            n * PODS_PER_NODE,
            multi.as_secs_f64(),
            plan.candidates.len(),
            plan.decision.as_str(),
            sweep.as_secs_f64(),
            sweep.as_secs_f64() * 1000.0 / n as f64,
        );
    }
    println!();
    println!("| nodes | pending pods | candidates simulated | moves found | per candidate |");
    println!("| --- | --- | --- | --- | --- |");
    for &n in &sizes {
        let (snapshot, pending) = scaling_up(n);
        let nodes = state_nodes(&snapshot);
        let pools = nodepools_by_name(&snapshot);
        let mut candidates: Vec<&karpenter::state::StateNode> = nodes.iter().collect();
        consolidation::sort_candidates(&mut candidates);
        candidates.truncate(20);
        let mut times = Vec::new();
        let mut moves = 0;
        for _ in 0..3 {
            let start = Instant::now();
            let world = World::new(
                &snapshot,
                Setting {
                    nodes: &nodes,
                    pending: pending.clone(),
                    options: SchedulerOptions::default(),
                    spot_to_spot: false,
                    pools: &pools,
                    now,
                    young: HashSet::new(),
                },
            );
            moves = candidates
                .iter()
                .filter(|c| black_box(consolidation::evaluate(&world, std::slice::from_ref(c), true)).is_ok())
                .count();
            times.push(start.elapsed());
        }
        let per = median(times).as_secs_f64() * 1000.0 / candidates.len() as f64;
        println!("| {n} | {} | {} | {moves} | {per:.1} ms |", pending.len(), candidates.len());
    }
}
