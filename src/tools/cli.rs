//! The live commands as the binary runs them: connect, snapshot, decide, render. Each returns
//! what to print, or a one-line error.

use std::collections::HashSet;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use crate::cloudprovider::aws::nodecost::BurstableCpu;
use crate::cloudprovider::catalog::Catalog;
use crate::disruption::decide::Inputs;
use crate::tools::simulate::{self, OutputFormat};
use crate::util::error_chain;

use super::explain::{explain_node as explain_node_of, explain_pod as explain_pod_of, find_node, find_pod};
use super::live::{self, Scale};
use super::{Target, ToolError, live_snapshot, render_data};

fn one_line(e: ToolError) -> String {
    error_chain(&e)
}

/// `value` as `table` text, JSON or YAML.
fn render<T: serde::Serialize>(value: &T, table: String, format: OutputFormat) -> Result<String, String> {
    match format {
        OutputFormat::Table => Ok(table),
        format => render_data(value, format).map_err(one_line),
    }
}

/// `karpenter explain pod`; without `namespace` (`-n`), the namespace of the kubeconfig's
/// context, as kubectl takes it.
pub async fn explain_pod(
    target: &Target,
    catalog: &Catalog,
    mode: BurstableCpu,
    namespace: Option<&str>,
    name: &str,
    format: OutputFormat,
) -> Result<String, String> {
    let given = name.split_once('/');
    if given.is_some_and(|(ns, n)| ns.is_empty() || n.is_empty()) || name.is_empty() {
        return Err("expected a pod as NAME or NAMESPACE/NAME".into());
    }
    let client = target.client().await.map_err(one_line)?;
    let (namespace, name) = match given {
        Some((ns, n)) => (ns.to_string(), n),
        None => (namespace.map_or_else(|| client.default_namespace().to_string(), str::to_string), name),
    };
    let namespace = namespace.as_str();
    let snapshot = live_snapshot(client, catalog, mode).await.map_err(one_line)?;
    let pod = find_pod(&snapshot, namespace, name).map_err(one_line)?;
    let explanation = explain_pod_of(&snapshot, &pod, &super::scheduler_options());
    render(&explanation, explanation.to_table(), format)
}

/// `karpenter explain node` (`claim`: `nodeclaim`).
pub async fn explain_node(
    target: &Target,
    catalog: &Catalog,
    mode: BurstableCpu,
    name: &str,
    claim: bool,
    spot_to_spot: bool,
    format: OutputFormat,
) -> Result<String, String> {
    let client = target.client().await.map_err(one_line)?;
    let snapshot = live_snapshot(client, catalog, mode).await.map_err(one_line)?;
    let inputs =
        Inputs::of(snapshot, super::disruption_options(), spot_to_spot, Timestamp::now(), HashSet::new());
    let node = find_node(&inputs.nodes, name, claim).map_err(one_line)?;
    let explanation = explain_node_of(&inputs, node);
    render(&explanation, explanation.to_table(), format)
}

/// What `simulate --from-cluster` changes, as given on the command line.
#[derive(Clone, Debug, Default)]
pub struct Changes {
    /// Manifests to add.
    pub files: Vec<PathBuf>,
    /// Deployments to scale.
    pub scale: Vec<Scale>,
    /// NodePools to remove.
    pub remove_nodepools: Vec<String>,
    /// The namespace of `scale` targets given without one (default: the kubeconfig context's).
    pub namespace: Option<String>,
}

/// `karpenter simulate --from-cluster`.
pub async fn simulate_from_cluster(
    target: &Target,
    catalog: &Catalog,
    mode: BurstableCpu,
    changes: &Changes,
    spot_to_spot: bool,
    format: OutputFormat,
) -> Result<String, String> {
    let manifests = if changes.files.is_empty() {
        simulate::Manifests::default()
    } else {
        simulate::load_paths(&changes.files).map_err(|e| error_chain(&e))?
    };
    let client = target.client().await.map_err(one_line)?;
    let namespace = changes.namespace.clone().unwrap_or_else(|| client.default_namespace().to_string());
    let mut scaled = Vec::new();
    for s in &changes.scale {
        let ns = s.namespace.clone().unwrap_or_else(|| namespace.clone());
        let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        match api.get_opt(&s.name).await {
            Ok(Some(d)) => scaled.push((s.clone(), d)),
            Ok(None) => return Err(format!("deployment \"{ns}/{}\" not found", s.name)),
            Err(e) => return Err(format!("reading deployment {ns}/{}: {}", s.name, error_chain(&e))),
        }
    }
    let snapshot = live_snapshot(client, catalog, mode).await.map_err(one_line)?;
    let live_changes =
        live::Changes { manifests, scale: scaled, remove_nodepools: changes.remove_nodepools.clone() };
    let options = (super::scheduler_options(), super::disruption_options());
    let now = Timestamp::now();
    let (report, warnings) =
        live::simulate(snapshot, &live_changes, &namespace, &options, spot_to_spot, now).map_err(one_line)?;
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    render(&report, report.to_table(), format)
}

/// `karpenter top --once`: one frame, as the terminal shows it or as JSON or YAML.
pub async fn top_once(
    target: &Target,
    catalog: &Catalog,
    mode: BurstableCpu,
    format: OutputFormat,
) -> Result<String, String> {
    let client = target.client().await.map_err(one_line)?;
    let types = catalog.load().map_err(|e| one_line(e.into()))?;
    let live = super::Live::start(client, types, mode).await.map_err(one_line)?;
    let view = super::top::view(&live.snapshot(), Timestamp::now());
    let mut table = super::top::render(&view).join("\n");
    table.push('\n');
    render(&view, table, format)
}

/// `karpenter top`: the terminal view, until the user quits.
pub fn top(target: &Target, catalog: &Catalog, mode: BurstableCpu) -> Result<(), String> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return Err("karpenter top draws in a terminal; use --once to print one frame".into());
    }
    // The watches run on the runtime's worker while this thread draws.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?;
    let live = runtime.block_on(async {
        let client = target.client().await.map_err(one_line)?;
        let types = catalog.load().map_err(|e| one_line(e.into()))?;
        super::Live::start(client, types, mode).await.map_err(one_line)
    })?;
    let _guard = runtime.enter();
    super::top::interactive(&live, std::time::Duration::from_secs(1)).map_err(|e| format!("drawing: {e}"))
}
