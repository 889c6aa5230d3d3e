use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::state::Snapshot;
use crate::state::statenode::state_nodes;

fn pool(replicas: i64, node_limit: Option<i64>) -> NodePool {
    let mut value = json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "fixed"},
        "spec": {"replicas": replicas, "template": {"spec": {"requirements": [],
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}}}}});
    if let Some(limit) = node_limit {
        value["spec"]["limits"] = json!({"nodes": limit});
    }
    serde_json::from_value(value).unwrap()
}

/// A claim of the pool: launched (with a Node) or not, deleting or not, its node tainted as being
/// replaced or not, created `age_h` hours ago.
fn claim(name: &str, launched: bool, deleting: bool, age_h: i64) -> Arc<crate::apis::NodeClaim> {
    let created = Timestamp::from_second(1_800_000_000 - age_h * 3600).unwrap();
    let mut value = json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": name, "uid": name, "labels": {"karpenter.sh/nodepool": "fixed"},
            "creationTimestamp": created.to_string()},
        "spec": {"requirements": [], "expireAfter": "100h",
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}},
    });
    if launched {
        value["status"] = json!({"providerID": format!("kwok://{name}"), "conditions": [
            {"type": "Launched", "status": "True", "reason": "Launched", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]});
    }
    if deleting {
        value["metadata"]["deletionTimestamp"] = json!("2026-11-27T00:00:00Z");
        value["metadata"]["finalizers"] = json!(["karpenter.sh/termination"]);
    }
    Arc::new(serde_json::from_value(value).unwrap())
}

fn node(name: &str, replaced: bool) -> Arc<k8s_openapi::api::core::v1::Node> {
    let taints =
        if replaced { json!([{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]) } else { json!([]) };
    Arc::new(
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "fixed"}},
            "spec": {"providerID": format!("kwok://{name}"), "taints": taints}}),
        )
        .unwrap(),
    )
}

fn pod(name: &str, on: &str, daemonset: bool, do_not_disrupt: bool) -> Arc<crate::apis::pod::Pod> {
    let owners = if daemonset {
        json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u", "controller": true}])
    } else {
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u", "controller": true}])
    };
    let annotations = if do_not_disrupt { json!({"karpenter.sh/do-not-disrupt": "true"}) } else { json!({}) };
    Arc::new(
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "ns", "ownerReferences": owners, "annotations": annotations},
            "spec": {"nodeName": on, "containers": [{"name": "c"}]}, "status": {"phase": "Running"}}))
        .unwrap(),
    )
}

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

fn nodes(
    claims: Vec<Arc<crate::apis::NodeClaim>>,
    nodes: Vec<Arc<k8s_openapi::api::core::v1::Node>>,
    pods: Vec<Arc<crate::apis::pod::Pod>>,
) -> Vec<StateNode> {
    state_nodes(&Snapshot { nodeclaims: claims, nodes, pods, ..Snapshot::default() })
}

fn none() -> BTreeSet<String> {
    BTreeSet::new()
}

#[test]
fn a_pool_short_of_its_replicas_makes_the_difference_within_its_node_limit() {
    let (created, deleted) = (none(), none());
    let unseen = Unseen { created: &created, deleted: &deleted };
    let two =
        nodes(vec![claim("a", true, false, 1), claim("b", false, false, 1)], vec![node("a", false)], vec![]);
    assert_eq!(plan(&pool(5, None), &two, &unseen, now()), Action::Create(3));
    assert_eq!(plan(&pool(5, Some(4)), &two, &unseen, now()), Action::Create(2));
    assert_eq!(plan(&pool(5, Some(2)), &two, &unseen, now()), Action::LimitReached);
    assert_eq!(plan(&pool(2, None), &two, &unseen, now()), Action::Hold);
    // A claim being deleted is not counted; one being replaced holds its place until it goes.
    let mixed = nodes(
        vec![claim("a", true, false, 1), claim("b", true, true, 1), claim("c", true, false, 1)],
        vec![node("a", false), node("b", false), node("c", true)],
        vec![],
    );
    assert_eq!(counts("fixed", &mixed, &unseen), Counts { running: 1, pending_disruption: 1, active: 2 });
    assert_eq!(plan(&pool(2, None), &mixed, &unseen, now()), Action::Hold);
    assert_eq!(plan(&pool(3, None), &mixed, &unseen, now()), Action::Create(2));
}

#[test]
fn claims_the_cache_does_not_show_yet_count_as_what_they_will_be() {
    let created: BTreeSet<String> = ["new-1".to_string(), "a".to_string()].into();
    let deleted: BTreeSet<String> = ["b".to_string()].into();
    let unseen = Unseen { created: &created, deleted: &deleted };
    let two = nodes(
        vec![claim("a", true, false, 1), claim("b", true, false, 1)],
        vec![node("a", false), node("b", false)],
        vec![],
    );
    // a (seen) + new-1 (not yet seen) running, b deleted: 2 running.
    assert_eq!(counts("fixed", &two, &unseen).running, 2);
    assert_eq!(plan(&pool(2, None), &two, &unseen, now()), Action::Hold);
}

#[test]
fn scale_down_takes_unlaunched_then_empty_then_cheapest_to_move_and_do_not_disrupt_last() {
    let claims = vec![
        claim("busy-old", true, false, 90),
        claim("busy-young", true, false, 1),
        claim("protected", true, false, 99),
        claim("empty", true, false, 1),
        claim("unlaunched", false, false, 1),
    ];
    let ns = vec![
        node("busy-old", false),
        node("busy-young", false),
        node("protected", false),
        node("empty", false),
    ];
    let pods = vec![
        pod("ds", "empty", true, false),
        pod("w1", "busy-old", false, false),
        pod("w2", "busy-young", false, false),
        pod("w3", "protected", false, true),
    ];
    let all = nodes(claims, ns, pods);
    let (created, deleted) = (none(), none());
    let unseen = Unseen { created: &created, deleted: &deleted };
    assert_eq!(
        scale_down_order(&pool(0, None), &all, &unseen, now()),
        ["unlaunched", "empty", "busy-old", "busy-young", "protected"],
        "the old node has less of its life left: cheaper to move"
    );
    assert_eq!(
        plan(&pool(3, None), &all, &unseen, now()),
        Action::Delete(vec!["unlaunched".into(), "empty".into()])
    );
}
