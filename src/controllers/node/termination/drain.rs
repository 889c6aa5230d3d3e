//! The pure rules of draining a node: which pods keep it from being drained, in which order they
//! leave, which must be deleted because the node's termination grace period runs out, and which
//! volume attachments must be gone before the instance is terminated.
//!
//! Nothing here talks to the API server; the controller feeds in what it listed and applies the
//! returned plan.

use std::borrow::Borrow;
use std::collections::BTreeSet;

use crate::apis::pod::Pod;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::apis::NodeClaim;
use crate::apis::labels::ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP;
pub use crate::state::pods::{
    do_not_disrupt, is_critical, is_mirror, is_owned_by_daemonset as is_daemonset_pod, is_terminal,
    is_terminating, tolerates_disrupted_taint,
};
use crate::util::parse_duration;

/// How long past its own deletion deadline a terminating pod may linger before it no longer holds
/// up the drain: the kubelet of a broken node may never confirm the deletion.
pub const STUCK_TERMINATING_AFTER: SignedDuration = SignedDuration::from_secs(60);

/// The grace period Kubernetes gives a pod that does not set `terminationGracePeriodSeconds`.
pub const DEFAULT_POD_GRACE_PERIOD_SECONDS: i64 = 30;

/// The shortest grace period a pod is deleted with, even past the node's termination deadline
/// (as upstream): one second, never zero.
pub const MIN_DELETE_GRACE_SECONDS: i64 = 1;

/// The order in which pods leave a draining node. A group starts only once every pod of the
/// groups before it is gone, so that critical and node-level services outlive the workloads that
/// may still need them while shutting down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DrainGroup {
    /// Ordinary pods.
    Workload,
    /// Pods of DaemonSets.
    DaemonSet,
    /// Pods with a system critical priority class.
    CriticalWorkload,
    /// DaemonSet pods with a system critical priority class.
    CriticalDaemonSet,
}

impl DrainGroup {
    /// The group of `pod`.
    pub fn of(pod: &Pod) -> Self {
        match (is_critical(pod), is_daemonset_pod(pod)) {
            (false, false) => DrainGroup::Workload,
            (false, true) => DrainGroup::DaemonSet,
            (true, false) => DrainGroup::CriticalWorkload,
            (true, true) => DrainGroup::CriticalDaemonSet,
        }
    }
}

/// Whether `pod` is still terminating more than [`STUCK_TERMINATING_AFTER`] past its deletion
/// deadline.
pub fn is_stuck_terminating(pod: &Pod, now: Timestamp) -> bool {
    pod.metadata
        .deletion_timestamp
        .as_ref()
        .is_some_and(|t| now.duration_since(t.0) > STUCK_TERMINATING_AFTER)
}

/// Whether `pod` must be gone before the node counts as drained: it has not finished, is no
/// mirror pod, does not tolerate the disrupted taint and is not stuck terminating.
pub fn blocks_drain(pod: &Pod, now: Timestamp) -> bool {
    !is_terminal(pod) && !is_mirror(pod) && !tolerates_disrupted_taint(pod) && !is_stuck_terminating(pod, now)
}

/// The time by which the node must be drained, if its NodeClaim bounds it.
///
/// The NodeClaim's `karpenter.sh/nodeclaim-termination-timestamp` annotation wins when present
/// (the NodeClaim's own termination sets it); otherwise the deadline is the node's deletion time
/// plus the claim's `spec.terminationGracePeriod`. Errors describe an unreadable value.
pub fn termination_deadline(
    node_deleted_at: Option<Timestamp>,
    node_claim: Option<&NodeClaim>,
) -> Result<Option<Timestamp>, String> {
    let Some(claim) = node_claim else { return Ok(None) };
    let annotation =
        claim.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP));
    if let Some(value) = annotation {
        return value
            .parse::<Timestamp>()
            .map(Some)
            .map_err(|e| format!("invalid {ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP} {value:?}: {e}"));
    }
    let (Some(deleted_at), Some(period)) = (node_deleted_at, claim.spec.termination_grace_period.as_deref())
    else {
        return Ok(None);
    };
    let period = parse_duration(period)?;
    let period = SignedDuration::try_from(period).map_err(|e| format!("termination grace period: {e}"))?;
    deleted_at.checked_add(period).map(Some).map_err(|e| format!("termination deadline: {e}"))
}

/// What to do next to drain a node.
#[derive(Debug, Default)]
pub struct DrainPlan<'a> {
    /// Pods that still keep the node from counting as drained.
    pub remaining: Vec<&'a Pod>,
    /// The group being drained: the first one that still has pods.
    pub group: Option<DrainGroup>,
    /// Pods to evict now: those of [`DrainPlan::group`] that are not terminating yet and not in
    /// [`DrainPlan::delete`].
    pub evict: Vec<&'a Pod>,
    /// Pods to delete now, each with the grace period (seconds) that ends at the deadline, because
    /// waiting for their eviction would run past the node's termination deadline (past the
    /// deadline: every pod left, with [`MIN_DELETE_GRACE_SECONDS`]). Never 0: a pod deleted with
    /// no grace leaves the API at once while its containers may still run, and its replacement
    /// (a StatefulSet's same-named pod) could then run beside it.
    pub delete: Vec<(&'a Pod, i64)>,
    /// Whether the node's termination deadline has passed: nothing is evicted any more, and the
    /// drain is over once the pods deleted at the deadline have had their grace period.
    pub expired: bool,
    /// Whether every pod left is terminating with its grace period over (its deletion time has
    /// come): past the deadline, the instance may then go.
    pub settled: bool,
    /// Pods of [`DrainPlan::remaining`] that `karpenter.sh/do-not-disrupt` protects: they are not
    /// evicted, and leave only when deleted at the termination deadline (minus their own grace
    /// period); without a deadline they keep the node.
    pub protected: Vec<&'a Pod>,
}

impl DrainPlan<'_> {
    /// Whether nothing keeps the node any longer.
    pub fn is_drained(&self) -> bool {
        self.remaining.is_empty() || (self.expired && self.settled)
    }
}

/// Plans the next step of draining a node that runs `pods`, at `now`, with an optional
/// termination `deadline`.
pub fn plan<P: Borrow<Pod>>(pods: &[P], now: Timestamp, deadline: Option<Timestamp>) -> DrainPlan<'_> {
    let remaining: Vec<&Pod> = pods.iter().map(Borrow::borrow).filter(|p| blocks_drain(p, now)).collect();
    let expired = deadline.is_some_and(|d| now >= d);
    let delete: Vec<(&Pod, i64)> = match deadline {
        Some(deadline) if !expired => {
            remaining.iter().filter_map(|p| expiring(p, now, deadline).map(|g| (*p, g))).collect()
        }
        // Past the deadline, what is left is deleted with the shortest grace period, and the
        // node waits for it (a pod terminating with a later deletion time is shortened too).
        Some(_) => remaining
            .iter()
            .filter(|p| grace_left(p, now).is_none_or(|left| left > MIN_DELETE_GRACE_SECONDS))
            .map(|p| (*p, MIN_DELETE_GRACE_SECONDS))
            .collect(),
        None => Vec::new(),
    };
    let settled = remaining.iter().all(|p| grace_left(p, now).is_some_and(|left| left <= 0));
    let protected: Vec<&Pod> = remaining
        .iter()
        .filter(|p| !is_terminating(p) && do_not_disrupt(p, now).is_active())
        .copied()
        .collect();
    let is_protected = |p: &Pod| protected.iter().any(|q| std::ptr::eq(*q, p));
    // The order of groups is that of the pods eviction can move.
    let group = remaining.iter().filter(|p| !is_protected(p)).map(|p| DrainGroup::of(p)).min();
    let evict = remaining
        .iter()
        .filter(|p| Some(DrainGroup::of(p)) == group)
        .filter(|p| !expired && !is_terminating(p) && !is_protected(p))
        .filter(|p| !delete.iter().any(|(d, _)| std::ptr::eq(*d, **p)))
        .copied()
        .collect();
    DrainPlan { remaining, group, evict, delete, expired, settled, protected }
}

/// Seconds until a terminating pod's deletion time (negative once past), `None` if it is not
/// terminating.
fn grace_left(pod: &Pod, now: Timestamp) -> Option<i64> {
    pod.metadata.deletion_timestamp.as_ref().map(|t| t.0.duration_since(now).as_secs())
}

/// The grace period to delete `pod` with, when it must be deleted now so that it is gone by
/// `deadline`: once `deadline` minus the pod's own grace period has come, and unless the pod is
/// already terminating with a deadline no later than the node's.
fn expiring(pod: &Pod, now: Timestamp, deadline: Timestamp) -> Option<i64> {
    if let Some(deleted) = &pod.metadata.deletion_timestamp
        && deleted.0 <= deadline
    {
        return None;
    }
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_POD_GRACE_PERIOD_SECONDS)
        .max(0);
    let left = deadline.duration_since(now).as_secs();
    (left <= own).then_some(left.max(MIN_DELETE_GRACE_SECONDS))
}

/// PersistentVolumeClaims (`(namespace, name)`) of the pods that stay on the node although it is
/// drained: running pods that do not block the drain (mirror pods, pods tolerating the disrupted
/// taint, pods stuck terminating). Their volumes stay attached until the instance is gone.
pub fn claims_of_undrained_pods<P: Borrow<Pod>>(pods: &[P], now: Timestamp) -> BTreeSet<(String, String)> {
    pods.iter()
        .map(Borrow::borrow)
        .filter(|p| !is_terminal(p) && !blocks_drain(p, now))
        .flat_map(|p| {
            let namespace = p.metadata.namespace.clone().unwrap_or_default();
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .map(move |c| (namespace.clone(), c.claim_name.clone()))
        })
        .collect()
}

/// Names of the VolumeAttachments of `node` that must be gone before its instance is terminated:
/// all of them except those of the persistent volumes in `ignored_volumes` (the volumes of pods
/// that were not drained, which cannot be detached while those pods run).
pub fn pending_volume_attachments<V: Borrow<VolumeAttachment>>(
    attachments: &[V],
    node: &str,
    ignored_volumes: &BTreeSet<String>,
) -> Vec<String> {
    attachments
        .iter()
        .map(Borrow::borrow)
        .filter(|va| va.spec.node_name == node)
        .filter(|va| {
            va.spec.source.persistent_volume_name.as_ref().is_none_or(|pv| !ignored_volumes.contains(pv))
        })
        .map(|va| va.metadata.name.clone().unwrap_or_default())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels::{
        ANNOTATION_MIRROR_POD, PRIORITY_CLASS_SYSTEM_CLUSTER_CRITICAL, PRIORITY_CLASS_SYSTEM_NODE_CRITICAL,
        TAINT_DISRUPTED,
    };
    use crate::apis::pod::{PodSpec, PodStatus, Volume};
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Toleration};
    use k8s_openapi::api::storage::v1::{VolumeAttachmentSource, VolumeAttachmentSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use rstest::rstest;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-01-01T00:10:00Z";

    /// A pod described by a compact spec: comma-separated flags among `ds`, `critical`,
    /// `mirror`, `nodeowned`, `tolerate`, `tolerate-all`, `succeeded`, `failed`,
    /// `deleting=<rfc3339>`, `grace=<seconds>`, `pvc=<claim>`.
    fn pod(name: &str, flags: &str) -> Pod {
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus { phase: Some("Running".into()), ..Default::default() }),
        };
        let owner = |kind: &str, api_version: &str| OwnerReference {
            kind: kind.into(),
            api_version: api_version.into(),
            name: "owner".into(),
            uid: "uid".into(),
            controller: Some(true),
            ..Default::default()
        };
        for flag in flags.split(',').filter(|f| !f.is_empty()) {
            let spec = pod.spec.as_mut().unwrap();
            let (key, value) = flag.split_once('=').unwrap_or((flag, ""));
            match key {
                "ds" => {
                    pod.metadata.owner_references.get_or_insert_default().push(owner("DaemonSet", "apps/v1"))
                }
                "nodeowned" => {
                    pod.metadata.owner_references.get_or_insert_default().push(owner("Node", "v1"))
                }
                "critical" => spec.priority_class_name = Some(PRIORITY_CLASS_SYSTEM_NODE_CRITICAL.into()),
                "cluster-critical" => {
                    spec.priority_class_name = Some(PRIORITY_CLASS_SYSTEM_CLUSTER_CRITICAL.into())
                }
                "mirror" => {
                    pod.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(ANNOTATION_MIRROR_POD.into(), "x".into());
                }
                "tolerate" => spec.tolerations.get_or_insert_default().push(Toleration {
                    key: Some(TAINT_DISRUPTED.into()),
                    operator: Some("Exists".into()),
                    ..Default::default()
                }),
                "tolerate-all" => spec
                    .tolerations
                    .get_or_insert_default()
                    .push(Toleration { operator: Some("Exists".into()), ..Default::default() }),
                "tolerate-other" => spec.tolerations.get_or_insert_default().push(Toleration {
                    key: Some("other".into()),
                    operator: Some("Exists".into()),
                    ..Default::default()
                }),
                "succeeded" => pod.status.as_mut().unwrap().phase = Some("Succeeded".into()),
                "failed" => pod.status.as_mut().unwrap().phase = Some("Failed".into()),
                "deleting" => pod.metadata.deletion_timestamp = Some(Time(ts(value))),
                "grace" => spec.termination_grace_period_seconds = Some(value.parse().unwrap()),
                "dnd" => {
                    pod.metadata
                        .annotations
                        .get_or_insert_default()
                        .insert(crate::apis::labels::ANNOTATION_DO_NOT_DISRUPT.into(), value.into());
                    pod.status.as_mut().unwrap().start_time = Some(Time(ts("2026-01-01T00:00:00Z")));
                }
                "pvc" => spec.volumes.get_or_insert_default().push(Volume {
                    name: value.into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: value.into(),
                        read_only: None,
                    }),
                    ..Default::default()
                }),
                other => panic!("unknown flag {other}"),
            }
        }
        pod
    }

    #[rstest]
    #[case::running("", true)]
    #[case::succeeded("succeeded", false)]
    #[case::failed("failed", false)]
    #[case::mirror("mirror", false)]
    #[case::owned_by_node("nodeowned", false)]
    #[case::tolerates_disrupted("tolerate", false)]
    #[case::tolerates_everything("tolerate-all", false)]
    #[case::tolerates_something_else("tolerate-other", true)]
    #[case::terminating("deleting=2026-01-01T00:09:30Z", true)]
    #[case::terminating_in_future("deleting=2026-01-01T00:20:00Z", true)]
    #[case::stuck_terminating("deleting=2026-01-01T00:08:59Z", false)]
    #[case::daemonset("ds", true)]
    #[case::critical("critical", true)]
    fn which_pods_block_the_drain(#[case] flags: &str, #[case] blocks: bool) {
        assert_eq!(blocks_drain(&pod("p", flags), ts(NOW)), blocks);
    }

    #[rstest]
    #[case("", DrainGroup::Workload)]
    #[case("ds", DrainGroup::DaemonSet)]
    #[case("critical", DrainGroup::CriticalWorkload)]
    #[case("cluster-critical", DrainGroup::CriticalWorkload)]
    #[case("ds,critical", DrainGroup::CriticalDaemonSet)]
    #[case("ds,cluster-critical", DrainGroup::CriticalDaemonSet)]
    fn groups(#[case] flags: &str, #[case] group: DrainGroup) {
        assert_eq!(DrainGroup::of(&pod("p", flags)), group);
    }

    #[test]
    fn groups_are_ordered() {
        assert!(DrainGroup::Workload < DrainGroup::DaemonSet);
        assert!(DrainGroup::DaemonSet < DrainGroup::CriticalWorkload);
        assert!(DrainGroup::CriticalWorkload < DrainGroup::CriticalDaemonSet);
    }

    fn names(pods: &[&Pod]) -> Vec<String> {
        pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect()
    }

    /// Each case: pods as `name:flags` separated by `;`, then the expected group, pods to evict and
    /// number of remaining pods.
    #[rstest]
    #[case::empty_node("", None, "", 0)]
    #[case::only_skipped_pods(
        "a:mirror;b:tolerate;c:succeeded;d:failed;e:deleting=2026-01-01T00:00:00Z",
        None,
        "",
        0
    )]
    #[case::workloads_first("a:;b:ds;c:critical;d:ds,critical", Some(DrainGroup::Workload), "a", 4)]
    #[case::daemonsets_after_workloads(
        "b:ds;c:critical;d:ds,critical;e:ds",
        Some(DrainGroup::DaemonSet),
        "b,e",
        4
    )]
    #[case::critical_workloads_third("c:critical;d:ds,critical", Some(DrainGroup::CriticalWorkload), "c", 2)]
    #[case::critical_daemonsets_last("d:ds,critical", Some(DrainGroup::CriticalDaemonSet), "d", 1)]
    #[case::terminating_pods_hold_their_group(
        "a:deleting=2026-01-01T00:10:20Z;b:ds",
        Some(DrainGroup::Workload),
        "",
        2
    )]
    #[case::terminating_pods_are_not_evicted_again(
        "a:deleting=2026-01-01T00:10:20Z;b:",
        Some(DrainGroup::Workload),
        "b",
        2
    )]
    #[case::stuck_pods_do_not_hold_their_group(
        "a:deleting=2026-01-01T00:00:00Z;b:ds",
        Some(DrainGroup::DaemonSet),
        "b",
        1
    )]
    #[case::tolerating_daemonset_is_ignored(
        "a:ds,tolerate-all;b:critical",
        Some(DrainGroup::CriticalWorkload),
        "b",
        1
    )]
    fn plans(
        #[case] spec: &str,
        #[case] group: Option<DrainGroup>,
        #[case] evict: &str,
        #[case] remaining: usize,
    ) {
        let pods: Vec<Pod> = spec
            .split(';')
            .filter(|s| !s.is_empty())
            .map(|s| {
                let (name, flags) = s.split_once(':').unwrap();
                pod(name, flags)
            })
            .collect();
        let plan = plan(&pods, ts(NOW), None);
        assert_eq!(plan.group, group);
        let expected: Vec<String> = evict.split(',').filter(|s| !s.is_empty()).map(String::from).collect();
        assert_eq!(names(&plan.evict), expected);
        assert_eq!(plan.remaining.len(), remaining);
        assert_eq!(plan.is_drained(), remaining == 0);
        assert!(plan.delete.is_empty());
        assert!(!plan.expired);
    }

    /// Pods are deleted once the deadline is closer than their own grace period, with a grace
    /// period that ends at the deadline.
    #[rstest]
    #[case::far_from_deadline("grace=30", "2026-01-01T01:00:00Z", None)]
    #[case::default_grace_not_reached("", "2026-01-01T00:10:31Z", None)]
    #[case::default_grace_reached("", "2026-01-01T00:10:30Z", Some(30))]
    #[case::own_grace_reached("grace=600", "2026-01-01T00:15:00Z", Some(300))]
    #[case::zero_grace("grace=0", "2026-01-01T00:10:01Z", None)]
    #[case::one_second_left("grace=1", "2026-01-01T00:10:01Z", Some(1))]
    #[case::already_terminating_in_time(
        "grace=600,deleting=2026-01-01T00:12:00Z",
        "2026-01-01T00:15:00Z",
        None
    )]
    #[case::terminating_too_late(
        "grace=3600,deleting=2026-01-01T01:00:00Z",
        "2026-01-01T00:15:00Z",
        Some(300)
    )]
    #[case::daemonset_too("ds,grace=600", "2026-01-01T00:15:00Z", Some(300))]
    #[case::tolerating_pods_are_left_alone("tolerate,grace=600", "2026-01-01T00:15:00Z", None)]
    fn expiring_pods(#[case] flags: &str, #[case] deadline: &str, #[case] grace: Option<i64>) {
        let pods = [pod("p", flags)];
        let plan = plan(&pods, ts(NOW), Some(ts(deadline)));
        let deleted: Vec<i64> = plan.delete.iter().map(|(_, g)| *g).collect();
        assert_eq!(deleted, grace.into_iter().collect::<Vec<_>>());
        if grace.is_some() {
            assert!(plan.evict.is_empty(), "deleted pods are not evicted as well");
        }
        assert!(!plan.expired);
    }

    #[test]
    fn deleting_covers_every_group_while_eviction_follows_the_order() {
        let pods = [pod("a", "grace=600"), pod("b", "ds,critical,grace=600"), pod("c", "grace=5")];
        let plan = plan(&pods, ts(NOW), Some(ts("2026-01-01T00:12:00Z")));
        assert_eq!(names(&plan.delete.iter().map(|(p, _)| *p).collect::<Vec<_>>()), ["a", "b"]);
        assert_eq!(plan.delete[0].1, 120);
        assert_eq!(names(&plan.evict), ["c"]);
    }

    #[test]
    fn do_not_disrupt_pods_are_not_evicted_and_wait_for_the_deadline() {
        // "true", and a duration not elapsed yet (the pod started at 00:00, it is 00:10): both stay;
        // an elapsed one is evicted like any pod. A protected pod does not hold up the next group.
        let pods =
            [pod("forever", "dnd=true"), pod("hour", "dnd=1h"), pod("done", "dnd=5m"), pod("ds", "ds")];
        let p = plan(&pods, ts(NOW), None);
        assert_eq!(names(&p.protected), ["forever", "hour"]);
        assert_eq!(names(&p.evict), ["done"]);
        assert_eq!(p.remaining.len(), 4);
        assert!(!p.is_drained());
        let only_protected = [pod("forever", "dnd=true"), pod("ds", "ds")];
        let p = plan(&only_protected, ts(NOW), None);
        assert_eq!(names(&p.evict), ["ds"], "the DaemonSet group goes on");
        // With a termination deadline, they are deleted once it is their own grace period away.
        let p = plan(&only_protected[..1], ts(NOW), Some(ts("2026-01-01T00:20:00Z")));
        assert!(p.delete.is_empty() && p.evict.is_empty());
        let p = plan(&only_protected[..1], ts(NOW), Some(ts("2026-01-01T00:10:20Z")));
        assert_eq!(p.delete.iter().map(|(_, g)| *g).collect::<Vec<_>>(), [20]);
    }

    #[test]
    fn past_the_deadline_pods_are_deleted_with_a_grace_period_and_waited_for() {
        let deadline = Some(ts("2026-01-01T00:10:00Z"));
        let pods = [pod("a", ""), pod("b", "ds")];
        let p = plan(&pods, ts(NOW), deadline);
        assert!(p.expired);
        assert!(!p.is_drained(), "the instance waits for the pods deleted at the deadline");
        // What is left is deleted with a grace period of one second (never 0), never evicted.
        assert_eq!(
            p.delete
                .iter()
                .map(|(p, g)| (p.metadata.name.clone().unwrap_or_default(), *g))
                .collect::<Vec<_>>(),
            [("a".into(), 1), ("b".into(), 1)]
        );
        assert!(p.evict.is_empty());
        assert_eq!(p.remaining.len(), 2);
        // Deleted: terminating until a second from now; the drain waits for that second.
        let deleting = format!("deleting={}", ts(NOW).checked_add(SignedDuration::from_secs(1)).unwrap());
        let pods = [pod("a", &deleting), pod("b", &format!("ds,{deleting}"))];
        let p = plan(&pods, ts(NOW), deadline);
        assert!(p.delete.is_empty(), "not deleted again");
        assert!(!p.is_drained());
        let later = ts(NOW).checked_add(SignedDuration::from_secs(1)).unwrap();
        assert!(plan(&pods, later, deadline).is_drained(), "their grace period is over");
        // A pod terminating with a longer grace period than is left is shortened.
        let slow = format!("deleting={}", ts(NOW).checked_add(SignedDuration::from_secs(600)).unwrap());
        let pods = [pod("c", &slow)];
        let p = plan(&pods, ts(NOW), deadline);
        assert_eq!(p.delete.iter().map(|(_, g)| *g).collect::<Vec<_>>(), [1]);
        assert!(!p.is_drained());
    }

    fn claim(tgp: Option<&str>, annotation: Option<&str>) -> NodeClaim {
        let mut claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodeClaim",
            "metadata": {"name": "c"},
            "spec": {"requirements": [], "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}},
        }))
        .unwrap();
        claim.spec.termination_grace_period = tgp.map(Into::into);
        if let Some(a) = annotation {
            claim
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP.into(), a.into());
        }
        claim
    }

    #[rstest]
    #[case::no_claim(None, Some(NOW), Ok(None))]
    #[case::no_grace_period(Some(claim(None, None)), Some(NOW), Ok(None))]
    #[case::not_deleted(Some(claim(Some("1h"), None)), None, Ok(None))]
    #[case::hours(Some(claim(Some("48h"), None)), Some(NOW), Ok(Some("2026-01-03T00:10:00Z")))]
    #[case::mixed(Some(claim(Some("1h30m"), None)), Some(NOW), Ok(Some("2026-01-01T01:40:00Z")))]
    #[case::annotation_wins(
        Some(claim(Some("48h"), Some("2026-01-01T00:30:00Z"))),
        Some(NOW),
        Ok(Some("2026-01-01T00:30:00Z"))
    )]
    #[case::annotation_without_grace_period(
        Some(claim(None, Some("2026-01-01T00:30:00Z"))),
        None,
        Ok(Some("2026-01-01T00:30:00Z"))
    )]
    #[case::bad_duration(Some(claim(Some("2d"), None)), Some(NOW), Err(()))]
    #[case::bad_annotation(Some(claim(None, Some("soon"))), Some(NOW), Err(()))]
    fn deadlines(
        #[case] claim: Option<NodeClaim>,
        #[case] deleted: Option<&str>,
        #[case] expected: Result<Option<&str>, ()>,
    ) {
        let got = termination_deadline(deleted.map(ts), claim.as_ref());
        match expected {
            Ok(e) => assert_eq!(got, Ok(e.map(ts))),
            Err(()) => assert!(got.is_err(), "{got:?}"),
        }
    }

    fn attachment(name: &str, node: &str, pv: Option<&str>) -> VolumeAttachment {
        VolumeAttachment {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: VolumeAttachmentSpec {
                attacher: "ebs.csi.aws.com".into(),
                node_name: node.into(),
                source: VolumeAttachmentSource {
                    persistent_volume_name: pv.map(Into::into),
                    ..Default::default()
                },
            },
            status: None,
        }
    }

    #[test]
    fn volume_attachments_of_undrained_pods_are_ignored() {
        let attachments = [
            attachment("mine", "n1", Some("pv-1")),
            attachment("daemon", "n1", Some("pv-2")),
            attachment("inline", "n1", None),
            attachment("other-node", "n2", Some("pv-3")),
        ];
        let ignored = BTreeSet::from(["pv-2".to_string()]);
        assert_eq!(pending_volume_attachments(&attachments, "n1", &ignored), ["mine", "inline"]);
        assert!(pending_volume_attachments(&attachments, "n3", &ignored).is_empty());
    }

    #[test]
    fn claims_of_pods_that_stay() {
        let pods = [
            pod("evicted", "pvc=a"),
            pod("tolerating", "tolerate,pvc=b"),
            pod("mirror", "mirror,pvc=c"),
            pod("done", "succeeded,tolerate,pvc=d"),
            pod("stuck", "deleting=2026-01-01T00:00:00Z,pvc=e"),
        ];
        let claims: Vec<String> =
            claims_of_undrained_pods(&pods, ts(NOW)).into_iter().map(|(_, c)| c).collect();
        assert_eq!(claims, ["b", "c", "e"]);
    }
}
