//! `karpenter simulate`: what would Karpenter launch for these manifests?
//!
//! Reads NodePools, workloads and existing nodes from YAML files ([`input`]), takes instance
//! types from a catalog ([`catalog`]), runs the [`scheduling`](crate::scheduling) engine once and
//! reports the NodeClaims it would create, the pods that fit on existing nodes and the pods that
//! fit nowhere ([`report`]). Nothing talks to a cluster or a cloud.
//!
//! Pods with `spec.nodeName` naming a node of the input are bound to it (they use its resources
//! and count for topology); other pods with a `spec.nodeName`, and pods that have finished, are
//! ignored with a warning. Nodes labelled with a NodePool count toward that NodePool's limits.

pub mod catalog;
pub mod input;
pub mod report;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use thiserror::Error;

use crate::apis::labels::LABEL_NODEPOOL;
use crate::apis::{Taint, TaintEffect};
use crate::scheduling::resources::{NODES, pod_requests};
use crate::scheduling::{
    ExistingNode, InstanceType, NodePoolInput, Resources, SchedulingError, SchedulingInput, schedule,
};

pub use catalog::Catalog;
pub use input::{Manifests, load_paths, parse_str};
pub use report::Report;

/// Errors of a simulation.
#[derive(Debug, Error)]
pub enum SimulateError {
    /// A file or directory could not be read.
    #[error("reading {path}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A document of an input file is malformed.
    #[error("{file}: document {document}{}: {message}", item.map(|i| format!(", item {i}")).unwrap_or_default())]
    Document {
        /// The file.
        file: String,
        /// 1-based index of the document in the file.
        document: usize,
        /// 1-based index in the items of a `List`.
        item: Option<usize>,
        /// What is wrong.
        message: String,
    },
    /// A catalog file is malformed.
    #[error("instance-type catalog {file}: {message}")]
    Catalog {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The embedded AWS catalog cannot be used.
    #[error("loading the aws instance-type catalog")]
    AwsCatalog(#[source] crate::cloudprovider::aws::embedded::EmbeddedCatalogError),
    /// A NodePool cannot be turned into scheduler input.
    #[error("invalid NodePool")]
    NodePool(#[from] SchedulingError),
    /// A node's allocatable or taints are malformed.
    #[error("node {node}: {message}")]
    Node {
        /// The node.
        node: String,
        /// What is wrong.
        message: String,
    },
    /// The report could not be rendered.
    #[error("rendering the report: {0}")]
    Render(String),
}

/// How to print the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned text tables.
    #[default]
    Table,
    /// JSON (see [`report`]).
    Json,
    /// YAML (see [`report`]).
    Yaml,
}

fn node_taints(node: &Node) -> Result<Vec<Taint>, SimulateError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
    taints
        .into_iter()
        .map(|t| {
            let effect = match t.effect.as_str() {
                "NoSchedule" => TaintEffect::NoSchedule,
                "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
                "NoExecute" => TaintEffect::NoExecute,
                other => {
                    return Err(SimulateError::Node {
                        node: name.clone(),
                        message: format!("taint {}: unknown effect {other:?}", t.key),
                    });
                }
            };
            Ok(Taint { key: t.key, value: t.value, effect, time_added: None })
        })
        .collect()
}

fn node_resources(node: &Node, capacity: bool) -> Result<Resources, SimulateError> {
    let status = node.status.as_ref();
    let list = if capacity {
        status.and_then(|s| s.capacity.clone().or_else(|| s.allocatable.clone()))
    } else {
        status.and_then(|s| s.allocatable.clone().or_else(|| s.capacity.clone()))
    };
    Resources::from_list(&list.unwrap_or_default()).map_err(|e| SimulateError::Node {
        node: node.metadata.name.clone().unwrap_or_default(),
        message: e.to_string(),
    })
}

fn is_finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn pod_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Builds the scheduler's input; returns warnings about ignored pods alongside.
pub fn scheduling_input(
    manifests: &Manifests,
    instance_types: &[Arc<InstanceType>],
) -> Result<(SchedulingInput, Vec<String>), SimulateError> {
    let mut warnings = Vec::new();
    let mut existing: Vec<ExistingNode> = Vec::new();
    let mut usage: BTreeMap<String, Resources> = BTreeMap::new();
    for node in &manifests.nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        if let Some(np) = labels.get(LABEL_NODEPOOL) {
            let used = usage.entry(np.clone()).or_default();
            used.add_assign(&node_resources(node, true)?);
            used.set(NODES, used.get(NODES) + 1);
        }
        existing.push(ExistingNode {
            name,
            labels,
            taints: node_taints(node)?,
            startup_taints: vec![],
            initialized: true,
            allocatable: node_resources(node, false)?,
            requested: Resources::default(),
            pods: vec![],
        });
    }
    let mut pending = Vec::new();
    for pod in &manifests.pods {
        if is_finished(pod) {
            warnings.push(format!("pod {}: finished, ignored", pod_name(pod)));
            continue;
        }
        match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).filter(|n| !n.is_empty()) {
            None => pending.push(Arc::clone(pod)),
            Some(node) => match existing.iter_mut().find(|n| n.name == node) {
                Some(n) => {
                    n.requested.add_assign(&pod_requests(pod));
                    n.pods.push(Arc::clone(pod));
                }
                None => warnings
                    .push(format!("pod {}: bound to node {node:?} not in the input, ignored", pod_name(pod))),
            },
        }
    }
    let mut nodepools = Vec::new();
    for np in &manifests.nodepools {
        let name = np.metadata.name.clone().unwrap_or_default();
        let used = usage.get(&name).cloned().unwrap_or_default();
        nodepools.push(NodePoolInput::from_nodepool(np, instance_types.to_vec(), &used)?);
    }
    let input = SchedulingInput {
        pods: pending,
        nodepools,
        existing_nodes: existing,
        daemonsets: manifests.daemonsets.clone(),
        namespace_labels: manifests.namespace_labels.clone(),
        volumes: manifests.volumes.clone(),
        options: Default::default(),
    };
    Ok((input, warnings))
}

/// Runs the simulation over parsed manifests; returns the report and warnings.
pub fn simulate(
    manifests: &Manifests,
    instance_types: &[Arc<InstanceType>],
) -> Result<(Report, Vec<String>), SimulateError> {
    let (input, warnings) = scheduling_input(manifests, instance_types)?;
    let results = schedule(&input);
    Ok((Report::from_results(&input, &results), warnings))
}

/// Renders a report.
pub fn render(report: &Report, format: OutputFormat) -> Result<String, SimulateError> {
    match format {
        OutputFormat::Table => Ok(report.to_table()),
        OutputFormat::Json => serde_json::to_string_pretty(report)
            .map(|s| s + "\n")
            .map_err(|e| SimulateError::Render(e.to_string())),
        OutputFormat::Yaml => {
            serde_saphyr::to_string(report).map_err(|e| SimulateError::Render(e.to_string()))
        }
    }
}

/// What `karpenter simulate` prints, and the warnings for stderr: reads `paths`, loads `catalog`,
/// schedules and renders in `format`.
pub fn run(
    paths: &[PathBuf],
    catalog: &Catalog,
    format: OutputFormat,
) -> Result<(String, Vec<String>), SimulateError> {
    let manifests = load_paths(paths)?;
    let instance_types = catalog.load()?;
    let (report, mut warnings) = simulate(&manifests, &instance_types)?;
    let mut all = manifests.warnings.clone();
    all.append(&mut warnings);
    Ok((render(&report, format)?, all))
}

#[cfg(test)]
mod tests;
