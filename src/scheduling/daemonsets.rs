//! Which DaemonSet pods a node runs, and what they cost it: the overhead every new node, in-flight
//! NodeClaim and not yet initialized node must keep free for them.

use crate::apis::pod::Pod;

use super::requirements::Requirements;
use super::requirements::pod_node_requirements;
use super::resources::{Resources, has_dra_requirements, pod_requests};
use super::taints::check_tolerated;
use crate::apis::Taint;

/// Whether the DaemonSet pod `ds` (one per DaemonSet, from its template) runs on a node with
/// `requirements` (its labels, or a NodePool's template) and `taints`: it tolerates the taints,
/// and its node selector with one of its required node-affinity terms fits the requirements.
/// Labels the requirements leave undefined (a zone not chosen yet) do not exclude it.
pub fn runs_on(ds: &Pod, requirements: &Requirements, taints: &[Taint]) -> bool {
    let tolerations = ds.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or(&[]);
    if check_tolerated(taints, tolerations).is_err() {
        return false;
    }
    let Ok((base, required, _)) = pod_node_requirements(ds) else { return false };
    if required.is_empty() {
        return requirements.compatible(&base, true).is_ok();
    }
    required.iter().any(|term| {
        let mut strict = base.clone();
        strict.add_all(term);
        requirements.compatible(&strict, true).is_ok()
    })
}

/// The requests of the DaemonSet pods of `daemonsets` that run on such a node. DaemonSets whose
/// pods claim DRA devices are left out, as upstream (their claims are not simulated).
pub fn overhead(daemonsets: &[Pod], requirements: &Requirements, taints: &[Taint]) -> Resources {
    let mut total = Resources::default();
    for ds in daemonsets.iter().filter(|ds| !has_dra_requirements(ds) && runs_on(ds, requirements, taints)) {
        total.add_assign(&pod_requests(ds));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::TaintEffect;

    fn ds(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn labels(pairs: &[(&str, &str)]) -> Requirements {
        let map: std::collections::BTreeMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Requirements::from_labels(&map)
    }

    #[test]
    fn selectors_affinity_terms_and_taints_decide() {
        let plain = ds(serde_json::json!({"spec": {"containers": [{"name": "c",
            "resources": {"requests": {"cpu": "100m"}}}]}}));
        let arm_only = ds(serde_json::json!({"spec": {"nodeSelector": {"kubernetes.io/arch": "arm64"},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "200m"}}}]}}));
        let either_zone = ds(serde_json::json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}]}]}}},
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "300m"}}}]}}));
        let tolerant = ds(serde_json::json!({"spec": {"tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "400m"}}}]}}));
        let all = [plain, arm_only, either_zone, tolerant];

        let node = labels(&[("kubernetes.io/arch", "amd64"), ("topology.kubernetes.io/zone", "b")]);
        assert_eq!(overhead(&all, &node, &[]).get("cpu"), 100 + 300 + 400, "the second term matches");
        let tainted = [Taint::new("dedicated", TaintEffect::NoSchedule)];
        assert_eq!(overhead(&all, &node, &tainted).get("cpu"), 400, "only the tolerant one");
        let arm = labels(&[("kubernetes.io/arch", "arm64"), ("topology.kubernetes.io/zone", "c")]);
        assert_eq!(overhead(&all, &arm, &[]).get("cpu"), 100 + 200 + 400);
        // A claim whose zone is not decided yet may still get the zonal one.
        let undecided = labels(&[("kubernetes.io/arch", "amd64")]);
        assert_eq!(overhead(&all, &undecided, &[]).get("cpu"), 100 + 300 + 400);
    }
}
