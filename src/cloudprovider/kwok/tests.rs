use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::json;

use super::*;
use crate::apis::labels::{CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT, LABEL_ARCH, LABEL_TOPOLOGY_REGION};
use crate::cloudprovider::aws::embedded;
use crate::scheduling::resources::{CPU, MEMORY, PODS};
use crate::scheduling::{Overhead, Requirement};

fn it(name: &str, cpu: i64, offerings: &[(&str, &str, f64, bool)]) -> Arc<InstanceType> {
    Arc::new(InstanceType::new(
        name,
        Requirements::from_labels(&BTreeMap::from([(LABEL_ARCH.to_string(), "amd64".to_string())])),
        Resources::from_pairs([(CPU, cpu * 1000), (MEMORY, cpu << 30), (PODS, 10)]),
        Overhead { kube_reserved: Resources::from_pairs([(CPU, 100)]), ..Default::default() },
        offerings.iter().map(|(z, c, p, a)| Offering::new(z.to_string(), c.to_string(), *p, *a)).collect(),
    ))
}

fn catalog() -> Vec<Arc<InstanceType>> {
    vec![
        it("small", 2, &[("a", "on-demand", 0.2, true), ("b", "spot", 0.05, false)]),
        it("big", 8, &[("a", "on-demand", 0.8, true), ("b", "spot", 0.3, true)]),
        it("huge", 32, &[("a", "on-demand", 3.2, true), ("a", "spot", 0.9, true)]),
    ]
}

fn reqs(pairs: &[(&str, &[&str])]) -> Requirements {
    let mut r = Requirements::new();
    for (k, values) in pairs {
        r.add(k, Requirement::in_values(values.iter().copied()));
    }
    r
}

fn pick(reqs: &Requirements, cpu_millis: i64) -> Result<(String, String, String)> {
    let types = catalog();
    let requests = Resources::from_pairs([(CPU, cpu_millis)]);
    select_offering(&types, "claim", reqs, &requests)
        .map(|(it, o)| (it.name.clone(), o.zone.clone(), o.capacity_type.clone()))
}

fn t(name: &str, zone: &str, ct: &str) -> (String, String, String) {
    (name.to_string(), zone.to_string(), ct.to_string())
}

#[test]
fn selects_the_cheapest_available_compatible_offering() {
    // small's spot offering is cheaper but unavailable.
    assert_eq!(pick(&Requirements::new(), 1000).unwrap(), t("small", "a", "on-demand"));
    assert_eq!(pick(&reqs(&[(LABEL_CAPACITY_TYPE, &["spot"])]), 1000).unwrap(), t("big", "b", "spot"));
    assert_eq!(pick(&Requirements::new(), 4000).unwrap(), t("big", "b", "spot"));
    assert_eq!(pick(&reqs(&[(LABEL_TOPOLOGY_ZONE, &["a"])]), 4000).unwrap(), t("big", "a", "on-demand"));
    assert_eq!(
        pick(&reqs(&[(LABEL_INSTANCE_TYPE, &["huge", "small"])]), 4000).unwrap(),
        t("huge", "a", "spot")
    );
    // Keys the types do not define (the NodePool label) do not get in the way.
    assert_eq!(pick(&reqs(&[(LABEL_NODEPOOL, &["default"])]), 1000).unwrap(), t("small", "a", "on-demand"));
}

#[test]
fn explains_why_nothing_was_selected() {
    let err = pick(&Requirements::new(), 64000).unwrap_err();
    assert!(
        matches!(&err, CloudProviderError::NoCompatibleInstanceTypes { node_claim, .. } if node_claim == "claim")
    );
    assert!(err.to_string().contains("none of 3 instance types"), "{err}");
    let err = pick(&reqs(&[(LABEL_ARCH, &["arm64"])]), 1000).unwrap_err();
    assert!(matches!(err, CloudProviderError::NoCompatibleInstanceTypes { .. }), "{err}");
    let err = pick(&reqs(&[(LABEL_TOPOLOGY_ZONE, &["c"])]), 1000).unwrap_err();
    assert!(matches!(err, CloudProviderError::NoCompatibleInstanceTypes { .. }), "{err}");
    // Only small's spot offering in zone b would do, and it is out of capacity.
    let only_small_spot = reqs(&[
        (LABEL_INSTANCE_TYPE, &["small"]),
        (LABEL_CAPACITY_TYPE, &["spot"]),
        (LABEL_TOPOLOGY_ZONE, &["b"]),
    ]);
    match pick(&only_small_spot, 1000).unwrap_err() {
        CloudProviderError::InsufficientCapacity { offerings } => {
            assert_eq!(offerings.iter().map(ToString::to_string).collect::<Vec<_>>(), vec!["small/b/spot"]);
        }
        other => panic!("{other}"),
    }
}

fn node_claim(name: &str, requirements: serde_json::Value, cpu: &str) -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": "default", "team": "blue"}},
        "spec": {
            "requirements": requirements,
            "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}},
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "taints": [{"key": "dedicated", "value": "blue", "effect": "NoSchedule"}],
            "startupTaints": [{"key": "example.com/agent-not-ready", "effect": "NoExecute"}],
        },
    }))
    .unwrap()
}

fn m5_large_claim(name: &str) -> NodeClaim {
    node_claim(
        name,
        json!([
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "m5.xlarge"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-east-1b"]},
            {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["default"]},
        ]),
        "1",
    )
}

/// Checks the node as built; the API server's node lifecycle controller may add its own
/// `node.kubernetes.io/*` taints to the stored one.
fn check_m5_large_node(node: &Node, name: &str) {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (k, v) in [
        (LABEL_INSTANCE_TYPE, "m5.large"),
        (LABEL_TOPOLOGY_ZONE, "us-east-1b"),
        (LABEL_CAPACITY_TYPE, CAPACITY_TYPE_ON_DEMAND),
        (LABEL_TOPOLOGY_REGION, "us-east-1"),
        (LABEL_NODEPOOL, "default"),
        (LABEL_HOSTNAME, name),
        (LABEL_ARCH, "amd64"),
        ("karpenter.k8s.aws/instance-family", "m5"),
        ("team", "blue"),
    ] {
        assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
    }
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(ANNOTATION_KWOK_NODE).map(String::as_str), Some(KWOK_NODE_VALUE));
    let spec = node.spec.clone().unwrap_or_default();
    assert_eq!(spec.provider_id.as_deref(), Some(format!("kwok://{name}").as_str()));
    let taints: Vec<(String, String)> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !t.key.starts_with("node.kubernetes.io/"))
        .map(|t| (t.key, t.effect))
        .collect();
    let want = [
        ("dedicated", "NoSchedule"),
        ("example.com/agent-not-ready", "NoExecute"),
        (TAINT_UNREGISTERED, "NoExecute"),
    ]
    .map(|(k, e)| (k.to_string(), e.to_string()));
    assert_eq!(taints, want);
    let status = node.status.clone().unwrap_or_default();
    let capacity = Resources::from_list(&status.capacity.unwrap_or_default()).unwrap();
    let allocatable = Resources::from_list(&status.allocatable.unwrap_or_default()).unwrap();
    assert_eq!((capacity.cpu, capacity.memory, capacity.pods), (2000, 7577 << 20, 29));
    assert_eq!((allocatable.cpu, allocatable.memory), (1930, 6903 << 20));
}

#[test]
fn builds_the_node_of_a_launch() {
    let types = embedded::instance_types().unwrap();
    let claim = m5_large_claim("nc-1");
    let (reqs, requests) = claim_requirements(&claim, "nc-1").unwrap();
    let (it, offering) = select_offering(&types, "nc-1", &reqs, &requests).unwrap();
    assert_eq!((it.name.as_str(), offering.zone.as_str()), ("m5.large", "us-east-1b"));
    let node = build_node(&claim, "nc-1", it, offering).unwrap();
    check_m5_large_node(&node, "nc-1");
    let instance = node_instance(&node);
    assert_eq!(instance.provider_id, "kwok://nc-1");
    assert_eq!(instance.instance_type, "m5.large");
    assert_eq!(instance.image_id, IMAGE_ID);
    assert_eq!(instance.node_pool.as_deref(), Some("default"));
    assert_eq!(instance.allocatable, it.allocatable().to_list());
}

#[test]
fn malformed_node_claims_are_errors() {
    let bad = node_claim(
        "bad",
        json!([{"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gt", "values": ["x"]}]),
        "1",
    );
    let err = claim_requirements(&bad, "bad").unwrap_err();
    assert!(matches!(err, CloudProviderError::InvalidNodeClaim { .. }), "{err}");
    let bad = node_claim("bad", json!([]), "lots");
    assert!(matches!(claim_requirements(&bad, "bad"), Err(CloudProviderError::InvalidNodeClaim { .. })));

    for bad in ["", "kwok://", "aws:///us-east-1a/i-1", "kwok://a/b"] {
        assert!(matches!(node_name(bad), Err(CloudProviderError::InvalidProviderId(_))), "{bad}");
    }
    assert_eq!(node_name("kwok://n-1").unwrap(), "n-1");
}

#[test]
fn a_standalone_claim_launches_without_a_nodepool() {
    let mut standalone = m5_large_claim("standalone");
    standalone.metadata.labels = Some([("team".to_string(), "blue".to_string())].into());
    standalone.spec.requirements.retain(|r| r.key != LABEL_NODEPOOL);
    let types = catalog();
    let node = build_node(&standalone, "standalone", &types[0], &types[0].offerings[0]).unwrap();
    let labels = node.metadata.labels.as_ref().unwrap();
    assert!(!labels.contains_key(LABEL_NODEPOOL));
    assert_eq!(labels["team"], "blue");
    assert!(is_instance(&node), "listed as this provider's instance");
    let mut foreign = node.clone();
    foreign.metadata.annotations = None;
    assert!(!is_instance(&foreign), "a kwok Node this provider did not create is not its instance");
}

#[test]
fn provider_ids_name_kwok_nodes() {
    for bad in ["", "kwok://", "aws:///us-east-1a/i-1", "kwok://a/b"] {
        assert!(matches!(node_name(bad), Err(CloudProviderError::InvalidProviderId(_))), "{bad}");
    }
    assert_eq!(node_name("kwok://n-1").unwrap(), "n-1");
}

// Against the local control plane.

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::SeqCst))
}

async fn provider(delay: Duration) -> KwokCloudProvider {
    let client = Client::try_default().await.expect("a kubeconfig for the local control plane");
    KwokCloudProvider::new(client, embedded::instance_types().unwrap(), delay)
}

fn launched(mut claim: NodeClaim, instance: &Instance) -> NodeClaim {
    claim.status = Some(crate::apis::NodeClaimStatus {
        provider_id: Some(instance.provider_id.clone()),
        ..Default::default()
    });
    claim
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn creates_gets_lists_and_deletes_nodes() {
    let cloud = provider(Duration::ZERO).await;
    let name = unique("kwok-cp-test");
    let claim = m5_large_claim(&name);
    let instance = cloud.create(&claim).await.unwrap();
    assert_eq!(instance.provider_id, format!("kwok://{name}"));
    assert_eq!((instance.instance_type.as_str(), instance.zone.as_str()), ("m5.large", "us-east-1b"));
    assert_eq!(instance.capacity_type, CAPACITY_TYPE_ON_DEMAND);

    let node = cloud.nodes().get(&name).await.unwrap();
    check_m5_large_node(&node, &name);

    // Idempotent: the second launch finds the first.
    let again = cloud.create(&claim).await.unwrap();
    assert_eq!(again.provider_id, instance.provider_id);
    assert_eq!(again.instance_type, "m5.large");
    assert!(again.launch_time.is_some());
    // A Node of the claim's name that another provider made is no launch of the claim's.
    let foreign = unique("kwok-cp-test");
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": foreign},
        "spec": {"providerID": format!("other://{foreign}")}
    }))
    .unwrap();
    cloud.nodes().create(&Default::default(), &node).await.unwrap();
    let err = cloud.create(&m5_large_claim(&foreign)).await.unwrap_err();
    assert!(matches!(err, CloudProviderError::Api { operation: "CreateNode", .. }), "{err}");
    cloud.nodes().delete(&foreign, &Default::default()).await.unwrap();

    let got = cloud.get(&instance.provider_id).await.unwrap();
    assert_eq!(got.instance_type, "m5.large");
    assert_eq!(got.labels.get("team").map(String::as_str), Some("blue"));
    let listed = cloud.list().await.unwrap();
    assert!(listed.iter().any(|i| i.provider_id == instance.provider_id));
    assert!(listed.iter().all(|i| i.provider_id.starts_with(PROVIDER_ID_PREFIX)));

    let claim = launched(claim, &instance);
    cloud.delete(&claim).await.unwrap();
    for _ in 0..50 {
        if cloud.nodes().get_opt(&name).await.unwrap().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(cloud.nodes().get_opt(&name).await.unwrap().is_none(), "node deleted");
    assert!(cloud.delete(&claim).await.unwrap_err().is_not_found());
    assert!(cloud.get(&instance.provider_id).await.unwrap_err().is_not_found());
    assert!(!cloud.list().await.unwrap().iter().any(|i| i.provider_id == instance.provider_id));

    // A claim that was never launched is malformed for delete.
    let err = cloud.delete(&m5_large_claim(&name)).await.unwrap_err();
    assert!(matches!(err, CloudProviderError::InvalidNodeClaim { .. }), "{err}");
    // Nothing fits.
    let huge = node_claim(&unique("kwok-cp-test"), json!([]), "100000");
    assert!(matches!(cloud.create(&huge).await, Err(CloudProviderError::NoCompatibleInstanceTypes { .. })));
}

#[tokio::test]
#[ignore = "needs the local control plane"]
async fn creates_the_node_after_the_registration_delay() {
    let cloud = provider(Duration::from_millis(1500)).await;
    let name = unique("kwok-cp-delay");
    let claim = m5_large_claim(&name);
    let instance = cloud.create(&claim).await.unwrap();
    assert!(cloud.nodes().get_opt(&name).await.unwrap().is_none(), "not yet");
    // Known as launched meanwhile.
    assert_eq!(cloud.get(&instance.provider_id).await.unwrap().provider_id, instance.provider_id);
    assert!(cloud.list().await.unwrap().iter().any(|i| i.provider_id == instance.provider_id));
    assert_eq!(cloud.create(&claim).await.unwrap().provider_id, instance.provider_id);
    let mut node = None;
    for _ in 0..50 {
        node = cloud.nodes().get_opt(&name).await.unwrap();
        if node.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    check_m5_large_node(&node.expect("the node appears after the delay"), &name);
    cloud.delete(&launched(claim.clone(), &instance)).await.unwrap();

    // Deleting during the delay cancels the launch.
    let name = unique("kwok-cp-delay");
    let claim = m5_large_claim(&name);
    let instance = cloud.create(&claim).await.unwrap();
    let claim = launched(claim, &instance);
    cloud.delete(&claim).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(cloud.nodes().get_opt(&name).await.unwrap().is_none(), "cancelled");
    assert!(cloud.delete(&claim).await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn instance_types_serve_every_node_pool() {
    // A client that is never used: instance_types does not talk to the API server.
    let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
    let client = Client::try_from(config).unwrap();
    let cloud = KwokCloudProvider::new(client, catalog(), Duration::ZERO);
    let pool: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": "any"},
        "spec": {"template": {"spec": {
            "requirements": [],
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "missing"},
        }}},
    }))
    .unwrap();
    let types = cloud.instance_types(&pool).await.unwrap();
    assert_eq!(types.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["small", "big", "huge"]);
    assert_eq!(cloud.name(), "kwok");
    let claim = m5_large_claim("x");
    assert_eq!(cloud.is_drifted(&claim).await.unwrap(), None);
    // Another scheme's provider ID names no instance of this provider.
    assert!(matches!(cloud.get("gce://x").await, Err(CloudProviderError::NotFound(_))));
    assert!(matches!(
        cloud.get("Provider:///AZ/i-01234567890123456").await,
        Err(CloudProviderError::NotFound(_))
    ));
}

#[test]
fn spot_offering_of_the_embedded_catalog() {
    let types = embedded::instance_types().unwrap();
    let claim = node_claim(
        "spot",
        json!([
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]},
        ]),
        "3",
    );
    let (reqs, requests) = claim_requirements(&claim, "spot").unwrap();
    let (it, o) = select_offering(&types, "spot", &reqs, &requests).unwrap();
    assert_eq!(o.capacity_type, CAPACITY_TYPE_SPOT);
    assert!(it.requirements.allows(LABEL_ARCH, "arm64") && it.allocatable().cpu >= 3000, "{}", it.name);
    let cheapest = types
        .iter()
        .filter(|t| t.fits(&requests) && t.requirements.intersects(&reqs).is_ok())
        .filter_map(|t| t.cheapest_price(&reqs))
        .min_by(f64::total_cmp);
    assert_eq!(Some(o.price), cheapest);
}

/// Upstream's garbage-collection spec, with the kwok provider: a NodeClaim marked launched,
/// registered and initialized by hand, with a provider ID no kwok instance has, is deleted.
#[tokio::test]
#[ignore = "needs the local control plane"]
async fn garbage_collection_deletes_a_claim_whose_provider_id_names_no_instance() {
    use crate::controllers::nodeclaim::garbagecollection::{self, KnownClaim, collect_claims};
    use kube::api::{Patch, PatchParams, PostParams};
    let cloud = provider(Duration::ZERO).await;
    let client = Client::try_default().await.unwrap();
    let claims: kube::Api<NodeClaim> = kube::Api::all(client.clone());
    let name = unique("kwok-gc-unknown");
    claims.create(&PostParams::default(), &m5_large_claim(&name)).await.unwrap();
    let at = "2026-01-01T00:00:00Z";
    let condition =
        |t: &str| json!({"type": t, "status": "True", "reason": t, "message": "", "lastTransitionTime": at});
    let status = json!({"status": {"providerID": "Provider:///AZ/i-01234567890123456", "conditions": [
        condition("Launched"), condition("Registered"), condition("Initialized")]}});
    claims.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

    let known: Vec<KnownClaim> = garbagecollection::list_claims(&client)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| c.name == name)
        .collect();
    assert_eq!(known.len(), 1);
    let instances = cloud.list().await.unwrap();
    let now = k8s_openapi::jiff::Timestamp::now();
    let collected = collect_claims(&client, &cloud, &known, &instances, now, garbagecollection::GRACE).await;
    assert_eq!(collected, std::slice::from_ref(&name));
    let left = claims.get_opt(&name).await.unwrap();
    assert!(left.is_none_or(|c| c.metadata.deletion_timestamp.is_some()), "the NodeClaim is deleted");
    let release = json!({"metadata": {"finalizers": null}});
    let _ = claims.patch(&name, &PatchParams::default(), &Patch::Merge(&release)).await;
}
