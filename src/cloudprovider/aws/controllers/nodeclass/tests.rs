//! Tests of the controller's decisions, and of the whole controller against the local control
//! plane and the AWS emulator.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use super::*;
use crate::apis::ec2nodeclass::{AmiStatus, SecurityGroupStatus, SubnetStatus};
use crate::apis::{Condition, ConditionStatus};
use crate::cloudprovider::aws::nodeclass::{conditions, is_ready};
use crate::cloudprovider::aws::provider::node_class_hash;
use crate::cloudprovider::aws::{AwsClients, Options};

fn class(name: &str, finalizers: &[&str], deleting: bool) -> EC2NodeClass {
    let mut class: EC2NodeClass = serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": name, "finalizers": finalizers},
        "spec": {
            "role": "r",
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {"a": "b"}}],
            "securityGroupSelectorTerms": [{"tags": {"a": "b"}}],
        }
    }))
    .unwrap();
    if deleting {
        class.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
    }
    class
}

fn claim(name: &str, group: &str, class: &str) -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": name},
        "spec": {
            "requirements": [],
            "nodeClassRef": {"group": group, "kind": "EC2NodeClass", "name": class},
        },
    }))
    .unwrap()
}

fn ready_status(subnets: &[&str], time: &str) -> EC2NodeClassStatus {
    EC2NodeClassStatus {
        subnets: subnets
            .iter()
            .map(|s| SubnetStatus { id: s.to_string(), zone: "us-west-2a".into(), zone_id: None })
            .collect(),
        security_groups: vec![SecurityGroupStatus { id: "sg-1".into(), name: None }],
        amis: vec![AmiStatus { id: "ami-1".into(), ..Default::default() }],
        instance_profile: Some("profile".into()),
        conditions: vec![Condition {
            type_: conditions::READY.into(),
            status: ConditionStatus::True,
            observed_generation: Some(1),
            last_transition_time: time.into(),
            reason: conditions::READY.into(),
            message: String::new(),
        }],
        ..Default::default()
    }
}

#[test]
fn steps_follow_the_finalizer_and_deletion() {
    let ours = FINALIZER_EC2NODECLASS_TERMINATION;
    assert_eq!(step(&class("a", &[], false)), Step::AddFinalizer);
    assert_eq!(step(&class("a", &["other"], false)), Step::AddFinalizer);
    assert_eq!(step(&class("a", &["other", ours], false)), Step::Resolve);
    assert_eq!(step(&class("a", &[ours], true)), Step::Finalize);
    assert_eq!(step(&class("a", &["other"], true)), Step::Done);
}

#[test]
fn finalizer_lists() {
    let ours = FINALIZER_EC2NODECLASS_TERMINATION.to_string();
    assert_eq!(with_finalizer(&[]), Some(vec![ours.clone()]));
    assert_eq!(with_finalizer(&["x".into()]), Some(vec!["x".into(), ours.clone()]));
    assert_eq!(with_finalizer(std::slice::from_ref(&ours)), None);
    assert_eq!(without_finalizer(&["x".into()]), None);
    assert_eq!(
        without_finalizer(&["x".into(), ours.clone(), "y".into()]),
        Some(vec!["x".into(), "y".into()])
    );
    assert_eq!(without_finalizer(&[ours]), Some(vec![]));
}

#[test]
fn an_unchanged_status_is_not_written() {
    let status = ready_status(&["subnet-1"], "t1");
    assert_eq!(status_patch(Some(&status), &status.clone()), None);
    let first = status_patch(None, &status).unwrap();
    assert_eq!(first["status"]["subnets"][0]["id"], "subnet-1");
    assert_eq!(first["status"]["conditions"][0]["lastTransitionTime"], "t1");

    let moved = ready_status(&["subnet-2"], "t1");
    let patch = status_patch(Some(&status), &moved).unwrap();
    assert_eq!(patch["status"]["subnets"][0]["id"], "subnet-2");

    // A field that disappears is removed, not left behind by the merge patch.
    let no_profile = EC2NodeClassStatus { instance_profile: None, ..status.clone() };
    let patch = status_patch(Some(&status), &no_profile).unwrap();
    assert_eq!(patch["status"]["instanceProfile"], Value::Null);
    assert!(patch["status"].as_object().unwrap().contains_key("instanceProfile"));
}

#[test]
fn the_status_round_trips_through_json_unchanged() {
    // What the API server returns must compare equal to what was written, or every
    // reconciliation would write again.
    let status = ready_status(&["subnet-1", "subnet-2"], "2026-01-01T00:00:00.123456789Z");
    let patch = status_patch(None, &status).unwrap();
    let back: EC2NodeClassStatus = serde_json::from_value(patch["status"].clone()).unwrap();
    assert_eq!(status_patch(Some(&back), &status), None);
}

#[test]
fn nodeclaims_of_a_class() {
    let claims = [
        claim("b", NODE_CLASS_GROUP, "default"),
        claim("a", NODE_CLASS_GROUP, "default"),
        claim("c", NODE_CLASS_GROUP, "other"),
        claim("d", "karpenter.kwok.sh", "default"),
    ];
    assert_eq!(claims_of_class(&claims, "default"), vec!["a".to_string(), "b".to_string()]);
    assert!(claims_of_class(&claims, "none").is_empty());
}

#[test]
fn claims_upstream_made_are_restamped_with_this_scheme() {
    let class = class("default", &[], false);
    let mut claim: NodeClaim =
        serde_saphyr::from_str(include_str!("../../../../../tests/fixtures/upstream/nodeclaim.yaml"))
            .unwrap();
    let hash = node_class_hash(&class.spec, "");
    let stamp = restamp(&claim, &hash).expect("upstream's v4 hash is re-stamped");
    assert_eq!(stamp[ANNOTATION_EC2NODECLASS_HASH_VERSION], NODE_CLASS_HASH_VERSION);
    assert_eq!(stamp[ANNOTATION_EC2NODECLASS_HASH], hash);

    // Once on this scheme, nothing more to write.
    for (k, v) in &stamp {
        claim.annotations_mut().insert(k.clone(), v.as_str().unwrap().to_string());
    }
    assert_eq!(restamp(&claim, &hash), None);

    // A claim already drifted keeps its hash, so it stays drifted; one not launched yet gets its
    // hash at launch.
    let mut drifted: NodeClaim =
        serde_saphyr::from_str(include_str!("../../../../../tests/fixtures/upstream/nodeclaim.yaml"))
            .unwrap();
    drifted.status.as_mut().unwrap().conditions.push(Condition {
        type_: "Drifted".into(),
        status: ConditionStatus::True,
        observed_generation: None,
        last_transition_time: "2026-10-02T08:00:00Z".into(),
        reason: "AMIDrift".into(),
        message: String::new(),
    });
    let stamp = restamp(&drifted, &hash).unwrap();
    assert_eq!(stamp.len(), 1, "{stamp:?}");
    assert!(stamp.contains_key(ANNOTATION_EC2NODECLASS_HASH_VERSION));
    drifted.status = None;
    assert_eq!(restamp(&drifted, &hash), None);
}

#[test]
fn names_in_messages() {
    let names: Vec<String> = (1..=7).map(|i| format!("n{i}")).collect();
    assert_eq!(pretty_names(&names[..2], 5), "n1, n2");
    assert_eq!(pretty_names(&names, 5), "n1, n2, n3, n4, n5 and 2 other(s)");
}

#[test]
fn discoveries_report_changed_sets() {
    let a = ready_status(&["subnet-1", "subnet-2"], "t");
    let got = discoveries(None, &a);
    assert_eq!(got.iter().map(|(w, _)| *w).collect::<Vec<_>>(), ["subnets", "security groups", "amis"]);
    assert_eq!(got[0].1, ["subnet-1", "subnet-2"]);
    assert!(discoveries(Some(&a), &a).is_empty());
    // Reordered subnets are the same set.
    let reordered = ready_status(&["subnet-2", "subnet-1"], "t");
    assert!(discoveries(Some(&a), &reordered).is_empty());
    let b = ready_status(&["subnet-3"], "t");
    assert_eq!(discoveries(Some(&a), &b), vec![("subnets", vec!["subnet-3".to_string()])]);
    // Nothing found is reported by the conditions, not as a discovery.
    assert!(discoveries(Some(&a), &EC2NodeClassStatus::default()).is_empty());
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    assert_eq!(backoff(1), Duration::from_secs(1));
    assert_eq!(backoff(2), Duration::from_secs(2));
    assert_eq!(backoff(5), Duration::from_secs(16));
    assert_eq!(backoff(20), BACKOFF_MAX);
    assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
}

#[test]
fn errors_name_the_class() {
    let error = Error::Resolve { name: "default".into(), source: CloudProviderError::Config("bad".into()) };
    assert_eq!(error_chain(&error), "failed to resolve ec2nodeclass default: invalid configuration: bad");
    let error = Error::Cleanup {
        name: "default".into(),
        what: "instance profile",
        source: CloudProviderError::Config("bad".into()),
    };
    assert_eq!(
        error_chain(&error),
        "failed to delete the instance profile of ec2nodeclass default: invalid configuration: bad"
    );
}

// --- Against the local control plane and the AWS emulator ---------------------------------

/// Label that restricts the test controller to the classes of one test run.
const TEST_LABEL: &str = "karpenter-rs.test/nodeclass-run";

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{nanos:x}", std::process::id())
}

fn test_class(name: &str, run: &str, cluster: &str, discovery: &str) -> EC2NodeClass {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": name, "labels": {TEST_LABEL: run}},
        "spec": {
            "role": format!("KarpenterNodeRole-{cluster}"),
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": discovery}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": cluster}}],
        }
    }))
    .unwrap()
}

fn condition(class: &EC2NodeClass, type_: &str) -> Option<Condition> {
    class.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_).cloned()
}

/// Polls `check` every 200 ms until it returns `Some`, for at most `limit`.
async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn profile_exists(iam: &aws_sdk_iam::Client, name: &str) -> bool {
    match iam.get_instance_profile().instance_profile_name(name).send().await {
        Ok(_) => true,
        Err(e) if e.as_service_error().is_some_and(|s| s.is_no_such_entity_exception()) => false,
        Err(e) => panic!("GetInstanceProfile: {e:?}"),
    }
}

async fn templates_of(ec2: &aws_sdk_ec2::Client, cluster: &str, class: &str) -> Vec<String> {
    use aws_sdk_ec2::types::Filter;
    let out = ec2
        .describe_launch_templates()
        .filters(Filter::builder().name("tag:karpenter.k8s.aws/cluster").values(cluster).build())
        .filters(Filter::builder().name("tag:karpenter.k8s.aws/ec2nodeclass").values(class).build())
        .send()
        .await
        .unwrap();
    out.launch_templates().iter().filter_map(|t| t.launch_template_name()).map(str::to_string).collect()
}

#[tokio::test]
#[ignore = "needs the local control plane and AWS emulator"]
async fn resolves_waits_for_nodeclaims_and_cleans_up() {
    let cluster = std::env::var("CLUSTER_NAME").unwrap_or_else(|_| "karpenter-demo".to_string());
    let client = Client::try_default().await.unwrap();
    let provider = Arc::new(
        AwsCloudProvider::new(AwsClients::from_env().await.unwrap(), Options::new(&cluster)).await.unwrap(),
    );
    let run_id = unique("run");
    let (stop_tx, stop_rx) = watch::channel(false);
    let (cluster_state, watches) = crate::state::ClusterState::start(client.clone());
    let watches = tokio::spawn(watches);
    cluster_state.wait_synced().await;
    let selected = run_id.clone();
    let controller = tokio::spawn(run_selected(
        client.clone(),
        cluster_state,
        provider.clone(),
        Events::new(client.clone(), None),
        stop_rx,
        move |c: &EC2NodeClass| c.labels().get(TEST_LABEL) == Some(&selected),
    ));

    let classes: Api<EC2NodeClass> = Api::all(client.clone());
    let good = unique("nc-good");
    let bad = unique("nc-nosubnets");
    classes.create(&PostParams::default(), &test_class(&good, &run_id, &cluster, &cluster)).await.unwrap();
    let nothing = format!("nothing-{run_id}");
    classes.create(&PostParams::default(), &test_class(&bad, &run_id, &cluster, &nothing)).await.unwrap();

    // The good class becomes ready, with everything resolved, and is handed to the provider.
    let ready = eventually("the class to be ready", Duration::from_secs(60), || async {
        let c = classes.get(&good).await.unwrap();
        let ready = condition(&c, conditions::READY)?;
        (ready.status == ConditionStatus::True).then_some(c)
    })
    .await;
    assert!(ready.finalizers().iter().any(|f| f == FINALIZER_EC2NODECLASS_TERMINATION));
    let status = ready.status.clone().unwrap();
    assert!(!status.subnets.is_empty() && !status.security_groups.is_empty() && !status.amis.is_empty());
    let profile = status.instance_profile.clone().unwrap();
    assert_eq!(profile, provider.managed_instance_profile_name(&ready));
    assert!(profile_exists(&provider.clients().iam, &profile).await);
    let stored = eventually("the provider to know the class", Duration::from_secs(10), || async {
        provider.node_classes().get(&good)
    })
    .await;
    assert!(is_ready(stored.status.as_ref()).is_ok());

    // A second look does not rewrite an unchanged status.
    let version = ready.resource_version();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(classes.get(&good).await.unwrap().resource_version(), version);

    // The class whose subnet selector matches nothing says so, naming the selector.
    let not_ready = eventually("SubnetsReady=False", Duration::from_secs(60), || async {
        condition(&classes.get(&bad).await.unwrap(), conditions::SUBNETS_READY)
    })
    .await;
    assert_eq!(not_ready.status, ConditionStatus::False);
    assert!(not_ready.message.contains(&nothing), "{}", not_ready.message);
    let bad_ready = condition(&classes.get(&bad).await.unwrap(), conditions::READY).unwrap();
    assert_eq!(bad_ready.status, ConditionStatus::False);
    // Validated only once resolved; the good class passed its dry runs.
    let waiting = condition(&classes.get(&bad).await.unwrap(), conditions::VALIDATION_SUCCEEDED).unwrap();
    assert_eq!((waiting.status, waiting.reason.as_str()), (ConditionStatus::False, "DependenciesNotReady"));
    let valid = condition(&ready, conditions::VALIDATION_SUCCEEDED).unwrap();
    assert_eq!((valid.status, valid.reason.as_str()), (ConditionStatus::True, "ValidationSucceeded"));

    // A launch template created for the class, as the provider tags them.
    let ec2 = &provider.clients().ec2;
    let template_name = format!("karpenter.k8s.aws/{}", unique("test"));
    ec2.create_launch_template()
        .launch_template_name(&template_name)
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder().image_id("ami-1").build(),
        )
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::LaunchTemplate)
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key("karpenter.k8s.aws/cluster")
                        .value(&cluster)
                        .build(),
                )
                .tags(
                    aws_sdk_ec2::types::Tag::builder()
                        .key("karpenter.k8s.aws/ec2nodeclass")
                        .value(&good)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    // With the one its validation created (a CreateLaunchTemplate among its dry runs).
    let templates = templates_of(ec2, &cluster, &good).await;
    assert_eq!(templates.len(), 2, "{templates:?}");
    assert!(templates.contains(&template_name), "{templates:?}");

    // A NodeClaim using the class holds its deletion back.
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let claim_name = unique("nc-claim");
    let mut node_claim = claim(&claim_name, NODE_CLASS_GROUP, &good);
    node_claim.metadata.labels = Some([(TEST_LABEL.to_string(), run_id.clone())].into());
    claims.create(&PostParams::default(), &node_claim).await.unwrap();
    classes.delete(&good, &DeleteParams::default()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let held = classes.get(&good).await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(held.finalizers().iter().any(|f| f == FINALIZER_EC2NODECLASS_TERMINATION));
    assert!(profile_exists(&provider.clients().iam, &profile).await);
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let waiting = eventually("the waiting event", Duration::from_secs(10), || async {
        let params = ListParams::default().fields(&format!("involvedObject.name={good}"));
        let list = events.list(&params).await.unwrap();
        list.items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reasons::WAITING_ON_NODECLAIM_TERMINATION))
    })
    .await;
    assert_eq!(waiting.type_.as_deref(), Some("Normal"));
    assert_eq!(waiting.message, Some(format!("Waiting on NodeClaim termination for {claim_name}")));

    // Once the NodeClaim is gone, the class's AWS resources and then the class itself go.
    claims.delete(&claim_name, &DeleteParams::default()).await.unwrap();
    eventually("the class to be deleted", Duration::from_secs(30), || async {
        classes.get_opt(&good).await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(!profile_exists(&provider.clients().iam, &profile).await);
    assert!(templates_of(ec2, &cluster, &good).await.is_empty());
    assert!(provider.node_classes().get(&good).is_none());

    classes.delete(&bad, &DeleteParams::default()).await.unwrap();
    eventually("the second class to be deleted", Duration::from_secs(30), || async {
        classes.get_opt(&bad).await.unwrap().is_none().then_some(())
    })
    .await;

    stop_tx.send_replace(true);
    tokio::time::timeout(Duration::from_secs(10), controller).await.unwrap().unwrap();
    watches.abort();
}
