//! The live commands as the binary runs them: connect, snapshot, decide, render. Each returns
//! what to print, or a one-line error.

use std::collections::HashSet;
use std::path::PathBuf;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::jiff::Timestamp;
use kube::Api;

use crate::cloudprovider::catalog::Catalog;
use crate::disruption::decide::Inputs;
use crate::operator::error_chain;
use crate::scheduling::SchedulerOptions;
use crate::simulate::{self, OutputFormat};

use super::explain::{explain_node as explain_node_of, explain_pod as explain_pod_of, find_node, find_pod};
use super::live::{self, Changes, Scale};
use super::{Target, ToolError, live_snapshot, render_data};

fn one_line(e: ToolError) -> String {
    error_chain(&e)
}

/// `karpenter explain pod`.
pub async fn explain_pod(
    target: &Target,
    catalog: &Catalog,
    namespace: &str,
    name: &str,
    format: OutputFormat,
) -> Result<String, String> {
    let (namespace, name) = match name.split_once('/') {
        Some((ns, n)) => (ns, n),
        None => (namespace, name),
    };
    if name.is_empty() || namespace.is_empty() {
        return Err("expected a pod as NAME or NAMESPACE/NAME".into());
    }
    let client = target.client().await.map_err(one_line)?;
    let snapshot = live_snapshot(client, catalog).await.map_err(one_line)?;
    let pod = find_pod(&snapshot, namespace, name).map_err(one_line)?;
    let explanation = explain_pod_of(&snapshot, &pod, &SchedulerOptions::default());
    match format {
        OutputFormat::Table => Ok(explanation.to_table()),
        format => render_data(&explanation, format).map_err(one_line),
    }
}

/// `karpenter explain node` (`claim`: `nodeclaim`).
pub async fn explain_node(
    target: &Target,
    catalog: &Catalog,
    name: &str,
    claim: bool,
    format: OutputFormat,
) -> Result<String, String> {
    let client = target.client().await.map_err(one_line)?;
    let snapshot = live_snapshot(client, catalog).await.map_err(one_line)?;
    let inputs = Inputs::of(snapshot, SchedulerOptions::default(), false, Timestamp::now(), HashSet::new());
    let node = find_node(&inputs.nodes, name, claim).map_err(one_line)?;
    let explanation = explain_node_of(&inputs, node);
    match format {
        OutputFormat::Table => Ok(explanation.to_table()),
        format => render_data(&explanation, format).map_err(one_line),
    }
}

/// `karpenter simulate --from-cluster`.
pub async fn simulate_from_cluster(
    target: &Target,
    catalog: &Catalog,
    files: &[PathBuf],
    scale: Vec<Scale>,
    remove_nodepools: Vec<String>,
    namespace: &str,
    format: OutputFormat,
) -> Result<String, String> {
    let manifests = if files.is_empty() {
        simulate::Manifests::default()
    } else {
        simulate::load_paths(files).map_err(|e| error_chain(&e))?
    };
    let client = target.client().await.map_err(one_line)?;
    let mut scaled = Vec::new();
    for s in scale {
        let ns = s.namespace.clone().unwrap_or_else(|| namespace.to_string());
        let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        match api.get_opt(&s.name).await {
            Ok(Some(d)) => scaled.push((s, d)),
            Ok(None) => return Err(format!("deployment \"{ns}/{}\" not found", s.name)),
            Err(e) => return Err(format!("reading deployment {ns}/{}: {}", s.name, error_chain(&e))),
        }
    }
    let snapshot = live_snapshot(client, catalog).await.map_err(one_line)?;
    let changes = Changes { manifests, scale: scaled, remove_nodepools };
    let (report, warnings) =
        live::simulate(snapshot, &changes, namespace, &SchedulerOptions::default(), false, Timestamp::now())
            .map_err(one_line)?;
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    match format {
        OutputFormat::Table => Ok(report.to_table()),
        format => render_data(&report, format).map_err(one_line),
    }
}

/// `karpenter top --once`: one frame.
pub async fn top_once(target: &Target, catalog: &Catalog) -> Result<String, String> {
    let client = target.client().await.map_err(one_line)?;
    let types = catalog.load().map_err(|e| one_line(e.into()))?;
    let live = super::Live::start(client, types).await.map_err(one_line)?;
    let view = super::top::view(&live.snapshot(), Timestamp::now());
    let mut out = super::top::render(&view).join("\n");
    out.push('\n');
    Ok(out)
}

/// `karpenter top`: the terminal view, until the user quits.
pub fn top(target: &Target, catalog: &Catalog) -> Result<(), String> {
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
        super::Live::start(client, types).await.map_err(one_line)
    })?;
    let _guard = runtime.enter();
    super::top::interactive(&live, std::time::Duration::from_secs(1)).map_err(|e| format!("drawing: {e}"))
}
