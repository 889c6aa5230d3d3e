//! A namespace's LimitRange defaults, applied to a pod as the API server's LimitRanger admission
//! applies them: each container (init containers included) that leaves a resource's limit unset
//! gets the `default` of every `Container` LimitRange item of its namespace, and each that leaves
//! a request unset gets its `defaultRequest`; a limit without a request then makes the request, as
//! the API server's defaulting does.
//!
//! Pods that exist went through admission already and are left as they are. What matters are the
//! pods that do not exist yet: the DaemonSet pods every new node will run, whose templates the
//! provisioner reads. Counted without their defaults they look empty, new nodes are sized too
//! small, and the DaemonSet pod pushes the workload off the node (with a higher priority, by
//! preemption) again and again.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::apis::pod::{Container, Pod};
use k8s_openapi::api::core::v1::{LimitRange, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The defaults of one namespace: `(default limits, default requests)`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Defaults {
    /// Limits of containers that set none (`default`).
    pub limits: BTreeMap<String, Quantity>,
    /// Requests of containers that set none (`defaultRequest`).
    pub requests: BTreeMap<String, Quantity>,
}

impl Defaults {
    fn is_empty(&self) -> bool {
        self.limits.is_empty() && self.requests.is_empty()
    }
}

/// The container defaults of every namespace that has any, from `ranges`. When several items
/// give a default for the same resource, the first (by LimitRange name) wins.
pub fn defaults_by_namespace<'a>(
    ranges: impl IntoIterator<Item = &'a LimitRange>,
) -> BTreeMap<String, Defaults> {
    let mut sorted: Vec<&LimitRange> = ranges.into_iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut out: BTreeMap<String, Defaults> = BTreeMap::new();
    for range in sorted {
        let namespace = range.metadata.namespace.clone().unwrap_or_default();
        let items = range.spec.as_ref().map(|s| s.limits.as_slice()).unwrap_or_default();
        for item in items.iter().filter(|i| i.type_ == "Container") {
            let d = out.entry(namespace.clone()).or_default();
            for (k, v) in item.default.iter().flatten() {
                d.limits.entry(k.clone()).or_insert_with(|| v.clone());
            }
            // The API server fills `defaultRequest` from `default` on the object; a LimitRange read
            // from elsewhere may not have it filled.
            for (k, v) in item.default_request.iter().flatten().chain(item.default.iter().flatten()) {
                d.requests.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    out.retain(|_, d| !d.is_empty());
    out
}

fn apply_to_container(container: &mut Container, defaults: &Defaults) -> bool {
    let resources = container.resources.get_or_insert_with(ResourceRequirements::default);
    let own_limits = resources.limits.clone().unwrap_or_default();
    let mut changed = false;
    // The API server's defaulting, before admission: a limit without a request is the request.
    let requests = resources.requests.get_or_insert_with(BTreeMap::new);
    for (k, v) in &own_limits {
        if !requests.contains_key(k) {
            requests.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    // Then the LimitRanger: the limits and requests still unset get the namespace's defaults.
    for (k, v) in &defaults.requests {
        if !requests.contains_key(k) {
            requests.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    let limits = resources.limits.get_or_insert_with(BTreeMap::new);
    for (k, v) in &defaults.limits {
        if !limits.contains_key(k) {
            limits.insert(k.clone(), v.clone());
            changed = true;
        }
    }
    changed
}

/// `pod` with its namespace's defaults applied (see the module documentation); returns whether
/// anything changed.
pub fn apply(pod: &mut Pod, defaults: &BTreeMap<String, Defaults>) -> bool {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let none = Defaults::default();
    let d = defaults.get(&namespace).unwrap_or(&none);
    let Some(spec) = pod.spec.as_mut() else { return false };
    let mut changed = false;
    for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
        changed |= apply_to_container(c, d);
    }
    changed
}

/// `pod`, or a copy with the defaults applied when it lacks any of them.
pub fn with_defaults(pod: &Arc<Pod>, defaults: &BTreeMap<String, Defaults>) -> Arc<Pod> {
    if !defaults.contains_key(pod.metadata.namespace.as_deref().unwrap_or_default()) {
        return Arc::clone(pod);
    }
    let mut copy = (**pod).clone();
    if apply(&mut copy, defaults) { Arc::new(copy) } else { Arc::clone(pod) }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::scheduling::resources::pod_requests;

    fn range(ns: &str, name: &str, item: serde_json::Value) -> LimitRange {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": ns}, "spec": {"limits": [item]}}),
        )
        .unwrap()
    }

    fn pod(ns: &str, containers: serde_json::Value) -> Pod {
        serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": ns}, "spec": {"containers": containers}}),
        )
        .unwrap()
    }

    #[test]
    fn requests_come_from_default_request_then_default_then_the_limit() {
        let ranges = [
            range(
                "ds",
                "a",
                json!({"type": "Container", "defaultRequest": {"cpu": "200m"}, "default": {"cpu": "500m", "memory": "256Mi"}}),
            ),
            range("ds", "b", json!({"type": "Container", "defaultRequest": {"memory": "1Gi", "cpu": "9"}})),
            range("ds", "c", json!({"type": "Pod", "max": {"cpu": "4"}})),
        ];
        let defaults = defaults_by_namespace(&ranges);
        // Nothing set: defaultRequest for cpu, default (limit) for memory.
        let mut empty = pod("ds", json!([{"name": "c"}]));
        assert!(apply(&mut empty, &defaults));
        let r = pod_requests(&empty);
        assert_eq!((r.get("cpu"), r.get("memory")), (200, 256 << 20));
        // A limit set by the container is its request.
        let mut limited = pod("ds", json!([{"name": "c", "resources": {"limits": {"cpu": "1"}}}]));
        apply(&mut limited, &defaults);
        assert_eq!(pod_requests(&limited).get("cpu"), 1000);
        // What the container sets stays.
        let mut set =
            pod("ds", json!([{"name": "c", "resources": {"requests": {"cpu": "50m", "memory": "8Mi"}}}]));
        apply(&mut set, &defaults);
        let r = pod_requests(&set);
        assert_eq!((r.get("cpu"), r.get("memory")), (50, 8 << 20));
        // Other namespaces are untouched, and a pod with nothing to add is shared, not copied.
        let other = Arc::new(pod("other", json!([{"name": "c"}])));
        assert!(Arc::ptr_eq(&with_defaults(&other, &defaults), &other));
        assert!(pod_requests(&other).is_zero() || pod_requests(&other).get("cpu") == 0);
    }

    #[test]
    fn init_containers_get_them_too_and_limits_alone_make_requests() {
        let defaults = defaults_by_namespace(&[]);
        let mut p: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "x"}, "spec": {
            "initContainers": [{"name": "i", "resources": {"limits": {"cpu": "2"}}}],
            "containers": [{"name": "c", "resources": {"limits": {"memory": "1Gi"}}}]}}))
            .unwrap();
        assert!(apply(&mut p, &defaults));
        let r = pod_requests(&p);
        assert_eq!((r.get("cpu"), r.get("memory")), (2000, 1 << 30));
    }
}
