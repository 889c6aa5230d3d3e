//! Bytes the watch cache holds per pod: the API's `Pod` as decoded, the API's `Pod` holding only
//! what the controller reads (the cache before the compact type), and the compact
//! `karpenter::apis::pod::Pod` the cache holds now.
//!
//! jemalloc's own count of allocated bytes (the controller's allocator) measures the live heap before and after 10,000 copies of a typical
//! Deployment pod (a ReplicaSet's pod as the API server returns it: managed fields, the service
//! account token volume, the default tolerations, the kubelet's conditions and container status)
//! are made and kept behind `Arc`s, as the cache keeps them.
//!
//! ```sh
//! cargo bench --bench pod_memory
//! ```

use std::hint::black_box;
use std::sync::Arc;

use k8s_openapi::api::core::v1 as api;
use karpenter::apis::pod::Pod;
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

/// Live heap bytes per pod once `make` has made and kept `PODS` of them.
fn bytes_per_pod<T>(make: impl Fn(usize) -> T) -> isize {
    let before = live();
    let kept: Vec<Arc<T>> = (0..PODS).map(|i| Arc::new(make(i))).collect();
    let after = live();
    black_box(&kept);
    drop(kept);
    (after - before) / PODS as isize
}

fn main() {
    let decoded = bytes_per_pod(|i| {
        let mut pod = api_pod(i);
        trim(&mut pod);
        pod
    });
    // What the cache held before the compact type: the API's pod, every field the compact type
    // does not keep emptied.
    let api_trimmed = bytes_per_pod(|i| -> api::Pod {
        serde_json::from_value(serde_json::to_value(cached_pod(api_pod(i))).unwrap_or_default())
            .unwrap_or_default()
    });
    let compact = bytes_per_pod(|i| -> Pod { cached_pod(api_pod(i)) });
    println!("bytes per cached pod ({PODS} pods of a Deployment, behind Arc, managed fields dropped):");
    println!("  k8s-openapi Pod, as decoded:            {decoded:>6}");
    println!("  k8s-openapi Pod, unread fields emptied: {api_trimmed:>6}");
    println!("  karpenter::apis::pod::Pod:              {compact:>6}");
}
