//! Persistent volumes as the scheduler sees them: where a pod's volumes let it run, and how many
//! volumes of each CSI driver a node may attach.
//!
//! A pod volume that is a `persistentVolumeClaim`, or a generic `ephemeral` volume (whose claim
//! is named `<pod>-<volume>`), is looked up by claim. A bound claim's PersistentVolume
//! `nodeAffinity` says where the pod may go (hostname terms of local and hostPath volumes left
//! out, as upstream, so that the pod may move to a new node); a claim not bound yet takes the
//! `allowedTopologies` of its StorageClass, whatever its binding mode (the volume will be made in
//! one of them). The requirements of every volume hold together, and with each of the pod's
//! ORed node-affinity terms. A claim, volume or class that does not exist makes the pod
//! unschedulable with a reason naming it.
//!
//! Attach limits come from CSINodes (`allocatable.count` per driver) and hold on existing nodes
//! only: the limit of a new node is not known before it starts. A node's volumes are those of the
//! pods bound to it, counted once per claim.

use std::collections::{BTreeMap, BTreeSet};

use crate::apis::pod::{Pod, Volume};
use k8s_openapi::api::core::v1::{
    NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim, TopologySelectorTerm,
};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};

use crate::apis::labels::LABEL_HOSTNAME;

use super::requirements::{Requirement, Requirements};

/// Most ORed alternatives kept when volumes and node-affinity terms are combined; later ones are
/// dropped (the pod may then fit in fewer places, never in a wrong one).
const MAX_TERMS: usize = 16;

/// Annotation of the default StorageClass.
const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// A PersistentVolumeClaim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimInfo {
    /// The PersistentVolume it is bound to.
    pub volume_name: Option<String>,
    /// Its StorageClass.
    pub storage_class: Option<String>,
}

/// A PersistentVolume.
#[derive(Clone, Debug)]
pub struct VolumeInfo {
    /// ORed node requirements (none: any node), or why they cannot be read.
    pub terms: Result<Vec<Requirements>, String>,
    /// CSI driver, for attach limits.
    pub driver: Option<String>,
}

/// A StorageClass.
#[derive(Clone, Debug, Default)]
pub struct ClassInfo {
    /// The provisioner: the CSI driver of the volumes it makes.
    pub provisioner: String,
    /// ORed `allowedTopologies` (none: anywhere).
    pub terms: Vec<Requirements>,
    /// Whether it is the default class.
    pub default: bool,
}

/// Volumes, claims, classes and attach limits of a scheduling run.
#[derive(Clone, Debug, Default)]
pub struct VolumeInput {
    /// PersistentVolumeClaims by namespace, then name.
    pub claims: BTreeMap<String, BTreeMap<String, ClaimInfo>>,
    /// PersistentVolumes by name.
    pub volumes: BTreeMap<String, VolumeInfo>,
    /// StorageClasses by name.
    pub classes: BTreeMap<String, ClassInfo>,
    /// Most volumes per CSI driver, by node name (from CSINodes).
    pub attach_limits: BTreeMap<String, BTreeMap<String, i64>>,
}

/// Volumes per CSI driver, each as `namespace/claim`.
pub type Attachments = BTreeMap<String, BTreeSet<String>>;

/// What one pod volume resolves to.
struct Resolved<'a> {
    /// `namespace/claim`.
    id: String,
    /// The bound volume, with its name.
    volume: Option<(&'a str, &'a VolumeInfo)>,
    class: Option<&'a ClassInfo>,
}

fn term_of(t: &NodeSelectorTerm, drop_hostname: bool) -> Result<Requirements, String> {
    let exprs = t.match_expressions.as_deref().unwrap_or(&[]);
    let mut r = Requirements::from_node_selector(exprs).map_err(|e| e.to_string())?;
    if drop_hostname {
        r.remove(LABEL_HOSTNAME);
    }
    Ok(r)
}

fn topology_term(t: &TopologySelectorTerm) -> Requirements {
    let mut r = Requirements::new();
    for e in t.match_label_expressions.iter().flatten() {
        r.add(&e.key, Requirement::in_values(e.values.iter().cloned()));
    }
    r
}

/// Every alternative of `a` with every alternative of `b` (ANDed), leaving out the pairs that
/// conflict; an empty side does not constrain. `None` when every pair conflicts.
pub fn and_terms(a: &[Requirements], b: &[Requirements]) -> Option<Vec<Requirements>> {
    if b.is_empty() {
        return Some(a.to_vec());
    }
    if a.is_empty() {
        return Some(b.iter().take(MAX_TERMS).cloned().collect());
    }
    let mut out = Vec::new();
    for (x, y) in a.iter().flat_map(|x| b.iter().map(move |y| (x, y))) {
        if out.len() == MAX_TERMS {
            break;
        }
        if x.intersects(y).is_ok() {
            let mut r = x.clone();
            r.add_all(y);
            out.push(r);
        }
    }
    (!out.is_empty()).then_some(out)
}

impl VolumeInput {
    /// Adds a PersistentVolumeClaim (without a namespace: `default`).
    pub fn add_claim(&mut self, pvc: &PersistentVolumeClaim) {
        let ns = pvc.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
        let spec = pvc.spec.as_ref();
        let info = ClaimInfo {
            volume_name: spec.and_then(|s| s.volume_name.clone()).filter(|v| !v.is_empty()),
            storage_class: spec.and_then(|s| s.storage_class_name.clone()).filter(|c| !c.is_empty()),
        };
        self.claims.entry(ns).or_default().insert(pvc.metadata.name.clone().unwrap_or_default(), info);
    }

    /// Adds a PersistentVolume.
    pub fn add_volume(&mut self, pv: &PersistentVolume) {
        let spec = pv.spec.as_ref();
        let local = spec.is_some_and(|s| s.local.is_some() || s.host_path.is_some());
        let terms = spec
            .and_then(|s| s.node_affinity.as_ref())
            .and_then(|a| a.required.as_ref())
            .map(|sel| sel.node_selector_terms.iter().map(|t| term_of(t, local)).collect())
            .unwrap_or(Ok(vec![]));
        let info = VolumeInfo { terms, driver: spec.and_then(|s| s.csi.as_ref()).map(|c| c.driver.clone()) };
        self.volumes.insert(pv.metadata.name.clone().unwrap_or_default(), info);
    }

    /// Adds a StorageClass.
    pub fn add_class(&mut self, sc: &StorageClass) {
        let info = ClassInfo {
            provisioner: sc.provisioner.clone(),
            terms: sc.allowed_topologies.iter().flatten().map(topology_term).collect(),
            default: sc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true"),
        };
        self.classes.insert(sc.metadata.name.clone().unwrap_or_default(), info);
    }

    /// Adds the attach limits of a CSINode (named after its node).
    pub fn add_csi_node(&mut self, node: &CSINode) {
        let limits: BTreeMap<String, i64> = node
            .spec
            .drivers
            .iter()
            .filter_map(|d| Some((d.name.clone(), i64::from(d.allocatable.as_ref()?.count?))))
            .collect();
        if !limits.is_empty() {
            self.attach_limits.insert(node.metadata.name.clone().unwrap_or_default(), limits);
        }
    }

    /// The class a claim without one gets: the default class (the first by name if several).
    fn default_class(&self) -> Option<&ClassInfo> {
        self.classes.values().find(|c| c.default)
    }

    /// Looks a pod volume up; `None` for volumes that are not claims.
    fn resolve(&self, pod: &Pod, v: &Volume) -> Result<Option<Resolved<'_>>, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let (name, template_class) = if let Some(pvc) = &v.persistent_volume_claim {
            (pvc.claim_name.clone(), None)
        } else if let Some(eph) = &v.ephemeral {
            let spec = eph.volume_claim_template.as_ref().map(|t| &t.spec);
            (format!("{pod_name}-{}", v.name), Some(spec.and_then(|s| s.storage_class_name.clone())))
        } else {
            return Ok(None);
        };
        let id = format!("{ns}/{name}");
        let claim = self.claims.get(ns).and_then(|c| c.get(&name));
        // The claim of an ephemeral volume is made with the pod: until then, its template says
        // which class it will have.
        let (volume_name, class_name) = match (claim, template_class) {
            (Some(c), _) => (c.volume_name.as_deref(), c.storage_class.clone()),
            (None, Some(class)) => (None, class.filter(|c| !c.is_empty())),
            (None, None) => return Err(format!("persistentvolumeclaim {id} not found")),
        };
        if let Some(pv) = volume_name {
            let (pv, volume) = self
                .volumes
                .get_key_value(pv)
                .ok_or_else(|| format!("persistentvolume {pv} of persistentvolumeclaim {id} not found"))?;
            return Ok(Some(Resolved { id, volume: Some((pv.as_str(), volume)), class: None }));
        }
        let class = match &class_name {
            Some(c) => Some(
                self.classes
                    .get(c)
                    .ok_or_else(|| format!("storageclass {c} of persistentvolumeclaim {id} not found"))?,
            ),
            None if claim.is_none() => self.default_class(),
            None => None,
        };
        Ok(Some(Resolved { id, volume: None, class }))
    }

    /// The ORed node requirements the pod's volumes need (none: any node), or why the pod cannot
    /// be scheduled.
    pub fn pod_terms(&self, pod: &Pod) -> Result<Vec<Requirements>, String> {
        let mut terms: Vec<Requirements> = vec![];
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Some(r) = self.resolve(pod, v)? else { continue };
            let alternatives = match (r.volume, r.class) {
                (Some((pv, volume)), _) => volume
                    .terms
                    .clone()
                    .map_err(|e| format!("persistentvolume {pv}: invalid node affinity: {e}"))?,
                (None, Some(class)) => class.terms.clone(),
                (None, None) => vec![],
            };
            terms = and_terms(&terms, &alternatives).ok_or_else(|| {
                format!("volume of persistentvolumeclaim {} conflicts with the pod's other volumes", r.id)
            })?;
        }
        Ok(terms)
    }

    /// The pod's volumes per CSI driver; volumes that cannot be resolved are left out.
    pub fn pod_attachments(&self, pod: &Pod) -> Attachments {
        let mut out = Attachments::new();
        self.add_attachments(pod, &mut out);
        out
    }

    /// Adds the pod's volumes per CSI driver to `out`.
    pub fn add_attachments(&self, pod: &Pod, out: &mut Attachments) {
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Ok(Some(r)) = self.resolve(pod, v) else { continue };
            let driver = match (r.volume, r.class) {
                (Some((_, volume)), _) => volume.driver.as_deref(),
                (None, Some(class)) => Some(class.provisioner.as_str()),
                (None, None) => None,
            };
            if let Some(d) = driver {
                out.entry(d.to_string()).or_default().insert(r.id);
            }
        }
    }
}

/// The first driver whose limit `incoming` would pass on a node with `attached` volumes, with
/// the count it would reach. Volumes already attached count once.
pub fn exceeded_limit<'a>(
    limits: &BTreeMap<String, i64>,
    attached: &Attachments,
    incoming: &'a Attachments,
) -> Option<(&'a str, usize)> {
    for (driver, ids) in incoming {
        let Some(limit) = limits.get(driver) else { continue };
        let have = attached.get(driver);
        let added = ids.iter().filter(|id| have.is_none_or(|h| !h.contains(*id))).count();
        if added == 0 {
            continue;
        }
        let total = have.map_or(0, BTreeSet::len) + added;
        if i64::try_from(total).unwrap_or(i64::MAX) > *limit {
            return Some((driver, total));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use rstest::rstest;
    use serde_json::{Value, json};

    use super::*;

    fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn claim(name: &str, volume: Option<&str>, class: Option<&str>) -> PersistentVolumeClaim {
        obj(json!({"metadata": {"name": name, "namespace": "shop"},
            "spec": {"volumeName": volume, "storageClassName": class}}))
    }

    fn zonal_volume(name: &str, zones: &[&str]) -> PersistentVolume {
        obj(json!({"metadata": {"name": name}, "spec": {
            "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": name},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": zones}]}]}}}}))
    }

    fn class(name: &str, zones: &[&str], default: bool) -> StorageClass {
        let topologies: Vec<Value> = if zones.is_empty() {
            vec![]
        } else {
            vec![json!({"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": zones}]})]
        };
        obj(
            json!({"metadata": {"name": name, "annotations": {DEFAULT_CLASS_ANNOTATION: default.to_string()}},
            "provisioner": "ebs.csi.aws.com", "volumeBindingMode": "WaitForFirstConsumer",
            "allowedTopologies": topologies}),
        )
    }

    /// Claims and volumes of namespace `shop`.
    fn input() -> VolumeInput {
        let mut v = VolumeInput::default();
        v.add_claim(&claim("bound", Some("pv-z1"), Some("gp3")));
        v.add_claim(&claim("unbound", None, Some("gp3")));
        v.add_claim(&claim("no-class", None, None));
        v.add_claim(&claim("lost-class", None, Some("gone")));
        v.add_claim(&claim("lost-volume", Some("pv-gone"), Some("gp3")));
        v.add_claim(&claim("local", Some("pv-local"), None));
        v.add_claim(&claim("db-made", Some("pv-z1"), None));
        v.add_volume(&zonal_volume("pv-z1", &["z1"]));
        v.add_volume(&obj(json!({"metadata": {"name": "pv-local"}, "spec": {
            "local": {"path": "/mnt/disk"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]},
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z3"]}]}]}}}})));
        v.add_class(&class("gp3", &["z2", "z3"], false));
        v.add_class(&class("standard", &["z3"], true));
        v
    }

    fn pod(volumes: Value) -> Pod {
        obj(json!({"metadata": {"name": "db", "namespace": "shop"},
            "spec": {"containers": [{"name": "c"}], "volumes": volumes}}))
    }

    fn describe(terms: &[Requirements]) -> Vec<String> {
        terms
            .iter()
            .map(|t| t.iter().map(|(k, r)| format!("{k} {}", r.describe())).collect::<Vec<_>>().join(", "))
            .collect()
    }

    const ZONE: &str = "topology.kubernetes.io/zone";

    #[rstest]
    #[case::bound_volume_pins_its_zone(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "bound"}}]), Ok(vec![format!("{ZONE} [z1]")]))]
    #[case::unbound_claim_takes_allowed_topologies(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "unbound"}}]), Ok(vec![format!("{ZONE} [z2, z3]")]))]
    #[case::unbound_claim_without_class_is_free(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "no-class"}}]), Ok(vec![]))]
    #[case::local_volume_drops_its_hostname(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "local"}}]), Ok(vec![format!("{ZONE} [z3]")]))]
    #[case::volumes_combine(json!([{"name": "a", "persistentVolumeClaim": {"claimName": "unbound"}}, {"name": "b", "persistentVolumeClaim": {"claimName": "local"}}]), Ok(vec![format!("{ZONE} [z3]")]))]
    #[case::other_volumes_are_ignored(json!([{"name": "c", "configMap": {"name": "x"}}, {"name": "e", "emptyDir": {}}]), Ok(vec![]))]
    #[case::ephemeral_volume_uses_its_claim(json!([{"name": "made", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "gp3"}}}}]), Ok(vec![format!("{ZONE} [z1]")]))]
    #[case::ephemeral_volume_before_its_claim_uses_the_template_class(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "gp3"}}}}]), Ok(vec![format!("{ZONE} [z2, z3]")]))]
    #[case::ephemeral_volume_without_class_uses_the_default(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]), Ok(vec![format!("{ZONE} [z3]")]))]
    #[case::volumes_in_different_zones(json!([{"name": "a", "persistentVolumeClaim": {"claimName": "bound"}}, {"name": "b", "persistentVolumeClaim": {"claimName": "local"}}]), Err("volume of persistentvolumeclaim shop/local conflicts with the pod's other volumes"))]
    #[case::missing_claim(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}]), Err("persistentvolumeclaim shop/nope not found"))]
    #[case::missing_class(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "lost-class"}}]), Err("storageclass gone of persistentvolumeclaim shop/lost-class not found"))]
    #[case::missing_class_of_ephemeral_volume(json!([{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {"storageClassName": "gone"}}}}]), Err("storageclass gone of persistentvolumeclaim shop/db-scratch not found"))]
    #[case::missing_volume(json!([{"name": "d", "persistentVolumeClaim": {"claimName": "lost-volume"}}]), Err("persistentvolume pv-gone of persistentvolumeclaim shop/lost-volume not found"))]
    fn pod_terms(#[case] volumes: Value, #[case] want: Result<Vec<String>, &str>) {
        let got = input().pod_terms(&pod(volumes)).map(|t| describe(&t));
        assert_eq!(got, want.map_err(str::to_string));
    }

    #[test]
    fn ored_terms_are_combined_pairwise_up_to_a_bound() {
        let t = |z: &str| {
            Requirements::from_labels(
                &[(ZONE.to_string(), z.to_string())].into_iter().collect::<BTreeMap<_, _>>(),
            )
        };
        let a = vec![t("z1"), t("z2")];
        let b = vec![t("z2"), t("z3")];
        let and = |a: &[Requirements], b: &[Requirements]| and_terms(a, b).map(|t| describe(&t));
        assert_eq!(and(&a, &[]), Some(describe(&a)));
        assert_eq!(and(&[], &b), Some(describe(&b)));
        assert_eq!(and(&a, &b), Some(vec![format!("{ZONE} [z2]")]));
        assert_eq!(and(&[t("z1")], &b), None);
        let any = |i: usize| {
            let mut r = t(&format!("z{i}"));
            r.add("app", Requirement::exists());
            r
        };
        let many: Vec<Requirements> = (0..10).map(any).collect();
        let wide: Vec<Requirements> = (0..10).map(|_| Requirements::new()).collect();
        assert_eq!(and_terms(&many, &wide).map(|t| t.len()), Some(MAX_TERMS));
    }

    /// `driver:id,id driver:id`.
    fn attachments(s: &str) -> Attachments {
        s.split_whitespace()
            .filter_map(|p| p.split_once(':'))
            .map(|(d, ids)| (d.to_string(), ids.split(',').map(str::to_string).collect()))
            .collect()
    }

    #[rstest]
    #[case::under_the_limit("ebs:a", "ebs:b", None)]
    #[case::over_the_limit("ebs:a,b", "ebs:c", Some(("ebs", 3)))]
    #[case::shared_claim_counts_once("ebs:a,b", "ebs:b", None)]
    #[case::other_driver_is_unlimited("ebs:a,b", "efs:c,d,e", None)]
    #[case::two_new_volumes("ebs:a", "ebs:b,c", Some(("ebs", 3)))]
    #[case::nothing_attached_yet("", "ebs:a,b", None)]
    fn attach_limits(#[case] attached: &str, #[case] incoming: &str, #[case] want: Option<(&str, usize)>) {
        let limits: BTreeMap<String, i64> = [("ebs".to_string(), 2)].into();
        let incoming = attachments(incoming);
        assert_eq!(exceeded_limit(&limits, &attachments(attached), &incoming), want);
    }

    #[test]
    fn attachments_name_claims_by_driver() {
        let v = input();
        let p = pod(json!([
            {"name": "a", "persistentVolumeClaim": {"claimName": "bound"}},
            {"name": "b", "persistentVolumeClaim": {"claimName": "unbound"}},
            {"name": "c", "persistentVolumeClaim": {"claimName": "no-class"}},
            {"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}]));
        assert_eq!(v.pod_attachments(&p), attachments("ebs.csi.aws.com:shop/bound,shop/unbound"));

        let mut v = v;
        v.add_csi_node(&obj(json!({"metadata": {"name": "n1"}, "spec": {"drivers": [
            {"name": "ebs.csi.aws.com", "nodeID": "i-1", "allocatable": {"count": 25}},
            {"name": "efs.csi.aws.com", "nodeID": "i-1"}]}})));
        assert_eq!(v.attach_limits["n1"], BTreeMap::from([("ebs.csi.aws.com".to_string(), 25)]));
    }
}
