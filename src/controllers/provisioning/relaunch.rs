//! A guard against launching node after node for pods that never stay.
//!
//! A pod placed on a new NodeClaim "bounces" when, within [`WINDOW`], the cluster removes it from
//! its node by preemption (`PreemptionByScheduler`), a `NoExecute` taint (`DeletionByTaintManager`)
//! or the kubelet (`TerminationByKubelet`), as its `DisruptionTarget` condition says. Bounces are
//! counted per workload (the pod's controller, or the pod itself), since a removed pod comes back
//! as a new pod of the same ReplicaSet, Job or StatefulSet.
//!
//! The rule: after [`LIMIT`] bounces of a workload within [`WINDOW`], its pending pods get no new
//! NodeClaim for 1 minute, doubling each time it happens again, up to 30 minutes ([`BACKOFF`]); a
//! `ProvisioningBackoff` warning on a pod says so. After each wait, one more bounce starts the next.
//! Pods can still land on capacity that exists: only new NodeClaims are held back. Evictions
//! (drains, consolidation), ordinary deletions, and a pending pod placed again (the kube-scheduler
//! often binds another pod where one was nominated) are not bounces.
//!
//! Whatever makes pods bounce (DaemonSet overhead the plan did not see, preemption by
//! higher-priority pods, a taint someone adds to new nodes), a mistake then costs a handful of
//! nodes, not a new one every batch.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::time::Instant;

use crate::controllers::kit::Backoff;

/// Bounces of a workload within [`WINDOW`] before its pods back off.
pub const LIMIT: usize = 3;
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

/// Pods placed on new NodeClaims, and the bounces of their workloads.
#[derive(Debug, Default)]
pub struct Relaunches {
    /// Pod uid → (workload, when it was placed on a new NodeClaim).
    placed: HashMap<String, (String, Instant)>,
    workloads: HashMap<String, WorkloadRecord>,
}

impl Relaunches {
    /// Records that pod `uid` of `workload` was placed on a new NodeClaim.
    pub fn placed(&mut self, uid: &str, workload: &str, now: Instant) {
        self.placed.insert(uid.to_string(), (workload.to_string(), now));
    }

    /// Records that pod `uid` is being taken off its node (see [`is_bounced`]): a bounce if it was
    /// placed on a new NodeClaim within the window. Counts once per pod.
    pub fn removed(&mut self, uid: &str, now: Instant) {
        if let Some((key, at)) = self.placed.remove(uid)
            && now.saturating_duration_since(at) < WINDOW
        {
            self.bounce(&key, now);
        }
    }

    fn bounce(&mut self, workload: &str, now: Instant) {
        self.workloads.entry(workload.to_string()).or_default().bounces.push(now);
    }

    /// Whether the pending pods of `workload` may have new NodeClaims now.
    pub fn verdict(&mut self, workload: &str, now: Instant) -> Verdict {
        let Some(record) = self.workloads.get_mut(workload) else { return Verdict::Place };
        record.bounces.retain(|t| now.saturating_duration_since(*t) < WINDOW);
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
        if record.bounces.len() < LIMIT {
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
        self.placed.retain(|_, (_, at)| now.saturating_duration_since(*at) < WINDOW);
        self.workloads.retain(|_, r| {
            r.bounces.retain(|t| now.saturating_duration_since(*t) < WINDOW);
            !r.bounces.is_empty() || r.until.is_some_and(|u| now < u)
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
            r.placed(&format!("pod-{i}"), "rs", Instant::now());
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
        r.placed("pod-x", "rs", Instant::now());
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
            r.placed(&format!("pod-{i}"), "big", Instant::now());
        }
        for _ in 0..=LIMIT {
            r.placed("moved", "big", Instant::now());
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
            r.placed(&format!("p{i}"), "w", Instant::now());
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

    #[test]
    fn durations_read_as_go_prints_them() {
        assert_eq!(go_duration(Duration::from_secs(45)), "45s");
        assert_eq!(go_duration(WINDOW), "10m0s");
        assert_eq!(go_duration(Duration::from_secs(5400)), "1h30m0s");
    }
}
