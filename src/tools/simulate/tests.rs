//! End-to-end tests of the simulation through [`run`] and [`simulate`].

use std::path::PathBuf;

use super::*;

const NODEPOOL: &str = "apiVersion: karpenter.sh/v1
kind: NodePool
metadata:
  name: default
spec:
  template:
    spec:
      requirements:
        - key: kubernetes.io/arch
          operator: In
          values: [amd64]
      nodeClassRef:
        group: karpenter.k8s.aws
        kind: EC2NodeClass
        name: default
";

const DEPLOYMENT: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: inflate
spec:
  replicas: 3
  selector: {matchLabels: {app: inflate}}
  template:
    metadata: {labels: {app: inflate}}
    spec:
      containers: [{name: c, resources: {requests: {cpu: '1'}}}]
      affinity:
        podAntiAffinity:
          requiredDuringSchedulingIgnoredDuringExecution:
            - topologyKey: kubernetes.io/hostname
              labelSelector: {matchLabels: {app: inflate}}
";

const HUGE: &str = "apiVersion: v1
kind: Pod
metadata: {name: huge}
spec:
  containers: [{name: c, resources: {requests: {cpu: '500'}}}]
";

fn manifests(docs: &[&str]) -> Manifests {
    let mut m = Manifests::default();
    parse_str(&docs.join("---\n"), "test.yaml", &mut m).expect("input parses");
    m
}

#[test]
fn anti_affinity_deployment_gets_one_claim_per_pod_and_huge_pod_is_unschedulable() {
    let m = manifests(&[NODEPOOL, DEPLOYMENT, HUGE]);
    let (report, warnings) =
        simulate(&m, &crate::cloudprovider::catalog::kwok_instance_types(), BurstableCpu::default())
            .expect("simulates");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(report.node_claims.len(), 3);
    let mut pods: Vec<String> = report.node_claims.iter().flat_map(|c| c.pods.clone()).collect();
    pods.sort();
    assert_eq!(pods, vec!["default/inflate-0", "default/inflate-1", "default/inflate-2"]);
    for c in &report.node_claims {
        assert_eq!(c.node_pool, "default");
        assert_eq!(c.pods.len(), 1);
        assert_eq!(c.instance_type_options.first(), Some(&c.instance_type));
        // 1 vCPU does not fit beside the 100m kubelet reservation: the cheapest is 2 vCPUs, spot.
        assert_eq!(c.instance_type, "c-2x-amd64");
        assert_eq!(c.capacity_type, "spot");
        assert!(c.price_per_hour > 0.0);
        assert!(crate::cloudprovider::catalog::KWOK_ZONES.contains(&c.zone.as_str()));
    }
    let total: f64 = report.node_claims.iter().map(|c| c.price_per_hour).sum();
    assert!((report.total_price_per_hour - total).abs() < 1e-9);
    assert_eq!(report.unschedulable.len(), 1);
    assert_eq!(report.unschedulable[0].pod, "default/huge");
    assert!(!report.unschedulable[0].reasons.is_empty());
    assert!(report.unschedulable[0].reasons[0].contains("default"), "{:?}", report.unschedulable[0].reasons);
}

#[test]
fn pods_fill_existing_nodes_first() {
    let node = "apiVersion: v1
kind: Node
metadata:
  name: node-1
  labels: {kubernetes.io/hostname: node-1, kubernetes.io/arch: amd64, karpenter.sh/nodepool: default}
status:
  allocatable: {cpu: '4', memory: 8Gi, pods: '20'}
";
    let bound = "apiVersion: v1
kind: Pod
metadata: {name: bound}
spec:
  nodeName: node-1
  containers: [{name: c, resources: {requests: {cpu: '2'}}}]
";
    let small = "apiVersion: v1
kind: Pod
metadata: {name: small}
spec:
  containers: [{name: c, resources: {requests: {cpu: '1'}}}]
";
    let m = manifests(&[NODEPOOL, node, bound, small]);
    let (report, _) =
        simulate(&m, &crate::cloudprovider::catalog::kwok_instance_types(), BurstableCpu::default())
            .expect("simulates");
    assert!(report.node_claims.is_empty());
    assert_eq!(report.existing_placements.len(), 1);
    assert_eq!(report.existing_placements[0].node, "node-1");
    assert_eq!(report.existing_placements[0].pods, vec!["default/small"]);
    assert_eq!(report.total_price_per_hour, 0.0);
}

#[test]
fn renders_every_format() {
    let m = manifests(&[NODEPOOL, DEPLOYMENT, HUGE]);
    let (report, _) =
        simulate(&m, &crate::cloudprovider::catalog::kwok_instance_types(), BurstableCpu::default())
            .expect("simulates");
    let table = render(&report, OutputFormat::Table).expect("table");
    assert!(table.starts_with("NODEPOOL"), "{table}");
    assert!(table.contains("UNSCHEDULABLE-POD") && table.contains("TOTAL $/h:"), "{table}");
    let json: serde_json::Value =
        serde_json::from_str(&render(&report, OutputFormat::Json).expect("json")).expect("valid json");
    assert_eq!(json["nodeClaims"].as_array().map(Vec::len), Some(3));
    for key in
        ["nodePool", "instanceType", "instanceTypeOptions", "zone", "capacityType", "pricePerHour", "pods"]
    {
        assert!(json["nodeClaims"][0].get(key).is_some(), "{key}");
    }
    assert_eq!(json["unschedulable"][0]["pod"], "default/huge");
    assert!(json["existingPlacements"].is_array() && json["totalPricePerHour"].is_number());
    let yaml: serde_json::Value =
        serde_saphyr::from_str(&render(&report, OutputFormat::Yaml).expect("yaml")).expect("valid yaml");
    assert_eq!(yaml, json);
}

#[test]
fn runs_the_example_directory() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/simulate");
    let (out, warnings) =
        run(&[dir], &Catalog::Kwok, OutputFormat::Json, BurstableCpu::default()).expect("runs");
    assert!(warnings.is_empty(), "{warnings:?}");
    let json: serde_json::Value = serde_json::from_str(&out).expect("valid json");
    let claims = json["nodeClaims"].as_array().cloned().unwrap_or_default();
    let pods: usize = claims.iter().filter_map(|c| c["pods"].as_array().map(Vec::len)).sum();
    assert_eq!(pods, 9);
    assert!(json["unschedulable"].as_array().is_some_and(Vec::is_empty));
}

#[test]
fn the_aws_catalog_schedules_on_ec2_types() {
    let m = manifests(&[NODEPOOL, DEPLOYMENT]);
    let types = Catalog::Aws.load().expect("the embedded catalog loads");
    let (report, warnings) = simulate(&m, &types, BurstableCpu::default()).expect("simulates");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(report.node_claims.len(), 3);
    assert!(report.unschedulable.is_empty());
    for c in &report.node_claims {
        assert!(crate::cloudprovider::aws::embedded::ZONES.contains(&c.zone.as_str()), "{}", c.zone);
        assert_eq!(c.capacity_type, "spot");
        let it = types.iter().find(|t| t.name == c.instance_type).expect("a catalog type");
        assert!(it.name.contains('.') && it.allocatable().cpu >= 1000, "{}", it.name);
        assert!(c.price_per_hour > 0.0);
    }
}

#[test]
fn volumes_pin_pods_to_their_zone() {
    let volumes = "apiVersion: v1
kind: PersistentVolume
metadata: {name: pv-data}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteOnce]
  csi: {driver: ebs.csi.aws.com, volumeHandle: vol-1}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - {key: topology.kubernetes.io/zone, operator: In, values: [test-zone-b]}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: zonal
  volumeName: pv-data
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: zonal}
provisioner: ebs.csi.aws.com
volumeBindingMode: WaitForFirstConsumer
allowedTopologies:
  - matchLabelExpressions:
      - {key: topology.kubernetes.io/zone, values: [test-zone-c]}
---
apiVersion: storage.k8s.io/v1
kind: CSINode
metadata: {name: node-1}
spec:
  drivers: [{name: ebs.csi.aws.com, nodeID: i-1, allocatable: {count: 25}}]
";
    let pods = "apiVersion: v1
kind: Pod
metadata: {name: db}
spec:
  containers: [{name: c, resources: {requests: {cpu: '1'}}}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: data}}]
---
apiVersion: v1
kind: Pod
metadata: {name: cache}
spec:
  containers: [{name: c, resources: {requests: {cpu: '1'}}}]
  volumes:
    - name: scratch
      ephemeral: {volumeClaimTemplate: {spec: {storageClassName: zonal, accessModes: [ReadWriteOnce]}}}
---
apiVersion: v1
kind: Pod
metadata: {name: orphan}
spec:
  containers: [{name: c, resources: {requests: {cpu: '1'}}}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: gone}}]
";
    let m = manifests(&[NODEPOOL, volumes, pods]);
    let (report, warnings) =
        simulate(&m, &crate::cloudprovider::catalog::kwok_instance_types(), BurstableCpu::default())
            .expect("simulates");
    assert!(warnings.is_empty() && m.warnings.is_empty(), "{warnings:?} {:?}", m.warnings);
    let zone_of = |pod: &str| {
        report.node_claims.iter().find(|c| c.pods.iter().any(|p| p == pod)).map(|c| c.zone.clone())
    };
    assert_eq!(zone_of("default/db").as_deref(), Some("test-zone-b"));
    assert_eq!(zone_of("default/cache").as_deref(), Some("test-zone-c"));
    assert_eq!(report.unschedulable.len(), 1);
    assert_eq!(report.unschedulable[0].pod, "default/orphan");
    assert_eq!(report.unschedulable[0].reasons, vec!["persistentvolumeclaim default/gone not found"]);
    let volumes = crate::state::snapshot::volume_input(&m.snapshot());
    assert_eq!(volumes.attach_limits["node-1"]["ebs.csi.aws.com"], 25);
}

#[test]
fn the_table_summarises_long_pod_lists_and_prices_the_plan_against_its_lower_bound() {
    let small = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: small
spec:
  replicas: 95
  selector: {matchLabels: {app: small}}
  template:
    metadata: {labels: {app: small}}
    spec:
      containers: [{name: c, resources: {requests: {cpu: 100m, memory: 128Mi}}}]
";
    let m = manifests(&[NODEPOOL, small]);
    let (report, _) =
        simulate(&m, &crate::cloudprovider::catalog::kwok_instance_types(), BurstableCpu::default())
            .expect("simulates");
    let table = render(&report, OutputFormat::Table).expect("table");
    let claim = &report.node_claims[0];
    assert!(claim.pods.len() > 5, "{claim:?}");
    let shown =
        format!("{} pods: {} … (+{})", claim.pods.len(), claim.pods[..5].join(", "), claim.pods.len() - 5);
    assert!(table.contains(&shown), "{table}");
    assert!(!table.contains(&claim.pods[5]), "{table}");
    assert!(table.contains("LOWER BOUND $/h:"), "{table}");
    assert!(report.lower_bound_per_hour > 0.0);
    assert!(report.lower_bound_per_hour <= report.total_price_per_hour);
    let ratio = report.price_to_lower_bound.expect("a ratio");
    assert!(ratio >= 1.0, "{ratio}");
    let json: serde_json::Value =
        serde_json::from_str(&render(&report, OutputFormat::Json).expect("json")).expect("valid json");
    let listed: usize = json["nodeClaims"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["pods"].as_array().map(Vec::len))
        .sum();
    assert_eq!(listed, 95);
    assert!(json["lowerBoundPerHour"].is_number() && json["priceToLowerBound"].is_number());
}

#[test]
fn a_plan_with_no_new_nodeclaims_costs_zero_not_minus_zero() {
    let m = manifests(&[NODEPOOL]);
    let (report, _) =
        simulate(&m, &Catalog::Kwok.load().unwrap(), BurstableCpu::default()).expect("simulates");
    assert!(report.total_price_per_hour.is_sign_positive(), "{}", report.total_price_per_hour);
    assert!(report.to_table().contains("TOTAL $/h: 0.0000"), "{}", report.to_table());
}

/// The command plans burstable types as `BURSTABLE_CPU` says: the full-cost example's pods run
/// above a t3a's baseline, so `baseline` plans no T type and `ignore` (upstream's rule) does.
#[test]
fn burstable_types_are_planned_as_the_setting_says() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/full-cost");
    let types = |mode| -> Vec<String> {
        let (out, _) =
            run(std::slice::from_ref(&dir), &Catalog::Aws, OutputFormat::Json, mode).expect("runs");
        let report: serde_json::Value = serde_json::from_str(&out).expect("json");
        report["nodeClaims"]
            .as_array()
            .expect("claims")
            .iter()
            .filter_map(|c| c["instanceType"].as_str().map(str::to_string))
            .collect()
    };
    let baseline = types(BurstableCpu::Baseline);
    assert!(!baseline.is_empty() && baseline.iter().all(|t| !t.starts_with('t')), "{baseline:?}");
    let ignore = types(BurstableCpu::Ignore);
    assert!(ignore.iter().any(|t| t.starts_with('t')), "{ignore:?}");
}
