//! The pod as the controller holds it: the parts of a `v1` Pod that scheduling, disruption and
//! draining read, and nothing else.
//!
//! k8s-openapi's `Pod` carries every field of the API as inline optional values: a `PodSpec` is
//! about 1.4 KB and each `Container` about 2.1 KB before anything is set, so a cluster's pods
//! held that way cost several kilobytes each even with the unread fields emptied. This type keeps
//! the same field names and types for what it has (code reads it as it would read the API's
//! pod), and drops the rest: container images, environments, commands, probes, mounts and
//! security contexts; volumes other than persistent volume claims and generic ephemeral volumes;
//! container statuses, addresses, and the conditions no decision reads ([`READ_CONDITIONS`]). It is made from the API's pod by moving, never copying
//! ([`From`]), and reads and writes the same JSON (its fields' names are the API's), so a pod
//! written in a test or a file parses as either.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as api;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};

/// A pod: its metadata whole, and the parts of its spec and status that decisions read. Written
/// as JSON with its `apiVersion` and `kind`, as the API's pod is.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Pod {
    /// The pod's metadata (managed fields are dropped before a pod is cached).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the pod asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<PodSpec>,
    /// Where the pod is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodStatus>,
}

impl Serialize for Pod {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Written<'a> {
            api_version: &'static str,
            kind: &'static str,
            metadata: &'a ObjectMeta,
            #[serde(skip_serializing_if = "Option::is_none")]
            spec: &'a Option<PodSpec>,
            #[serde(skip_serializing_if = "Option::is_none")]
            status: &'a Option<PodStatus>,
        }
        Written {
            api_version: "v1",
            kind: "Pod",
            metadata: &self.metadata,
            spec: &self.spec,
            status: &self.status,
        }
        .serialize(serializer)
    }
}

/// The scheduling and draining fields of a pod's spec (see the API's `PodSpec` for each).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct PodSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<api::Affinity>,
    #[serde(default)]
    pub containers: Vec<Container>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_network: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_containers: Option<Vec<Container>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<api::PodOS>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<BTreeMap<String, Quantity>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_claims: Option<Vec<api::PodResourceClaim>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<api::ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_gates: Option<Vec<api::PodSchedulingGate>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<api::Toleration>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<api::TopologySpreadConstraint>>,
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "claim_volumes")]
    pub volumes: Option<Vec<Volume>>,
}

/// The volumes of a pod's JSON that are backed by a claim (see [`Volume`]); the rest are not read.
fn claim_volumes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<Volume>>, D::Error> {
    let volumes: Option<Vec<Volume>> = Option::deserialize(d)?;
    Ok(volumes.map(|vs| exact(vs.into_iter().filter(Volume::is_claim))))
}

/// The parts of a container that placement reads: its name, resources, ports and restart
/// policy (an init container with `Always` is a sidecar).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<api::ContainerPort>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize_policy: Option<Vec<api::ContainerResizePolicy>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<api::ResourceRequirements>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
}

/// A volume that placement reads: a persistent volume claim, or a generic ephemeral volume
/// (whose claim is named after the pod). Other volumes are not kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct Volume {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<api::EphemeralVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<api::PersistentVolumeClaimVolumeSource>,
}

/// The parts of a pod's status that decisions read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct PodStatus {
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "read_conditions")]
    pub conditions: Option<Vec<api::PodCondition>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nominated_node_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
}

impl From<api::Container> for Container {
    fn from(c: api::Container) -> Self {
        Container {
            name: c.name,
            ports: c.ports,
            resize_policy: c.resize_policy,
            resources: c.resources,
            restart_policy: c.restart_policy,
        }
    }
}

/// `items` in a vector of their exact length. Collecting a vector's items into smaller ones (or
/// fewer) may reuse its allocation whole, which would keep the API's 2 KB per container this type
/// exists to drop; and a list decoded from a stream has room to spare.
fn exact<T>(items: impl Iterator<Item = T>) -> Vec<T> {
    shrunk(items.collect())
}

/// `v` without room to spare.
fn shrunk<T>(mut v: Vec<T>) -> Vec<T> {
    v.shrink_to_fit();
    v
}

impl Volume {
    /// Whether a claim backs the volume: a persistent volume claim, or a generic ephemeral volume.
    pub fn is_claim(&self) -> bool {
        self.persistent_volume_claim.is_some() || self.ephemeral.is_some()
    }
}

impl From<api::Volume> for Volume {
    fn from(v: api::Volume) -> Self {
        Volume { name: v.name, ephemeral: v.ephemeral, persistent_volume_claim: v.persistent_volume_claim }
    }
}

impl From<api::PodSpec> for PodSpec {
    fn from(s: api::PodSpec) -> Self {
        PodSpec {
            affinity: s.affinity,
            containers: exact(s.containers.into_iter().map(Container::from)),
            host_network: s.host_network,
            init_containers: s.init_containers.map(|cs| exact(cs.into_iter().map(Container::from))),
            node_name: s.node_name,
            node_selector: s.node_selector,
            os: s.os,
            overhead: s.overhead,
            preemption_policy: s.preemption_policy,
            priority: s.priority,
            priority_class_name: s.priority_class_name,
            resource_claims: s.resource_claims,
            resources: s.resources,
            restart_policy: s.restart_policy,
            runtime_class_name: s.runtime_class_name,
            scheduler_name: s.scheduler_name,
            scheduling_gates: s.scheduling_gates,
            termination_grace_period_seconds: s.termination_grace_period_seconds,
            tolerations: s.tolerations.map(shrunk),
            topology_spread_constraints: s.topology_spread_constraints.map(shrunk),
            volumes: s.volumes.map(|vs| exact(vs.into_iter().map(Volume::from).filter(Volume::is_claim))),
        }
    }
}

/// The pod conditions decisions read: `PodScheduled` (the kube-scheduler's verdict), `Ready`
/// (pod startup metrics) and `DisruptionTarget` (a pod being evicted). The kubelet's others
/// (`Initialized`, `ContainersReady`, `PodReadyToStartContainers`) are not kept.
pub const READ_CONDITIONS: [&str; 3] = ["PodScheduled", "Ready", "DisruptionTarget"];

fn is_read(c: &api::PodCondition) -> bool {
    READ_CONDITIONS.contains(&c.type_.as_str())
}

/// The conditions of a pod's JSON that are read (see [`READ_CONDITIONS`]).
fn read_conditions<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<api::PodCondition>>, D::Error> {
    let conditions: Option<Vec<api::PodCondition>> = Option::deserialize(d)?;
    Ok(conditions.map(|cs| exact(cs.into_iter().filter(is_read))))
}

impl From<api::PodStatus> for PodStatus {
    fn from(s: api::PodStatus) -> Self {
        PodStatus {
            conditions: s.conditions.map(|cs| exact(cs.into_iter().filter(is_read))),
            nominated_node_name: s.nominated_node_name,
            phase: s.phase,
            qos_class: s.qos_class,
            reason: s.reason,
            start_time: s.start_time,
        }
    }
}

impl From<api::Pod> for Pod {
    fn from(p: api::Pod) -> Self {
        let mut metadata = p.metadata;
        metadata.owner_references = metadata.owner_references.map(shrunk);
        Pod { metadata, spec: p.spec.map(PodSpec::from), status: p.status.map(PodStatus::from) }
    }
}

impl kube::Resource for Pod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        <api::Pod as kube::Resource>::kind(&())
    }

    fn group(_: &()) -> Cow<'_, str> {
        <api::Pod as kube::Resource>::group(&())
    }

    fn version(_: &()) -> Cow<'_, str> {
        <api::Pod as kube::Resource>::version(&())
    }

    fn plural(_: &()) -> Cow<'_, str> {
        <api::Pod as kube::Resource>::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_pod() -> api::Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web-1", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {
                "nodeName": "node-a",
                "priorityClassName": "high",
                "containers": [{
                    "name": "app",
                    "image": "nginx",
                    "env": [{"name": "A", "value": "1"}],
                    "ports": [{"containerPort": 80, "hostPort": 8080}],
                    "resources": {"requests": {"cpu": "250m", "memory": "64Mi"}},
                    "livenessProbe": {"httpGet": {"port": 80}}
                }],
                "initContainers": [{"name": "proxy", "image": "envoy", "restartPolicy": "Always"}],
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "config", "configMap": {"name": "web"}}
                ]
            },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}],
                "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": true, "restartCount": 0}]
            }
        }))
        .unwrap()
    }

    #[test]
    fn keeps_what_placement_reads_and_drops_the_rest() {
        let pod = Pod::from(api_pod());
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-1"));
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.priority_class_name.as_deref(), Some("high"));
        assert_eq!(spec.containers[0].ports.as_ref().unwrap()[0].host_port, Some(8080));
        assert!(
            spec.containers[0].resources.as_ref().unwrap().requests.as_ref().unwrap().contains_key("cpu")
        );
        assert_eq!(spec.init_containers.as_ref().unwrap()[0].restart_policy.as_deref(), Some("Always"));
        assert_eq!(spec.tolerations.as_ref().unwrap().len(), 1);
        let volumes = spec.volumes.as_ref().unwrap();
        assert_eq!(volumes.len(), 1, "only the claim is kept");
        // The API's allocations (2 KB a container, 3 KB a volume) are not kept for smaller items.
        assert_eq!((spec.containers.capacity(), volumes.capacity()), (1, 1));
        assert_eq!(volumes[0].persistent_volume_claim.as_ref().unwrap().claim_name, "data");
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let conditions: Vec<&str> = status.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
        assert_eq!(conditions, ["Ready"], "the kubelet's other conditions are not kept");

        let written = serde_json::to_value(&pod).unwrap();
        assert_eq!((written["apiVersion"].as_str(), written["kind"].as_str()), (Some("v1"), Some("Pod")));
        assert!(written["spec"]["containers"][0].get("image").is_none());
        assert!(written["status"].get("podIP").is_none());
    }

    #[test]
    fn reads_the_api_json_as_the_api_pod_does() {
        let json = serde_json::to_value(api_pod()).unwrap();
        let read: Pod = serde_json::from_value(json).unwrap();
        assert_eq!(read, Pod::from(api_pod()));
        let again: Pod = serde_json::from_value(serde_json::to_value(&read).unwrap()).unwrap();
        assert_eq!(again, read);
    }

    #[test]
    fn is_much_smaller_than_the_api_pod() {
        // What the cache allocates for each pod and container, before any string or map.
        let sizes = (std::mem::size_of::<Pod>(), std::mem::size_of::<api::Pod>());
        assert!(sizes.0 * 3 < sizes.1 * 2, "{sizes:?}");
        assert!(std::mem::size_of::<Container>() * 8 < std::mem::size_of::<api::Container>());
    }

    #[test]
    fn is_the_api_kind_for_the_client() {
        use kube::Resource;
        assert_eq!(Pod::kind(&()), "Pod");
        assert_eq!(Pod::api_version(&()), "v1");
        assert_eq!(Pod::plural(&()), "pods");
        let pod = Pod::from(api_pod());
        let r = pod.object_ref(&());
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(r.namespace.as_deref(), Some("shop"));
    }
}
