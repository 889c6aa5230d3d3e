//! A guard against launching node after node for pods that never stay.
//!
//! A pod placed on a new NodeClaim "bounces" when, within [`WINDOW`], the cluster removes it from
//! its node by preemption (`PreemptionByScheduler`), a `NoExecute` taint (`DeletionByTaintManager`)
//! or the kubelet (`TerminationByKubelet`), as its `DisruptionTarget` condition says. Bounces are
//! counted per workload (the pod's controller, or the pod itself), since a removed pod comes back
//! as a new pod of the same ReplicaSet, Job or StatefulSet.
//!
//! The rule: after [`LIMIT`] bounces of a workload within [`WINDOW`], and at least one bounce
//! in [`SHARE`] of its pods placed on new NodeClaims in that time (a large workload that a busy
//! kube-scheduler binds slowly misses here and there; one whose pods never stay bounces nearly
//! every time), its pending pods get no new NodeClaim for 1 minute, doubling each time it happens again, up to 30 minutes ([`BACKOFF`]); a
//! `ProvisioningBackoff` warning on a pod says so. After each wait, one more bounce starts the next.
//! Pods can still land on capacity that exists: only new NodeClaims are held back. Evictions
//! (drains, consolidation), ordinary deletions, and a pending pod placed again (the kube-scheduler
//! often binds another pod where one was nominated) are not bounces.
//!
//! A pod also counts as bounced when the capacity launched for it does not take it: its NodeClaim's
//! node has registered with a taint the pod does not tolerate that neither the NodeClaim nor
//! Kubernetes put there (another controller taints new nodes), or the pod is still pending
//! [`MISS_GRACE`] after that node was initialized and nothing took the node ([`misses`]: a node
//! the kube-scheduler gave another pod was taken, and the pod is placed again).
//!
//! Whatever makes pods bounce (DaemonSet overhead the plan did not see, preemption by
//! higher-priority pods, a taint someone adds to new nodes), a mistake then costs a handful of
//! nodes, not a new one every batch; the empty nodes left behind go the way of empty nodes.

use std::collections::HashMap;
use std::time::Duration;

use crate::apis::pod::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::time::Instant;

use crate::apis::TaintEffect;
use crate::apis::labels::TAINT_DISRUPTED;
use crate::apis::nodeclaim::conditions::INITIALIZED;
use crate::controllers::kit::Backoff;
use crate::scheduling::taints::{describe, is_ephemeral, tolerates};
use crate::state::StateNode;

/// How long a pod may stay pending after the node launched for it is initialized before that
/// counts as the node not taking it (the kube-scheduler binds within seconds).
pub const MISS_GRACE: SignedDuration = SignedDuration::from_secs(60);

/// Why the capacity launched for the pending `pod`, the StateNode of its NodeClaim, will not take
/// it (see the module's documentation); `None` while the node may still take it.
pub fn misses(pod: &Pod, node: &StateNode, now: Timestamp) -> Option<String> {
    // Checked as soon as the node has registered, before the next pass places the pod again.
    node.node.as_ref()?;
    let asked = node.claim.as_deref().map(|c| (c.spec.taints.as_slice(), c.spec.startup_taints.as_slice()));
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    let foreign = node.taints.iter().find(|t| {
        t.effect != TaintEffect::PreferNoSchedule
            && !is_ephemeral(t)
            && t.key != TAINT_DISRUPTED
            && !t.key.starts_with("node.kubernetes.io/")
            && !asked.is_some_and(|(taints, startup)| {
                taints.iter().chain(startup).any(|a| a.key == t.key && a.effect == t.effect)
            })
            && !tolerations.iter().any(|tol| tolerates(tol, t))
    });
    if let Some(taint) = foreign {
        return Some(format!("node {} has taint {} the pod does not tolerate", node.name, describe(taint)));
    }
    // The kube-scheduler put another pod there: the capacity was used, the pod is placed again.
    if !node.initialized || node.reschedulable_pods().next().is_some() {
        return None;
    }
    let initialized_at = node
        .claim
        .as_deref()
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == INITIALIZED))
        .and_then(|c| c.last_transition_time.parse::<Timestamp>().ok())?;
    (now.duration_since(initialized_at) >= MISS_GRACE).then(|| {
        format!("the pod is still pending {}s after node {} was initialized", MISS_GRACE.as_secs(), node.name)
    })
}

/// Bounces of a workload within [`WINDOW`] before its pods back off.
pub const LIMIT: usize = 3;
/// A workload backs off only when at least one in this many of its placements within
/// [`WINDOW`] bounced.
pub const SHARE: usize = 10;
/// How far back bounces count.
pub const WINDOW: Duration = Duration::from_secs(10 * 60);
/// How long a workload over the limit waits, by how many times it went over it.
pub const BACKOFF: Backoff = Backoff::new(Duration::from_secs(60), Duration::from_secs(30 * 60));

/// `DisruptionTarget` reasons that mean the cluster would not keep the pod where it was put.
const BOUNCE_REASONS: [&str; 3] = ["PreemptionByScheduler", "DeletionByTaintManager", "TerminationByKubelet"];

/// The workload a pod belongs to: the uid of its controller, or its own uid (namespace/name if it
/// has none).
pub fn workload(pod: &Pod) -> String {
    let owner =
        pod.metadata.owner_references.as_ref().and_then(|o| o.iter().find(|o| o.controller == Some(true)));
    match (owner, pod.metadata.uid.as_deref()) {
        (Some(owner), _) => owner.uid.clone(),
        (None, Some(uid)) => uid.to_string(),
        (None, None) => crate::state::pods::key(pod),
    }
}

/// Whether the cluster is taking the pod off its node for a reason that would take it off any
/// node like it (see the module's documentation).
pub fn is_bounced(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|conditions| {
        conditions.iter().any(|c| {
            c.type_ == "DisruptionTarget"
                && c.status == "True"
                && c.reason.as_deref().is_some_and(|r| BOUNCE_REASONS.contains(&r))
        })
    })
}

#[derive(Debug, Default)]
struct WorkloadRecord {
    bounces: Vec<Instant>,
    /// When its pods were placed on new NodeClaims, within the window.
    placements: Vec<Instant>,
    strikes: u32,
    until: Option<Instant>,
}

/// What the guard says about a workload with pending pods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Give its pods new NodeClaims as needed.
    Place,
    /// It just went over the limit: say so, and give its pods no new NodeClaim before `until`.
    BackOff {
        /// Bounces within the window.
        bounces: usize,
        /// When its pods may have new NodeClaims again.
        until: Instant,
    },
    /// It is waiting out a back-off.
    Waiting,
}

/// A pod placed on a new NodeClaim.
#[derive(Debug)]
struct Placement {
    workload: String,
    claim: String,
    at: Instant,
}

/// Pods placed on new NodeClaims, and the bounces of their workloads.
#[derive(Debug, Default)]
pub struct Relaunches {
    /// Pod uid → where and when it was placed on a new NodeClaim.
    placed: HashMap<String, Placement>,
    workloads: HashMap<String, WorkloadRecord>,
}

impl Relaunches {
    /// Records that pod `uid` of `workload` was placed on the new NodeClaim `claim`.
    pub fn placed(&mut self, uid: &str, workload: &str, claim: &str, now: Instant) {
        let placement = Placement { workload: workload.to_string(), claim: claim.to_string(), at: now };
        self.placed.insert(uid.to_string(), placement);
        self.workloads.entry(workload.to_string()).or_default().placements.push(now);
    }

    /// The NodeClaim pod `uid` was last placed on, if the guard follows it.
    pub fn claim_of(&self, uid: &str) -> Option<&str> {
        self.placed.get(uid).map(|p| p.claim.as_str())
    }

    /// Records that pod `uid` is being taken off its node (see [`is_bounced`]), or that the node
    /// launched for it will not take it ([`misses`]): a bounce if it was placed on a new NodeClaim
    /// within the window. Counts once per placement.
    pub fn removed(&mut self, uid: &str, now: Instant) {
        if let Some(p) = self.placed.remove(uid)
            && now.saturating_duration_since(p.at) < WINDOW
        {
            self.bounce(&p.workload, now);
        }
    }

    fn bounce(&mut self, workload: &str, now: Instant) {
        self.workloads.entry(workload.to_string()).or_default().bounces.push(now);
    }

    /// Whether the pending pods of `workload` may have new NodeClaims now.
    pub fn verdict(&mut self, workload: &str, now: Instant) -> Verdict {
        let Some(record) = self.workloads.get_mut(workload) else { return Verdict::Place };
        record.bounces.retain(|t| now.saturating_duration_since(*t) < WINDOW);
        record.placements.retain(|t| now.saturating_duration_since(*t) < WINDOW);
        if let Some(until) = record.until {
            if now < until {
                return Verdict::Waiting;
            }
            record.until = None;
            // The wait is over: one more bounce starts the next.
            let drop = record.bounces.len().saturating_sub(LIMIT.saturating_sub(1));
            record.bounces.drain(..drop);
            return Verdict::Place;
        }
        if record.bounces.len() < LIMIT || record.bounces.len() * SHARE < record.placements.len() {
            return Verdict::Place;
        }
        record.strikes = record.strikes.saturating_add(1);
        let until = now + BACKOFF.delay(record.strikes);
        record.until = Some(until);
        Verdict::BackOff { bounces: record.bounces.len(), until }
    }

    /// Forgets placements and bounces older than the window, and workloads with nothing left to
    /// wait out.
    pub fn forget_old(&mut self, now: Instant) {
        self.placed.retain(|_, p| now.saturating_duration_since(p.at) < WINDOW);
        self.workloads.retain(|_, r| {
            r.bounces.retain(|t| now.saturating_duration_since(*t) < WINDOW);
            r.placements.retain(|t| now.saturating_duration_since(*t) < WINDOW);
            !r.bounces.is_empty() || !r.placements.is_empty() || r.until.is_some_and(|u| now < u)
        });
    }

    /// Whether pod `uid` is one the guard follows.
    pub fn follows(&self, uid: &str) -> bool {
        self.placed.contains_key(uid)
    }
}

/// Whole seconds of `d` the way Go prints a duration (`1m0s`, `10m0s`, `1h30m0s`), as
/// Karpenter's messages do.
pub fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    match (h, m) {
        (0, 0) => format!("{s}s"),
        (0, _) => format!("{m}m{s}s"),
        _ => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test(start_paused = true)]
    async fn a_workload_whose_pods_keep_bouncing_backs_off_longer_each_time() {
        let mut r = Relaunches::default();
        // Each replacement pod of the ReplicaSet is placed on a new NodeClaim and preempted there.
        for i in 0..LIMIT {
            assert_eq!(r.verdict("rs", Instant::now()), Verdict::Place);
            r.placed(&format!("pod-{i}"), "rs", "claim", Instant::now());
            tokio::time::sleep(Duration::from_secs(20)).await;
            r.removed(&format!("pod-{i}"), Instant::now());
        }
        let Verdict::BackOff { bounces, until } = r.verdict("rs", Instant::now()) else {
            panic!("backs off")
        };
        assert_eq!(bounces, LIMIT);
        assert_eq!(until - Instant::now(), Duration::from_secs(60));
        assert_eq!(r.verdict("rs", Instant::now()), Verdict::Waiting);
        tokio::time::sleep(Duration::from_secs(61)).await;
        // One more try after the wait; one more bounce doubles the next wait.
        assert_eq!(r.verdict("rs", Instant::now()), Verdict::Place);
        r.placed("pod-x", "rs", "claim", Instant::now());
        r.removed("pod-x", Instant::now());
        let Verdict::BackOff { until, .. } = r.verdict("rs", Instant::now()) else {
            panic!("backs off again")
        };
        assert_eq!(until - Instant::now(), Duration::from_secs(120));
        // Other workloads are not affected.
        assert_eq!(r.verdict("other", Instant::now()), Verdict::Place);
    }

    #[tokio::test(start_paused = true)]
    async fn placements_alone_are_not_bounces() {
        let mut r = Relaunches::default();
        // A scale-up of many pods, and a pod placed on new NodeClaims again and again (another pod
        // took its place each time), back nothing off.
        for i in 0..10 {
            r.placed(&format!("pod-{i}"), "big", "claim", Instant::now());
        }
        for _ in 0..=LIMIT {
            r.placed("moved", "big", "claim", Instant::now());
        }
        assert_eq!(r.verdict("big", Instant::now()), Verdict::Place);
        // A pod removed twice counts once.
        r.removed("pod-0", Instant::now());
        r.removed("pod-0", Instant::now());
        assert_eq!(r.workloads.get("big").map(|w| w.bounces.len()), Some(1));
    }

    #[tokio::test(start_paused = true)]
    async fn old_placements_and_bounces_are_forgotten() {
        let mut r = Relaunches::default();
        for i in 0..LIMIT {
            r.placed(&format!("p{i}"), "w", "claim", Instant::now());
            tokio::time::sleep(WINDOW / 2).await;
            r.removed(&format!("p{i}"), Instant::now());
        }
        assert_eq!(r.verdict("w", Instant::now()), Verdict::Place, "only removals within the window count");
        tokio::time::sleep(WINDOW).await;
        r.forget_old(Instant::now());
        assert!(r.placed.is_empty() && r.workloads.is_empty());
    }

    #[test]
    fn bounces_are_what_the_cluster_does_to_the_pod_not_evictions() {
        let pod = |reason: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "status": {"conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": reason}]}}))
            .unwrap()
        };
        assert!(is_bounced(&pod("PreemptionByScheduler")));
        assert!(is_bounced(&pod("DeletionByTaintManager")));
        assert!(!is_bounced(&pod("EvictionByEvictionAPI")));
        assert!(!is_bounced(&pod("DeletionByPodGC")));
        let owned: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-uid", "controller": true}]}}))
        .unwrap();
        assert_eq!(workload(&owned), "rs-uid");
        assert_eq!(workload(&pod("x")), "u");
    }

    /// The StateNode of an initialized NodeClaim `c1` (initialized at `initialized`) whose node has
    /// `node_taints`, the claim asking for `claim_taints`.
    fn launched(
        node_taints: serde_json::Value,
        claim_taints: serde_json::Value,
        initialized: &str,
    ) -> StateNode {
        use crate::state::snapshot::Snapshot;
        let labels = json!({"karpenter.sh/nodepool": "p", "karpenter.sh/initialized": "true", "kubernetes.io/hostname": "c1"});
        let node = serde_json::from_value(json!({"metadata": {"name": "c1", "labels": labels},
            "spec": {"providerID": "kwok://c1", "taints": node_taints},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
        .unwrap();
        let claim = serde_json::from_value(json!({"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c1", "labels": labels},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"},
                "requirements": [], "taints": claim_taints},
            "status": {"providerID": "kwok://c1", "nodeName": "c1", "conditions": [{"type": "Initialized",
                "status": "True", "reason": "Initialized", "message": "", "lastTransitionTime": initialized}]}}))
        .unwrap();
        let snapshot = Snapshot {
            nodes: vec![std::sync::Arc::new(node)],
            nodeclaims: vec![std::sync::Arc::new(claim)],
            ..Default::default()
        };
        crate::state::statenode::state_nodes(&snapshot).remove(0)
    }

    #[test]
    fn a_node_that_will_not_take_its_pod_is_a_miss() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"},
            "spec": {"containers": [], "tolerations": [{"key": "dedicated", "operator": "Exists"}]}}))
        .unwrap();
        let now: Timestamp = "2026-11-24T12:00:30Z".parse().unwrap();
        let just = "2026-11-24T12:00:00Z";
        // Another controller tainted the node: a miss at once.
        let tainted =
            launched(json!([{"key": "test", "value": "true", "effect": "NoExecute"}]), json!([]), just);
        assert_eq!(
            misses(&pod, &tainted, now).as_deref(),
            Some("node c1 has taint test=true:NoExecute the pod does not tolerate")
        );
        // A taint the NodeClaim asked for, one the pod tolerates, Kubernetes' own or a preference:
        // no reason to think the node will not take the pod.
        for (node_taints, claim_taints) in [
            (
                json!([{"key": "test", "effect": "NoSchedule"}]),
                json!([{"key": "test", "effect": "NoSchedule"}]),
            ),
            (json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]), json!([])),
            (json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]), json!([])),
            (json!([{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]), json!([])),
            (json!([{"key": "soft", "effect": "PreferNoSchedule"}]), json!([])),
        ] {
            let node = launched(node_taints.clone(), claim_taints, just);
            assert_eq!(misses(&pod, &node, now), None, "{node_taints}");
        }
        // Registered, not initialized yet: the foreign taint already counts (before the next pass
        // would place the pod again), the wait does not.
        let mut coming =
            launched(json!([{"key": "test", "value": "true", "effect": "NoExecute"}]), json!([]), just);
        coming.initialized = false;
        assert!(misses(&pod, &coming, now).is_some());
        let mut coming = launched(json!([]), json!([]), just);
        coming.initialized = false;
        assert_eq!(misses(&pod, &coming, "2026-11-24T13:00:00Z".parse().unwrap()), None);
        // Still pending a minute after the node was initialized: a miss.
        let untainted = launched(json!([]), json!([]), just);
        assert_eq!(misses(&pod, &untainted, now), None);
        let later: Timestamp = "2026-11-24T12:01:00Z".parse().unwrap();
        assert!(misses(&pod, &untainted, later).is_some_and(|m| m.contains("still pending 60s")));
        // Unless the kube-scheduler gave the node another pod: the capacity was used.
        let mut taken = launched(json!([]), json!([]), just);
        taken.pods.push(std::sync::Arc::new(
            serde_json::from_value(json!({"metadata": {"name": "other", "namespace": "ns", "uid": "o"},
                "spec": {"nodeName": "c1", "containers": []}, "status": {"phase": "Running"}}))
            .unwrap(),
        ));
        assert_eq!(misses(&pod, &taken, later), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_large_workload_with_a_few_misses_does_not_back_off() {
        let mut r = Relaunches::default();
        // 2,000 pods each placed on a node of its own; a busy kube-scheduler leaves a few of them
        // pending past the grace.
        for i in 0..2000 {
            r.placed(&format!("pod-{i}"), "rs", &format!("claim-{i}"), Instant::now());
        }
        for i in 0..44 {
            r.removed(&format!("pod-{i}"), Instant::now());
        }
        assert_eq!(r.verdict("rs", Instant::now()), Verdict::Place);
        // One bounce in ten placements is a workload whose pods do not stay.
        for i in 44..200 {
            r.removed(&format!("pod-{i}"), Instant::now());
        }
        assert!(matches!(r.verdict("rs", Instant::now()), Verdict::BackOff { bounces: 200, .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn misses_count_like_bounces_once_per_placement() {
        let mut r = Relaunches::default();
        for i in 0..LIMIT {
            r.placed("pod", "rs", &format!("claim-{i}"), Instant::now());
            assert_eq!(r.claim_of("pod"), Some(format!("claim-{i}").as_str()));
            r.removed("pod", Instant::now());
            r.removed("pod", Instant::now());
        }
        assert!(matches!(r.verdict("rs", Instant::now()), Verdict::BackOff { bounces: LIMIT, .. }));
    }

    #[test]
    fn durations_read_as_go_prints_them() {
        assert_eq!(go_duration(Duration::from_secs(45)), "45s");
        assert_eq!(go_duration(WINDOW), "10m0s");
        assert_eq!(go_duration(Duration::from_secs(5400)), "1h30m0s");
    }
}
