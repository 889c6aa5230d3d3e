//! The lifecycle's decisions, without a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use rstest::rstest;
use serde_json::json;

use super::logic::*;
use crate::apis::common::{ConditionUpdate, condition, set_condition};
use crate::apis::labels::*;
use crate::apis::nodeclaim::conditions::{INITIALIZED, LAUNCHED, READY, REGISTERED};
use crate::apis::{Condition, ConditionStatus, NodeClaim};
use crate::cloudprovider::Instance;
use crate::controllers::events::reasons as event_reasons;

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

const T0: &str = "2026-01-01T00:00:00Z";

fn claim() -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "name": "default-abcde",
            "uid": "uid-1",
            "generation": 1,
            "creationTimestamp": T0,
            "labels": { "karpenter.sh/nodepool": "default", "team": "a" },
            "annotations": { "karpenter.sh/nodepool-hash": "123" },
        },
        "spec": {
            "nodeClassRef": { "group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default" },
            "requirements": [
                { "key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"] },
                { "key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "m5.xlarge"] },
                { "key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"] },
            ],
            "taints": [{ "key": "dedicated", "value": "a", "effect": "NoSchedule" }],
            "startupTaints": [{ "key": "agent/not-ready", "effect": "NoSchedule" }],
            "resources": { "requests": { "cpu": "1", "nvidia.com/gpu": "1" } },
        },
        "status": { "providerID": "aws:///us-west-2a/i-0123" },
    }))
    .unwrap()
}

fn node(ready: bool, taints: serde_json::Value, allocatable: serde_json::Value) -> Node {
    serde_json::from_value(json!({
        "metadata": { "name": "ip-10-0-0-1", "labels": { "kubernetes.io/hostname": "ip-10-0-0-1" } },
        "spec": { "providerID": "aws:///us-west-2a/i-0123", "taints": taints },
        "status": {
            "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" } }],
            "allocatable": allocatable,
        },
    }))
    .unwrap()
}

fn with_conditions(mut claim: NodeClaim, conditions: &[(&str, ConditionStatus, &str)]) -> NodeClaim {
    let status = claim.status.get_or_insert_with(Default::default);
    for (type_, s, time) in conditions {
        let update = ConditionUpdate { status: *s, reason: "R".into(), message: String::new() };
        set_condition(&mut status.conditions, type_, update, Some(1), at(time));
    }
    claim
}

#[test]
fn a_new_condition_is_recorded_with_reason_message_time_and_generation() {
    let mut conditions = Vec::new();
    assert!(set_condition(
        &mut conditions,
        LAUNCHED,
        ConditionUpdate::false_("LaunchFailed", "boom"),
        Some(3),
        at("2026-01-01T00:00:00.75Z")
    ));
    assert_eq!(
        conditions,
        vec![Condition {
            type_: LAUNCHED.into(),
            status: ConditionStatus::False,
            observed_generation: Some(3),
            last_transition_time: T0.into(),
            reason: "LaunchFailed".into(),
            message: "boom".into(),
        }]
    );
}

#[rstest]
#[case::same_everything(ConditionStatus::True, "A", "", false, T0)]
#[case::new_message(ConditionStatus::True, "A", "m", true, T0)]
#[case::new_reason(ConditionStatus::True, "B", "", true, T0)]
#[case::new_status(ConditionStatus::False, "A", "", true, "2026-01-01T00:10:00Z")]
fn transition_time_moves_only_with_the_status(
    #[case] status: ConditionStatus,
    #[case] reason: &str,
    #[case] message: &str,
    #[case] changed: bool,
    #[case] transition: &str,
) {
    let mut conditions = Vec::new();
    set_condition(&mut conditions, READY, ConditionUpdate::true_("A"), Some(1), at(T0));
    let update = ConditionUpdate { status, reason: reason.into(), message: message.into() };
    assert_eq!(set_condition(&mut conditions, READY, update, Some(1), at("2026-01-01T00:10:00Z")), changed);
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].last_transition_time, transition);
}

#[test]
fn missing_dependents_start_unknown_and_existing_ones_are_kept() {
    let mut claim = with_conditions(claim(), &[(LAUNCHED, ConditionStatus::True, T0)]);
    let conditions = &mut claim.status.as_mut().unwrap().conditions;
    initialize_conditions(conditions, Some(1), at("2026-01-01T00:01:00Z"));
    let status = |t: &str| condition(conditions, t).map(|c| (c.status, c.reason.clone()));
    assert_eq!(status(LAUNCHED), Some((ConditionStatus::True, "R".into())));
    for t in [REGISTERED, INITIALIZED] {
        assert_eq!(status(t), Some((ConditionStatus::Unknown, reasons::AWAITING_RECONCILIATION.into())));
    }
    assert_eq!(status(READY), None);
}

use ConditionStatus::{False as F, True as T, Unknown as U};

#[rstest]
#[case::all_true(&[T, T, T], T, "")]
#[case::none_yet(&[], U, "Launched=Unknown, Registered=Unknown, Initialized=Unknown")]
#[case::waiting_for_node(&[T, U, U], U, "Registered=Unknown, Initialized=Unknown")]
#[case::launch_failed(&[F, U, U], F, "Launched=False, Registered=Unknown, Initialized=Unknown")]
#[case::not_initialized(&[T, T, U], U, "Initialized=Unknown")]
fn ready_follows_its_dependents(
    #[case] dependents: &[ConditionStatus],
    #[case] expected: ConditionStatus,
    #[case] message: &str,
) {
    let conditions: Vec<_> = DEPENDENTS.iter().zip(dependents).map(|(t, s)| (*t, *s, T0)).collect::<Vec<_>>();
    let claim = with_conditions(claim(), &conditions);
    let ready = ready(claim.conditions());
    assert_eq!(ready.status, expected);
    assert_eq!(ready.message, message);
    let reason = match expected {
        T => reasons::READY,
        F => reasons::UNHEALTHY_DEPENDENTS,
        _ => reasons::RECONCILING_DEPENDENTS,
    };
    assert_eq!(ready.reason, reason);
}

#[rstest]
#[case::just_created(&[], "2026-01-01T00:01:00Z", Liveness::Alive(Some(Duration::from_secs(240))))]
#[case::launch_failing_within_ttl(&[(LAUNCHED, F, T0)], "2026-01-01T00:04:59Z", Liveness::Alive(Some(Duration::from_secs(1))))]
#[case::launch_timed_out(&[(LAUNCHED, F, T0)], "2026-01-01T00:05:00Z", expired(event_reasons::LAUNCH_FAILED, "launch_timeout"))]
#[case::clock_behind_creation(&[], "2025-12-31T23:59:00Z", Liveness::Alive(Some(Duration::from_secs(300))))]
#[case::awaiting_node(&[(LAUNCHED, T, "2026-01-01T00:01:00Z")], "2026-01-01T00:11:00Z", Liveness::Alive(Some(Duration::from_secs(300))))]
#[case::registration_timed_out(&[(LAUNCHED, T, "2026-01-01T00:01:00Z"), (REGISTERED, U, T0)], "2026-01-01T00:16:00Z", expired(event_reasons::REGISTRATION_TIMEOUT, "registration_timeout"))]
#[case::registered(&[(LAUNCHED, T, T0), (REGISTERED, T, T0)], "2026-02-01T00:00:00Z", Liveness::Alive(None))]
fn liveness_deadlines(
    #[case] conditions: &[(&str, ConditionStatus, &str)],
    #[case] now: &str,
    #[case] expected: Liveness,
) {
    let claim = with_conditions(claim(), conditions);
    let got = liveness(&claim, at(now));
    match (&got, &expected) {
        (
            Liveness::Expired { reason: a, metric_reason: ma, message },
            Liveness::Expired { reason: b, metric_reason: mb, .. },
        ) => {
            assert_eq!((a, ma), (b, mb));
            assert!(!message.is_empty());
        }
        _ => assert_eq!(got, expected),
    }
}

fn expired(reason: &'static str, metric_reason: &'static str) -> Liveness {
    Liveness::Expired { reason, metric_reason, message: String::new() }
}

#[test]
fn a_claim_without_creation_time_never_expires() {
    let mut claim = claim();
    claim.metadata.creation_timestamp = None;
    assert_eq!(liveness(&claim, at("2030-01-01T00:00:00Z")), Liveness::Alive(None));
}

#[rstest]
#[case::initialized(true, json!([]), json!({"nvidia.com/gpu": "1"}), None)]
#[case::not_ready(false, json!([]), json!({"nvidia.com/gpu": "1"}), Some(reasons::NODE_NOT_READY))]
#[case::startup_taint(true, json!([{"key": "agent/not-ready", "effect": "NoSchedule"}]), json!({"nvidia.com/gpu": "1"}), Some(reasons::STARTUP_TAINTS_EXIST))]
#[case::startup_taint_other_effect(true, json!([{"key": "agent/not-ready", "effect": "NoExecute"}]), json!({"nvidia.com/gpu": "1"}), None)]
#[case::not_ready_taint(true, json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]), json!({"nvidia.com/gpu": "1"}), Some(reasons::KNOWN_EPHEMERAL_TAINTS_EXIST))]
#[case::uninitialized(true, json!([{"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true", "effect": "NoSchedule"}]), json!({"nvidia.com/gpu": "1"}), Some(reasons::KNOWN_EPHEMERAL_TAINTS_EXIST))]
#[case::unregistered(true, json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]), json!({"nvidia.com/gpu": "1"}), Some(reasons::KNOWN_EPHEMERAL_TAINTS_EXIST))]
#[case::other_taints_are_fine(true, json!([{"key": "dedicated", "value": "a", "effect": "NoSchedule"}]), json!({"nvidia.com/gpu": "1"}), None)]
#[case::gpu_missing(true, json!([]), json!({"cpu": "2"}), Some(reasons::RESOURCE_NOT_REGISTERED))]
#[case::gpu_zero(true, json!([]), json!({"nvidia.com/gpu": "0"}), Some(reasons::RESOURCE_NOT_REGISTERED))]
fn initialization_waits_for_ready_taints_and_resources(
    #[case] ready: bool,
    #[case] taints: serde_json::Value,
    #[case] allocatable: serde_json::Value,
    #[case] reason: Option<&str>,
) {
    let got = initialization(&claim(), &node(ready, taints, allocatable));
    assert_eq!(got.as_ref().err().map(|u| u.reason.as_str()), reason, "{got:?}");
    if let Err(update) = got {
        assert_eq!(update.status, ConditionStatus::Unknown);
        assert!(!update.message.is_empty());
    }
}

#[test]
fn requests_of_zero_extended_resources_do_not_block_initialization() {
    let mut claim = claim();
    claim
        .spec
        .resources
        .as_mut()
        .unwrap()
        .requests
        .as_mut()
        .unwrap()
        .insert("nvidia.com/gpu".into(), Quantity("0".into()));
    assert_eq!(initialization(&claim, &node(true, json!([]), json!({}))), Ok(()));
}

#[rstest]
#[case("nvidia.com/gpu", true)]
#[case("vpc.amazonaws.com/pod-eni", true)]
#[case("cpu", false)]
#[case("memory", false)]
#[case("hugepages-2Mi", false)]
#[case("kubernetes.io/batch", false)]
#[case("example.kubernetes.io/x", false)]
fn extended_resources(#[case] name: &str, #[case] extended: bool) {
    assert_eq!(is_extended_resource(name), extended);
}

#[test]
fn registration_syncs_the_claim_onto_its_node() {
    let claim = claim();
    let before = node(
        true,
        json!([
            {"key": "karpenter.sh/unregistered", "effect": "NoExecute"},
            {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
        ]),
        json!({}),
    );
    let after = registered_node(&claim, &before);
    assert_eq!(after.finalizers(), [FINALIZER_TERMINATION.to_string()]);
    let owners = after.owner_references();
    assert_eq!(owners.len(), 1);
    assert_eq!((owners[0].kind.as_str(), owners[0].name.as_str()), ("NodeClaim", "default-abcde"));
    assert_eq!(owners[0].api_version, "karpenter.sh/v1");
    assert_eq!(owners[0].uid, "uid-1");
    assert_eq!(owners[0].block_owner_deletion, Some(true));
    let labels = after.labels();
    assert_eq!(labels.get(LABEL_NODEPOOL).map(String::as_str), Some("default"));
    assert_eq!(labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(labels.get(LABEL_REGISTERED).map(String::as_str), Some("true"));
    assert_eq!(labels.get(LABEL_HOSTNAME).map(String::as_str), Some("ip-10-0-0-1"));
    assert_eq!(after.annotations().get(ANNOTATION_NODEPOOL_HASH).map(String::as_str), Some("123"));
    let taints: Vec<(String, String)> = after
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap()
        .into_iter()
        .map(|t| (t.key, t.effect))
        .collect();
    let pair = |k: &str, e: &str| (k.to_string(), e.to_string());
    assert_eq!(
        taints,
        vec![
            pair("node.kubernetes.io/not-ready", "NoSchedule"),
            pair("dedicated", "NoSchedule"),
            pair("agent/not-ready", "NoSchedule"),
        ]
    );
    // Syncing again changes nothing.
    assert_eq!(registered_node(&claim, &after), after);
}

#[test]
fn a_node_labelled_do_not_sync_taints_keeps_its_own_taints() {
    let claim = claim();
    let mut before =
        node(true, json!([{"key": "karpenter.sh/unregistered", "effect": "NoExecute"}]), json!({}));
    before.labels_mut().insert("karpenter.sh/do-not-sync-taints".into(), "true".into());
    let after = registered_node(&claim, &before);
    assert_eq!(
        after.spec.clone().and_then(|s| s.taints),
        Some(vec![]),
        "neither the claim's taints nor its startup taints"
    );
    assert_eq!(after.labels().get(LABEL_REGISTERED).map(String::as_str), Some("true"), "labels still synced");
    before.labels_mut().insert("karpenter.sh/do-not-sync-taints".into(), "false".into());
    let synced = registered_node(&claim, &before);
    assert_eq!(synced.spec.and_then(|s| s.taints).map(|t| t.len()), Some(2), "any other value syncs");
}

#[test]
fn startup_taints_are_not_put_back_once_registered() {
    let claim = with_conditions(claim(), &[(REGISTERED, T, T0)]);
    let after = registered_node(&claim, &node(true, json!([]), json!({})));
    let keys: Vec<String> =
        after.spec.unwrap().taints.unwrap_or_default().into_iter().map(|t| t.key).collect();
    assert_eq!(keys, ["dedicated"]);
}

#[test]
fn a_node_without_taints_or_owner_is_synced_and_a_claim_without_uid_owns_nothing() {
    let mut claim = claim();
    claim.metadata.uid = None;
    claim.spec.taints.clear();
    claim.spec.startup_taints.clear();
    let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
    let after = registered_node(&claim, &bare);
    assert!(after.owner_references().is_empty());
    assert!(after.spec.is_none_or(|s| s.taints.is_none()));
    assert_eq!(after.metadata.finalizers, Some(vec![FINALIZER_TERMINATION.to_string()]));
}

#[test]
fn a_launched_instance_fills_status_labels_and_annotations() {
    let mut claim = claim();
    claim.labels_mut().insert(LABEL_TOPOLOGY_ZONE.into(), "user-zone".into());
    let quantity = |s: &str| Quantity(s.into());
    let instance = Instance {
        provider_id: "aws:///us-west-2b/i-0456".into(),
        instance_type: "m5.large".into(),
        zone: "us-west-2b".into(),
        capacity_type: "spot".into(),
        image_id: "ami-1".into(),
        node_claim: Some("default-abcde".into()),
        capacity: BTreeMap::from([("cpu".into(), quantity("2"))]),
        allocatable: BTreeMap::from([("cpu".into(), quantity("1930m"))]),
        labels: BTreeMap::from([
            (LABEL_ARCH.into(), "amd64".into()),
            (LABEL_INSTANCE_CPU.into(), "2".into()),
            ("team".into(), "from-instance".into()),
        ]),
        annotations: BTreeMap::from([(ANNOTATION_EC2NODECLASS_HASH.into(), "h".into())]),
        ..Instance::default()
    };
    apply_instance(&mut claim, &instance);
    let labels = claim.labels();
    let label = |k: &str| labels.get(k).map(String::as_str);
    assert_eq!(label(LABEL_INSTANCE_TYPE), Some("m5.large"));
    assert_eq!(label(LABEL_CAPACITY_TYPE), Some("spot"));
    assert_eq!(label(LABEL_TOPOLOGY_ZONE), Some("user-zone"), "the claim's own labels win");
    assert_eq!(label("team"), Some("a"));
    assert_eq!(label(LABEL_INSTANCE_CPU), Some("2"));
    assert_eq!(label(LABEL_INSTANCE_FAMILY), Some("m5"), "single-valued requirements become labels");
    assert_eq!(label(LABEL_ARCH), Some("amd64"));
    assert_eq!(label(LABEL_NODEPOOL), Some("default"));
    assert_eq!(claim.annotations().get(ANNOTATION_EC2NODECLASS_HASH).map(String::as_str), Some("h"));
    assert_eq!(claim.annotations().get(ANNOTATION_NODEPOOL_HASH).map(String::as_str), Some("123"));
    let status = claim.status.as_ref().unwrap();
    assert_eq!(status.provider_id.as_deref(), Some("aws:///us-west-2b/i-0456"));
    assert_eq!(status.image_id.as_deref(), Some("ami-1"));
    assert_eq!(status.capacity.as_ref().unwrap()["cpu"], quantity("2"));
    assert_eq!(status.allocatable.as_ref().unwrap()["cpu"], quantity("1930m"));
}

#[test]
fn nodes_match_claims_by_provider_id() {
    let claim = claim();
    let mut node = node(true, json!([]), json!({}));
    assert!(is_claims_node(&claim, &node));
    node.spec.as_mut().unwrap().provider_id = Some("aws:///us-west-2a/i-other".into());
    assert!(!is_claims_node(&claim, &node));
    let mut unlaunched = claim.clone();
    unlaunched.status = None;
    node.spec.as_mut().unwrap().provider_id = None;
    assert!(!is_claims_node(&unlaunched, &node));
}

#[test]
fn metric_labels() {
    let mut claim = claim();
    claim.labels_mut().insert(LABEL_CAPACITY_TYPE.into(), "spot".into());
    assert_eq!(nodepool(&claim), "default");
    assert_eq!(
        terminated_labels(&claim),
        vec![("nodepool", "default".into()), ("capacity_type", "spot".into()), ("zone", String::new())]
    );
}

#[rstest]
#[case(1, 1)]
#[case(2, 2)]
#[case(4, 8)]
#[case(8, 120)]
#[case(u32::MAX, 120)]
fn retries_back_off(#[case] attempts: u32, #[case] seconds: u64) {
    assert_eq!(super::backoff(attempts), Duration::from_secs(seconds));
}

#[test]
fn conditions_record_whole_seconds() {
    assert_eq!(crate::apis::common::transition_time(at("2026-01-01T00:00:00.999Z")), T0);
    assert_eq!(elapsed(at("2026-01-01T00:01:00Z"), at(T0)), Duration::ZERO);
}

#[rstest]
#[case::no_grace_period(None, Some(T0), None, None)]
#[case::not_deleted(Some("1h"), None, None, None)]
#[case::deleted(Some("1h30m"), Some(T0), None, Some("2026-01-01T01:30:00Z"))]
#[case::already_annotated(Some("1h"), Some(T0), Some("2026-01-01T00:30:00Z"), None)]
#[case::malformed_grace_period(Some("soon"), Some(T0), None, None)]
fn termination_deadlines(
    #[case] grace: Option<&str>,
    #[case] deleted: Option<&str>,
    #[case] annotated: Option<&str>,
    #[case] expected: Option<&str>,
) {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let mut claim = claim();
    claim.spec.termination_grace_period = grace.map(String::from);
    claim.metadata.deletion_timestamp = deleted.map(|t| Time(at(t)));
    if let Some(a) = annotated {
        claim.annotations_mut().insert(ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP.into(), a.into());
    }
    assert_eq!(termination_deadline(&claim).as_deref(), expected);
}

#[test]
fn long_launch_failures_are_shortened() {
    assert_eq!(launch_failure_message("short"), "short");
    let long = "é".repeat(200);
    let cut = launch_failure_message(&long);
    assert!(cut.ends_with("...") && cut.len() <= 303, "{}", cut.len());
}

#[test]
fn versions_written_over_are_held_until_the_cache_catches_up() {
    let mut written = super::WrittenOver::default();
    assert!(!written.holds("a", "1"), "nothing written yet");
    // A reconcile read version 1, wrote labels (2), then the status (3).
    written.add("a", "1");
    written.add("a", "2");
    assert!(written.holds("a", "2"), "the cache still shows the labels' write");
    assert!(written.holds("a", "1"));
    assert!(!written.holds("b", "2"), "another claim's versions are its own");
    assert!(!written.holds("a", "3"), "the cache shows the last write");
    assert!(!written.holds("a", "1"), "caught up: what was remembered is gone");
    for v in 0..20 {
        written.add("c", &v.to_string());
    }
    assert_eq!(written.0["c"].len(), super::WrittenOver::KEPT);
    assert!(written.holds("c", "19") && !written.holds("c", "0"));
}
