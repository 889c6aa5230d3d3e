//! Bytes the controller holds per cached object and per node view, counted by jemalloc (the
//! controller's allocator) as the live heap before and after the objects are made and kept:
//!
//! - **pods:** 10,000 copies of a typical Deployment pod (a ReplicaSet's pod as the API server
//!   returns it: managed fields, the service account token volume, the default tolerations, the
//!   kubelet's conditions and container status) behind `Arc`s, as the cache keeps them: the API's
//!   `Pod` as decoded, the API's `Pod` holding only what the controller reads (the cache before
//!   the compact type), and the compact `karpenter::apis::pod::Pod` the cache holds now;
//! - **NodeClaims:** 2,000 NodeClaims as the watch decodes them, each listing 600 instance types
//!   (upstream's most), all the same list (the claims of one NodePool) or each its own order of it
//!   (what every claim cost before value lists were shared, and still costs when no two agree);
//! - **node views:** one `state_nodes` view of 2,000 Nodes with the labels Karpenter's nodes carry
//!   and their NodeClaims, the view every provisioning, disruption, NodePool status and node
//!   metrics pass builds.
//!
//! ```sh
//! cargo bench --bench memory
//! ```

use std::hint::black_box;
use std::sync::Arc;

use k8s_openapi::api::core::v1 as api;
use karpenter::apis::NodeClaim;
use karpenter::apis::pod::Pod;
use karpenter::state::Snapshot;
use karpenter::state::statenode::state_nodes;
use karpenter::state::watches::{cached_pod, trim};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Bytes allocated and not yet freed, as jemalloc counts them (size classes included).
fn live() -> isize {
    let _ = tikv_jemalloc_ctl::epoch::advance();
    tikv_jemalloc_ctl::stats::allocated::read().map_or(0, |b| b as isize)
}

const PODS: usize = 10_000;

/// The `i`th pod of a Deployment's ReplicaSet, as the API server returns it once it runs.
fn api_pod(i: usize) -> api::Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": format!("web-7d4b9c8f6d-{i:05}"),
            "generateName": "web-7d4b9c8f6d-",
            "namespace": "shop",
            "uid": format!("4f1c2d3e-5a6b-7c8d-9e0f-{i:012}"),
            "resourceVersion": format!("{}", 100_000 + i),
            "creationTimestamp": "2026-11-28T10:00:00Z",
            "labels": {"app": "web", "pod-template-hash": "7d4b9c8f6d"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c8f6d",
                "uid": "9a8b7c6d-5e4f-3a2b-1c0d-000000000001", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                    "time": "2026-11-28T10:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "subresource": "status",
                    "time": "2026-11-28T10:00:30Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:phase": {}}}}
            ]
        },
        "spec": {
            "containers": [{
                "name": "web",
                "image": "registry.example.com/shop/web:1.42.0",
                "imagePullPolicy": "IfNotPresent",
                "env": [{"name": "PORT", "value": "8080"}, {"name": "LOG_LEVEL", "value": "info"}],
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}},
                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
                    "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "volumeMounts": [{"name": "kube-api-access-x1y2z", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]
            }],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": format!("ip-10-0-{}-{}.ec2.internal", i / 250, i % 250),
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            ],
            "priority": 0,
            "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
            "volumes": [{"name": "kube-api-access-x1y2z", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
            ]}}]
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-11-28T10:00:20Z"},
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-28T10:00:10Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-28T10:00:30Z"},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-28T10:00:30Z"},
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-28T10:00:05Z"}
            ],
            "hostIP": "10.0.1.17",
            "hostIPs": [{"ip": "10.0.1.17"}],
            "podIP": "10.0.1.201",
            "podIPs": [{"ip": "10.0.1.201"}],
            "startTime": "2026-11-28T10:00:10Z",
            "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0, "started": true,
                "image": "registry.example.com/shop/web:1.42.0", "imageID": "registry.example.com/shop/web@sha256:0123456789abcdef",
                "containerID": "containerd://0123456789abcdef", "state": {"running": {"startedAt": "2026-11-28T10:00:25Z"}}}],
            "qosClass": "Burstable"
        }
    }))
    .unwrap_or_default()
}

/// Live heap bytes per object once `make` has made and kept `count` of them behind `Arc`s.
fn bytes_each<T>(count: usize, make: impl Fn(usize) -> T) -> isize {
    let before = live();
    let kept: Vec<Arc<T>> = (0..count).map(|i| Arc::new(make(i))).collect();
    let after = live();
    black_box(&kept);
    drop(kept);
    (after - before) / count as isize
}

const NODES: usize = 2_000;
const INSTANCE_TYPES: usize = 600;
const ZONES: [&str; 3] = ["us-west-2a", "us-west-2b", "us-west-2c"];

/// The `i`th instance type name of a catalog of `INSTANCE_TYPES`.
fn type_name(i: usize) -> String {
    let families = ["m5", "m6i", "m7i", "c5", "c6i", "c7i", "r5", "r6i", "r7i", "t3"];
    let sizes = ["large", "xlarge", "2xlarge", "4xlarge", "8xlarge", "12xlarge"];
    format!(
        "{}{}.{}",
        families[i % 10],
        ["", "a", "d", "n", "dn", "g", "gd", "in", "idn", "e"][i / 60 % 10],
        sizes[i / 10 % 6]
    )
}

/// NodeClaim `i` as the API server returns it once launched, listing `types` as it may launch.
fn claim_json(i: usize, types: &[String]) -> serde_json::Value {
    let conditions: Vec<serde_json::Value> = [
        "Launched",
        "Registered",
        "Initialized",
        "Ready",
        "Consolidatable",
    ]
    .iter()
    .map(|t| {
        serde_json::json!({"type": t, "status": "True", "reason": t, "message": "", "observedGeneration": 1,
                "lastTransitionTime": "2026-11-28T10:01:00Z"})
    })
    .collect();
    serde_json::json!({
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodeClaim",
        "metadata": {
            "name": format!("default-{i:05x}"),
            "uid": format!("0c1d2e3f-4a5b-6c7d-8e9f-{i:012}"),
            "resourceVersion": format!("{}", 200_000 + i),
            "generation": 1,
            "creationTimestamp": "2026-11-28T10:00:00Z",
            "labels": {"karpenter.sh/nodepool": "default", "karpenter.k8s.aws/ec2nodeclass": "default",
                "node.kubernetes.io/instance-type": "m5.large", "topology.kubernetes.io/zone": ZONES[i % 3],
                "karpenter.sh/capacity-type": "on-demand"},
            "annotations": {"karpenter.sh/nodepool-hash": "6432911240224178935", "karpenter.sh/nodepool-hash-version": "v3",
                "karpenter.k8s.aws/ec2nodeclass-hash": "2930284412456651432", "karpenter.k8s.aws/ec2nodeclass-hash-version": "v4"},
            "finalizers": ["karpenter.sh/termination"],
            "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "name": "default",
                "uid": "9a8b7c6d-5e4f-3a2b-1c0d-000000000002", "blockOwnerDeletion": true}]
        },
        "spec": {
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            "requirements": [
                {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["default"]},
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": types}
            ],
            "resources": {"requests": {"cpu": "1150m", "memory": "1Gi", "pods": "3"}},
            "expireAfter": "720h"
        },
        "status": {
            "providerID": format!("aws:///{}/i-{i:017x}", ZONES[i % 3]),
            "nodeName": format!("ip-10-0-{}-{}.us-west-2.compute.internal", i / 250, i % 250),
            "imageID": "ami-0123456789abcdef0",
            "capacity": {"cpu": "2", "memory": "7910Mi", "ephemeral-storage": "20Gi", "pods": "29"},
            "allocatable": {"cpu": "1930m", "memory": "7134Mi", "ephemeral-storage": "17Gi", "pods": "29"},
            "conditions": conditions
        }
    })
}

/// NodeClaim `i` as the watch decodes it.
fn claim(i: usize, types: &[String]) -> NodeClaim {
    serde_json::from_value(claim_json(i, types)).unwrap_or_else(|e| panic!("NodeClaim {i}: {e}"))
}

/// The Node of NodeClaim `i`, with the labels a Karpenter node carries.
fn node(i: usize) -> api::Node {
    let claim = claim_json(i, &[]);
    let name = claim["status"]["nodeName"].clone();
    let mut labels = serde_json::json!({
        "karpenter.sh/nodepool": "default", "karpenter.sh/capacity-type": "on-demand",
        "karpenter.sh/initialized": "true", "karpenter.sh/registered": "true",
        "karpenter.k8s.aws/ec2nodeclass": "default",
        "node.kubernetes.io/instance-type": "m5.large", "beta.kubernetes.io/instance-type": "m5.large",
        "kubernetes.io/arch": "amd64", "beta.kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux", "beta.kubernetes.io/os": "linux",
        "topology.kubernetes.io/zone": ZONES[i % 3], "failure-domain.beta.kubernetes.io/zone": ZONES[i % 3],
        "topology.kubernetes.io/region": "us-west-2", "failure-domain.beta.kubernetes.io/region": "us-west-2",
        "topology.k8s.aws/zone-id": format!("usw2-az{}", i % 3 + 1),
        "kubernetes.io/hostname": name,
        "karpenter.k8s.aws/instance-category": "m", "karpenter.k8s.aws/instance-family": "m5",
        "karpenter.k8s.aws/instance-generation": "5", "karpenter.k8s.aws/instance-size": "large",
        "karpenter.k8s.aws/instance-cpu": "2", "karpenter.k8s.aws/instance-cpu-manufacturer": "intel",
        "karpenter.k8s.aws/instance-cpu-sustained-clock-speed-mhz": "3100",
        "karpenter.k8s.aws/instance-memory": "8192", "karpenter.k8s.aws/instance-hypervisor": "nitro",
        "karpenter.k8s.aws/instance-network-bandwidth": "750", "karpenter.k8s.aws/instance-ebs-bandwidth": "4750",
        "karpenter.k8s.aws/instance-encryption-in-transit-supported": "false",
        "karpenter.k8s.aws/instance-capability-flex": "false",
        "k8s.io/cloud-provider-aws": "a94c3e6b1f0d2e8a7c5b9d4f6e3a1c2b"
    });
    labels["kubernetes.io/hostname"] = name.clone();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": format!("1c2d3e4f-5a6b-7c8d-9e0f-{i:012}"), "labels": labels},
        "spec": {"providerID": claim["status"]["providerID"]},
        "status": {
            "capacity": claim["status"]["capacity"], "allocatable": claim["status"]["allocatable"],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                "lastHeartbeatTime": "2026-11-28T10:05:00Z", "lastTransitionTime": "2026-11-28T10:01:30Z"}]
        }
    }))
    .unwrap_or_else(|e| panic!("Node {i}: {e}"))
}

/// Bytes per NodeClaim and per entry of a node view.
fn nodes() -> (isize, isize, isize) {
    let types: Vec<String> = (0..INSTANCE_TYPES).map(type_name).collect();
    let same = bytes_each(NODES, |i| claim(i, &types));
    let own = bytes_each(NODES, |i| {
        let mut mine = types.clone();
        // Distinct for every claim: rotated, then its first type swapped with a later one.
        mine.rotate_left(i % INSTANCE_TYPES);
        mine.swap(0, 1 + i / INSTANCE_TYPES);
        claim(i, &mine)
    });
    let snapshot = Snapshot {
        nodes: (0..NODES).map(|i| Arc::new(node(i))).collect(),
        nodeclaims: (0..NODES).map(|i| Arc::new(claim(i, &types))).collect(),
        ..Snapshot::default()
    };
    let before = live();
    let view = state_nodes(&snapshot);
    let after = live();
    assert_eq!(view.len(), NODES, "every Node is joined to its NodeClaim");
    black_box(&view);
    (same, own, (after - before) / NODES as isize)
}

fn main() {
    let decoded = bytes_each(PODS, |i| {
        let mut pod = api_pod(i);
        trim(&mut pod);
        pod
    });
    // What the cache held before the compact type: the API's pod, every field the compact type
    // does not keep emptied.
    let api_trimmed = bytes_each(PODS, |i| -> api::Pod {
        serde_json::from_value(serde_json::to_value(cached_pod(api_pod(i))).unwrap_or_default())
            .unwrap_or_default()
    });
    let compact = bytes_each(PODS, |i| -> Pod { cached_pod(api_pod(i)) });
    println!("bytes per cached pod ({PODS} pods of a Deployment, behind Arc, managed fields dropped):");
    println!("  k8s-openapi Pod, as decoded:            {decoded:>6}");
    println!("  k8s-openapi Pod, unread fields emptied: {api_trimmed:>6}");
    println!("  karpenter::apis::pod::Pod:              {compact:>6}");
    let (same, own, view) = nodes();
    println!("bytes per cached NodeClaim ({NODES} launched claims listing {INSTANCE_TYPES} instance types):");
    println!("  all listing the same types:             {same:>6}");
    println!("  each listing them in its own order:     {own:>6}");
    println!("bytes per node of one state_nodes view ({NODES} Nodes, each with its NodeClaim): {view:>6}");
}
