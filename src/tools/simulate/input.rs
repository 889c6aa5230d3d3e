//! Reading the simulation's input: Kubernetes manifests in YAML, one or many documents a file.
//!
//! Each document is read first as a generic value to look at its `kind`, then converted into the
//! typed object. Workloads are expanded into the pods their controllers would create.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::apis::pod::{Pod, PodSpec};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, PodTemplateSpec};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::apis::labels::{GROUP, VERSION};
use crate::apis::{EC2NodeClass, NodePool};
use crate::state::Snapshot;

use super::SimulateError;

/// Namespace of objects that do not name one.
pub const DEFAULT_NAMESPACE: &str = "default";

/// Everything read from the input files.
#[derive(Clone, Debug, Default)]
pub struct Manifests {
    /// NodePools (`karpenter.sh/v1`).
    pub nodepools: Vec<NodePool>,
    /// EC2NodeClasses: accepted, not used by the generated catalogs.
    pub node_classes: Vec<EC2NodeClass>,
    /// Pods, given directly or expanded from workloads; shared with the scheduler's input.
    pub pods: Vec<Arc<Pod>>,
    /// DaemonSets: each puts one pod on every node it fits.
    pub daemonsets: Vec<DaemonSet>,
    /// Existing nodes.
    pub nodes: Vec<Node>,
    /// Namespaces (their labels, for affinity namespace selectors).
    pub namespaces: Vec<Namespace>,
    /// PersistentVolumeClaims.
    pub persistent_volume_claims: Vec<PersistentVolumeClaim>,
    /// PersistentVolumes.
    pub persistent_volumes: Vec<PersistentVolume>,
    /// StorageClasses.
    pub storage_classes: Vec<StorageClass>,
    /// CSINodes.
    pub csi_nodes: Vec<CSINode>,
    /// Documents that were skipped, and why.
    pub warnings: Vec<String>,
}

impl Manifests {
    /// The objects as a cluster-state snapshot: what the scheduler-input builder reads.
    pub fn snapshot(&self) -> Snapshot {
        fn arcs<T: Clone>(items: &[T]) -> Vec<Arc<T>> {
            items.iter().cloned().map(Arc::new).collect()
        }
        Snapshot {
            pods: self.pods.clone(),
            nodes: arcs(&self.nodes),
            nodepools: arcs(&self.nodepools),
            nodeclasses: arcs(&self.node_classes),
            daemonsets: arcs(&self.daemonsets),
            namespaces: arcs(&self.namespaces),
            persistent_volumes: arcs(&self.persistent_volumes),
            persistent_volume_claims: arcs(&self.persistent_volume_claims),
            storage_classes: arcs(&self.storage_classes),
            csi_nodes: arcs(&self.csi_nodes),
            ..Snapshot::default()
        }
    }
}

/// Where a document comes from, for messages.
#[derive(Clone, Debug)]
struct Origin<'a> {
    file: &'a str,
    document: usize,
    item: Option<usize>,
}

impl Origin<'_> {
    fn describe(&self) -> String {
        match self.item {
            Some(item) => format!("{}: document {}, item {}", self.file, self.document, item),
            None => format!("{}: document {}", self.file, self.document),
        }
    }

    fn error(&self, message: impl Into<String>) -> SimulateError {
        SimulateError::Document {
            file: self.file.to_string(),
            document: self.document,
            item: self.item,
            message: message.into(),
        }
    }
}

/// The files to read for `paths`: a file as is, a directory's `*.yaml` and `*.yml` files sorted
/// by name (not recursively).
pub fn expand_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>, SimulateError> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path)
                .map_err(|source| SimulateError::Read { path: path.display().to_string(), source })?;
            let mut found = Vec::new();
            for entry in entries {
                let entry = entry
                    .map_err(|source| SimulateError::Read { path: path.display().to_string(), source })?;
                let p = entry.path();
                let is_yaml =
                    p.extension().and_then(|e| e.to_str()).is_some_and(|e| e == "yaml" || e == "yml");
                if is_yaml && p.is_file() {
                    found.push(p);
                }
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

/// Reads every file of `paths` (see [`expand_paths`]).
pub fn load_paths(paths: &[PathBuf]) -> Result<Manifests, SimulateError> {
    let mut manifests = Manifests::default();
    for file in expand_paths(paths)? {
        load_file(&file, &mut manifests)?;
    }
    Ok(manifests)
}

/// Reads one file into `manifests`.
pub fn load_file(path: &Path, manifests: &mut Manifests) -> Result<(), SimulateError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| SimulateError::Read { path: path.display().to_string(), source })?;
    parse_str(&text, &path.display().to_string(), manifests)
}

/// Splits a YAML stream into its documents, with the 1-based line each starts on; documents
/// holding only comments and blank lines are left out.
pub(crate) fn split_documents(text: &str) -> Vec<(usize, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (i, line) in text.lines().enumerate() {
        let is_marker = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        let is_end = line == "...";
        if is_marker || is_end {
            docs.push((start, std::mem::take(&mut current)));
            start = i + 2;
            if is_marker {
                // Content after the marker on the same line belongs to the new document.
                let rest = line[3..].trim_start();
                if !rest.is_empty() {
                    start = i + 1;
                    current.push_str(rest);
                    current.push('\n');
                }
            }
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    docs.push((start, current));
    docs.retain(|(_, d)| {
        d.lines().any(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#') && !t.starts_with('%')
        })
    });
    docs
}

/// Parses a multi-document YAML text; `file` names it in messages.
pub fn parse_str(text: &str, file: &str, manifests: &mut Manifests) -> Result<(), SimulateError> {
    for (index, (line, doc)) in split_documents(text).into_iter().enumerate() {
        let origin = Origin { file, document: index + 1, item: None };
        let value: Value = serde_saphyr::from_str(&doc).map_err(|e| {
            // The parser's message goes on with a picture of the input: its first line says it.
            let e = e.to_string();
            let first = e.lines().next().unwrap_or_default();
            origin.error(format!("invalid YAML (document starts at line {line}): {first}"))
        })?;
        if value.is_null() {
            continue;
        }
        add_value(value, &origin, manifests)?;
    }
    Ok(())
}

fn typed<T: DeserializeOwned>(value: Value, kind: &str, origin: &Origin<'_>) -> Result<T, SimulateError> {
    let name = value
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(|n| format!(" {n:?}"))
        .unwrap_or_default();
    serde_json::from_value(value).map_err(|e| origin.error(format!("{kind}{name}: {e}")))
}

fn add_value(value: Value, origin: &Origin<'_>, manifests: &mut Manifests) -> Result<(), SimulateError> {
    if !value.is_object() {
        return Err(origin.error("expected a Kubernetes object (a mapping with apiVersion and kind)"));
    }
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let api_version = value.get("apiVersion").and_then(Value::as_str).unwrap_or_default().to_string();
    match kind.as_str() {
        "" => return Err(origin.error("missing field `kind`")),
        "List" => {
            let items = match value.get("items") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => items.clone(),
                Some(_) => return Err(origin.error("List: field `items` is not a list")),
            };
            for (i, item) in items.into_iter().enumerate() {
                let inner = Origin { item: Some(i + 1), ..origin.clone() };
                add_value(item, &inner, manifests)?;
            }
        }
        "NodePool" => {
            if api_version != format!("{GROUP}/{VERSION}") {
                manifests.warnings.push(format!(
                    "{}: skipping NodePool of apiVersion {api_version:?} (only {GROUP}/{VERSION} is read)",
                    origin.describe()
                ));
                return Ok(());
            }
            manifests.nodepools.push(typed(value, &kind, origin)?);
        }
        "EC2NodeClass" => manifests.node_classes.push(typed(value, &kind, origin)?),
        "Pod" => {
            let mut pod: Pod = typed(value, &kind, origin)?;
            default_namespace(&mut pod.metadata);
            manifests.pods.push(Arc::new(pod));
        }
        "Deployment" => {
            let d: Deployment = typed(value, &kind, origin)?;
            let spec = d.spec.unwrap_or_default();
            expand(&d.metadata, &spec.template, spec.replicas.unwrap_or(1), "ReplicaSet", manifests);
        }
        "ReplicaSet" => {
            let r: ReplicaSet = typed(value, &kind, origin)?;
            let spec = r.spec.unwrap_or_default();
            expand(
                &r.metadata,
                &spec.template.unwrap_or_default(),
                spec.replicas.unwrap_or(1),
                "ReplicaSet",
                manifests,
            );
        }
        "StatefulSet" => {
            let s: StatefulSet = typed(value, &kind, origin)?;
            let spec = s.spec.unwrap_or_default();
            expand(&s.metadata, &spec.template, spec.replicas.unwrap_or(1), "StatefulSet", manifests);
        }
        "Job" => {
            let j: Job = typed(value, &kind, origin)?;
            let spec = j.spec.unwrap_or_default();
            expand(&j.metadata, &spec.template, spec.parallelism.unwrap_or(1), "Job", manifests);
        }
        "DaemonSet" => {
            let mut ds: DaemonSet = typed(value, &kind, origin)?;
            default_namespace(&mut ds.metadata);
            manifests.daemonsets.push(ds);
        }
        "Node" => manifests.nodes.push(typed(value, &kind, origin)?),
        "Namespace" => manifests.namespaces.push(typed(value, &kind, origin)?),
        "PersistentVolumeClaim" => {
            let mut pvc: PersistentVolumeClaim = typed(value, &kind, origin)?;
            default_namespace(&mut pvc.metadata);
            manifests.persistent_volume_claims.push(pvc);
        }
        "PersistentVolume" => manifests.persistent_volumes.push(typed(value, &kind, origin)?),
        "StorageClass" => manifests.storage_classes.push(typed(value, &kind, origin)?),
        "CSINode" => manifests.csi_nodes.push(typed(value, &kind, origin)?),
        other => manifests
            .warnings
            .push(format!("{}: skipping unsupported kind {other:?} ({api_version})", origin.describe())),
    }
    Ok(())
}

fn default_namespace(meta: &mut ObjectMeta) {
    if meta.namespace.as_deref().is_none_or(str::is_empty) {
        meta.namespace = Some(DEFAULT_NAMESPACE.to_string());
    }
}

/// A pod named `name` from a workload's template, in the workload's namespace, controlled by an
/// object of kind `controller` (`apps/v1` or `batch/v1`) named as the workload: a Deployment's
/// pods by a ReplicaSet, as in a cluster.
pub fn pod_from_template(
    owner: &ObjectMeta,
    template: &PodTemplateSpec,
    name: String,
    controller: &str,
) -> Pod {
    let mut metadata = template.metadata.clone().unwrap_or_default();
    metadata.name = Some(name);
    metadata.namespace = owner.namespace.clone();
    default_namespace(&mut metadata);
    let api_version = if controller == "Job" { "batch/v1" } else { "apps/v1" };
    metadata.owner_references = Some(vec![OwnerReference {
        api_version: api_version.into(),
        kind: controller.into(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    Pod { metadata, spec: template.spec.clone().map(PodSpec::from), status: None }
}

/// Adds `count` pods `<name>-<i>` built from `template`, controlled by a `controller`.
fn expand(
    owner: &ObjectMeta,
    template: &PodTemplateSpec,
    count: i32,
    controller: &str,
    manifests: &mut Manifests,
) {
    let base = owner.name.clone().unwrap_or_default();
    for i in 0..count.max(0) {
        manifests.pods.push(Arc::new(pod_from_template(owner, template, format!("{base}-{i}"), controller)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Manifests, SimulateError> {
        let mut m = Manifests::default();
        parse_str(text, "input.yaml", &mut m)?;
        Ok(m)
    }

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n    - name: c\n      image: i\n";

    #[test]
    fn reads_multiple_documents_and_skips_unknown_kinds() {
        let text = format!(
            "# leading comment\n---\n{POD}---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n---\n# only a comment\n---\n{}",
            POD.replace("name: p\n", "name: q\n  namespace: web\n")
        );
        let m = parse(&text).expect("parses");
        let names: Vec<String> = m
            .pods
            .iter()
            .map(|p| {
                format!(
                    "{}/{}",
                    p.metadata.namespace.clone().unwrap_or_default(),
                    p.metadata.name.clone().unwrap_or_default()
                )
            })
            .collect();
        assert_eq!(names, vec!["default/p", "web/q"]);
        assert_eq!(m.warnings.len(), 1);
        assert!(
            m.warnings[0].contains("document 2") && m.warnings[0].contains("ConfigMap"),
            "{:?}",
            m.warnings
        );
    }

    #[test]
    fn reads_lists() {
        let text = "apiVersion: v1\nkind: List\nitems:\n  - apiVersion: v1\n    kind: Pod\n    metadata: {name: a}\n    spec: {containers: [{name: c}]}\n  - apiVersion: v1\n    kind: Node\n    metadata: {name: n1}\n";
        let m = parse(text).expect("parses");
        assert_eq!(m.pods.len(), 1);
        assert_eq!(m.nodes.len(), 1);
    }

    #[test]
    fn expands_workloads() {
        let text = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  replicas: 3\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: c, resources: {requests: {cpu: 1}}}]}\n---\napiVersion: batch/v1\nkind: Job\nmetadata: {name: batch}\nspec:\n  template:\n    spec: {containers: [{name: c}]}\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent}\nspec:\n  selector: {matchLabels: {app: agent}}\n  template:\n    spec: {containers: [{name: c}]}\n";
        let m = parse(text).expect("parses");
        let names: Vec<String> = m.pods.iter().map(|p| p.metadata.name.clone().unwrap_or_default()).collect();
        assert_eq!(names, vec!["web-0", "web-1", "web-2", "batch-0"]);
        assert_eq!(m.pods[0].metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(m.pods[3].metadata.namespace.as_deref(), Some(DEFAULT_NAMESPACE));
        assert_eq!(
            m.pods[0].metadata.labels.as_ref().and_then(|l| l.get("app")).map(String::as_str),
            Some("web")
        );
        assert_eq!(m.daemonsets.len(), 1);
    }

    #[test]
    fn malformed_document_names_file_and_index() {
        let text = format!(
            "{POD}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: bad}}\nspec:\n  containers: nope\n"
        );
        let err = parse(&text).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("input.yaml") && err.contains("document 2"), "{err}");
        assert!(err.contains("\"bad\"") && err.contains("invalid type"), "{err}");

        let err = parse("kind: Pod\n---\n[unclosed\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("document 2") && err.contains("invalid YAML"), "{err}");

        let err = parse("just a string\n").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("document 1"), "{err}");
    }
}
