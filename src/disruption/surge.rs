//! Surge for workloads whose PodDisruptionBudget allows no eviction (pure).
//!
//! A Deployment (or a ReplicaSet of its own) with one replica under a PodDisruptionBudget of
//! `minAvailable: 1` can never be evicted: its node is never consolidated, drifted or expired.
//! With the opt-in [`ANNOTATION_SURGE_ON_DISRUPTION`] on its pods (set in the pod template), its
//! node is a candidate like any other, and when the drain's eviction is refused the workload is
//! surged: its replicas are raised by one, the new pod starts elsewhere (the node is tainted),
//! and once it is Ready the budget allows the eviction the drain keeps asking for. When the old
//! pod is gone, the replicas are restored.
//!
//! The change is recorded on the workload itself, in the same write that raises the replicas
//! ([`SurgeRecord`] in [`ANNOTATION_SURGE`], and [`LABEL_SURGING`] to find it), so a controller
//! that restarts in the middle finds and finishes it; [`next_step`] decides what to do with one.
//! StatefulSets and other kinds are never surged.

use crate::apis::pod::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

/// The pod annotation (set in the workload's pod template) that opts a workload in.
pub const ANNOTATION_SURGE_ON_DISRUPTION: &str = "karpenter-rs.dev/surge-on-disruption";
/// The workload annotation that records a surge under way.
pub const ANNOTATION_SURGE: &str = "karpenter-rs.dev/surge";
/// The workload label that finds the surges under way.
pub const LABEL_SURGING: &str = "karpenter-rs.dev/surging";
/// The workload annotation naming the pod (by UID) whose surge timed out: it is not surged again.
pub const ANNOTATION_SURGE_GAVE_UP: &str = "karpenter-rs.dev/surge-gave-up";
/// How long the new pod may take to be Ready (and the old one to leave) before the surge is
/// given up and the replicas restored.
pub const SURGE_TIMEOUT: SignedDuration = SignedDuration::from_mins(10);

/// Whether `pod` opted in and belongs to a ReplicaSet (its own, or a Deployment's).
pub fn surgeable(pod: &Pod) -> bool {
    let opted_in = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_SURGE_ON_DISRUPTION))
        .is_some_and(|v| v == "true");
    opted_in && replica_set_of(pod).is_some()
}

/// Whether `budget` allows an eviction once its workload has one more healthy pod, as the
/// disruption controller will compute it: only a `minAvailable` budget can (a `maxUnavailable`
/// one expects one more pod and asks for one more healthy pod), when its healthy pods are at the
/// minimum (not below it), and only from a status that is current.
pub fn surge_unblocks(budget: &PodDisruptionBudget) -> bool {
    let (Some(spec), Some(status)) = (&budget.spec, &budget.status) else { return false };
    if status.observed_generation != budget.metadata.generation {
        return false;
    }
    let expected = i64::from(status.expected_pods) + 1;
    let desired = match &spec.min_available {
        Some(IntOrString::Int(n)) => i64::from(*n),
        Some(IntOrString::String(text)) => {
            let Some(percent) = text.trim().strip_suffix('%').and_then(|p| p.trim().parse::<i64>().ok())
            else {
                return false;
            };
            // Rounded up, as the disruption controller scales it.
            (percent * expected + 99) / 100
        }
        None => return false,
    };
    i64::from(status.current_healthy) + 1 - desired >= 1
}

/// The name of the ReplicaSet that controls `pod`, if one does.
pub fn replica_set_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "ReplicaSet" && o.api_version == "apps/v1")
        .map(|o| o.name.as_str())
}

/// A surge under way, as recorded on the workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SurgeRecord {
    /// The replicas before the surge, restored after it.
    pub replicas: i32,
    /// The pod that could not be evicted.
    pub pod: String,
    /// Its UID: a new pod of the same name is another pod.
    pub pod_uid: String,
    /// The node it was on.
    pub node: String,
    /// When the surge began (RFC 3339).
    pub started: String,
}

impl SurgeRecord {
    /// The annotation's text.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the annotation's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let record: SurgeRecord = serde_json::from_str(text).map_err(|e| e.to_string())?;
        record.started.parse::<Timestamp>().map_err(|e| format!("started: {e}"))?;
        if record.replicas < 0 {
            return Err(format!("replicas: {} is negative", record.replicas));
        }
        Ok(record)
    }
}

/// Where the pod a surge is for stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Still there, not being deleted.
    Present,
    /// Gone, being deleted, or replaced by another pod of the same name.
    Left,
}

/// What to do with a surge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The old pod is still there and time remains.
    Wait,
    /// End it: restore `replicas` (`None` when someone else changed them meanwhile: they are
    /// left as they are), remove the record.
    Finish {
        /// The replicas to write back.
        replicas: Option<i32>,
        /// Why it ends.
        reason: FinishReason,
    },
}

/// Why a surge ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// The old pod left.
    Done,
    /// The old pod was still there after [`SURGE_TIMEOUT`].
    TimedOut,
}

/// What to do with the surge `record` of a workload that now has `replicas`, `ready` of them
/// Ready, whose old pod is `pod`, at `now`. Past [`SURGE_TIMEOUT`] a surge whose new pod is Ready
/// waits on (the drain's next eviction goes through; restoring the replicas now would delete the
/// new pod), up to twice the timeout.
pub fn next_step(record: &SurgeRecord, replicas: i32, ready: i32, pod: PodState, now: Timestamp) -> Step {
    let elapsed = record.started.parse::<Timestamp>().map(|started| now.duration_since(started));
    let new_pod_ready = ready > record.replicas;
    let timed_out =
        elapsed.as_ref().is_ok_and(|e| *e >= SURGE_TIMEOUT * 2 || (*e >= SURGE_TIMEOUT && !new_pod_ready));
    let reason = match (pod, timed_out) {
        (PodState::Left, _) => FinishReason::Done,
        (PodState::Present, true) => FinishReason::TimedOut,
        (PodState::Present, false) => return Step::Wait,
    };
    let restore = (replicas == record.replicas + 1).then_some(record.replicas);
    Step::Finish { replicas: restore, reason }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(annotation: Option<&str>, owner: (&str, &str)) -> Pod {
        let mut meta = json!({"name": "solo-abc", "namespace": "ns",
            "ownerReferences": [{"apiVersion": owner.1, "kind": owner.0, "name": "solo-rs", "uid": "u", "controller": true}]});
        if let Some(v) = annotation {
            meta["annotations"] = json!({ANNOTATION_SURGE_ON_DISRUPTION: v});
        }
        serde_json::from_value(json!({"metadata": meta})).unwrap()
    }

    #[rstest::rstest]
    #[case::a_replica_set_that_opted_in(Some("true"), ("ReplicaSet", "apps/v1"), true)]
    #[case::not_opted_in(None, ("ReplicaSet", "apps/v1"), false)]
    #[case::opted_out(Some("false"), ("ReplicaSet", "apps/v1"), false)]
    #[case::never_a_stateful_set(Some("true"), ("StatefulSet", "apps/v1"), false)]
    #[case::never_a_job(Some("true"), ("Job", "batch/v1"), false)]
    fn only_opted_in_replica_sets_surge(
        #[case] annotation: Option<&str>,
        #[case] owner: (&str, &str),
        #[case] expected: bool,
    ) {
        assert_eq!(surgeable(&pod(annotation, owner)), expected);
    }

    fn record() -> SurgeRecord {
        SurgeRecord {
            replicas: 1,
            pod: "solo-abc".into(),
            pod_uid: "u1".into(),
            node: "n1".into(),
            started: "2026-11-27T12:00:00Z".into(),
        }
    }

    #[rstest::rstest]
    #[case::waits_for_the_old_pod(PodState::Present, 2, 1, "2026-11-27T12:05:00Z", Step::Wait)]
    #[case::restores_once_it_left(PodState::Left, 2, 2, "2026-11-27T12:01:00Z",
        Step::Finish { replicas: Some(1), reason: FinishReason::Done })]
    #[case::leaves_replicas_someone_changed(PodState::Left, 5, 5, "2026-11-27T12:01:00Z",
        Step::Finish { replicas: None, reason: FinishReason::Done })]
    #[case::gives_up_after_the_timeout(PodState::Present, 2, 1, "2026-11-27T12:10:00Z",
        Step::Finish { replicas: Some(1), reason: FinishReason::TimedOut })]
    #[case::waits_on_past_it_while_the_new_pod_is_ready(
        PodState::Present,
        2,
        2,
        "2026-11-27T12:15:00Z",
        Step::Wait
    )]
    #[case::but_not_past_twice_it(PodState::Present, 2, 2, "2026-11-27T12:20:00Z",
        Step::Finish { replicas: Some(1), reason: FinishReason::TimedOut })]
    fn a_surge_ends_when_the_old_pod_left_or_time_is_up(
        #[case] pod: PodState,
        #[case] replicas: i32,
        #[case] ready: i32,
        #[case] now: &str,
        #[case] expected: Step,
    ) {
        assert_eq!(next_step(&record(), replicas, ready, pod, now.parse().unwrap()), expected);
    }

    fn budget(spec: serde_json::Value, healthy: i32, expected: i32, observed: i64) -> PodDisruptionBudget {
        serde_json::from_value(json!({"metadata": {"name": "b", "generation": 2}, "spec": spec,
            "status": {"currentHealthy": healthy, "desiredHealthy": 0, "disruptionsAllowed": 0,
                "expectedPods": expected, "observedGeneration": observed}}))
        .unwrap()
    }

    #[rstest::rstest]
    #[case::min_available_one_of_one(json!({"minAvailable": 1}), 1, 1, true)]
    #[case::min_available_two_of_one(json!({"minAvailable": 2}), 1, 1, false)]
    #[case::min_available_below_the_minimum(json!({"minAvailable": 3}), 2, 3, false)]
    #[case::min_available_half(json!({"minAvailable": "50%"}), 1, 1, true)]
    // 80% of 4 rounds up to 4: one more healthy pod of four still allows nothing.
    #[case::min_available_percent_rounding(json!({"minAvailable": "80%"}), 3, 3, false)]
    #[case::min_available_all(json!({"minAvailable": "100%"}), 1, 1, false)]
    #[case::max_unavailable_zero(json!({"maxUnavailable": 0}), 1, 1, false)]
    #[case::max_unavailable_one(json!({"maxUnavailable": 1}), 1, 2, false)]
    fn a_surge_unblocks_only_a_min_available_budget_at_its_minimum(
        #[case] spec: serde_json::Value,
        #[case] healthy: i32,
        #[case] expected: i32,
        #[case] unblocks: bool,
    ) {
        assert_eq!(surge_unblocks(&budget(spec.clone(), healthy, expected, 2)), unblocks);
        if unblocks {
            assert!(!surge_unblocks(&budget(spec, healthy, expected, 1)), "not from a stale status");
        }
    }

    #[test]
    fn the_record_round_trips_and_a_bad_one_says_why() {
        let r = record();
        assert_eq!(SurgeRecord::parse(&r.to_annotation()).unwrap(), r);
        assert!(r.to_annotation().contains("\"podUid\":\"u1\""));
        assert!(SurgeRecord::parse("{}").unwrap_err().contains("missing field"));
        let bad = SurgeRecord { started: "yesterday".into(), ..record() };
        assert!(SurgeRecord::parse(&bad.to_annotation()).unwrap_err().starts_with("started:"));
    }
}
