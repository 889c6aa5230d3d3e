//! The one zone a pending pod can go to, as upstream's `karpenter_scheduler_pending_pods_by_
//! effective_zone_count` reports it: from the pod's strict node requirements (node selector and
//! required node affinity) and its volumes' zones. Topology spread, which upstream also reads, is
//! left out: its domains depend on the simulation, and a pod constrained only by it counts as
//! `flexible`.

use std::collections::BTreeSet;

use crate::apis::pod::Pod;

use crate::apis::Operator;
use crate::apis::labels::LABEL_TOPOLOGY_ZONE;

use super::requirements::pod_node_requirements;
use super::{Requirements, VolumeInput};

/// The zone label value of a pod that can go to several zones (or any).
pub const FLEXIBLE: &str = "flexible";
/// The zone label value of a pod that can go to no zone.
pub const NONE: &str = "none";

/// The zones `reqs` allow; `None` when they do not constrain the zone.
fn zones_of(reqs: &Requirements) -> Option<BTreeSet<String>> {
    let r = reqs.get(LABEL_TOPOLOGY_ZONE)?;
    match r.operator() {
        Operator::In => Some(r.values().iter().map(String::from).collect()),
        Operator::DoesNotExist => Some(BTreeSet::new()),
        _ => None,
    }
}

/// The zones any of `terms` (ORed) allows; `None` when one of them does not constrain the zone
/// or there are none.
fn zones_of_terms(terms: &[Requirements]) -> Option<BTreeSet<String>> {
    if terms.is_empty() {
        return None;
    }
    let mut out = BTreeSet::new();
    for t in terms {
        out.extend(zones_of(t)?);
    }
    Some(out)
}

/// The zone `pod` can go to: a zone's name, [`FLEXIBLE`] for several or any, [`NONE`] for none
/// (its requirements or volumes cannot be met, or contradict each other).
pub fn effective_zone(pod: &Pod, volumes: &VolumeInput) -> String {
    let Ok((base, required, _)) = pod_node_requirements(pod) else { return NONE.into() };
    let from_pod = if required.is_empty() {
        zones_of(&base)
    } else {
        let terms: Vec<Requirements> = required
            .iter()
            .map(|t| {
                let mut merged = base.clone();
                merged.add_all(t);
                merged
            })
            .collect();
        zones_of_terms(&terms)
    };
    let from_volumes = match volumes.pod_terms(pod) {
        Ok(terms) => zones_of_terms(&terms),
        Err(_) => return NONE.into(),
    };
    let zones = match (from_pod, from_volumes) {
        (None, None) => return FLEXIBLE.into(),
        (Some(z), None) | (None, Some(z)) => z,
        (Some(a), Some(b)) => a.intersection(&b).cloned().collect(),
    };
    match zones.len() {
        0 => NONE.into(),
        1 => zones.into_iter().next().unwrap_or_else(|| NONE.into()),
        _ => FLEXIBLE.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({ "spec": spec })).unwrap()
    }

    fn required(terms: serde_json::Value) -> serde_json::Value {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}})
    }

    fn zone(operator: &str, values: &[&str]) -> serde_json::Value {
        json!({"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": operator, "values": values}]})
    }

    #[test]
    fn zones_from_selectors_and_affinity() {
        let v = VolumeInput::default();
        assert_eq!(effective_zone(&pod(json!({"containers": []})), &v), FLEXIBLE);
        let one =
            pod(json!({"containers": [], "nodeSelector": {"topology.kubernetes.io/zone": "us-west-2a"}}));
        assert_eq!(effective_zone(&one, &v), "us-west-2a");
        let two = pod(json!({"containers": [], "affinity": required(json!([
            zone("In", &["us-west-2a"]),
            zone("In", &["us-west-2b"]),
        ]))}));
        assert_eq!(effective_zone(&two, &v), FLEXIBLE);
        let narrowed = pod(json!({
            "containers": [],
            "nodeSelector": {"topology.kubernetes.io/zone": "us-west-2a"},
            "affinity": required(json!([zone("In", &["us-west-2b", "us-west-2a"])])),
        }));
        assert_eq!(effective_zone(&narrowed, &v), "us-west-2a");
        let contradiction = pod(json!({
            "containers": [],
            "nodeSelector": {"topology.kubernetes.io/zone": "us-west-2a"},
            "affinity": required(json!([zone("In", &["us-west-2b"])])),
        }));
        assert_eq!(effective_zone(&contradiction, &v), NONE);
        let not_in =
            pod(json!({"containers": [], "affinity": required(json!([zone("NotIn", &["us-west-2b"])]))}));
        assert_eq!(effective_zone(&not_in, &v), FLEXIBLE);
    }
}
