//! The AWS cloud provider against the AWS emulator (moto): catalog, node-class resolution,
//! launch, idempotency, lookup, termination, insufficient capacity, drift and the life of launch
//! templates.
//!
//! Every test seeds its own cluster name (its own VPC, subnets, security group, role and EKS
//! cluster) so tests neither see each other's instances nor need an emulator reset.
//!
//! These tests need the emulator (`make test` starts it and runs them); on their own they are
//! ignored: `eval "$(hack/moto-up.sh)" && cargo test --test aws -- --ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use aws_sdk_ec2::types::Filter;
use base64::Engine;
use karpenter::apis::labels::*;
use karpenter::apis::{EC2NodeClass, NodeClaim, NodePool};
use karpenter::cloudprovider::aws::cache::{Clock, ManualClock, SystemClock};
use karpenter::cloudprovider::aws::catalog;
use karpenter::cloudprovider::aws::faults::{FaultInjector, requested_overrides};
use karpenter::cloudprovider::aws::instancetype::{self, Settings, TypeInfo};
use karpenter::cloudprovider::aws::launchtemplate::LAUNCH_TEMPLATE_TTL;
use karpenter::cloudprovider::aws::nodeclass::conditions;
use karpenter::cloudprovider::aws::nodecost::NodeCost;
use karpenter::cloudprovider::aws::unavailable::Scope;
use karpenter::cloudprovider::aws::{AwsClients, AwsCloudProvider, Options};
use karpenter::cloudprovider::{CloudProvider, CloudProviderError, DriftReason, OfferingKey};
use karpenter::controllers::nodeclaim::garbagecollection::{
    self, KnownClaim, collect_claims, collect_instances,
};
use serde_json::json;

const IGNORE: &str = "needs the AWS emulator: make test";

fn endpoint() -> String {
    std::env::var("AWS_ENDPOINT_URL").unwrap_or_else(|_| {
        panic!("AWS_ENDPOINT_URL is not set; start the emulator with `eval \"$(hack/moto-up.sh)\"` or run `make test` ({IGNORE})")
    })
}

fn region() -> String {
    std::env::var("AWS_REGION").unwrap_or_else(|_| "us-west-2".to_string())
}

/// A cluster name no other test (or earlier run) uses.
fn unique_cluster(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{nanos:x}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

/// Seeds `cluster` through the emulator's own endpoint.
fn seed(cluster: &str) {
    let url = endpoint();
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let body = json!({"clusters": [cluster], "region": region()}).to_string();
    let mut stream =
        TcpStream::connect(host).unwrap_or_else(|e| panic!("cannot reach the emulator at {url}: {e}"));
    write!(
        stream,
        "POST /_karpenter-rs/seed HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
        "seeding failed: {answer}"
    );
}

async fn clients() -> AwsClients {
    let config = karpenter::cloudprovider::aws::config_loader()
        .endpoint_url(endpoint())
        .region(aws_config::Region::new(region()))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "test"))
        .load()
        .await;
    AwsClients::from_config(&config).unwrap()
}

fn node_class(cluster: &str, alias: &str) -> EC2NodeClass {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.k8s.aws/v1",
        "kind": "EC2NodeClass",
        "metadata": {"name": "default", "generation": 1},
        "spec": {
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": cluster}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": cluster}}],
            "amiSelectorTerms": [{"alias": alias}],
            "role": format!("KarpenterNodeRole-{cluster}"),
            "tags": {"team": "platform"},
        }
    }))
    .unwrap()
}

fn node_claim(name: &str, types: &[&str], capacity_type: &str) -> NodeClaim {
    serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": name, "labels": {LABEL_NODEPOOL: "default", "team": "a"}},
        "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": LABEL_INSTANCE_TYPE, "operator": "In", "values": types},
                {"key": LABEL_CAPACITY_TYPE, "operator": "In", "values": [capacity_type]},
            ],
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
        }
    }))
    .unwrap()
}

/// The data of the launch template of the first override of the last CreateFleet request.
async fn last_launch_template(
    p: &AwsCloudProvider,
    faults: &FaultInjector,
) -> aws_sdk_ec2::types::ResponseLaunchTemplateData {
    let template = faults
        .create_fleet_requests()
        .last()
        .map(|b| requested_overrides(b)[0].launch_template.clone())
        .unwrap();
    let versions = p
        .clients()
        .ec2
        .describe_launch_template_versions()
        .launch_template_name(template)
        .send()
        .await
        .unwrap();
    versions.launch_template_versions()[0].launch_template_data().unwrap().clone()
}

/// `claim` as its lifecycle records the instance `launched` for it: its provider id, labels and
/// annotations.
fn as_launched(claim: &NodeClaim, launched: &karpenter::cloudprovider::Instance) -> NodeClaim {
    let mut claimed = claim.clone();
    claimed.metadata.labels.get_or_insert_with(Default::default).extend(launched.labels.clone());
    claimed.metadata.annotations = Some(launched.annotations.clone());
    claimed.status = Some(karpenter::apis::NodeClaimStatus {
        provider_id: Some(launched.provider_id.clone()),
        ..Default::default()
    });
    claimed
}

/// The user data of launch template `data`, decoded.
fn user_data_of(data: &aws_sdk_ec2::types::ResponseLaunchTemplateData) -> String {
    let encoded = data.user_data().unwrap();
    String::from_utf8(base64::engine::general_purpose::STANDARD.decode(encoded).unwrap()).unwrap()
}

/// A provider for a freshly seeded cluster with its resolved, ready `default` node class.
async fn provider(prefix: &str) -> (AwsCloudProvider, String) {
    let (p, cluster, _) = provider_with_faults(prefix).await;
    (p, cluster)
}

/// As [`provider`], with a fault injector (which also records CreateFleet requests) on EC2.
async fn provider_with_faults(prefix: &str) -> (AwsCloudProvider, String, FaultInjector) {
    let cluster = unique_cluster(prefix);
    seed(&cluster);
    let (p, faults) = provider_for(&cluster, Arc::new(SystemClock)).await;
    (p, cluster, faults)
}

/// A provider for `cluster` (seeded already) whose caches `clock` times, with a fault injector
/// on EC2 and the resolved, ready `default` node class. Its classes are not validated with dry
/// runs (`node_class_validation_dry_runs_the_launch_calls` tests that), so that the launch tests
/// see only their own calls and launch templates.
async fn provider_for(cluster: &str, clock: Arc<dyn Clock>) -> (AwsCloudProvider, FaultInjector) {
    let mut options = Options::new(cluster);
    options.disable_dry_run = true;
    let (p, faults) = provider_with_options(options, clock).await;
    let mut class = node_class(cluster, "al2023@latest");
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    p.node_classes().upsert(class);
    (p, faults)
}

/// A provider of `options` whose caches `clock` times, with a fault injector on EC2.
async fn provider_with_options(options: Options, clock: Arc<dyn Clock>) -> (AwsCloudProvider, FaultInjector) {
    let config = karpenter::cloudprovider::aws::config_loader()
        .endpoint_url(endpoint())
        .region(aws_config::Region::new(region()))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new("testing", "testing", None, None, "test"))
        .load()
        .await;
    let faults = FaultInjector::new();
    let mut clients = AwsClients::from_config(&config).unwrap();
    clients.ec2 = aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(&config).interceptor(faults.clone()).build(),
    );
    let p = AwsCloudProvider::with_clock(clients, options, clock).await.unwrap();
    (p, faults)
}

async fn instances_tagged(p: &AwsCloudProvider, claim: &str) -> Vec<String> {
    let out = p
        .clients()
        .ec2
        .describe_instances()
        .filters(Filter::builder().name("tag:eks:eks-cluster-name").values(&p.cluster().name).build())
        .filters(Filter::builder().name("tag:karpenter.sh/nodeclaim").values(claim).build())
        .filters(Filter::builder().name("instance-state-name").values("pending").values("running").build())
        .send()
        .await
        .unwrap();
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .filter_map(|i| i.instance_id().map(str::to_string))
        .collect()
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn sdk_reads_the_endpoint_from_the_environment() {
    let _ = endpoint();
    let cluster = unique_cluster("env");
    seed(&cluster);
    // No explicit endpoint: aws-config reads AWS_ENDPOINT_URL (and the region and credentials).
    let clients = AwsClients::from_env().await.unwrap();
    let out = clients.eks.describe_cluster().name(&cluster).send().await.unwrap();
    assert_eq!(out.cluster().and_then(|c| c.name()), Some(cluster.as_str()));
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn catalog_has_the_common_types_with_their_labels() {
    let clients = clients().await;
    let data = catalog::fetch(&clients.ec2).await.unwrap();
    assert!(data.types.len() > 500, "only {} types", data.types.len());
    let spec = node_class("x", "al2023@latest").spec;
    let settings = Settings::for_node_class("us-west-2", &spec);
    let labels = |info: &TypeInfo| {
        instancetype::instance_type(info, &settings, vec![]).unwrap().requirements.single_valued_labels()
    };
    let want: [(&str, &[(&str, &str)]); 4] = [
        (
            "m5.large",
            &[
                (LABEL_ARCH, "amd64"),
                (LABEL_INSTANCE_CPU, "2"),
                (LABEL_INSTANCE_MEMORY, "8192"),
                (LABEL_INSTANCE_FAMILY, "m5"),
                (LABEL_INSTANCE_GENERATION, "5"),
                (LABEL_INSTANCE_CPU_MANUFACTURER, "intel"),
                (LABEL_INSTANCE_HYPERVISOR, "nitro"),
                (LABEL_INSTANCE_NETWORK_BANDWIDTH, "750"),
                (LABEL_INSTANCE_EBS_BANDWIDTH, "4750"),
            ],
        ),
        ("c6g.xlarge", &[(LABEL_ARCH, "arm64"), (LABEL_INSTANCE_CPU, "4"), (LABEL_INSTANCE_CATEGORY, "c")]),
        (
            "g4dn.xlarge",
            &[
                (LABEL_INSTANCE_GPU_NAME, "t4"),
                (LABEL_INSTANCE_GPU_MANUFACTURER, "nvidia"),
                (LABEL_INSTANCE_GPU_COUNT, "1"),
                (LABEL_INSTANCE_GPU_MEMORY, "16384"),
                (LABEL_INSTANCE_LOCAL_NVME, "125"),
            ],
        ),
        (
            "t3.medium",
            &[(LABEL_INSTANCE_CPU, "2"), (LABEL_INSTANCE_MEMORY, "4096"), (LABEL_INSTANCE_SIZE, "medium")],
        ),
    ];
    for (name, expected) in want {
        let info = data.get(name).unwrap_or_else(|| panic!("{name} missing from the catalog"));
        let got = labels(info);
        for (k, v) in expected {
            assert_eq!(got.get(*k).map(String::as_str), Some(*v), "{name} {k}");
        }
        assert!(data.zones[name].contains("us-west-2a"), "{name} not offered in us-west-2a");
    }
    let g4dn = instancetype::instance_type(data.get("g4dn.xlarge").unwrap(), &settings, vec![]).unwrap();
    assert_eq!(g4dn.capacity.get(RESOURCE_NVIDIA_GPU), 1);
    assert_eq!(g4dn.capacity.pods, 29);
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn node_class_resolves_to_a_ready_status() {
    let cluster = unique_cluster("nc");
    seed(&cluster);
    let p = AwsCloudProvider::new(clients().await, Options::new(&cluster)).await.unwrap();
    let class = node_class(&cluster, "al2023@latest");
    let status = p.resolve_node_class(&class, &[]).await.unwrap().status;
    assert_eq!(status.subnets.len(), 3);
    let zones: BTreeSet<&str> = status.subnets.iter().map(|s| s.zone.as_str()).collect();
    assert_eq!(zones, BTreeSet::from(["us-west-2a", "us-west-2b", "us-west-2c"]));
    assert_eq!(status.security_groups.len(), 1);
    assert_eq!(status.security_groups[0].name.as_deref(), Some(format!("{cluster}-node").as_str()));
    assert_eq!(status.amis.len(), 5, "{:?}", status.amis);
    assert!(status.amis.iter().all(|a| a.name.as_deref().is_some_and(|n| n.contains("al2023"))));
    let profile = status.instance_profile.clone().unwrap();
    let roles = p.clients().iam.get_instance_profile().instance_profile_name(&profile).send().await.unwrap();
    assert_eq!(
        roles.instance_profile().unwrap().roles()[0].role_name(),
        format!("KarpenterNodeRole-{cluster}")
    );
    let ready = status.conditions.iter().find(|c| c.type_ == conditions::READY).unwrap();
    assert_eq!(format!("{:?}", ready.status), "True", "{ready:?}");

    // Resolving again reuses the profile.
    assert_eq!(p.resolve_node_class(&class, &[]).await.unwrap().status.instance_profile, Some(profile));

    // Pinned Bottlerocket alias.
    let br = p.resolve_node_class(&node_class(&cluster, "bottlerocket@v1.49.0"), &[]).await.unwrap().status;
    assert_eq!(br.amis.len(), 4);
    assert!(br.amis.iter().all(|a| a.name.as_deref().is_some_and(|n| n.contains("1.49.0"))), "{:?}", br.amis);

    // Selectors that match nothing.
    let mut bad = node_class(&cluster, "al2023@v19990101");
    bad.spec.subnet_selector_terms[0].tags =
        Some([("karpenter.sh/discovery".to_string(), "nobody".to_string())].into());
    let status = p.resolve_node_class(&bad, &[]).await.unwrap().status;
    let get = |t: &str| status.conditions.iter().find(|c| c.type_ == t).unwrap().clone();
    assert_eq!(get(conditions::SUBNETS_READY).reason, "SubnetsNotFound");
    assert!(get(conditions::SUBNETS_READY).message.contains("nobody"));
    assert_eq!(get(conditions::AMIS_READY).reason, "AMINotFound");
    assert!(get(conditions::AMIS_READY).message.contains("al2023@v19990101"));
    assert_eq!(get(conditions::SECURITY_GROUPS_READY).reason, "SecurityGroupsReady");
    assert_eq!(
        get(conditions::READY).message,
        "SubnetsReady=False, AMIsReady=False, ValidationSucceeded=False"
    );
    assert_eq!(get(conditions::VALIDATION_SUCCEEDED).reason, "DependenciesNotReady");

    // AMIs by name and owner; security groups by name.
    let mut by_name = node_class(&cluster, "al2023@latest");
    by_name.spec.ami_family = Some(karpenter::apis::ec2nodeclass::AmiFamily::AL2023);
    by_name.spec.ami_selector_terms = vec![
        serde_json::from_value(
            json!({"name": "amazon-eks-node-al2023-arm64-standard-1.33-*", "owner": "602401143452"}),
        )
        .unwrap(),
    ];
    by_name.spec.security_group_selector_terms =
        vec![serde_json::from_value(json!({"name": format!("{cluster}-node")})).unwrap()];
    let status = p.resolve_node_class(&by_name, &[]).await.unwrap().status;
    // Both releases match; only the newer one is kept for the architecture.
    assert_eq!(status.amis.len(), 1, "{:?}", status.amis);
    assert_eq!(
        status.amis[0].name.as_deref(),
        Some("amazon-eks-node-al2023-arm64-standard-1.33-v20251101"),
        "{:?}",
        status.amis
    );
    assert_eq!(status.security_groups.len(), 1);

    // A pattern matching both architectures keeps the newest image of each.
    by_name.spec.ami_selector_terms =
        vec![serde_json::from_value(json!({"name": "amazon-eks-node-al2023-*-standard-1.33-*"})).unwrap()];
    let status = p.resolve_node_class(&by_name, &[]).await.unwrap().status;
    let mut names: Vec<&str> = status.amis.iter().filter_map(|a| a.name.as_deref()).collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            "amazon-eks-node-al2023-arm64-standard-1.33-v20251101",
            "amazon-eks-node-al2023-x86_64-standard-1.33-v20251101"
        ]
    );
}

/// A copy of the EKS image `name` in the account, named `copy_name`; EC2 dates it now.
async fn copy_image(p: &AwsCloudProvider, name: &str, copy_name: &str) -> String {
    let ec2 = &p.clients().ec2;
    let found = ec2
        .describe_images()
        .owners("602401143452")
        .filters(Filter::builder().name("name").values(name).build())
        .send()
        .await
        .unwrap();
    let source = found.images()[0].image_id().unwrap().to_string();
    let copy = ec2.copy_image().source_image_id(&source).source_region(region()).name(copy_name).send().await;
    copy.unwrap().image_id().unwrap().to_string()
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn a_newer_image_replaces_the_selected_one_and_drifts_its_nodes() {
    let (p, cluster, faults) = provider_with_faults("newami").await;
    let source = "amazon-eks-node-al2023-x86_64-standard-1.33-v20251101";
    let first = copy_image(&p, source, &format!("{cluster}-node-a")).await;
    let mut class = node_class(&cluster, "al2023@latest");
    class.spec.ami_family = Some(karpenter::apis::ec2nodeclass::AmiFamily::AL2023);
    class.spec.ami_selector_terms =
        vec![serde_json::from_value(json!({"name": format!("{cluster}-node-*")})).unwrap()];
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    assert_eq!(
        class.status.as_ref().unwrap().amis.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
        [first.as_str()]
    );
    p.node_classes().upsert(class.clone());

    let claim = node_claim("newami-1", &["m5.large"], CAPACITY_TYPE_ON_DEMAND);
    let launched = p.create(&claim).await.unwrap();
    assert_eq!(launched.image_id, first);
    let claimed = as_launched(&claim, &launched);
    // The instance has the launch template's security groups, as EC2 gives them.
    let id = launched.provider_id.rsplit('/').next().unwrap().to_string();
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), None);

    // A newer image matches the selector: it replaces the older one, whose node drifts. Its name
    // sorts first, so only its creation date (a second later) can make it win.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = copy_image(&p, source, &format!("{cluster}-node-0")).await;
    let status = p.resolve_node_class(&class, &[]).await.unwrap().status;
    assert_eq!(status.amis.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), [second.as_str()]);
    class.status = Some(status);
    p.node_classes().upsert(class);
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), Some(DriftReason::Ami));
    // Many claims at once (one DescribeInstances): the same answer; a claim whose instance does
    // not exist is NotFound, one not launched yet has not drifted.
    let mut gone = claimed.clone();
    gone.status.as_mut().unwrap().provider_id =
        Some(launched.provider_id.replace(&id, "i-0123456789abcdef0"));
    let before = faults.attempts("DescribeInstances");
    let answers = p.are_drifted(&[&claimed, &gone, &claim]).await;
    assert_eq!(faults.attempts("DescribeInstances") - before, 1, "one call for every claim");
    assert_eq!(answers[0].as_ref().unwrap(), &Some(DriftReason::Ami));
    assert!(answers[1].as_ref().is_err_and(|e| e.is_not_found()), "{:?}", answers[1]);
    assert_eq!(answers[2].as_ref().unwrap(), &None);
    let replacement =
        p.create(&node_claim("newami-2", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    assert_eq!(replacement.image_id, second);
}

/// Creates the placement group `name` of `strategy` (with three partitions for `partition`)
/// and returns its id.
async fn placement_group(p: &AwsCloudProvider, name: &str, strategy: &str) -> String {
    let strategy = aws_sdk_ec2::types::PlacementStrategy::from(strategy);
    let partitions = (strategy == aws_sdk_ec2::types::PlacementStrategy::Partition).then_some(3);
    let out = p
        .clients()
        .ec2
        .create_placement_group()
        .group_name(name)
        .strategy(strategy)
        .set_partition_count(partitions)
        .send()
        .await
        .unwrap();
    out.placement_group().and_then(|g| g.group_id()).unwrap().to_string()
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn a_placement_group_takes_the_launches_and_labels_the_nodes() {
    let (p, cluster, faults) = provider_with_faults("placed").await;
    let name = format!("{cluster}-training");
    let id = placement_group(&p, &name, "partition").await;
    let mut class = node_class(&cluster, "al2023@latest");
    class.spec.placement_group_selector = Some(serde_json::from_value(json!({"name": name})).unwrap());
    let condition = |class: &karpenter::apis::EC2NodeClass, type_: &str| {
        let c = class.status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == type_).unwrap().clone();
        (c.status, c.reason, c.message)
    };
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    assert_eq!(condition(&class, "PlacementGroupReady").0, karpenter::apis::ConditionStatus::True);
    assert_eq!(condition(&class, "Ready").0, karpenter::apis::ConditionStatus::True);
    p.node_classes().upsert(class.clone());

    // Every type carries the group's id and its partitions.
    let types = p.instance_types_for_class(&class).await.unwrap();
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    assert!(m5.requirements.allows(LABEL_PLACEMENT_GROUP_ID, &id));
    assert!(m5.requirements.allows(LABEL_PLACEMENT_GROUP_PARTITION, "3"));
    assert!(!m5.requirements.allows(LABEL_PLACEMENT_GROUP_PARTITION, "4"));

    // A claim that names partition 2 launches there; its node is labelled with the group.
    let mut claim = node_claim("placed-1", &["m5.large"], CAPACITY_TYPE_ON_DEMAND);
    claim.spec.requirements.push(
        serde_json::from_value(
            json!({"key": LABEL_PLACEMENT_GROUP_PARTITION, "operator": "In", "values": ["2"]}),
        )
        .unwrap(),
    );
    let launched = p.create(&claim).await.unwrap();
    assert_eq!(launched.labels.get(LABEL_PLACEMENT_GROUP_ID), Some(&id));
    assert_eq!(launched.labels.get(LABEL_PLACEMENT_GROUP_PARTITION).map(String::as_str), Some("2"));
    let placement = last_launch_template(&p, &faults).await.placement().unwrap().clone();
    assert_eq!((placement.group_id(), placement.partition_number()), (Some(id.as_str()), Some(2)));
    // One that names none gets the partition EC2 gives it.
    let other = p.create(&node_claim("placed-2", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let partition: i32 = other.labels[LABEL_PLACEMENT_GROUP_PARTITION].parse().unwrap();
    assert!((1..=3).contains(&partition), "{partition}");

    // Not drifted while it is in the group the class resolves to; drifted when the group its
    // label names is another (the group was made again, or the node was placed by hand).
    let mut claimed = as_launched(&claim, &launched);
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), None);
    claimed
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(LABEL_PLACEMENT_GROUP_ID.into(), "pg-0123456789abcdef0".into());
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), Some(DriftReason::PlacementGroup));
    // Out of capacity inside the group: only launches into that partition of the group leave
    // the offering out, never launches elsewhere.
    faults.fail_instance_type("m5.large");
    let mut full = node_claim("placed-3", &["m5.large"], CAPACITY_TYPE_ON_DEMAND);
    full.spec.requirements = claim.spec.requirements.clone();
    let err = p.create(&full).await.unwrap_err();
    assert!(matches!(err, CloudProviderError::InsufficientCapacity { .. }), "{err}");
    faults.heal_instance_type("m5.large");
    let key = |zone: &str| OfferingKey {
        instance_type: "m5.large".into(),
        zone: zone.into(),
        capacity_type: CAPACITY_TYPE_ON_DEMAND.into(),
    };
    let zone = format!("{}a", region());
    assert!(p.unavailable_offerings().marked(&key(&zone), Scope::Partition(id.clone(), 2)));
    assert!(!p.unavailable_offerings().marked(&key(&zone), Scope::Everywhere));
    assert!(!p.unavailable_offerings().contains(&key(&zone), None));

    // A group in use is not deleted.
    let refused = p.clients().ec2.delete_placement_group().group_name(&name).send().await;
    assert!(refused.is_err());

    // A group that does not exist: the class says so and is not Ready.
    let mut missing = node_class(&cluster, "al2023@latest");
    missing.metadata.name = Some("missing".into());
    missing.spec.placement_group_selector =
        Some(serde_json::from_value(json!({"name": "no-such-group"})).unwrap());
    missing.status = Some(p.resolve_node_class(&missing, &[]).await.unwrap().status);
    assert_eq!(
        condition(&missing, "PlacementGroupReady"),
        (
            karpenter::apis::ConditionStatus::False,
            "PlacementGroupNotFound".into(),
            "Placement group \"no-such-group\" not found".into()
        )
    );
    assert_eq!(condition(&missing, "Ready").0, karpenter::apis::ConditionStatus::False);
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn capacity_reservations_are_resolved_into_the_status() {
    let (p, cluster, _faults) = provider_with_faults("odcr").await;
    let ec2 = &p.clients().ec2;
    let reserve = |zone: &str, criteria: &str, team: &str| {
        ec2.create_capacity_reservation()
            .instance_type("p5.48xlarge")
            .instance_platform(aws_sdk_ec2::types::CapacityReservationInstancePlatform::LinuxUnix)
            .availability_zone(zone)
            .instance_count(2)
            .instance_match_criteria(aws_sdk_ec2::types::InstanceMatchCriteria::from(criteria))
            .tag_specifications(
                aws_sdk_ec2::types::TagSpecification::builder()
                    .resource_type(aws_sdk_ec2::types::ResourceType::CapacityReservation)
                    .tags(aws_sdk_ec2::types::Tag::builder().key("team").value(team).build())
                    .tags(aws_sdk_ec2::types::Tag::builder().key("cluster").value(&cluster).build())
                    .build(),
            )
            .send()
    };
    let zone = format!("{}a", region());
    let targeted = reserve(&zone, "targeted", "ml").await.unwrap();
    let targeted_id =
        targeted.capacity_reservation().and_then(|r| r.capacity_reservation_id()).unwrap().to_string();
    let open = reserve(&zone, "open", "web").await.unwrap();
    let open_id = open.capacity_reservation().and_then(|r| r.capacity_reservation_id()).unwrap().to_string();

    let mut class = node_class(&cluster, "al2023@latest");
    class.spec.capacity_reservation_selector_terms = serde_json::from_value(json!([
        {"id": targeted_id},
        {"tags": {"team": "web", "cluster": cluster}},
        {"id": "cr-0123456789abcdef0"}]))
    .unwrap();
    let status = p.resolve_node_class(&class, &[]).await.unwrap().status;
    let ids: Vec<&str> = status.capacity_reservations.iter().map(|r| r.id.as_str()).collect();
    let mut want = vec![targeted_id.as_str(), open_id.as_str()];
    want.sort();
    assert_eq!(ids, want, "by id, the unknown id left out");
    let t = status.capacity_reservations.iter().find(|r| r.id == targeted_id).unwrap();
    assert_eq!(
        (t.instance_type.as_str(), t.availability_zone.as_str(), t.instance_match_criteria.as_deref()),
        ("p5.48xlarge", zone.as_str(), Some("targeted"))
    );
    assert_eq!((t.reservation_type.as_deref(), t.state.as_deref()), (Some("default"), Some("active")));
    let ready = status.conditions.iter().find(|c| c.type_ == "CapacityReservationsReady").unwrap();
    assert_eq!(ready.status, karpenter::apis::ConditionStatus::True);

    // A cancelled reservation is no longer listed.
    ec2.cancel_capacity_reservation().capacity_reservation_id(&open_id).send().await.unwrap();
    let status = p.resolve_node_class(&class, &[]).await.unwrap().status;
    let ids: Vec<&str> = status.capacity_reservations.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, [targeted_id.as_str()]);
}

/// The id of a new targeted On-Demand Capacity Reservation of `count` m5.large in `zone`.
async fn targeted_m5_reservation(ec2: &aws_sdk_ec2::Client, zone: &str, count: i32) -> String {
    let out = ec2
        .create_capacity_reservation()
        .instance_type("m5.large")
        .instance_platform(aws_sdk_ec2::types::CapacityReservationInstancePlatform::LinuxUnix)
        .availability_zone(zone)
        .instance_count(count)
        .instance_match_criteria(aws_sdk_ec2::types::InstanceMatchCriteria::Targeted)
        .send()
        .await
        .unwrap();
    out.capacity_reservation().and_then(|r| r.capacity_reservation_id()).unwrap().to_string()
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn reserved_claims_launch_into_their_reservation_until_it_is_exhausted() {
    let (p, cluster, faults) = provider_with_faults("reserved").await;
    let ec2 = &p.clients().ec2;
    let zone = format!("{}a", region());
    let id = targeted_m5_reservation(ec2, &zone, 2).await;
    let mut class = node_class(&cluster, "al2023@latest");
    class.spec.capacity_reservation_selector_terms = serde_json::from_value(json!([{"id": id}])).unwrap();
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    p.node_classes().upsert(class.clone());

    // The type has a reserved offering of the reservation, in its zone, all but free.
    let types = p.instance_types_for_class(&class).await.unwrap();
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    let reserved = m5.offerings.iter().find(|o| o.capacity_type == "reserved").unwrap();
    assert_eq!(
        (reserved.zone.as_str(), reserved.reservation_id(), reserved.available),
        (zone.as_str(), Some(id.as_str()), true)
    );
    assert!(reserved.list_price < 0.0001);
    let on_demand = m5.offerings.iter().find(|o| o.capacity_type == "on-demand").unwrap();
    assert!(reserved.price < on_demand.price, "the node's own costs come on top of both");
    assert_eq!(p.reservations().left(&id), 2);

    // A claim that allows reserved capacity launches into the reservation, with its labels.
    let first = p.create(&node_claim("reserved-1", &["m5.large"], "reserved")).await.unwrap();
    assert_eq!(first.capacity_type, "reserved");
    assert_eq!(first.labels.get(LABEL_CAPACITY_RESERVATION_ID), Some(&id));
    assert_eq!(first.labels.get(LABEL_CAPACITY_RESERVATION_TYPE).map(String::as_str), Some("default"));
    assert_eq!(first.labels.get(LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE).map(String::as_str), Some("false"));
    assert_eq!(p.reservations().left(&id), 1);
    let instance_id = first.provider_id.rsplit('/').next().unwrap().to_string();
    let described = ec2.describe_instances().instance_ids(&instance_id).send().await.unwrap();
    assert_eq!(described.reservations()[0].instances()[0].capacity_reservation_id(), Some(id.as_str()));
    let request = faults.create_fleet_requests().pop().unwrap();
    for expected in [
        "TargetCapacitySpecification.DefaultTargetCapacityType=on-demand",
        "OnDemandOptions.AllocationStrategy=lowest-price",
    ] {
        assert!(request.split('&').any(|p| p == expected), "{expected} missing from {request}");
    }

    // Someone else takes the last instance: the next reserved launch finds it exhausted, is
    // told there is no capacity, and the reservation has none left for the scheduler.
    ec2.run_instances()
        .image_id(first.image_id.clone())
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .placement(aws_sdk_ec2::types::Placement::builder().availability_zone(&zone).build())
        .capacity_reservation_specification(
            aws_sdk_ec2::types::CapacityReservationSpecification::builder()
                .capacity_reservation_target(
                    aws_sdk_ec2::types::CapacityReservationTarget::builder()
                        .capacity_reservation_id(&id)
                        .build(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let exhausted = p.create(&node_claim("reserved-2", &["m5.large"], "reserved")).await;
    assert!(matches!(exhausted, Err(CloudProviderError::InsufficientCapacity { .. })), "{exhausted:?}");
    assert_eq!(p.reservations().left(&id), 0);
    let types = p.instance_types_for_class(&class).await.unwrap();
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    assert!(!m5.offerings.iter().any(|o| o.capacity_type == "reserved" && o.available));
    // A claim that also allows on-demand falls back to it; on-demand launches never take a
    // reservation's instances.
    let mut fallback = node_claim("reserved-3", &["m5.large"], "reserved");
    let mut capacity_types = fallback.spec.requirements[1].values.to_vec();
    capacity_types.push(CAPACITY_TYPE_ON_DEMAND.to_string());
    fallback.spec.requirements[1].values = capacity_types.into();
    let launched = p.create(&fallback).await.unwrap();
    assert_eq!(launched.capacity_type, "on-demand");
    assert!(!launched.labels.contains_key(LABEL_CAPACITY_RESERVATION_ID));

    // The class stops selecting the reservation: the reserved node drifts.
    let claimed = as_launched(&node_claim("reserved-1", &["m5.large"], "reserved"), &first);
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), None);
    class.spec.capacity_reservation_selector_terms = Vec::new();
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    p.node_classes().upsert(class.clone());
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), Some(DriftReason::CapacityReservation));
}

/// An interruptible capacity reservation (unused instances of another team's reservation, lent
/// out until it takes them back) is launched into with its own market type and fleet target type.
#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn interruptible_reservations_launch_with_their_market_type() {
    let (p, cluster, faults) = provider_with_faults("interruptible").await;
    let ec2 = &p.clients().ec2;
    let zone = format!("{}a", region());
    let source_id = targeted_m5_reservation(ec2, &zone, 3).await;
    ec2.create_interruptible_capacity_reservation_allocation()
        .capacity_reservation_id(&source_id)
        .instance_count(2)
        .send()
        .await
        .unwrap();
    let described =
        ec2.describe_capacity_reservations().capacity_reservation_ids(&source_id).send().await.unwrap();
    let id = described.capacity_reservations()[0]
        .interruptible_capacity_allocation()
        .and_then(|a| a.interruptible_capacity_reservation_id())
        .unwrap()
        .to_string();
    let mut class = node_class(&cluster, "al2023@latest");
    class.spec.capacity_reservation_selector_terms = serde_json::from_value(json!([{"id": id}])).unwrap();
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    let listed = &class.status.as_ref().unwrap().capacity_reservations;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].id.as_str(), listed[0].interruptible), (id.as_str(), Some(true)));
    p.node_classes().upsert(class.clone());

    let launched = p.create(&node_claim("interruptible-1", &["m5.large"], "reserved")).await.unwrap();
    assert_eq!(launched.capacity_type, "reserved");
    assert_eq!(launched.labels.get(LABEL_CAPACITY_RESERVATION_ID), Some(&id));
    assert_eq!(
        launched.labels.get(LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE).map(String::as_str),
        Some("true")
    );
    assert_eq!(p.reservations().left(&id), 1);
    let request = faults.create_fleet_requests().pop().unwrap();
    for expected in [
        "TargetCapacitySpecification.DefaultTargetCapacityType=reserved-capacity",
        "ReservedCapacityOptions.ReservationType.1=interruptible-capacity-reservation",
    ] {
        assert!(request.split('&').any(|p| p == expected), "{expected} missing from {request}");
    }
    assert!(!request.contains("OnDemandOptions"), "{request}");
    let instance_id = launched.provider_id.rsplit('/').next().unwrap().to_string();
    let described = ec2.describe_instances().instance_ids(&instance_id).send().await.unwrap();
    let inst = &described.reservations()[0].instances()[0];
    assert_eq!(inst.instance_lifecycle().map(|l| l.as_str()), Some("interruptible-capacity-reservation"));
    assert_eq!(inst.capacity_reservation_id(), Some(id.as_str()));
    // Found again (after a restart), the instance is still an interruptible reserved one.
    let listed = p.get(&launched.provider_id).await.unwrap();
    assert_eq!(listed.labels.get(LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE).map(String::as_str), Some("true"));
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn a_windows_class_launches_windows_nodes() {
    let (p, cluster, faults) = provider_with_faults("windows").await;
    let mut class = node_class(&cluster, "windows2022@latest");
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    let status = class.status.clone().unwrap();
    assert_eq!(status.amis.len(), 1, "{:?}", status.amis);
    let ami = &status.amis[0];
    assert!(
        ami.name.as_deref().unwrap().starts_with("Windows_Server-2022-English-Core-EKS_Optimized-"),
        "{ami:?}"
    );
    p.node_classes().upsert(class.clone());

    // amd64 types only, labelled as Windows nodes of the family's build, 110 pods each.
    let types = p.instance_types_for_class(&class).await.unwrap();
    assert!(!types.is_empty());
    assert!(types.iter().all(|t| t.requirements.allows(LABEL_ARCH, "amd64")));
    assert!(!types.iter().any(|t| t.name == "c6g.xlarge"));
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    let labels = m5.requirements.single_valued_labels();
    assert_eq!(labels.get(LABEL_OS).map(String::as_str), Some("windows"));
    assert_eq!(labels.get(LABEL_WINDOWS_BUILD).map(String::as_str), Some("10.0.20348"));
    assert_eq!(m5.capacity.pods, 110);
    assert_eq!(m5.capacity.get(RESOURCE_PRIVATE_IPV4_ADDRESS), 9);

    let launched = p.create(&node_claim("win-1", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    assert_eq!(launched.image_id, ami.id);
    assert_eq!(launched.labels.get(LABEL_OS).map(String::as_str), Some("windows"));
    assert_eq!(launched.labels.get(LABEL_WINDOWS_BUILD).map(String::as_str), Some("10.0.20348"));
    let data = last_launch_template(&p, &faults).await;
    assert_eq!(data.block_device_mappings()[0].device_name(), Some("/dev/sda1"));
    assert_eq!(data.block_device_mappings()[0].ebs().and_then(|e| e.volume_size()), Some(50));
    let user_data = user_data_of(&data);
    assert!(user_data.starts_with("<powershell>\n"), "{user_data}");
    assert!(user_data.contains(&format!("-EKSClusterName '{cluster}'")), "{user_data}");
    assert!(user_data.contains("--max-pods=110"), "{user_data}");
    assert!(user_data.contains("karpenter.sh/unregistered:NoExecute"), "{user_data}");

    // Windows Server 2025 needs Kubernetes 1.35: the class says so.
    let mut newer = node_class(&cluster, "windows2025@latest");
    newer.metadata.name = Some("win2025".into());
    let status = p.resolve_node_class(&newer, &[]).await.unwrap().status;
    let amis = status.conditions.iter().find(|c| c.type_ == "AMIsReady").unwrap();
    assert_eq!(amis.reason, "UnsupportedAlias");
    assert!(
        amis.message.starts_with("Windows Server 2025 requires EKS version 1.35 or higher"),
        "{}",
        amis.message
    );
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn instance_types_of_a_node_pool() {
    let (p, _) = provider("types").await;
    let pool: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [],
        }}}
    }))
    .unwrap();
    let types = p.instance_types(&pool).await.unwrap();
    let m5 = types.iter().find(|t| t.name == "m5.large").expect("m5.large");
    let od: Vec<_> = m5.offerings.iter().filter(|o| o.capacity_type == CAPACITY_TYPE_ON_DEMAND).collect();
    // The list price, and in full with the class's root volume (its subnets give no public IPv4).
    let root = NodeCost::of_class(&p.node_classes().get("default").unwrap().spec, false).per_hour();
    assert!(root > 0.002, "{root}");
    assert!(od.iter().all(|o| o.list_price == 0.096 && (o.price - 0.096 - root).abs() < 1e-12), "{od:?}");
    // A burstable type plans the CPU it sustains, unless the pool names it.
    let t3 = types.iter().find(|t| t.name == "t3.medium").expect("t3.medium");
    assert_eq!(t3.capacity.cpu, 2000);
    assert_eq!(t3.allocatable().cpu, 400 - t3.overhead.kube_reserved.cpu);
    let mut asking = pool.clone();
    asking.spec.template.spec.requirements = serde_json::from_value(
        json!([{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["t3"]}]),
    )
    .unwrap();
    let types = p.instance_types(&asking).await.unwrap();
    let t3 = types.iter().find(|t| t.name == "t3.medium").unwrap();
    assert_eq!(t3.allocatable().cpu, 2000 - t3.overhead.kube_reserved.cpu);
    // Subnets that map public IPv4 addresses on launch: each node pays for one.
    let mut class = (*p.node_classes().get("default").unwrap()).clone();
    let ec2 = &p.clients().ec2;
    for subnet in &class.status.as_ref().unwrap().subnets {
        ec2.modify_subnet_attribute()
            .subnet_id(&subnet.id)
            .map_public_ip_on_launch(aws_sdk_ec2::types::AttributeBooleanValue::builder().value(true).build())
            .send()
            .await
            .unwrap();
    }
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    p.node_classes().upsert(class);
    let types = p.instance_types(&pool).await.unwrap();
    let m5_public = types.iter().find(|t| t.name == "m5.large").unwrap();
    let public = m5_public.offerings.iter().find(|o| o.capacity_type == CAPACITY_TYPE_ON_DEMAND).unwrap();
    assert!((public.price - 0.096 - root - 0.005).abs() < 1e-12, "{public:?}");
    assert!(od.iter().any(|o| o.zone == "us-west-2a" && o.available));
    // us-west-2d has no subnet of the class.
    assert!(od.iter().filter(|o| o.zone == "us-west-2d").all(|o| !o.available));
    // Spot prices are unknown until fetched.
    assert!(m5.offerings.iter().all(|o| o.capacity_type != CAPACITY_TYPE_SPOT));
    assert!(p.pricing().refresh_spot_prices(&p.clients().ec2).await.unwrap() > 0);
    let types = p.instance_types(&pool).await.unwrap();
    let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
    assert!(m5.offerings.iter().any(|o| o.capacity_type == CAPACITY_TYPE_SPOT && o.available));
    // Every type has an AMI: GPU types through the nvidia variant.
    assert!(types.iter().any(|t| t.name == "g4dn.xlarge"));
    // A class that is not ready has no instance types.
    p.node_classes().remove("default");
    assert!(matches!(p.instance_types(&pool).await, Err(CloudProviderError::NodeClassNotReady { .. })));
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn create_is_idempotent_and_delete_terminates() {
    let (p, cluster) = provider("launch").await;
    let claim = node_claim("default-abcde", &["m5.large", "c5.large", "m5.xlarge"], CAPACITY_TYPE_ON_DEMAND);
    let launched = p.create(&claim).await.unwrap();
    // c5.large is the cheapest on-demand type allowed.
    assert_eq!(launched.instance_type, "c5.large");
    assert_eq!(launched.capacity_type, CAPACITY_TYPE_ON_DEMAND);
    assert!(
        launched.provider_id.starts_with(&format!("aws:///{}/i-", launched.zone)),
        "{}",
        launched.provider_id
    );
    assert_eq!(launched.labels[LABEL_INSTANCE_TYPE], "c5.large");
    assert_eq!(launched.labels[LABEL_ARCH], "amd64");
    assert_eq!(launched.labels[LABEL_TOPOLOGY_ZONE], launched.zone);
    assert_eq!(launched.capacity["cpu"].0, "2");
    assert_eq!(launched.capacity["pods"].0, "29");
    assert!(launched.allocatable.contains_key("memory"));
    assert!(launched.annotations.contains_key(ANNOTATION_EC2NODECLASS_HASH));
    assert_eq!(launched.node_claim.as_deref(), Some("default-abcde"));
    assert_eq!(launched.node_pool.as_deref(), Some("default"));
    let class = p.node_classes().get("default").unwrap();
    let status = class.status.as_ref().unwrap();
    assert!(status.amis.iter().any(|a| a.id == launched.image_id));

    // The instance's tags.
    let ec2 = &p.clients().ec2;
    let id = launched.provider_id.rsplit('/').next().unwrap().to_string();
    let described = ec2.describe_instances().instance_ids(&id).send().await.unwrap();
    let inst = &described.reservations()[0].instances()[0];
    let tags: std::collections::BTreeMap<&str, &str> =
        inst.tags().iter().map(|t| (t.key().unwrap(), t.value().unwrap())).collect();
    assert_eq!(tags.get(format!("kubernetes.io/cluster/{cluster}").as_str()), Some(&"owned"));
    assert_eq!(tags.get("eks:eks-cluster-name"), Some(&cluster.as_str()));
    assert_eq!(tags.get("karpenter.sh/nodepool"), Some(&"default"));
    assert_eq!(tags.get("karpenter.sh/nodeclaim"), Some(&"default-abcde"));
    assert_eq!(tags.get("karpenter.k8s.aws/ec2nodeclass"), Some(&"default"));
    assert_eq!(tags.get("team"), Some(&"platform"));

    // The launch template carries what the instance needs.
    let lt_name = inst
        .tags()
        .iter()
        .find(|t| t.key() == Some("aws:ec2launchtemplate:name"))
        .and_then(|t| t.value())
        .map(str::to_string);
    let templates = ec2
        .describe_launch_templates()
        .filters(Filter::builder().name("tag:karpenter.k8s.aws/cluster").values(&cluster).build())
        .send()
        .await
        .unwrap();
    // One template per (AMI, max pods): c5.large and m5.large hold 29 pods, m5.xlarge 58.
    assert_eq!(templates.launch_templates().len(), 2);
    let mut used = None;
    for t in templates.launch_templates() {
        let name = t.launch_template_name().unwrap().to_string();
        assert!(name.starts_with("karpenter.k8s.aws/"));
        let versions =
            ec2.describe_launch_template_versions().launch_template_name(&name).send().await.unwrap();
        let data = versions.launch_template_versions()[0].launch_template_data().unwrap().clone();
        let text = user_data_of(&data);
        if text.contains("maxPods: 29") {
            used = Some((name, data));
        }
    }
    let (name, data) = used.expect("a template for 29 pods");
    if let Some(lt_name) = lt_name {
        assert_eq!(lt_name, name);
    }
    assert_eq!(data.image_id(), Some(launched.image_id.as_str()));
    assert_eq!(data.security_group_ids(), [status.security_groups[0].id.clone()]);
    assert_eq!(data.iam_instance_profile().and_then(|p| p.name()), status.instance_profile.as_deref());
    assert_eq!(data.metadata_options().and_then(|m| m.http_tokens()).map(|t| t.as_str()), Some("required"));
    assert_eq!(data.metadata_options().and_then(|m| m.http_put_response_hop_limit()), Some(1));
    let bdm = &data.block_device_mappings()[0];
    assert_eq!(bdm.device_name(), Some("/dev/xvda"));
    assert_eq!(bdm.ebs().and_then(|e| e.volume_size()), Some(20));
    let user_data = user_data_of(&data);
    assert!(user_data.contains("kind: NodeConfig"), "{user_data}");
    assert!(user_data.contains(&format!("name: {cluster}")), "{user_data}");
    assert!(user_data.contains("cidr: 172.20.0.0/16"), "{user_data}");
    assert!(user_data.contains("- \"172.20.0.10\""), "{user_data}");
    assert!(user_data.contains("maxPods: 29"), "{user_data}");
    assert!(user_data.contains("karpenter.sh/nodepool=default"), "{user_data}");
    assert!(user_data.contains("karpenter.sh/capacity-type=on-demand"), "{user_data}");
    assert!(user_data.contains("key: karpenter.sh/unregistered"), "{user_data}");

    // A retried create finds the instance instead of launching another.
    let again = p.create(&claim).await.unwrap();
    assert_eq!(again.provider_id, launched.provider_id);
    assert_eq!(instances_tagged(&p, "default-abcde").await, vec![id.clone()]);

    // Get and list.
    let got = p.get(&launched.provider_id).await.unwrap();
    assert_eq!((got.instance_type.as_str(), got.image_id.as_str()), ("c5.large", launched.image_id.as_str()));
    assert_eq!(got.capacity, launched.capacity);
    let listed = p.list().await.unwrap();
    assert_eq!(
        listed.iter().map(|i| i.provider_id.as_str()).collect::<Vec<_>>(),
        vec![launched.provider_id.as_str()]
    );

    // Not drifted; then the class stops selecting the AMI.
    let claimed = as_launched(&claim, &launched);
    // The instance has its launch template's security groups, as EC2 gives them.
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), None);
    // Moved to another group behind Karpenter's back: drifted; moved back: not.
    let vpc = ec2.describe_instances().instance_ids(&id).send().await.unwrap().reservations()[0].instances()
        [0]
    .vpc_id()
    .unwrap()
    .to_string();
    let groups = ec2
        .describe_security_groups()
        .filters(aws_sdk_ec2::types::Filter::builder().name("vpc-id").values(&vpc).build())
        .send()
        .await
        .unwrap();
    let other = groups
        .security_groups()
        .iter()
        .filter_map(|g| g.group_id())
        .find(|g| *g != status.security_groups[0].id)
        .expect("another group in the VPC")
        .to_string();
    for (group, drift) in
        [(other.as_str(), Some(DriftReason::SecurityGroup)), (&status.security_groups[0].id, None)]
    {
        ec2.modify_instance_attribute().instance_id(&id).groups(group).send().await.unwrap();
        assert_eq!(p.is_drifted(&claimed).await.unwrap(), drift, "in {group}");
    }
    let mut drifted = (*class).clone();
    drifted.status.as_mut().unwrap().amis.retain(|a| a.id != launched.image_id);
    p.node_classes().upsert(drifted);
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), Some(DriftReason::Ami));
    let mut changed = (*class).clone();
    changed.spec.detailed_monitoring = Some(true);
    p.node_classes().upsert(changed);
    assert_eq!(p.is_drifted(&claimed).await.unwrap(), Some(DriftReason::NodeClass));
    p.node_classes().upsert((*class).clone());

    // Delete terminates once, then reports NotFound.
    p.delete(&claimed).await.unwrap();
    assert!(p.delete(&claimed).await.unwrap_err().is_not_found());
    assert!(p.get(&launched.provider_id).await.unwrap_err().is_not_found());
    assert!(p.list().await.unwrap().is_empty());
    assert!(matches!(
        p.get("aws:///us-west-2a/i-00000000000000000").await,
        Err(CloudProviderError::NotFound(_))
    ));
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn spot_launches_the_cheapest_offering_and_skips_exhausted_ones() {
    let (p, _, faults) = provider_with_faults("spot").await;
    // Prices of the emulator are all equal: set our own.
    for zone in ["us-west-2a", "us-west-2b", "us-west-2c"] {
        p.pricing().update_spot_prices([
            (("m5.large".to_string(), zone.to_string()), 0.05),
            (("c5.large".to_string(), zone.to_string()), if zone == "us-west-2b" { 0.02 } else { 0.03 }),
        ]);
    }
    let first = p.create(&node_claim("spot-1", &["m5.large", "c5.large"], CAPACITY_TYPE_SPOT)).await.unwrap();
    assert_eq!((first.instance_type.as_str(), first.zone.as_str()), ("c5.large", "us-west-2b"));
    assert_eq!(first.capacity_type, CAPACITY_TYPE_SPOT);
    let request = faults.create_fleet_requests().pop().unwrap();
    for expected in [
        "TargetCapacitySpecification.DefaultTargetCapacityType=spot",
        "SpotOptions.AllocationStrategy=price-capacity-optimized",
    ] {
        assert!(request.split('&').any(|p| p == expected), "{expected} missing from {request}");
    }
    let order: Vec<(String, String)> =
        requested_overrides(&request).into_iter().map(|o| (o.instance_type, o.subnet_id)).collect();
    assert_eq!(order.len(), 6);
    assert_eq!(order[0].0, "c5.large");
    assert_eq!(order[3].0, "m5.large");

    // c5.large in us-west-2b runs out: the next launch takes the next cheapest offering.
    let ice = |zone: &str, it: &str| OfferingKey {
        instance_type: it.into(),
        zone: zone.into(),
        capacity_type: CAPACITY_TYPE_SPOT.into(),
    };
    p.unavailable_offerings().mark(ice("us-west-2b", "c5.large"), Scope::Everywhere);
    let second =
        p.create(&node_claim("spot-2", &["m5.large", "c5.large"], CAPACITY_TYPE_SPOT)).await.unwrap();
    assert_eq!((second.instance_type.as_str(), second.zone.as_str()), ("c5.large", "us-west-2a"));

    for zone in ["us-west-2a", "us-west-2c"] {
        p.unavailable_offerings().mark(ice(zone, "c5.large"), Scope::Everywhere);
    }
    let third = p.create(&node_claim("spot-3", &["m5.large", "c5.large"], CAPACITY_TYPE_SPOT)).await.unwrap();
    assert_eq!(third.instance_type, "m5.large");

    for zone in ["us-west-2a", "us-west-2b", "us-west-2c"] {
        p.unavailable_offerings().mark(ice(zone, "m5.large"), Scope::Everywhere);
    }
    let err =
        p.create(&node_claim("spot-4", &["m5.large", "c5.large"], CAPACITY_TYPE_SPOT)).await.unwrap_err();
    assert!(matches!(err, CloudProviderError::InsufficientCapacity { .. }), "{err}");
    assert!(instances_tagged(&p, "spot-4").await.is_empty());

    // Requirements nothing satisfies.
    let err = p.create(&node_claim("none", &["no-such.type"], CAPACITY_TYPE_SPOT)).await.unwrap_err();
    assert!(matches!(err, CloudProviderError::NoCompatibleInstanceTypes { .. }), "{err}");
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn node_class_validation_dry_runs_the_launch_calls() {
    let cluster = unique_cluster("validate");
    seed(&cluster);
    let (p, faults) = provider_with_options(Options::new(&cluster), Arc::new(SystemClock)).await;
    let validation = |status: &karpenter::apis::EC2NodeClassStatus| {
        let c = status.conditions.iter().find(|c| c.type_ == conditions::VALIDATION_SUCCEEDED).unwrap();
        (format!("{:?}", c.status), c.reason.clone(), c.message.clone())
    };
    let ready = |status: &karpenter::apis::EC2NodeClassStatus| {
        let c = status.conditions.iter().find(|c| c.type_ == conditions::READY).unwrap();
        format!("{:?}", c.status)
    };
    let calls = |faults: &FaultInjector| {
        ["CreateLaunchTemplate", "CreateFleet", "RunInstances"].map(|action| faults.attempts(action))
    };
    // The NodePool's requirements choose the type validated.
    let pool: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [{"key": LABEL_INSTANCE_TYPE, "operator": "In", "values": ["c5.large"]}],
        }}},
    }))
    .unwrap();

    // A launch template is created; CreateFleet and RunInstances are dry runs that EC2 allows.
    let mut class = node_class(&cluster, "al2023@latest");
    let resolved = p.resolve_node_class(&class, &[&pool]).await.unwrap();
    assert!(resolved.undecided.is_none(), "{:?}", resolved.undecided);
    assert_eq!(validation(&resolved.status), ("True".into(), "ValidationSucceeded".into(), String::new()));
    assert_eq!(ready(&resolved.status), "True");
    assert_eq!(calls(&faults), [1, 1, 1]);
    assert!(faults.create_fleet_requests().is_empty(), "a dry run is not a launch");
    let templates = p
        .clients()
        .ec2
        .describe_launch_templates()
        .filters(Filter::builder().name("tag:eks:eks-cluster-name").values(&cluster).build())
        .send()
        .await
        .unwrap();
    let template = &templates.launch_templates()[0];
    let tag = |key: &str| template.tags().iter().find(|t| t.key() == Some(key)).and_then(|t| t.value());
    assert_eq!((tag(LABEL_NODEPOOL), tag("karpenter.k8s.aws/ec2nodeclass")), (Some(""), Some("default")));
    assert!(p.list().await.unwrap().is_empty(), "nothing was launched");

    // The verdict is kept while the class stays the same.
    p.resolve_node_class(&class, &[&pool]).await.unwrap();
    assert_eq!(calls(&faults), [1, 1, 1]);

    // A changed class is validated again. One subnet that may launch is enough.
    class.spec.tags.insert("round".into(), "2".into());
    faults.fail("RunInstances", "UnauthorizedOperation", 403, 1);
    let resolved = p.resolve_node_class(&class, &[&pool]).await.unwrap();
    assert_eq!(validation(&resolved.status).0, "True");
    assert_eq!(calls(&faults)[1..], [2, 3]);

    // The controller may not launch in any subnet: the class is not ready, and says why.
    class.spec.tags.insert("round".into(), "3".into());
    faults.fail("RunInstances", "UnauthorizedOperation", 403, 3);
    let resolved = p.resolve_node_class(&class, &[&pool]).await.unwrap();
    assert_eq!(
        validation(&resolved.status),
        (
            "False".into(),
            "RunInstancesAuthCheckFailed".into(),
            "Controller isn't authorized to call ec2:RunInstances: User is not authorized to perform this operation because no identity-based policy allows it".into()
        )
    );
    assert_eq!(ready(&resolved.status), "False");
    class.status = Some(resolved.status);
    p.node_classes().upsert(class.clone());
    let err = p.create(&node_claim("denied", &["c5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap_err();
    assert!(err.to_string().contains("ValidationSucceeded=False"), "{err}");

    class.spec.tags.insert("round".into(), "4".into());
    faults.fail("CreateFleet", "UnauthorizedOperation", 403, 1);
    let resolved = p.resolve_node_class(&class, &[&pool]).await.unwrap();
    assert_eq!(validation(&resolved.status).1, "CreateFleetAuthCheckFailed");

    // Throttled: nothing decided, the last condition stays, and the controller asks again soon.
    class.status = Some(resolved.status);
    class.spec.tags.insert("round".into(), "5".into());
    faults.throttle("CreateFleet", 1);
    let resolved = p.resolve_node_class(&class, &[&pool]).await.unwrap();
    assert!(matches!(resolved.undecided, Some((_, true))), "{:?}", resolved.undecided);
    assert_eq!(validation(&resolved.status).1, "CreateFleetAuthCheckFailed");
    // Allowed again: True.
    let resolved = p.resolve_node_class(&class, &[&pool]).await.unwrap();
    assert_eq!(validation(&resolved.status).0, "True");

    // With DISABLE_DRY_RUN, no call is made.
    let mut options = Options::new(&cluster);
    options.disable_dry_run = true;
    let (quiet, quiet_faults) = provider_with_options(options, Arc::new(SystemClock)).await;
    let resolved = quiet.resolve_node_class(&node_class(&cluster, "al2023@latest"), &[]).await.unwrap();
    assert_eq!(validation(&resolved.status).0, "True");
    assert_eq!(calls(&quiet_faults), [0, 0, 0]);
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn the_v1_14_networking_fields_reach_the_launch() {
    let (p, _cluster, faults) = provider_with_faults("netfields").await;
    let mut class = (*p.node_classes().get("default").unwrap()).clone();
    class.spec.ip_prefix_count = Some(2);
    class.spec.connection_tracking =
        Some(serde_json::from_value(json!({"tcpEstablishedTimeout": 3600, "udpTimeout": 45})).unwrap());
    class.spec.context = Some("cr-0123456789abcdef0".into());
    class.spec.block_device_mappings = vec![serde_json::from_value(json!({
        "deviceName": "/dev/xvda", "rootVolume": true,
        "ebs": {"snapshotID": "snap-0123456789abcdef0", "volumeInitializationRate": 200, "volumeSize": "40Gi", "volumeType": "gp3"},
    }))
    .unwrap()];
    p.node_classes().upsert(class.clone());
    let launched = p.create(&node_claim("netfields", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();

    // The fleet request carries the context.
    let requests = faults.create_fleet_requests();
    assert!(requests.last().unwrap().contains("Context=cr-0123456789abcdef0"), "{requests:?}");
    // The template's primary interface has the prefixes, the timeouts and the security groups.
    let ec2 = &p.clients().ec2;
    let id = launched.provider_id.rsplit('/').next().unwrap().to_string();
    let described = ec2.describe_instances().instance_ids(&id).send().await.unwrap();
    let inst = &described.reservations()[0].instances()[0];
    let template =
        inst.tags().iter().find(|t| t.key() == Some("aws:ec2launchtemplate:id")).and_then(|t| t.value());
    let versions = match template {
        Some(id) => ec2.describe_launch_template_versions().launch_template_id(id),
        None => {
            let name = faults
                .create_fleet_requests()
                .last()
                .map(|b| requested_overrides(b)[0].launch_template.clone())
                .unwrap();
            ec2.describe_launch_template_versions().launch_template_name(name)
        }
    }
    .send()
    .await
    .unwrap();
    let data = versions.launch_template_versions()[0].launch_template_data().unwrap();
    let nic = &data.network_interfaces()[0];
    assert_eq!((nic.device_index(), nic.ipv4_prefix_count()), (Some(0), Some(2)));
    let tracking = nic.connection_tracking_specification().unwrap();
    assert_eq!((tracking.tcp_established_timeout(), tracking.udp_timeout()), (Some(3600), Some(45)));
    let class_groups: Vec<String> =
        class.status.as_ref().unwrap().security_groups.iter().map(|g| g.id.clone()).collect();
    assert_eq!(nic.groups(), class_groups.as_slice());
    let ebs = data.block_device_mappings()[0].ebs().unwrap();
    assert_eq!(
        (ebs.volume_initialization_rate(), ebs.snapshot_id()),
        (Some(200), Some("snap-0123456789abcdef0"))
    );
    // The instance is in the class's security groups, so it is not drifted.
    let groups: Vec<String> =
        inst.security_groups().iter().filter_map(|g| g.group_id().map(str::to_string)).collect();
    assert_eq!(groups, class_groups);

    // Nested virtualization: only the types that support it, turned on in the template.
    class.spec.cpu_options =
        Some(serde_json::from_value(json!({"nestedVirtualization": "enabled"})).unwrap());
    p.node_classes().upsert(class.clone());
    let nested =
        p.create(&node_claim("nested", &["m5.large", "c7i.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    assert_eq!(nested.instance_type, "c7i.large", "m5.large has no nested virtualization");
    let id = nested.provider_id.rsplit('/').next().unwrap().to_string();
    let described = ec2.describe_instances().instance_ids(&id).send().await.unwrap();
    let cpu = described.reservations()[0].instances()[0].cpu_options().cloned();
    assert_eq!(
        cpu.and_then(|c| c.nested_virtualization().cloned()),
        Some(aws_sdk_ec2::types::NestedVirtualizationSpecification::Enabled)
    );
}

/// The network interfaces of the launch template the instance launched from `launched` was
/// made from (the fleet's last request names it).
async fn launched_interfaces(
    p: &AwsCloudProvider,
    faults: &FaultInjector,
) -> Vec<aws_sdk_ec2::types::LaunchTemplateInstanceNetworkInterfaceSpecification> {
    let name = faults
        .create_fleet_requests()
        .last()
        .map(|b| requested_overrides(b)[0].launch_template.clone())
        .unwrap();
    let versions =
        p.clients().ec2.describe_launch_template_versions().launch_template_name(name).send().await.unwrap();
    versions.launch_template_versions()[0].launch_template_data().unwrap().network_interfaces().to_vec()
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn efa_requests_and_configured_interfaces_reach_the_launch() {
    let (p, _cluster, faults) = provider_with_faults("efa").await;
    // A claim that requests EFA gets every EFA interface of its type, one per network card.
    let mut claim = node_claim("efa", &["c6in.32xlarge"], CAPACITY_TYPE_ON_DEMAND);
    claim.spec.resources.as_mut().unwrap().requests.as_mut().unwrap().insert(
        "vpc.amazonaws.com/efa".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("1".into()),
    );
    p.create(&claim).await.unwrap();
    let nics = launched_interfaces(&p, &faults).await;
    let shape: Vec<(Option<i32>, Option<i32>, Option<&str>)> =
        nics.iter().map(|n| (n.network_card_index(), n.device_index(), n.interface_type())).collect();
    assert_eq!(shape, [(Some(0), Some(0), Some("efa")), (Some(1), Some(1), Some("efa"))]);

    // A class that configures interfaces launches with them: the primary, and an EFA-only one
    // on the second card without IP networking.
    let mut class = (*p.node_classes().get("default").unwrap()).clone();
    class.spec.network_interfaces = serde_json::from_value(json!([
        {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
        {"networkCardIndex": 1, "deviceIndex": 0, "interfaceType": "efa-only"}]))
    .unwrap();
    class.spec.ip_prefix_count = Some(1);
    p.node_classes().upsert(class.clone());
    let types = p.instance_types_for_class(&class).await.unwrap();
    assert!(types.iter().any(|t| t.name == "c6in.32xlarge"));
    assert!(!types.iter().any(|t| t.name == "m5.large"), "one network card: no EFA-only interface on card 1");
    let efa = types.iter().find(|t| t.name == "c6in.32xlarge").unwrap();
    assert_eq!(efa.capacity.get("vpc.amazonaws.com/efa"), 1, "the class's EFA-only interfaces");
    p.create(&node_claim("efa-only", &["c6in.32xlarge"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let nics = launched_interfaces(&p, &faults).await;
    assert_eq!(nics.len(), 2);
    assert_eq!((nics[0].interface_type(), nics[0].ipv4_prefix_count()), (Some("interface"), Some(1)));
    assert_eq!((nics[1].network_card_index(), nics[1].interface_type()), (Some(1), Some("efa-only")));
    assert_eq!(nics[1].ipv4_prefix_count(), None);
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn an_ipv6_cluster_launches_with_ipv6_addresses_and_prefixes() {
    let cluster = unique_cluster("ipv6");
    seed(&cluster);
    let mut options = Options::new(&cluster);
    options.disable_dry_run = true;
    options.kube_dns_ip = Some("fd00:ec2::a".into());
    let (p, faults) = provider_with_options(options, Arc::new(SystemClock)).await;
    assert!(p.cluster().is_ipv6());
    let mut class = node_class(&cluster, "al2023@latest");
    class.spec.ip_prefix_count = Some(1);
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    p.node_classes().upsert(class);
    p.create(&node_claim("ipv6", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let nics = launched_interfaces(&p, &faults).await;
    let primary = &nics[0];
    assert_eq!(
        (primary.device_index(), primary.primary_ipv6(), primary.ipv6_address_count()),
        (Some(0), Some(true), Some(1))
    );
    assert_eq!((primary.ipv6_prefix_count(), primary.ipv4_prefix_count()), (Some(1), None));
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn a_claim_that_requires_dedicated_tenancy_launches_dedicated() {
    let (p, _cluster) = provider("tenancy").await;
    let mut claim = node_claim("dedicated", &["m5.large"], CAPACITY_TYPE_ON_DEMAND);
    claim.spec.requirements.push(
        serde_json::from_value(
            json!({"key": LABEL_INSTANCE_TENANCY, "operator": "In", "values": ["dedicated"]}),
        )
        .unwrap(),
    );
    let dedicated = p.create(&claim).await.unwrap();
    assert_eq!(dedicated.labels.get(LABEL_INSTANCE_TENANCY).map(String::as_str), Some("dedicated"));
    let shared = p.create(&node_claim("shared", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    assert_eq!(shared.labels.get(LABEL_INSTANCE_TENANCY).map(String::as_str), Some("default"));
    // Each from its own launch template: the dedicated one asks EC2 for dedicated tenancy.
    let templates = p
        .clients()
        .ec2
        .describe_launch_templates()
        .filters(Filter::builder().name("tag:eks:eks-cluster-name").values(&p.cluster().name).build())
        .send()
        .await
        .unwrap();
    let mut tenancies = Vec::new();
    for t in templates.launch_templates() {
        let versions = p
            .clients()
            .ec2
            .describe_launch_template_versions()
            .launch_template_id(t.launch_template_id().unwrap())
            .send()
            .await
            .unwrap();
        let data = versions.launch_template_versions()[0].launch_template_data().unwrap();
        tenancies.push(data.placement().and_then(|p| p.tenancy()).map(|t| t.as_str().to_string()));
    }
    tenancies.sort();
    assert_eq!(tenancies, vec![None, Some("dedicated".to_string())]);
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn create_needs_a_ready_node_class() {
    let cluster = unique_cluster("notready");
    seed(&cluster);
    let p = AwsCloudProvider::new(clients().await, Options::new(&cluster)).await.unwrap();
    let claim = node_claim("c", &["m5.large"], CAPACITY_TYPE_ON_DEMAND);
    assert!(matches!(p.create(&claim).await, Err(CloudProviderError::NodeClassNotReady { .. })));
    let mut class = node_class(&cluster, "al2023@latest");
    class.spec.subnet_selector_terms[0].tags =
        Some([("karpenter.sh/discovery".to_string(), "nobody".to_string())].into());
    class.status = Some(p.resolve_node_class(&class, &[]).await.unwrap().status);
    p.node_classes().upsert(class);
    let err = p.create(&claim).await.unwrap_err();
    assert!(err.to_string().contains("SubnetsReady=False"), "{err}");
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn insufficient_capacity_moves_on_to_the_next_offering() {
    let (p, cluster, faults) = provider_with_faults("ice").await;

    // c5.large is the cheapest, but EC2 has none.
    faults.fail_instance_type("c5.large");
    let claim = node_claim("ice-1", &["m5.large", "c5.large"], CAPACITY_TYPE_ON_DEMAND);
    let err = p.create(&claim).await.unwrap_err();
    let CloudProviderError::InsufficientCapacity { offerings } = &err else { panic!("{err}") };
    assert_eq!(offerings.iter().filter(|o| o.instance_type == "c5.large").count(), 3, "{err}");
    assert_eq!(faults.injected(), 1);
    assert!(instances_tagged(&p, "ice-1").await.is_empty(), "nothing was launched");
    for zone in ["us-west-2a", "us-west-2b", "us-west-2c"] {
        let key = OfferingKey {
            instance_type: "c5.large".into(),
            zone: zone.into(),
            capacity_type: CAPACITY_TYPE_ON_DEMAND.into(),
        };
        assert!(p.unavailable_offerings().marked(&key, Scope::Everywhere));
    }

    // The retry (as the lifecycle controller would) launches the next cheapest type.
    let launched = p.create(&claim).await.unwrap();
    assert_eq!(launched.instance_type, "m5.large");
    assert_eq!(faults.injected(), 1);
    assert_eq!(instances_tagged(&p, "ice-1").await.len(), 1);

    // What was asked of EC2: cheapest first, one override per (type, zone subnet).
    let requests = faults.create_fleet_requests();
    assert_eq!(requests.len(), 2);
    let first = requested_overrides(&requests[0]);
    let types: Vec<&str> = first.iter().map(|o| o.instance_type.as_str()).collect();
    assert_eq!(types, vec!["c5.large", "c5.large", "c5.large", "m5.large", "m5.large", "m5.large"]);
    let subnets: BTreeSet<&str> = first.iter().map(|o| o.subnet_id.as_str()).collect();
    assert_eq!(subnets.len(), 3);
    assert!(first.iter().all(|o| o.launch_template.starts_with("karpenter.k8s.aws/")));
    let second = requested_overrides(&requests[1]);
    assert!(second.iter().all(|o| o.instance_type == "m5.large") && second.len() == 3, "{second:?}");
    for expected in [
        "Type=instant",
        "TargetCapacitySpecification.TotalTargetCapacity=1",
        "TargetCapacitySpecification.DefaultTargetCapacityType=on-demand",
        "OnDemandOptions.AllocationStrategy=lowest-price",
        "TagSpecification.1.ResourceType=instance",
        "TagSpecification.2.ResourceType=volume",
        "TagSpecification.3.ResourceType=fleet",
    ] {
        assert!(requests[1].split('&').any(|p| p == expected), "{expected} missing from {}", requests[1]);
    }
    assert!(requests[1].contains("karpenter.sh%2Fnodeclaim"), "{}", requests[1]);
    // EC2 tagged the fleet as asked (the first request never reached it: the fault injector
    // answered it).
    let fleets_tagged = |key: &'static str, value: String| {
        let ec2 = p.clients().ec2.clone();
        async move {
            let out = ec2
                .describe_tags()
                .filters(Filter::builder().name("resource-type").values("fleet").build())
                .filters(Filter::builder().name("key").values(key).build())
                .filters(Filter::builder().name("value").values(value).build())
                .send()
                .await
                .unwrap();
            out.tags().iter().filter_map(|t| t.resource_id()).map(str::to_string).collect::<BTreeSet<_>>()
        }
    };
    let of_cluster = fleets_tagged("eks:eks-cluster-name", cluster.clone()).await;
    assert_eq!(of_cluster.len(), 1, "{of_cluster:?}");
    assert!(of_cluster.is_subset(&fleets_tagged("karpenter.sh/nodeclaim", "ice-1".to_string()).await));
}

/// The names of the launch templates Karpenter created for `cluster`.
async fn launch_templates_of(p: &AwsCloudProvider, cluster: &str) -> BTreeSet<String> {
    let out = p
        .clients()
        .ec2
        .describe_launch_templates()
        .filters(Filter::builder().name("tag:karpenter.k8s.aws/cluster").values(cluster).build())
        .send()
        .await
        .unwrap();
    out.launch_templates().iter().filter_map(|t| t.launch_template_name()).map(str::to_string).collect()
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn a_launch_template_deleted_behind_our_back_is_created_again() {
    let (p, cluster, faults) = provider_with_faults("ltgone").await;
    p.create(&node_claim("ltgone-1", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let templates = launch_templates_of(&p, &cluster).await;
    assert_eq!(templates.len(), 1, "{templates:?}");
    // Tagged for IAM policies scoped to the cluster's and a NodePool's resources.
    let name = templates.first().unwrap();
    let described =
        p.clients().ec2.describe_launch_templates().launch_template_names(name).send().await.unwrap();
    let template = &described.launch_templates()[0];
    let tags: BTreeSet<(&str, &str)> = template
        .tags()
        .iter()
        .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
        .collect();
    let owned = format!("kubernetes.io/cluster/{cluster}");
    for want in [
        (owned.as_str(), "owned"),
        ("eks:eks-cluster-name", cluster.as_str()),
        ("karpenter.sh/nodepool", "default"),
        ("karpenter.k8s.aws/ec2nodeclass", "default"),
        ("karpenter.k8s.aws/cluster", cluster.as_str()),
    ] {
        assert!(tags.contains(&want), "{want:?} missing from {tags:?}");
    }
    for name in &templates {
        p.clients().ec2.delete_launch_template().launch_template_name(name).send().await.unwrap();
    }

    // The cache still vouches for the template: CreateFleet names it and EC2 rejects the whole
    // request. Nothing is launched, and the template is forgotten.
    let claim = node_claim("ltgone-2", &["m5.large"], CAPACITY_TYPE_ON_DEMAND);
    let err = p.create(&claim).await.unwrap_err();
    assert_eq!(err.api_code(), Some("InvalidLaunchTemplateName.NotFoundException"), "{err}");
    assert!(instances_tagged(&p, "ltgone-2").await.is_empty());
    assert_eq!(faults.attempts("CreateFleet"), 2);

    // The lifecycle's next attempt creates the template again and launches.
    let launched = p.create(&claim).await.unwrap();
    assert_eq!(instances_tagged(&p, "ltgone-2").await.len(), 1);
    assert_eq!(launch_templates_of(&p, &cluster).await, templates, "the same content, the same name");
    assert_eq!(launched.instance_type, "m5.large");
}

/// A provider for `cluster` (seeded already) whose caches `clock` times.
async fn provider_with_clock(cluster: &str, clock: &ManualClock) -> AwsCloudProvider {
    provider_for(cluster, Arc::new(clock.clone())).await.0
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn launch_templates_unused_for_their_ttl_are_deleted() {
    let cluster = unique_cluster("ltttl");
    seed(&cluster);
    let clock = ManualClock::default();
    let p = provider_with_clock(&cluster, &clock).await;
    let minutes = |n: u64| Duration::from_secs(60 * n);
    assert_eq!(LAUNCH_TEMPLATE_TTL, minutes(60));

    // Two templates: m5.large holds 29 pods, m5.xlarge 58.
    p.create(&node_claim("ltttl-1", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let first = launch_templates_of(&p, &cluster).await;
    p.create(&node_claim("ltttl-2", &["m5.xlarge"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let both = launch_templates_of(&p, &cluster).await;
    assert_eq!((first.len(), both.len()), (1, 2));
    let unused: BTreeSet<String> = both.difference(&first).cloned().collect();
    assert!(p.delete_unused_launch_templates().await.unwrap().is_empty(), "nothing expired yet");

    // The m5.large template is used again within the TTL; the other is not.
    clock.advance(minutes(40));
    p.create(&node_claim("ltttl-3", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    clock.advance(minutes(30));
    let deleted: BTreeSet<String> = p.delete_unused_launch_templates().await.unwrap().into_iter().collect();
    assert_eq!(deleted, unused);
    assert_eq!(launch_templates_of(&p, &cluster).await, first, "the template in use survives");
    assert!(p.delete_unused_launch_templates().await.unwrap().is_empty());

    // A deleted template is created again when a launch needs it.
    p.create(&node_claim("ltttl-4", &["m5.xlarge"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    assert_eq!(launch_templates_of(&p, &cluster).await, both);

    // After a restart, the first sweep takes in the templates the earlier run created; they go
    // once unused for the TTL from then on.
    let restarted_clock = ManualClock::default();
    let restarted = provider_with_clock(&cluster, &restarted_clock).await;
    assert!(restarted.delete_unused_launch_templates().await.unwrap().is_empty());
    restarted_clock.advance(minutes(59));
    assert!(restarted.delete_unused_launch_templates().await.unwrap().is_empty());
    restarted_clock.advance(minutes(1));
    let deleted: BTreeSet<String> =
        restarted.delete_unused_launch_templates().await.unwrap().into_iter().collect();
    assert_eq!(deleted, both);
    assert!(launch_templates_of(&p, &cluster).await.is_empty());
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn garbage_collection_terminates_instances_without_node_claim() {
    let (p, _) = provider("gc").await;
    let keep = p.create(&node_claim("gc-keep", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let lost = p.create(&node_claim("gc-lost", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let claims = [KnownClaim { name: "gc-keep".to_string(), provider_id: None, ..Default::default() }];
    let now = k8s_openapi::jiff::Timestamp::now();
    let instances = p.list().await.unwrap();
    // Within the grace period nothing is collected.
    assert!(collect_instances(&p, &instances, &claims, now, garbagecollection::GRACE).await.is_empty());
    let later = now + Duration::from_secs(31);
    let collected = collect_instances(&p, &instances, &claims, later, garbagecollection::GRACE).await;
    let ids: Vec<&str> = collected.iter().map(|i| i.provider_id.as_str()).collect();
    assert_eq!(ids, [lost.provider_id.as_str()]);
    assert!(p.get(&lost.provider_id).await.unwrap_err().is_not_found());
    assert!(p.get(&keep.provider_id).await.is_ok());
    // A terminated instance is not listed, so not collected twice.
    let instances = p.list().await.unwrap();
    assert!(collect_instances(&p, &instances, &claims, later, garbagecollection::GRACE).await.is_empty());
}

/// A Launched NodeClaim whose instance is gone (terminated outside Karpenter) is deleted; one whose
/// instance runs is kept. Needs the local control plane too.
#[tokio::test]
#[ignore = "needs the AWS emulator and the local control plane: make test"]
async fn garbage_collection_deletes_claims_whose_instance_is_gone() {
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let (p, cluster) = provider("gcclaims").await;
    let client = kube::Client::try_default().await.expect("a kubeconfig for the local control plane");
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let (gone, alive) = (format!("{cluster}-gone"), format!("{cluster}-alive"));
    let mut names = Vec::new();
    for name in [&gone, &alive] {
        let instance = p.create(&node_claim(name, &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
        claims
            .create(&PostParams::default(), &node_claim(name, &["m5.large"], CAPACITY_TYPE_ON_DEMAND))
            .await
            .unwrap();
        let status = json!({"status": {"providerID": instance.provider_id, "conditions": [{"type": "Launched",
            "status": "True", "reason": "Launched", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
        claims.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
        names.push((name.clone(), instance));
    }
    // Someone terminates one instance behind Karpenter's back.
    p.delete(&claims.get(&gone).await.unwrap()).await.unwrap();

    let known: Vec<KnownClaim> = garbagecollection::list_claims(&client)
        .await
        .unwrap()
        .into_iter()
        .filter(|c| names.iter().any(|(n, _)| n == &c.name))
        .collect();
    assert_eq!(known.len(), 2);
    let instances = p.list().await.unwrap();
    let now = k8s_openapi::jiff::Timestamp::now();
    let collected = collect_claims(&client, &p, &known, &instances, now, garbagecollection::GRACE).await;
    assert_eq!(collected, std::slice::from_ref(&gone));
    assert!(claims.get_opt(&gone).await.unwrap().is_none());
    assert!(claims.get_opt(&alive).await.unwrap().is_some());
    // A second round finds nothing more to do.
    let known: Vec<KnownClaim> = known.into_iter().filter(|c| c.name == alive).collect();
    assert!(collect_claims(&client, &p, &known, &instances, now, garbagecollection::GRACE).await.is_empty());
    p.delete(&claims.get(&alive).await.unwrap()).await.unwrap();
    claims.delete(&alive, &Default::default()).await.unwrap();
}

/// A second instance tagged for a NodeClaim that records another instance is a duplicate (a
/// launch repeated after its result was lost): it is collected, the recorded one stays.
#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn garbage_collection_terminates_a_duplicate_of_a_live_claim() {
    let (p, cluster) = provider("gcdup").await;
    let kept = p.create(&node_claim("gc-dup", &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    let image = p.get(&kept.provider_id).await.unwrap().image_id;
    let tag = |k: &str, v: &str| aws_sdk_ec2::types::Tag::builder().key(k).value(v).build();
    let duplicate = p
        .clients()
        .ec2
        .run_instances()
        .image_id(image)
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .tag_specifications(
            aws_sdk_ec2::types::TagSpecification::builder()
                .resource_type(aws_sdk_ec2::types::ResourceType::Instance)
                .tags(tag(&format!("kubernetes.io/cluster/{cluster}"), "owned"))
                .tags(tag("karpenter.sh/nodepool", "default"))
                .tags(tag("karpenter.sh/nodeclaim", "gc-dup"))
                .build(),
        )
        .send()
        .await
        .unwrap();
    let duplicate = duplicate.instances()[0].instance_id().unwrap().to_string();
    let later = k8s_openapi::jiff::Timestamp::now() + Duration::from_secs(31);
    let instances = p.list().await.unwrap();
    assert_eq!(instances.iter().filter(|i| i.node_claim.as_deref() == Some("gc-dup")).count(), 2);
    // While the claim records no instance yet (its launch under way), both are its own.
    let launching = [KnownClaim { name: "gc-dup".to_string(), provider_id: None, ..Default::default() }];
    assert!(collect_instances(&p, &instances, &launching, later, garbagecollection::GRACE).await.is_empty());
    // Once it records one, the other is a duplicate.
    let recorded = [KnownClaim {
        name: "gc-dup".to_string(),
        provider_id: Some(kept.provider_id.clone()),
        ..Default::default()
    }];
    let collected = collect_instances(&p, &instances, &recorded, later, garbagecollection::GRACE).await;
    let ids: Vec<&str> = collected.iter().map(|i| i.provider_id.as_str()).collect();
    assert_eq!(ids.len(), 1);
    assert!(ids[0].ends_with(&duplicate), "{ids:?} is {duplicate}");
    assert!(p.get(&kept.provider_id).await.is_ok());
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn throttling_and_server_errors_are_retried_with_backoff() {
    let (p, _, faults) = provider_with_faults("throttle").await;
    let before = faults.attempts("DescribeInstances");

    // Two throttled answers, then the real one: the SDK's standard retry mode gets through.
    faults.throttle("DescribeInstances", 2);
    p.list().await.unwrap();
    assert_eq!(faults.attempts("DescribeInstances") - before, 3, "two retries");

    // The same for server errors.
    faults.fail_with_server_error("DescribeInstances", 2);
    p.list().await.unwrap();
    assert_eq!(faults.attempts("DescribeInstances") - before, 6, "two more retries");

    // Beyond the retries: a clear error naming the call and EC2's code, no panic.
    faults.throttle("DescribeInstances", 3);
    let err = p.list().await.unwrap_err();
    let chain = karpenter::util::error_chain(&err);
    assert!(chain.contains("DescribeInstances") && chain.contains("RequestLimitExceeded"), "{chain}");
    assert_eq!(faults.attempts("DescribeInstances") - before, 9, "three attempts in all");
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn a_launch_whose_answer_is_lost_is_adopted_not_repeated() {
    let (p, _, faults) = provider_with_faults("lost").await;

    // EC2 launches the instance, but its answer never arrives.
    let claim = node_claim("lost-1", &["m5.large"], CAPACITY_TYPE_ON_DEMAND);
    faults.lose_next_answer("CreateFleet");
    let err = p.create(&claim).await.unwrap_err();
    assert!(karpenter::util::error_chain(&err).contains("CreateFleet"), "{err}");
    assert_eq!(faults.attempts("CreateFleet"), 1, "CreateFleet is not retried blindly");
    let launched = instances_tagged(&p, "lost-1").await;
    assert_eq!(launched.len(), 1, "EC2 did launch it");

    // The lifecycle's next attempt adopts that instance instead of launching another.
    let adopted = p.create(&claim).await.unwrap();
    assert!(adopted.provider_id.ends_with(&format!("/{}", launched[0])), "{}", adopted.provider_id);
    assert_eq!(faults.attempts("CreateFleet"), 1);
    assert_eq!(instances_tagged(&p, "lost-1").await, launched, "still one instance");

    // A throttled CreateFleet launches nothing; the next attempt launches exactly one.
    let claim = node_claim("lost-2", &["m5.large"], CAPACITY_TYPE_ON_DEMAND);
    faults.throttle("CreateFleet", 1);
    let err = p.create(&claim).await.unwrap_err();
    assert!(karpenter::util::error_chain(&err).contains("RequestLimitExceeded"), "{err}");
    assert!(instances_tagged(&p, "lost-2").await.is_empty());
    p.create(&claim).await.unwrap();
    assert_eq!(instances_tagged(&p, "lost-2").await.len(), 1);
}

/// As [`provider_with_faults`], with a clock the test moves.
async fn provider_with_faults_and_clock(prefix: &str) -> (AwsCloudProvider, FaultInjector, ManualClock) {
    let cluster = unique_cluster(prefix);
    seed(&cluster);
    let clock = ManualClock::default();
    let (p, faults) = provider_for(&cluster, Arc::new(clock.clone())).await;
    (p, faults, clock)
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn an_exhausted_offering_comes_back_after_three_minutes() {
    let (p, faults, clock) = provider_with_faults_and_clock("ice-ttl").await;
    faults.fail_instance_type("c5.large");
    let types = ["m5.large", "c5.large"];
    assert!(p.create(&node_claim("ttl-1", &types, CAPACITY_TYPE_ON_DEMAND)).await.is_err());
    // EC2 has c5.large again, but the offering stays out until its entry expires.
    faults.heal_instance_type("c5.large");
    let second = p.create(&node_claim("ttl-2", &types, CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    assert_eq!(second.instance_type, "m5.large");
    clock.advance(Duration::from_secs(179));
    let third = p.create(&node_claim("ttl-3", &types, CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    assert_eq!(third.instance_type, "m5.large", "still within the three minutes");
    clock.advance(Duration::from_secs(2));
    let fourth = p.create(&node_claim("ttl-4", &types, CAPACITY_TYPE_ON_DEMAND)).await.unwrap();
    assert_eq!(fourth.instance_type, "c5.large", "the cheapest offering is back");
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn refreshes_keep_the_last_good_data() {
    let (p, faults, _) = provider_with_faults_and_clock("refresh").await;
    // Spot prices come from the spot price history.
    assert!(p.refresh_spot_prices().await.unwrap() > 0);
    assert!(p.pricing().price("m5.large", "us-west-2a", CAPACITY_TYPE_SPOT).is_some());
    // The emulator has no Pricing API: the refresh fails, promptly, and the table stays.
    let on_demand = tokio::time::timeout(Duration::from_secs(60), p.refresh_on_demand_prices())
        .await
        .expect("the Pricing API call gives up");
    assert!(on_demand.is_err(), "{on_demand:?}");
    assert_eq!(p.pricing().on_demand_price("m5.large"), Some(0.096));
    // A catalog fetch that fails keeps the catalog fetched before.
    let known = p.refresh_catalog().await.unwrap();
    assert!(known > 0);
    faults.fail_with_server_error("DescribeInstanceTypes", 10);
    assert!(p.refresh_catalog().await.is_err());
    let pool: NodePool = serde_json::from_value(json!({
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
        "spec": {"template": {"spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [],
        }}}
    }))
    .unwrap();
    let types = p.instance_types(&pool).await.unwrap();
    assert!(types.iter().any(|t| t.name == "m5.large"));
    assert!(faults.attempts("DescribeInstanceTypes") >= 2);
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn configured_endpoint_and_ca_need_no_eks_cluster() {
    // No EKS cluster of this name exists.
    let cluster = unique_cluster("no-eks");
    let mut options = Options::new(&cluster);
    let err = AwsCloudProvider::new(clients().await, options.clone()).await.unwrap_err();
    assert!(err.to_string().contains("DescribeCluster"), "{err}");
    options.cluster_endpoint = Some("https://api.example.test".to_string());
    assert!(
        AwsCloudProvider::new(clients().await, options.clone()).await.is_err(),
        "the CA is still missing"
    );
    options.cluster_ca_bundle = Some("Q0EK".to_string());
    options.kubernetes_version = Some("1.33".to_string());
    let p = AwsCloudProvider::new(clients().await, options).await.unwrap();
    assert_eq!(p.cluster().endpoint, "https://api.example.test");
    assert_eq!(p.cluster().ca_bundle, "Q0EK");
    assert_eq!(p.cluster().version, "1.33");
    assert_eq!(p.cluster().service_cidr, None);

    // With an EKS cluster, the settings still win over what EKS says.
    let seeded = unique_cluster("eks");
    seed(&seeded);
    let mut options = Options::new(&seeded);
    let from_eks = AwsCloudProvider::new(clients().await, options.clone()).await.unwrap();
    assert!(from_eks.cluster().endpoint.starts_with("https://") && !from_eks.cluster().ca_bundle.is_empty());
    assert!(from_eks.cluster().service_cidr.is_some());
    options.cluster_ca_bundle = Some("Q0EK".to_string());
    let p = AwsCloudProvider::new(clients().await, options).await.unwrap();
    assert_eq!(p.cluster().ca_bundle, "Q0EK");
    assert_eq!(p.cluster().endpoint, from_eks.cluster().endpoint);
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn the_instance_profile_follows_the_role() {
    let (p, cluster) = provider("profile").await;
    let iam = &p.clients().iam;
    let other = format!("other-{cluster}");
    let trust = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Service":"ec2.amazonaws.com"},"Action":"sts:AssumeRole"}]}"#;
    let created =
        iam.create_role().role_name(&other).assume_role_policy_document(trust).send().await.unwrap();
    let other_arn = created.role().unwrap().arn().to_string();

    let mut class = node_class(&cluster, "al2023@latest");
    let status = p.resolve_node_class(&class, &[]).await.unwrap().status;
    let name = status.instance_profile.clone().unwrap();
    let profile = |name: String| async move {
        iam.get_instance_profile().instance_profile_name(name).send().await.unwrap().instance_profile.unwrap()
    };
    let first = profile(name.clone()).await;
    let roles: Vec<&str> = first.roles().iter().map(|r| r.role_name()).collect();
    assert_eq!(roles, [format!("KarpenterNodeRole-{cluster}")]);
    let tags: BTreeSet<(String, String)> =
        first.tags().iter().map(|t| (t.key().to_string(), t.value().to_string())).collect();
    for (k, v) in [
        (format!("kubernetes.io/cluster/{cluster}"), "owned".to_string()),
        ("karpenter.sh/managed-by".to_string(), cluster.clone()),
        ("karpenter.k8s.aws/ec2nodeclass".to_string(), "default".to_string()),
        ("topology.kubernetes.io/region".to_string(), region()),
    ] {
        assert!(tags.contains(&(k.clone(), v.clone())), "{k}={v} missing from {tags:?}");
    }

    // The class now names another role, by ARN: the same profile carries that role alone.
    class.spec.role = Some(other_arn);
    let status = p.resolve_node_class(&class, &[]).await.unwrap().status;
    assert_eq!(status.instance_profile.as_deref(), Some(name.as_str()));
    let second = profile(name.clone()).await;
    let roles: Vec<&str> = second.roles().iter().map(|r| r.role_name()).collect();
    assert_eq!(roles, [other.as_str()]);
}

#[tokio::test]
#[ignore = "needs the AWS emulator: make test"]
async fn concurrent_launches_create_one_launch_template() {
    let (p, cluster) = provider("ltrace").await;
    let claims: Vec<NodeClaim> =
        (0..4).map(|i| node_claim(&format!("ltrace-{i}"), &["m5.large"], CAPACITY_TYPE_ON_DEMAND)).collect();
    let launches = futures::future::join_all(claims.iter().map(|c| p.create(c))).await;
    assert!(launches.iter().all(Result::is_ok), "{launches:?}");
    let described = p
        .clients()
        .ec2
        .describe_launch_templates()
        .filters(Filter::builder().name("tag:karpenter.k8s.aws/cluster").values(&cluster).build())
        .send()
        .await
        .unwrap();
    assert_eq!(described.launch_templates().len(), 1, "{:?}", described.launch_templates());
    // Deleting the class's templates goes by ID and finds nothing left behind.
    let deleted = p.delete_launch_templates("default").await.unwrap();
    assert_eq!(deleted.len(), 1);
    assert!(launch_templates_of(&p, &cluster).await.is_empty());
}
