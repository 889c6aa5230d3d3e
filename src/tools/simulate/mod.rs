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

pub mod input;
pub mod report;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use thiserror::Error;

use crate::apis::{Taint, TaintEffect};
pub use crate::cloudprovider::aws::nodecost::BurstableCpu;
use crate::scheduling::{InstanceType, Resources, SchedulingInput, schedule};
use crate::state::input::{Scenario, scheduling_input as build_input};
use crate::state::pods;
use crate::state::statenode::state_nodes;

pub use crate::cloudprovider::catalog::Catalog;
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
    /// The instance-type catalog cannot be loaded.
    #[error(transparent)]
    Catalog(#[from] crate::cloudprovider::catalog::CatalogError),
    /// A NodePool cannot be turned into scheduler input.
    #[error("invalid NodePool: {0}")]
    InvalidNodePool(String),
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

/// Builds the scheduler's input with the one builder the controller uses (see
/// [`crate::state::input`]); returns warnings about ignored pods alongside.
pub fn scheduling_input(
    manifests: &Manifests,
    instance_types: &[Arc<InstanceType>],
    mode: BurstableCpu,
) -> Result<(SchedulingInput, Vec<String>), SimulateError> {
    let mut warnings = Vec::new();
    let node_names: BTreeSet<String> =
        manifests.nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
    for node in &manifests.nodes {
        // Reported here, with the node named; the cluster state would skip such values.
        node_taints(node)?;
        node_resources(node, true)?;
        node_resources(node, false)?;
    }
    let mut snapshot = manifests.snapshot();
    let mut pending = Vec::new();
    snapshot.pods.retain(|pod| {
        if pods::is_terminal(pod) {
            warnings.push(format!("pod {}: finished, ignored", pods::key(pod)));
            return false;
        }
        match pods::node_name(pod) {
            None => {
                if !pods::is_owned_by_daemonset(pod) && !pods::is_mirror(pod) {
                    pending.push(Arc::clone(pod));
                }
                true
            }
            Some(node) if node_names.contains(node) => true,
            Some(node) => {
                warnings.push(format!(
                    "pod {}: bound to node {node:?} not in the input, ignored",
                    pods::key(pod)
                ));
                false
            }
        }
    });
    let pool_types = manifests
        .nodepools
        .iter()
        .map(|np| {
            let types = crate::tools::planned_for(instance_types, np, snapshot.node_class_of(np), mode);
            (np.metadata.name.clone().unwrap_or_default(), types)
        })
        .collect();
    let snapshot = snapshot.with_instance_types(pool_types);
    let nodes = state_nodes(&snapshot);
    let scenario = Scenario { options: crate::tools::scheduler_options(), ..Scenario::default() };
    let built = build_input(&snapshot, &nodes, pending, &scenario);
    if let Some((_, why)) = built.skipped_pools.first() {
        return Err(SimulateError::InvalidNodePool(why.clone()));
    }
    Ok((built.input, warnings))
}

/// Runs the simulation over parsed manifests; returns the report and warnings.
pub fn simulate(
    manifests: &Manifests,
    instance_types: &[Arc<InstanceType>],
    mode: BurstableCpu,
) -> Result<(Report, Vec<String>), SimulateError> {
    let (input, warnings) = scheduling_input(manifests, instance_types, mode)?;
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
/// schedules (burstable types planned as `mode` says) and renders in `format`.
pub fn run(
    paths: &[PathBuf],
    catalog: &Catalog,
    format: OutputFormat,
    mode: BurstableCpu,
) -> Result<(String, Vec<String>), SimulateError> {
    let manifests = load_paths(paths)?;
    let instance_types = catalog.load()?;
    let (report, mut warnings) = simulate(&manifests, &instance_types, mode)?;
    let mut all = manifests.warnings.clone();
    all.append(&mut warnings);
    Ok((render(&report, format)?, all))
}

#[cfg(test)]
mod tests;
