//! What a pod is, for the decisions: pending for Karpenter, finished, terminating, owned by a
//! DaemonSet or a Node, reschedulable elsewhere, critical. The one place these questions are
//! answered.

use crate::apis::pod::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::apis::labels::{
    ANNOTATION_DO_NOT_DISRUPT, ANNOTATION_MIRROR_POD, PRIORITY_CLASS_SYSTEM_CLUSTER_CRITICAL,
    PRIORITY_CLASS_SYSTEM_NODE_CRITICAL, TAINT_DISRUPTED,
};
use crate::apis::{Taint, TaintEffect};
use crate::scheduling::taints::tolerates;
use crate::util::parse_duration;

/// `namespace/name` of a pod.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The node the pod is bound to.
pub fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty())
}

/// Whether the pod has finished for good (phase `Succeeded` or `Failed`): it holds no resources.
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

/// Whether the pod is being deleted.
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// Whether the pod is neither finished nor being deleted.
pub fn is_active(pod: &Pod) -> bool {
    !is_terminal(pod) && !is_terminating(pod)
}

/// Whether a DaemonSet (of `apps`) owns the pod.
pub fn is_owned_by_daemonset(pod: &Pod) -> bool {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.kind == "DaemonSet" && r.api_version.starts_with("apps/"))
}

/// Whether a StatefulSet owns the pod.
pub fn is_owned_by_statefulset(pod: &Pod) -> bool {
    pod.metadata.owner_references.iter().flatten().any(|r| r.kind == "StatefulSet")
}

/// Whether the pod is the API server's mirror of a static pod: it cannot be evicted or placed
/// elsewhere, it goes away with its kubelet.
pub fn is_mirror(pod: &Pod) -> bool {
    let annotated = pod.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_MIRROR_POD));
    annotated || pod.metadata.owner_references.iter().flatten().any(|r| r.kind == "Node")
}

/// Whether the pod runs with the `system-cluster-critical` or `system-node-critical` priority
/// class.
pub fn is_critical(pod: &Pod) -> bool {
    matches!(
        pod.spec.as_ref().and_then(|s| s.priority_class_name.as_deref()),
        Some(PRIORITY_CLASS_SYSTEM_CLUSTER_CRITICAL | PRIORITY_CLASS_SYSTEM_NODE_CRITICAL)
    )
}

/// Whether the pod tolerates the `karpenter.sh/disrupted:NoSchedule` taint: it could land right
/// back on a disrupted node, so it is neither drained nor counted as displaced.
pub fn tolerates_disrupted_taint(pod: &Pod) -> bool {
    let taint = Taint::new(TAINT_DISRUPTED, TaintEffect::NoSchedule);
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|tolerations| tolerations.iter().any(|t| tolerates(t, &taint)))
}

/// Whether Karpenter should find capacity for the pod: the kube-scheduler marked it
/// unschedulable, it is not bound, not terminating, not finished, and no DaemonSet or Node owns
/// it.
pub fn is_provisionable(pod: &Pod) -> bool {
    if is_terminating(pod) || is_terminal(pod) || node_name(pod).is_some() || pod.spec.is_none() {
        return false;
    }
    if is_owned_by_daemonset(pod) || is_mirror(pod) {
        return false;
    }
    pod.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten().any(|c| {
        c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
    })
}

/// What a pod's `karpenter.sh/do-not-disrupt` annotation says at a given time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DoNotDisrupt {
    /// No annotation, or a grace period that has elapsed.
    No,
    /// The pod must not be disrupted: `"true"` (for ever, `until` is `None`), or a duration from
    /// the pod's start that has not elapsed (`until` the end of it; `None` while the pod has not
    /// started).
    Active {
        /// When the protection ends, when it ends.
        until: Option<Timestamp>,
    },
    /// The value is neither `"true"` nor a positive duration: it is ignored.
    Invalid(String),
}

impl DoNotDisrupt {
    /// Whether the pod is protected now.
    pub fn is_active(&self) -> bool {
        matches!(self, DoNotDisrupt::Active { .. })
    }
}

/// The pod's `karpenter.sh/do-not-disrupt` annotation at `now`: `"true"`, or a duration (`1h`,
/// `90m30s`) counted from the pod's start, as upstream reads it.
pub fn do_not_disrupt(pod: &Pod, now: Timestamp) -> DoNotDisrupt {
    let Some(value) = pod.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_DO_NOT_DISRUPT)) else {
        return DoNotDisrupt::No;
    };
    if value == "true" {
        return DoNotDisrupt::Active { until: None };
    }
    let period = match parse_duration(value) {
        Ok(d) if !d.is_zero() => d,
        Ok(_) => return DoNotDisrupt::Invalid(format!("{value:?} is not a positive duration")),
        Err(e) => return DoNotDisrupt::Invalid(e),
    };
    let Some(start) = pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0) else {
        return DoNotDisrupt::Active { until: None };
    };
    let until = SignedDuration::try_from(period).ok().and_then(|d| start.checked_add(d).ok());
    match until {
        Some(until) if now >= until => DoNotDisrupt::No,
        until => DoNotDisrupt::Active { until },
    }
}

/// Whether the pod needs a place elsewhere when its node goes: active (or a terminating
/// StatefulSet pod, whose replacement keeps its name and waits for it), and neither a DaemonSet
/// pod nor a mirror pod, which go with the node.
pub fn is_reschedulable(pod: &Pod) -> bool {
    (is_active(pod) || (is_terminating(pod) && is_owned_by_statefulset(pod)))
        && !is_owned_by_daemonset(pod)
        && !is_mirror(pod)
}

/// Whether draining its node evicts the pod (so that its PodDisruptionBudgets matter): active,
/// not a mirror pod, not tolerating the disrupted taint and not protected by
/// `karpenter.sh/do-not-disrupt` at `now` (such a pod waits for the node's termination grace
/// period instead).
pub fn is_evictable(pod: &Pod, now: Timestamp) -> bool {
    is_active(pod)
        && !is_mirror(pod)
        && !tolerates_disrupted_taint(pod)
        && !do_not_disrupt(pod, now).is_active()
}

#[cfg(test)]
mod tests {
    use crate::apis::pod::{PodSpec, PodStatus};
    use k8s_openapi::api::core::v1::{PodCondition, Toleration};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use rstest::rstest;

    use super::*;

    fn pod(flags: &str) -> Pod {
        let mut pod = Pod {
            metadata: Default::default(),
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some("Unschedulable".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        };
        let owner = |kind: &str, api_version: &str| OwnerReference {
            kind: kind.into(),
            api_version: api_version.into(),
            name: "o".into(),
            uid: "u".into(),
            ..Default::default()
        };
        for flag in flags.split(',').filter(|f| !f.is_empty()) {
            match flag {
                "bound" => pod.spec.as_mut().unwrap().node_name = Some("n".into()),
                "running" => pod.status.as_mut().unwrap().phase = Some("Running".into()),
                "succeeded" => pod.status.as_mut().unwrap().phase = Some("Succeeded".into()),
                "deleting" => {
                    pod.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
                }
                "ds" => {
                    pod.metadata.owner_references.get_or_insert_default().push(owner("DaemonSet", "apps/v1"))
                }
                "sts" => pod
                    .metadata
                    .owner_references
                    .get_or_insert_default()
                    .push(owner("StatefulSet", "apps/v1")),
                "mirror" => pod.metadata.owner_references.get_or_insert_default().push(owner("Node", "v1")),
                "gated" => {
                    pod.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].reason =
                        Some("SchedulingGated".into())
                }
                "unseen" => pod.status = None,
                "tolerant" => {
                    pod.spec.as_mut().unwrap().tolerations =
                        Some(vec![Toleration { operator: Some("Exists".into()), ..Default::default() }])
                }
                dnd if dnd.starts_with("dnd=") => {
                    pod.metadata.annotations = Some(
                        [(ANNOTATION_DO_NOT_DISRUPT.to_string(), dnd.trim_start_matches("dnd=").to_string())]
                            .into(),
                    );
                    pod.status.as_mut().unwrap().start_time =
                        Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
                }
                other => panic!("unknown flag {other}"),
            }
        }
        pod
    }

    #[rstest]
    #[case::pending("", true)]
    #[case::bound("bound", false)]
    #[case::daemonset("ds", false)]
    #[case::mirror("mirror", false)]
    #[case::gated("gated", false)]
    #[case::deleting("deleting", false)]
    #[case::finished("succeeded", false)]
    #[case::not_yet_seen_by_the_scheduler("unseen", false)]
    fn provisionable(#[case] flags: &str, #[case] expected: bool) {
        assert_eq!(is_provisionable(&pod(flags)), expected);
    }

    #[rstest]
    #[case::running("bound,running", true)]
    #[case::finished("bound,succeeded", false)]
    #[case::terminating("bound,running,deleting", false)]
    #[case::terminating_statefulset("bound,running,deleting,sts", true)]
    #[case::daemonset("bound,running,ds", false)]
    #[case::mirror("bound,running,mirror", false)]
    fn reschedulable(#[case] flags: &str, #[case] expected: bool) {
        assert_eq!(is_reschedulable(&pod(flags)), expected);
    }

    #[rstest]
    #[case::running("bound,running", true)]
    #[case::daemonset("bound,running,ds", true)]
    #[case::tolerates_the_disrupted_taint("bound,running,tolerant", false)]
    #[case::mirror("bound,running,mirror", false)]
    #[case::terminating("bound,running,deleting", false)]
    #[case::do_not_disrupt("bound,running,dnd=true", false)]
    #[case::do_not_disrupt_elapsed("bound,running,dnd=5m", true)]
    fn evictable(#[case] flags: &str, #[case] expected: bool) {
        assert_eq!(is_evictable(&pod(flags), "2026-01-01T01:00:00Z".parse().unwrap()), expected);
    }

    fn annotated(value: &str, started: Option<&str>) -> Pod {
        let mut p = pod("bound,running");
        p.metadata.annotations = Some([(ANNOTATION_DO_NOT_DISRUPT.to_string(), value.to_string())].into());
        p.status.as_mut().unwrap().start_time = started.map(|s| Time(s.parse().unwrap()));
        p
    }

    #[rstest]
    #[case::forever("true", Some("2026-01-01T00:00:00Z"), DoNotDisrupt::Active { until: None })]
    #[case::within("1h", Some("2026-01-01T00:00:00Z"), DoNotDisrupt::Active { until: Some("2026-01-01T01:00:00Z".parse().unwrap()) })]
    #[case::mixed_units("30m30s", Some("2026-01-01T00:00:00Z"), DoNotDisrupt::Active { until: Some("2026-01-01T00:30:30Z".parse().unwrap()) })]
    #[case::elapsed("10m", Some("2026-01-01T00:00:00Z"), DoNotDisrupt::No)]
    #[case::not_started("10m", None, DoNotDisrupt::Active { until: None })]
    #[case::false_is_not_a_duration("false", None, DoNotDisrupt::Invalid(String::new()))]
    #[case::zero("0s", None, DoNotDisrupt::Invalid(String::new()))]
    #[case::garbage("soon", None, DoNotDisrupt::Invalid(String::new()))]
    fn do_not_disrupt_values(
        #[case] value: &str,
        #[case] started: Option<&str>,
        #[case] expected: DoNotDisrupt,
    ) {
        let now: Timestamp = "2026-01-01T00:20:00Z".parse().unwrap();
        let got = do_not_disrupt(&annotated(value, started), now);
        match expected {
            DoNotDisrupt::Invalid(_) => assert!(matches!(got, DoNotDisrupt::Invalid(_)), "{got:?}"),
            other => assert_eq!(got, other),
        }
        assert_eq!(do_not_disrupt(&pod("bound,running"), now), DoNotDisrupt::No);
    }
}
