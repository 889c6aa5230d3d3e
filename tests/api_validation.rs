//! The CRDs, installed into a real kube-apiserver, accept the examples and reject what upstream
//! Karpenter rejects, with a message naming the field.
//!
//! These tests need the local control plane (`make test` starts it and runs them); on their own
//! they are ignored: `eval "$(make -s cluster-up)" && cargo test -- --ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use karpenter::apis::{EC2NodeClass, NodeClaim, NodeOverlay, NodePool, crds};
use kube::api::{Api, DeleteParams, PostParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::OnceCell;

static CRDS_INSTALLED: OnceCell<()> = OnceCell::const_new();

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

async fn client() -> Client {
    let client = Client::try_default()
        .await
        .expect("a kubeconfig for the local control plane (run through `make test`, or eval \"$(make -s cluster-up)\")");
    CRDS_INSTALLED
        .get_or_init(|| async {
            crds::install(&client, "karpenter-rs-tests", Duration::from_secs(30))
                .await
                .expect("CRDs installed");
        })
        .await;
    client
}

/// Reads an example and renames it uniquely, so that tests never collide with each other or with
/// objects already in the cluster (e.g. from `make demo`).
fn example<K: Resource + DeserializeOwned>(file: &str) -> K {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let text = std::fs::read_to_string(repo().join("examples").join(file)).unwrap();
    let mut obj: K = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("examples/{file}: {e}"));
    let name = obj.meta().name.clone().unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    obj.meta_mut().name = Some(format!("{name}-test-{}-{n}", std::process::id()));
    obj
}

fn dry_run() -> PostParams {
    PostParams { dry_run: true, field_manager: None }
}

/// Creates `obj` with a server-side dry run and returns the API server's rejection message.
async fn rejection<K>(api: &Api<K>, obj: &K) -> String
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    match api.create(&dry_run(), obj).await {
        Ok(_) => panic!("the API server accepted an invalid object: {obj:?}"),
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "expected 422 Invalid, got {status:?}");
            status.message
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

fn assert_mentions(message: &str, needles: &[&str]) {
    for needle in needles {
        assert!(message.contains(needle), "expected {needle:?} in the rejection:\n{message}");
    }
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn every_example_applies_with_kubectl() {
    client().await;
    let output = Command::new("kubectl")
        .args(["apply", "--dry-run=server", "--recursive", "-f"])
        .arg(repo().join("examples"))
        .output()
        .expect("kubectl on PATH");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kubectl apply failed:\n{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let files = yaml_files(&repo().join("examples"));
    assert!(files >= 6, "the examples are there ({files} files)");
    assert!(stdout.lines().count() >= files, "one object per example file at least:\n{stdout}");
}

/// `karpenter convert` turns v1beta1 NodePools and EC2NodeClasses into v1 objects the API server
/// accepts; bad input is a one-line error and a non-zero exit.
#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn converted_v1beta1_manifests_apply() {
    client().await;
    let karpenter = env!("CARGO_BIN_EXE_karpenter");
    let fixtures = repo().join("tests/fixtures/v1beta1");
    let converted = Command::new(karpenter)
        .args(["convert", "-f"])
        .arg(fixtures.join("default.yaml"))
        .arg("-f")
        .arg(fixtures.join("kubelet.yaml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&converted.stderr);
    assert!(converted.status.success(), "convert: {stderr}");
    let yaml = String::from_utf8(converted.stdout).unwrap();
    assert!(
        yaml.contains("# karpenter convert: spec.kubelet moved here from the template of NodePool(s) batch"),
        "{yaml}"
    );
    let path = std::env::temp_dir().join(format!("converted-{}.yaml", std::process::id()));
    std::fs::write(&path, &yaml).unwrap();
    let applied =
        Command::new("kubectl").args(["apply", "--dry-run=server", "-f"]).arg(&path).output().unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(
        applied.status.success(),
        "the API server accepts the output:\n{}\n{yaml}",
        String::from_utf8_lossy(&applied.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&applied.stdout).lines().count(),
        4,
        "two NodePools, two EC2NodeClasses"
    );

    // Bad input: one line on stderr, a non-zero exit.
    let missing = repo().join("tests/fixtures/v1beta1/missing.yaml");
    let malformed = std::env::temp_dir().join(format!("malformed-{}.yaml", std::process::id()));
    std::fs::write(&malformed, "apiVersion: [").unwrap();
    for (input, expected) in [
        (repo().join("examples/nodepool-general-purpose.yaml"), "is already karpenter.sh/v1"),
        (missing, "reading"),
        (malformed.clone(), "invalid YAML"),
    ] {
        let out = Command::new(karpenter).args(["convert", "-f"]).arg(&input).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: {stderr}", input.display());
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.starts_with("error: ") && stderr.contains(expected), "{stderr}");
    }
    let _ = std::fs::remove_file(&malformed);
}

fn yaml_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            if p.is_dir() { yaml_files(&p) } else { usize::from(p.extension().is_some_and(|x| x == "yaml")) }
        })
        .sum()
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn examples_round_trip_through_the_api_server_with_defaults() {
    let client = client().await;
    let pools: Api<NodePool> = Api::all(client.clone());
    let pool: NodePool = example("nodepool-t3-medium-spot.yaml");
    let created = pools.create(&dry_run(), &pool).await.unwrap();
    assert_eq!(created.spec.template.spec.expire_after, "720h");
    assert_eq!(created.spec.disruption.consolidate_after, "0s");
    assert_eq!(created.spec.disruption.budgets.len(), 1);
    assert_eq!(created.spec.disruption.budgets[0].nodes, "10%");
    assert_eq!(created.spec.limits.unwrap()["cpu"].0, "20");

    let classes: Api<EC2NodeClass> = Api::all(client);
    let class: EC2NodeClass = example("ec2nodeclass.yaml");
    let created = classes.create(&dry_run(), &class).await.unwrap();
    let md = &created.spec.metadata_options;
    assert_eq!(
        (
            md.http_endpoint.as_str(),
            md.http_protocol_ipv6.as_str(),
            md.http_put_response_hop_limit,
            md.http_tokens.as_str()
        ),
        ("enabled", "disabled", 1, "required")
    );
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn nodepool_weight_must_be_between_1_and_100() {
    let api: Api<NodePool> = Api::all(client().await);
    for weight in [0, 101] {
        let mut pool: NodePool = example("nodepool-general-purpose.yaml");
        pool.spec.weight = Some(weight);
        let message = rejection(&api, &pool).await;
        assert_mentions(&message, &["spec.weight"]);
    }
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn gt_takes_a_single_integer() {
    let api: Api<NodePool> = Api::all(client().await);
    for values in [vec!["5", "6"], vec!["five"]] {
        let mut pool: NodePool = example("nodepool-general-purpose.yaml");
        let req = pool
            .spec
            .template
            .spec
            .requirements
            .iter_mut()
            .find(|r| r.key == "karpenter.k8s.aws/instance-generation")
            .unwrap();
        req.values = values.iter().map(|v| v.to_string()).collect();
        let message = rejection(&api, &pool).await;
        assert_mentions(
            &message,
            &["spec.template.spec.requirements", "must have a single positive integer value"],
        );
    }
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn min_values_at_most_50() {
    let api: Api<NodePool> = Api::all(client().await);
    let mut pool: NodePool = example("nodepool-general-purpose.yaml");
    pool.spec.template.spec.requirements[3].min_values = Some(51);
    let message = rejection(&api, &pool).await;
    assert_mentions(&message, &["minValues", "50"]);
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn budget_nodes_percentage_at_most_100() {
    let api: Api<NodePool> = Api::all(client().await);
    let mut pool: NodePool = example("nodepool-spot.yaml");
    pool.spec.disruption.budgets[0].nodes = "150%".into();
    let message = rejection(&api, &pool).await;
    assert_mentions(&message, &["spec.disruption.budgets[0].nodes"]);
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn budget_schedule_needs_a_duration() {
    let api: Api<NodePool> = Api::all(client().await);
    let mut pool: NodePool = example("nodepool-spot.yaml");
    pool.spec.disruption.budgets[1].duration = None;
    let message = rejection(&api, &pool).await;
    assert_mentions(&message, &["spec.disruption.budgets", "'schedule' must be set with 'duration'"]);
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn expire_after_takes_hours_not_days() {
    let api: Api<NodePool> = Api::all(client().await);
    let mut pool: NodePool = example("nodepool-general-purpose.yaml");
    pool.spec.template.spec.expire_after = "1d".into();
    let message = rejection(&api, &pool).await;
    assert_mentions(&message, &["spec.template.spec.expireAfter"]);
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn requirement_keys_in_restricted_domains_are_rejected() {
    let api: Api<NodePool> = Api::all(client().await);
    for (key, message) in [
        ("karpenter.sh/custom", r#"label domain "karpenter.sh" is restricted"#),
        ("karpenter.sh/nodepool", r#"label "karpenter.sh/nodepool" is restricted"#),
        ("kubernetes.io/hostname", r#"label "kubernetes.io/hostname" is restricted"#),
        ("karpenter.k8s.aws/custom", r#"label domain "karpenter.k8s.aws" is restricted"#),
    ] {
        let mut pool: NodePool = example("nodepool-general-purpose.yaml");
        pool.spec.template.spec.requirements[0].key = key.into();
        let rejected = rejection(&api, &pool).await;
        assert_mentions(&rejected, &["spec.template.spec.requirements", message]);
    }
    // Well-known labels and the exception domains stay allowed.
    let mut pool: NodePool = example("nodepool-general-purpose.yaml");
    for (i, key) in [
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "example.com/team",
        "kubernetes.io/custom",
    ]
    .iter()
    .enumerate()
    {
        pool.spec.template.spec.requirements[i].key = key.to_string();
    }
    api.create(&dry_run(), &pool).await.expect("well-known and custom keys are allowed");
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn template_labels_in_restricted_domains_are_rejected() {
    let api: Api<NodePool> = Api::all(client().await);
    let mut pool: NodePool = example("nodepool-spot.yaml");
    pool.spec.template.metadata.as_mut().unwrap().labels.insert("karpenter.sh/custom".into(), "x".into());
    let message = rejection(&api, &pool).await;
    assert_mentions(
        &message,
        &["spec.template.metadata.labels", r#"label domain "karpenter.sh" is restricted"#],
    );
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn ec2nodeclass_needs_exactly_one_of_role_and_instance_profile() {
    let api: Api<EC2NodeClass> = Api::all(client().await);
    let mut neither: EC2NodeClass = example("ec2nodeclass.yaml");
    neither.spec.role = None;
    let mut both: EC2NodeClass = example("ec2nodeclass.yaml");
    both.spec.instance_profile = Some("KarpenterNodeInstanceProfile".into());
    for class in [neither, both] {
        let message = rejection(&api, &class).await;
        assert_mentions(&message, &["spec", "must specify exactly one of ['role', 'instanceProfile']"]);
    }
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn ami_alias_needs_family_and_version() {
    let api: Api<EC2NodeClass> = Api::all(client().await);
    let mut class: EC2NodeClass = example("ec2nodeclass.yaml");
    class.spec.ami_selector_terms[0].alias = Some("al2023".into());
    let message = rejection(&api, &class).await;
    assert_mentions(&message, &["spec.amiSelectorTerms[0].alias", "must match the format 'family@version'"]);

    let mut class: EC2NodeClass = example("ec2nodeclass.yaml");
    class.spec.ami_selector_terms[0].alias = Some("ubuntu@latest".into());
    let message = rejection(&api, &class).await;
    assert_mentions(&message, &["spec.amiSelectorTerms[0].alias", "family is not supported"]);
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn ami_alias_cannot_be_combined_with_an_id_term() {
    let api: Api<EC2NodeClass> = Api::all(client().await);
    let mut class: EC2NodeClass = example("ec2nodeclass.yaml");
    class.spec.ami_selector_terms.push(karpenter::apis::ec2nodeclass::AmiSelectorTerm {
        id: Some("ami-0123456789abcdef0".into()),
        ..Default::default()
    });
    let message = rejection(&api, &class).await;
    assert_mentions(
        &message,
        &[
            "spec.amiSelectorTerms",
            "'alias' is mutually exclusive, cannot be set with a combination of other amiSelectorTerms",
        ],
    );
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn restricted_tags_are_rejected() {
    let api: Api<EC2NodeClass> = Api::all(client().await);
    for key in ["karpenter.sh/nodepool", "eks:eks-cluster-name", "kubernetes.io/cluster/demo"] {
        let mut class: EC2NodeClass = example("ec2nodeclass.yaml");
        class.spec.tags.insert(key.into(), "x".into());
        let message = rejection(&api, &class).await;
        assert_mentions(&message, &["spec.tags", "tag contains a restricted tag matching"]);
    }
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn the_v1_14_networking_fields_are_validated_as_upstream() {
    let api: Api<EC2NodeClass> = Api::all(client().await);
    let with = |patch: serde_json::Value| -> EC2NodeClass {
        let mut value = serde_json::to_value(example::<EC2NodeClass>("ec2nodeclass.yaml")).unwrap();
        value["spec"].as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
        serde_json::from_value(value).unwrap()
    };
    let message = rejection(&api, &with(serde_json::json!({"connectionTracking": {}}))).await;
    assert_mentions(
        &message,
        &[
            "spec.connectionTracking",
            "at least one of tcpEstablishedTimeout, udpStreamTimeout, or udpTimeout must be set",
        ],
    );
    let message = rejection(&api, &with(serde_json::json!({"connectionTracking": {"udpTimeout": 61}}))).await;
    assert_mentions(&message, &["spec.connectionTracking.udpTimeout", "60"]);
    let message = rejection(&api, &with(serde_json::json!({"ipPrefixCount": -1}))).await;
    assert_mentions(&message, &["spec.ipPrefixCount", "0"]);
    let unrestored = serde_json::json!({"blockDeviceMappings": [{"deviceName": "/dev/xvda",
        "ebs": {"volumeSize": "20Gi", "volumeInitializationRate": 200}}]});
    let message = rejection(&api, &with(unrestored)).await;
    assert_mentions(&message, &["snapshotID must be set when volumeInitializationRate is set"]);
    // All of them, well formed, are accepted.
    let mut class = with(serde_json::json!({
        "ipPrefixCount": 2,
        "context": "cr-0123456789abcdef0",
        "connectionTracking": {"tcpEstablishedTimeout": 3600, "udpStreamTimeout": 120, "udpTimeout": 45},
        "blockDeviceMappings": [{"deviceName": "/dev/xvda", "rootVolume": true,
            "ebs": {"snapshotID": "snap-0123456789abcdef0", "volumeInitializationRate": 200, "volumeSize": "20Gi"}}],
    }));
    class.metadata.name = Some(format!("v114-fields-{}", std::process::id()));
    let created = api.create(&kube::api::PostParams::default(), &class).await.unwrap();
    assert_eq!(created.spec.ip_prefix_count, Some(2));
    assert_eq!(created.spec.connection_tracking.as_ref().and_then(|c| c.udp_stream_timeout), Some(120));
    api.delete(&class.metadata.name.clone().unwrap(), &Default::default()).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn network_interfaces_placement_groups_and_cpu_options_are_validated_as_upstream() {
    let api: Api<EC2NodeClass> = Api::all(client().await);
    let with = |patch: serde_json::Value| -> EC2NodeClass {
        let mut value = serde_json::to_value(example::<EC2NodeClass>("ec2nodeclass.yaml")).unwrap();
        value["spec"].as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
        serde_json::from_value(value).unwrap()
    };
    let nic = |card: i32, device: i32, kind: &str| serde_json::json!({"networkCardIndex": card, "deviceIndex": device, "interfaceType": kind});
    let message =
        rejection(&api, &with(serde_json::json!({"networkInterfaces": [nic(1, 0, "efa-only")]}))).await;
    assert_mentions(
        &message,
        &["networkInterfaces must include a primary interface with interfaceType='interface'"],
    );
    let duplicated = serde_json::json!({"networkInterfaces": [nic(0, 0, "interface"), nic(1, 0, "efa-only"), nic(1, 1, "efa-only")]});
    let message = rejection(&api, &with(duplicated)).await;
    assert_mentions(&message, &["can have at most one efa device per network card"]);
    let message = rejection(&api, &with(serde_json::json!({"placementGroupSelector": {}}))).await;
    assert_mentions(&message, &["expected at least one, got none, ['name', 'id']"]);
    let both =
        serde_json::json!({"placementGroupSelector": {"name": "training", "id": "pg-0123456789abcdef0"}});
    assert_mentions(&rejection(&api, &with(both)).await, &["'name' and 'id' are mutually exclusive"]);
    let bad_id = serde_json::json!({"placementGroupSelector": {"id": "training"}});
    assert_mentions(&rejection(&api, &with(bad_id)).await, &["spec.placementGroupSelector.id"]);
    let bad = serde_json::json!({"cpuOptions": {"nestedVirtualization": "on"}});
    assert_mentions(&rejection(&api, &with(bad)).await, &["spec.cpuOptions.nestedVirtualization", "enabled"]);
    // Well formed, accepted.
    let mut class = with(serde_json::json!({
        "networkInterfaces": [nic(0, 0, "interface"), nic(1, 0, "efa-only")],
        "placementGroupSelector": {"name": "training"},
        "cpuOptions": {"nestedVirtualization": "enabled"},
    }));
    class.metadata.name = Some(format!("v114-nics-{}", std::process::id()));
    let created = api.create(&kube::api::PostParams::default(), &class).await.unwrap();
    assert_eq!(created.spec.network_interfaces.len(), 2);
    assert_eq!(created.spec.cpu_options.and_then(|c| c.nested_virtualization).as_deref(), Some("enabled"));
    api.delete(&class.metadata.name.clone().unwrap(), &Default::default()).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn static_nodepools_are_validated_as_upstream() {
    let api: Api<NodePool> = Api::all(client().await);
    let with = |replicas: i64, limits: Option<serde_json::Value>, weight: Option<i32>| -> NodePool {
        let mut pool: NodePool = example("nodepool-general-purpose.yaml");
        pool.spec.replicas = Some(replicas);
        pool.spec.limits = limits.map(|l| serde_json::from_value(l).unwrap());
        pool.spec.weight = weight;
        pool
    };
    let message = rejection(&api, &with(2, Some(serde_json::json!({"cpu": "10"})), None)).await;
    assert_mentions(&message, &["only 'limits.nodes' is supported on static NodePools"]);
    let message = rejection(&api, &with(2, None, Some(10))).await;
    assert_mentions(&message, &["'weight' is not supported on static NodePools"]);
    let message = rejection(&api, &with(-1, None, None)).await;
    assert_mentions(&message, &["spec.replicas"]);
    api.create(&dry_run(), &with(0, Some(serde_json::json!({"nodes": "5"})), None)).await.unwrap();
    // A dynamic NodePool cannot become static.
    let mut pool: NodePool = example("nodepool-general-purpose.yaml");
    pool.spec.limits = None;
    let name = pool.metadata.name.clone().unwrap();
    api.create(&PostParams::default(), &pool).await.unwrap();
    let patch = serde_json::json!({"spec": {"replicas": 2}});
    let refused = api.patch(&name, &Default::default(), &kube::api::Patch::Merge(&patch)).await.unwrap_err();
    api.delete(&name, &DeleteParams::default()).await.unwrap();
    assert_mentions(
        &refused.to_string(),
        &["Cannot transition NodePool between static (replicas set) and dynamic"],
    );
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn nodeoverlays_are_validated_as_upstream() {
    let api: Api<NodeOverlay> = Api::all(client().await);
    let with = |spec: serde_json::Value| -> NodeOverlay {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay",
            "metadata": {"name": format!("overlay-test-{}", std::process::id())},
            "spec": spec,
        }))
        .unwrap()
    };
    let family =
        serde_json::json!([{"key": "karpenter.k8s.aws/instance-family", "operator": "In", "values": ["m5"]}]);
    let cases = [
        (
            serde_json::json!({"requirements": family, "price": "1", "priceAdjustment": "+1"}),
            "cannot set both 'price' and 'priceAdjustment'",
        ),
        (
            serde_json::json!({"requirements": family, "capacity": {"cpu": "4"}}),
            "invalid resource restricted",
        ),
        (serde_json::json!({"requirements": family, "priceAdjustment": "-150%"}), "spec.priceAdjustment"),
        (serde_json::json!({"requirements": family, "price": "-1"}), "spec.price"),
        (serde_json::json!({"requirements": family, "weight": 0}), "spec.weight"),
        (
            serde_json::json!({"requirements": [{"key": "team", "operator": "NotIn"}]}),
            "requirements with operator 'NotIn' must have a value defined",
        ),
        (
            serde_json::json!({"requirements": [{"key": "karpenter.k8s.aws/instance-cpu", "operator": "Gt", "values": ["1", "2"]}]}),
            "must have a single positive integer value",
        ),
        (
            serde_json::json!({"requirements": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]}),
            r#"label "kubernetes.io/hostname" is restricted"#,
        ),
        (
            serde_json::json!({"requirements": [{"key": "karpenter.sh/unknown", "operator": "Exists"}]}),
            r#"label domain "karpenter.sh" is restricted"#,
        ),
    ];
    for (spec, expected) in cases {
        let message = rejection(&api, &with(spec.clone())).await;
        assert_mentions(&message, &[expected]);
    }
    for spec in [
        serde_json::json!({"requirements": [], "priceAdjustment": "-100%", "weight": 10000}),
        serde_json::json!({"requirements": family, "capacity": {"smarter-devices/fuse": 4, "hugepages-2Mi": "100Mi"}}),
    ] {
        api.create(&dry_run(), &with(spec)).await.unwrap();
    }
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn subnet_selector_terms_cannot_be_empty() {
    let api: Api<EC2NodeClass> = Api::all(client().await);
    let mut class: EC2NodeClass = example("ec2nodeclass.yaml");
    class.spec.subnet_selector_terms.clear();
    let message = rejection(&api, &class).await;
    assert_mentions(&message, &["spec.subnetSelectorTerms", "subnetSelectorTerms cannot be empty"]);

    let mut class: EC2NodeClass = example("ec2nodeclass.yaml");
    class.spec.subnet_selector_terms[0].tags = None;
    let message = rejection(&api, &class).await;
    assert_mentions(
        &message,
        &["spec.subnetSelectorTerms", "expected at least one, got none, ['tags', 'id']"],
    );
}

#[tokio::test]
#[ignore = "needs the local control plane: make test"]
async fn nodeclaim_spec_is_immutable() {
    let api: Api<NodeClaim> = Api::all(client().await);
    let name = &format!("immutability-check-{}", std::process::id());
    let claim: NodeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {"name": name},
        "spec": {
            "requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]}],
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}
        }
    }))
    .unwrap();
    let _ = api.delete(name, &DeleteParams::default()).await;
    let created = api.create(&PostParams::default(), &claim).await.expect("create NodeClaim");
    let mut changed = created.clone();
    changed.spec.requirements[0].values = ["m5.xlarge"].into();
    let result = api.replace(name, &PostParams::default(), &changed).await;
    api.delete(name, &DeleteParams::default()).await.expect("clean up");
    match result {
        Err(kube::Error::Api(status)) => assert_mentions(&status.message, &["spec", "spec is immutable"]),
        other => panic!("changing a NodeClaim's spec must be refused, got {other:?}"),
    }
}

#[test]
fn examples_directory_is_where_the_tests_look() {
    assert!(Path::new(&repo().join("examples/inflate.yaml")).exists());
}
