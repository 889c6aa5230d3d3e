//! CapacityBuffers (pure): how many chunks a buffer holds, and the placeholder ("virtual") pods
//! that stand for them in the decisions, as upstream v1.14 computes and builds them.
//!
//! Chunks: `replicas`, or `percentage` of the `scalableRef`'s replicas rounded up (at least one),
//! the larger of the two when both are set; with `limits`, no more than fit in them (by the
//! chunk's requests), or as many as fit when neither is set.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodSpec, PodStatus, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::apis::CapacityBuffer;
use crate::scheduling::resources::{Resources, parse_quantity_for, pod_requests};

/// Marks a placeholder pod of a CapacityBuffer (upstream's annotation).
pub const ANNOTATION_FAKE_POD: &str = "karpenter.sh/capacity-buffer-fake-pod";
/// The name of the CapacityBuffer a placeholder pod belongs to.
pub const ANNOTATION_BUFFER_NAME: &str = "karpenter.sh/capacity-buffer-name";
/// The namespace of the CapacityBuffer a placeholder pod belongs to.
pub const ANNOTATION_BUFFER_NAMESPACE: &str = "karpenter.sh/capacity-buffer-namespace";
/// The priority placeholder pods carry: the lowest.
pub const VIRTUAL_POD_PRIORITY: i32 = i32::MIN;

/// Whether `pod` is a CapacityBuffer's placeholder.
pub fn is_virtual(pod: &Pod) -> bool {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_FAKE_POD)).is_some_and(|v| v == "true")
}

/// Chunks for `percentage` of `scalable` replicas: rounded up, at least one.
pub fn percentage_replicas(scalable: i32, percentage: i32) -> i32 {
    let chunks = (f64::from(scalable) * f64::from(percentage) / 100.0).ceil();
    let chunks = if chunks.is_finite() { chunks.clamp(0.0, f64::from(i32::MAX)) as i32 } else { 0 };
    if chunks < 1 && percentage > 0 && scalable > 0 { 1 } else { chunks }
}

/// How many chunks of `requests` fit in `limits` (the tightest limit on a resource the chunk
/// requests); `None` when no limit names a resource it requests.
pub fn limit_replicas(limits: &crate::apis::ResourceList, requests: &Resources) -> Option<i32> {
    let mut fewest: Option<i64> = None;
    for (name, quantity) in limits {
        let asked = requests.get(name);
        if asked <= 0 {
            continue;
        }
        let Ok(limit) = parse_quantity_for(name, quantity) else { continue };
        let n = limit.max(0) / asked;
        fewest = Some(fewest.map_or(n, |f| f.min(n)));
    }
    fewest.map(|n| i32::try_from(n).unwrap_or(i32::MAX))
}

/// The buffer's chunks, given its chunk's `requests` and its `scalableRef`'s replicas (when it
/// has one).
pub fn replicas(buffer: &CapacityBuffer, requests: &Resources, scalable: Option<i32>) -> i32 {
    let spec = &buffer.spec;
    let mut candidates = Vec::new();
    if let (Some(percentage), Some(scalable)) = (spec.percentage, scalable)
        && scalable > 0
    {
        candidates.push(percentage_replicas(scalable, percentage));
    }
    candidates.extend(spec.replicas);
    let desired = candidates.iter().copied().max();
    let limited = spec.limits.as_ref().and_then(|l| limit_replicas(l, requests));
    match (desired, limited) {
        (Some(d), Some(l)) => d.min(l),
        (None, Some(l)) => l,
        (Some(d), None) => d,
        (None, None) => 0,
    }
}

/// The requests of one chunk of `template`.
pub fn chunk_requests(template: &PodTemplateSpec) -> Resources {
    let pod = Pod { spec: template.spec.clone(), ..Pod::default() };
    pod_requests(&pod)
}

/// The buffer's `count` placeholder pods, shaped by `template`: its labels and spec, without a
/// node, without volumes that need a claim, at the lowest priority, marked as placeholders.
pub fn virtual_pods(buffer: &CapacityBuffer, template: &PodTemplateSpec, count: i32) -> Vec<Arc<Pod>> {
    let name = buffer.metadata.name.clone().unwrap_or_default();
    let namespace = buffer.metadata.namespace.clone().unwrap_or_default();
    let uid = buffer.metadata.uid.clone().unwrap_or_else(|| format!("{namespace}/{name}"));
    let spec = sanitized(template.spec.clone().unwrap_or_default());
    let labels = template.metadata.as_ref().and_then(|m| m.labels.clone());
    (1..=count.max(0))
        .map(|i| {
            Arc::new(Pod {
                metadata: ObjectMeta {
                    name: Some(format!("capacity-buffer-{name}-{i}")),
                    namespace: Some(namespace.clone()),
                    uid: Some(format!("{uid}-{i}")),
                    labels: labels.clone(),
                    annotations: Some(
                        [
                            (ANNOTATION_FAKE_POD.to_string(), "true".to_string()),
                            (ANNOTATION_BUFFER_NAME.to_string(), name.clone()),
                            (ANNOTATION_BUFFER_NAMESPACE.to_string(), namespace.clone()),
                        ]
                        .into(),
                    ),
                    creation_timestamp: buffer.metadata.creation_timestamp.clone(),
                    ..ObjectMeta::default()
                },
                spec: Some(spec.clone()),
                status: Some(PodStatus {
                    phase: Some("Pending".to_string()),
                    conditions: Some(vec![PodCondition {
                        type_: "PodScheduled".to_string(),
                        status: "False".to_string(),
                        reason: Some("Unschedulable".to_string()),
                        ..PodCondition::default()
                    }]),
                    ..PodStatus::default()
                }),
            })
        })
        .collect()
}

/// `spec` for a pod that will never run: no node, no volumes backed by claims (nor their
/// mounts), the lowest priority.
fn sanitized(mut spec: PodSpec) -> PodSpec {
    spec.node_name = None;
    spec.priority = Some(VIRTUAL_POD_PRIORITY);
    spec.priority_class_name = None;
    let mut dropped = BTreeSet::new();
    if let Some(volumes) = spec.volumes.as_mut() {
        volumes.retain(|v| {
            let keep = v.persistent_volume_claim.is_none() && v.ephemeral.is_none();
            if !keep {
                dropped.insert(v.name.clone());
            }
            keep
        });
    }
    if !dropped.is_empty() {
        let containers = spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            if let Some(mounts) = c.volume_mounts.as_mut() {
                mounts.retain(|m| !dropped.contains(&m.name));
            }
        }
    }
    spec
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn buffer(spec: serde_json::Value) -> CapacityBuffer {
        serde_json::from_value(json!({"apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer",
            "metadata": {"name": "b", "namespace": "ns", "uid": "u"}, "spec": spec}))
        .unwrap()
    }

    fn template() -> PodTemplateSpec {
        serde_json::from_value(json!({"metadata": {"labels": {"app": "web"}}, "spec": {
            "nodeName": "somewhere", "priorityClassName": "high",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}},
                "volumeMounts": [{"name": "data", "mountPath": "/d"}, {"name": "config", "mountPath": "/c"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "x"}}, {"name": "config", "configMap": {"name": "c"}}]}}))
        .unwrap()
    }

    #[test]
    fn chunks_follow_upstreams_rules() {
        let requests = chunk_requests(&template());
        assert_eq!(replicas(&buffer(json!({"replicas": 3})), &requests, None), 3);
        // A percentage of the scalable's replicas, rounded up, at least one; the larger of both.
        assert_eq!(percentage_replicas(10, 25), 3);
        assert_eq!(percentage_replicas(3, 1), 1);
        assert_eq!(percentage_replicas(0, 50), 0);
        assert_eq!(replicas(&buffer(json!({"percentage": 20, "replicas": 1})), &requests, Some(10)), 2);
        assert_eq!(replicas(&buffer(json!({"percentage": 20, "replicas": 5})), &requests, Some(10)), 5);
        // Limits cap the count, or set it alone: 2 CPU holds four chunks of 500m, 3Gi three of 1Gi.
        assert_eq!(replicas(&buffer(json!({"limits": {"cpu": "2", "memory": "3Gi"}})), &requests, None), 3);
        assert_eq!(replicas(&buffer(json!({"replicas": 10, "limits": {"cpu": "2"}})), &requests, None), 4);
        // A limit on a resource the chunk does not request limits nothing.
        assert_eq!(
            replicas(&buffer(json!({"replicas": 2, "limits": {"nvidia.com/gpu": "1"}})), &requests, None),
            2
        );
        assert_eq!(replicas(&buffer(json!({})), &requests, None), 0);
    }

    #[test]
    fn placeholder_pods_are_marked_unbound_and_need_no_claim() {
        let pods = virtual_pods(&buffer(json!({"replicas": 2})), &template(), 2);
        assert_eq!(pods.len(), 2);
        let p = &pods[1];
        assert!(is_virtual(p));
        assert_eq!(p.metadata.name.as_deref(), Some("capacity-buffer-b-2"));
        assert_eq!(p.metadata.uid.as_deref(), Some("u-2"));
        assert_eq!(p.metadata.labels.as_ref().unwrap()["app"], "web");
        let spec = p.spec.as_ref().unwrap();
        assert_eq!((spec.node_name.as_deref(), spec.priority), (None, Some(i32::MIN)));
        let volumes: Vec<&str> = spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
        assert_eq!(volumes, ["config"]);
        let mounts: Vec<&str> =
            spec.containers[0].volume_mounts.iter().flatten().map(|m| m.name.as_str()).collect();
        assert_eq!(mounts, ["config"]);
        assert_eq!(pod_requests(p).get("cpu"), 500);
        assert!(!is_virtual(&Pod::default()));
    }
}
