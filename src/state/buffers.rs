//! CapacityBuffers (pure): how many chunks a buffer holds, and the placeholder ("virtual") pods
//! that stand for them in the decisions, as upstream v1.14 computes and builds them.
//!
//! Chunks: `replicas`, or `percentage` of the `scalableRef`'s replicas rounded up (at least one),
//! the larger of the two when both are set; with `limits`, no more than fit in them (by the
//! chunk's requests), or as many as fit when neither is set.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::apis::pod::{Pod, PodSpec, PodStatus};
use k8s_openapi::api::core::v1::{self as api, PodCondition, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::apis::CapacityBuffer;
use crate::scheduling::resources::{Resources, parse_quantity_for, pod_requests};
use crate::scheduling::{PodRef, SchedulingResults};

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
    let pod = Pod { spec: template.spec.clone().map(PodSpec::from), ..Pod::default() };
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

/// The CapacityBuffer (`namespace/name`) a placeholder pod belongs to; `None` for a real pod.
pub fn buffer_of(pod: &Pod) -> Option<String> {
    if !is_virtual(pod) {
        return None;
    }
    let annotations = pod.metadata.annotations.as_ref()?;
    let namespace = annotations.get(ANNOTATION_BUFFER_NAMESPACE).filter(|v| !v.is_empty())?;
    let name = annotations.get(ANNOTATION_BUFFER_NAME).filter(|v| !v.is_empty())?;
    Some(format!("{namespace}/{name}"))
}

/// Where one CapacityBuffer's placeholders went in a provisioning pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BufferPlacement {
    /// Existing nodes and NodeClaims (by name) that hold its placeholders, with how many each.
    pub existing: BTreeMap<String, usize>,
    /// Placeholders that needed new NodeClaims, by NodePool.
    pub new_capacity: BTreeMap<String, usize>,
    /// Placeholders that fit nowhere.
    pub failed: usize,
    /// Why the first of those fit nowhere.
    pub error: Option<String>,
}

impl BufferPlacement {
    /// Placeholders on existing capacity.
    pub fn on_existing(&self) -> usize {
        self.existing.values().sum()
    }

    /// Placeholders that needed new NodeClaims.
    pub fn needing_new(&self) -> usize {
        self.new_capacity.values().sum()
    }
}

/// Where a provisioning pass placed the placeholders: by buffer, and the nodes and NodeClaims
/// (by name) that hold any of them, those the pass created included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BuffersPlaced {
    /// By buffer (`namespace/name`).
    pub placements: BTreeMap<String, BufferPlacement>,
    /// Nodes and NodeClaims holding placeholders: emptiness leaves them.
    pub hosts: std::collections::HashSet<String>,
}

impl BuffersPlaced {
    /// `placements`, held by the existing nodes and NodeClaims they name.
    pub fn new(placements: BTreeMap<String, BufferPlacement>) -> Self {
        let hosts = placements.values().flat_map(|p| p.existing.keys().cloned()).collect();
        BuffersPlaced { placements, hosts }
    }

    /// Whether `node` (by its name or its NodeClaim's) holds placeholders.
    pub fn holds(&self, node: &super::StateNode) -> bool {
        self.hosts.contains(&node.name) || node.claim_name().is_some_and(|c| self.hosts.contains(c))
    }

    /// The buffers (`namespace/name`) with placeholders on `node`, with how many each.
    pub fn on(&self, node: &super::StateNode) -> Vec<(&str, usize)> {
        let here = |p: &BufferPlacement| {
            let by_claim = node.claim_name().and_then(|c| p.existing.get(c));
            p.existing.get(&node.name).or(by_claim).copied()
        };
        self.placements.iter().filter_map(|(k, p)| Some((k.as_str(), here(p)?))).collect()
    }
}

/// Where the placeholders among `pods` (a pass's input pods) went in `results`, by buffer
/// (`namespace/name`). Real pods are left out.
pub fn placements(pods: &[Arc<Pod>], results: &SchedulingResults) -> BTreeMap<String, BufferPlacement> {
    let mut out: BTreeMap<String, BufferPlacement> = BTreeMap::new();
    let mut each = |refs: &[PodRef], f: &mut dyn FnMut(&mut BufferPlacement)| {
        for r in refs {
            if let Some(key) = pods.get(r.index).and_then(|p| buffer_of(p)) {
                f(out.entry(key).or_default());
            }
        }
    };
    for placement in &results.existing_placements {
        each(&placement.pods, &mut |b| *b.existing.entry(placement.node.clone()).or_default() += 1);
    }
    for claim in &results.new_node_claims {
        each(&claim.pods, &mut |b| *b.new_capacity.entry(claim.nodepool.clone()).or_default() += 1);
    }
    for error in &results.errors {
        each(std::slice::from_ref(&error.pod), &mut |b| {
            b.failed += 1;
            if b.error.is_none() {
                b.error = Some(error.to_string());
            }
        });
    }
    out
}

/// `spec` for a pod that will never run: no node, no volumes (those backed by claims would tie
/// it to their zones; the rest are never read), the lowest priority.
fn sanitized(spec: api::PodSpec) -> PodSpec {
    let mut spec = PodSpec::from(spec);
    spec.node_name = None;
    spec.priority = Some(VIRTUAL_POD_PRIORITY);
    spec.priority_class_name = None;
    spec.volumes = None;
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
    fn placements_count_each_buffers_placeholders_where_they_went() {
        use crate::scheduling::{ExistingPlacement, NewNodeClaim, PodError};
        let a = virtual_pods(&buffer(json!({"replicas": 3})), &template(), 3);
        let mut other = buffer(json!({"replicas": 1}));
        other.metadata.name = Some("c".into());
        let c = virtual_pods(&other, &template(), 1);
        let real = Arc::new(Pod::default());
        let pods: Vec<Arc<Pod>> = vec![real, a[0].clone(), a[1].clone(), a[2].clone(), c[0].clone()];
        let r = |index: usize| PodRef { index, namespace: "ns".into(), name: format!("p{index}") };
        let results = SchedulingResults {
            existing_placements: vec![ExistingPlacement { node: "n1".into(), pods: vec![r(0), r(1), r(2)] }],
            new_node_claims: vec![NewNodeClaim {
                nodepool: "default".into(),
                requirements: Default::default(),
                instance_type_names: Default::default(),
                labels: Default::default(),
                taints: Vec::new(),
                startup_taints: Vec::new(),
                requests: Resources::default(),
                daemonset_requests: Resources::default(),
                pods: vec![r(3)],
                instance_type_options: Arc::from([]),
                min_values_relaxed: false,
            }],
            errors: vec![PodError {
                pod: r(4),
                nodepools: vec![("default".into(), "too big".into())],
                reason: None,
                reserved: false,
            }],
            ignored: Vec::new(),
            preferences_broken: Vec::new(),
        };
        let placed = placements(&pods, &results);
        assert_eq!(placed.len(), 2, "the real pod belongs to no buffer");
        let b = &placed["ns/b"];
        assert_eq!((b.on_existing(), b.needing_new(), b.failed), (2, 1, 0));
        assert_eq!(b.existing["n1"], 2);
        assert_eq!(b.new_capacity["default"], 1);
        let c = &placed["ns/c"];
        assert_eq!((c.on_existing(), c.failed), (0, 1));
        assert_eq!(c.error.as_deref(), Some("nodepool \"default\": too big"));
        assert_eq!(buffer_of(&pods[0]), None);
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
        assert!(spec.volumes.is_none());
        assert_eq!(pod_requests(p).get("cpu"), 500);
        assert!(!is_virtual(&Pod::default()));
    }
}
