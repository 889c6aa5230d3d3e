//! The provisioner: batches pending pods, simulates where they fit, creates NodeClaims for the
//! rest and tells each pod what was decided for it.
//!
//! A batch opens with the first provisionable pod and closes after `BATCH_IDLE_DURATION` without
//! a new one, or at `BATCH_MAX_DURATION`. Each pass works on a snapshot of the cluster state in
//! which nodes, in-flight NodeClaims (and the ones this process created but has not seen come
//! back through its watch yet) are existing capacity, so a burst of pods never produces
//! duplicate claims.

pub mod template;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use tokio::sync::{mpsc, watch};

use crate::apis::{NodeClaim, NodePool};
use crate::controllers::Context;
use crate::controllers::events::reasons;
use crate::operator::error_chain;
use crate::operator::metrics::observe;
use crate::scheduling::{
    ExistingNode, InstanceType, NodePoolInput, SchedulerOptions, SchedulingInput, SchedulingResults, schedule,
};
use crate::state::snapshot::{self, Snapshot, pod_key};
use crate::state::{Change, ClusterState};

/// How long a NodeClaim this process created counts as capacity before it shows up in the
/// cache; far longer than a watch takes to deliver it.
const CREATED_GRACE: Duration = Duration::from_secs(60);
/// A pass also runs this often while provisionable pods remain, so that pods left pending (no
/// capacity, limits reached) are retried when the world changes in ways no watch reports.
const RESYNC: Duration = Duration::from_secs(60);
/// Events sent at once.
const EVENT_CONCURRENCY: usize = 32;
/// NodeClaims created at once.
const CREATE_CONCURRENCY: usize = 16;

/// Runs the provisioner until `stop` turns true.
pub async fn run(
    ctx: Context,
    state: ClusterState,
    mut changes: mpsc::UnboundedReceiver<Change>,
    mut stop: watch::Receiver<bool>,
) {
    let mut provisioner = Provisioner::new(ctx, state);
    provisioner.state.wait_synced().await;
    // Pods that were already pending when the controller started.
    let mut pending_start = true;
    loop {
        let window = if pending_start {
            pending_start = false;
            Some(Duration::ZERO)
        } else {
            tokio::select! {
                w = next_batch(&mut changes, provisioner.ctx.settings.batch_idle_duration, provisioner.ctx.settings.batch_max_duration) => w,
                _ = tokio::time::sleep(RESYNC) => Some(Duration::ZERO),
                _ = stop.changed() => None,
            }
        };
        if *stop.borrow() {
            break;
        }
        let Some(window) = window else { break };
        observe(&provisioner.ctx.metrics.provisioner_batch_window_duration, vec![], window);
        provisioner.reconcile().await;
    }
}

/// Waits for a batch: returns how long it stayed open, or `None` when the channel closed. Any
/// change opens a batch; only new pods keep it open (NodeClaim updates come in bursts while
/// nodes launch and would otherwise delay the pass).
async fn next_batch(
    changes: &mut mpsc::UnboundedReceiver<Change>,
    idle: Duration,
    max: Duration,
) -> Option<Duration> {
    changes.recv().await?;
    let start = tokio::time::Instant::now();
    let mut last = start;
    loop {
        let deadline = (last + idle).min(start + max);
        tokio::select! {
            msg = changes.recv() => match msg {
                Some(Change::NodeClaimUpdated) => {}
                Some(_) => last = tokio::time::Instant::now(),
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    Some(start.elapsed())
}

struct Provisioner {
    ctx: Context,
    state: ClusterState,
    /// Claims created by this process, until the cache has them.
    created: Vec<(Instant, Arc<NodeClaim>)>,
    /// Last event sent to each pod (uid → message), to not repeat it every pass.
    told: HashMap<String, String>,
}

impl Provisioner {
    fn new(ctx: Context, state: ClusterState) -> Self {
        Provisioner { ctx, state, created: vec![], told: HashMap::new() }
    }

    async fn reconcile(&mut self) {
        let start = Instant::now();
        let snapshot = self.state.snapshot();
        let mut pods: Vec<Arc<Pod>> =
            snapshot.pods.iter().filter(|p| snapshot::is_provisionable(p)).map(Arc::clone).collect();
        if pods.is_empty() {
            return;
        }
        pods.sort_by_cached_key(|p| pod_key(p));
        self.ctx.metrics.provisioner_batch_size.get_or_create(&vec![]).set(pods.len() as f64);
        tracing::info!(
            controller = "provisioner",
            Pods = %summarize_pods(&pods, 10),
            count = pods.len(),
            duration = ?start.elapsed(),
            "found provisionable pod(s)"
        );

        let known: HashSet<&str> =
            snapshot.nodeclaims.iter().filter_map(|c| c.metadata.name.as_deref()).collect();
        self.created.retain(|(at, c)| {
            at.elapsed() < CREATED_GRACE && !c.metadata.name.as_deref().is_some_and(|n| known.contains(n))
        });

        let input = match self.scheduling_input(&snapshot, pods).await {
            Some(input) => input,
            None => return,
        };
        let sim_start = Instant::now();
        let results = match tokio::task::spawn_blocking(move || {
            let results = schedule(&input);
            (input, results)
        })
        .await
        {
            Ok(r) => r,
            Err(error) => {
                tracing::error!(controller = "provisioner", error = %error, "scheduling simulation failed");
                return;
            }
        };
        observe(
            &self.ctx.metrics.scheduler_scheduling_duration,
            vec![("controller", "provisioner".into())],
            sim_start.elapsed(),
        );
        let (input, results) = results;
        if !results.new_node_claims.is_empty() {
            tracing::info!(
                controller = "provisioner",
                nodeclaims = results.new_node_claims.len(),
                pods = results.new_node_claims.iter().map(|c| c.pods.len()).sum::<usize>(),
                duration = ?sim_start.elapsed(),
                "computed new nodeclaim(s) to fit pod(s)"
            );
        }
        self.apply(&snapshot, &input, results).await;
        observe(&self.ctx.metrics.provisioner_scheduling_duration, vec![], start.elapsed());
    }

    /// Builds the simulation's input from the snapshot; `None` when nothing can be decided.
    async fn scheduling_input(
        &mut self,
        snapshot: &Snapshot,
        pods: Vec<Arc<Pod>>,
    ) -> Option<SchedulingInput> {
        let mut catalog: HashMap<String, Arc<InstanceType>> = HashMap::new();
        let mut pools: Vec<(Arc<NodePool>, Vec<Arc<InstanceType>>)> = Vec::new();
        for np in &snapshot.nodepools {
            if np.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let name = np.metadata.name.clone().unwrap_or_default();
            match self.ctx.cloud.instance_types(np).await {
                Ok(types) => {
                    for t in &types {
                        catalog.entry(t.name.clone()).or_insert_with(|| t.clone());
                    }
                    pools.push((np.clone(), types));
                }
                Err(error) => {
                    tracing::error!(
                        controller = "provisioner",
                        NodePool = %name,
                        error = %error_chain(&error),
                        "skipping, unable to resolve instance types"
                    );
                }
            }
        }
        // Limits count the nodes and NodeClaims only, in-flight claims of this process included.
        let usage_snapshot = Snapshot {
            nodes: snapshot.nodes.clone(),
            nodeclaims: snapshot
                .nodeclaims
                .iter()
                .chain(self.created.iter().map(|(_, c)| c))
                .cloned()
                .collect(),
            ..Default::default()
        };
        let usage = snapshot::nodepool_usage(&usage_snapshot, &catalog);
        let mut nodepools = Vec::new();
        for (np, types) in pools {
            let name = np.metadata.name.clone().unwrap_or_default();
            let used = usage.get(&name).cloned().unwrap_or_default();
            match NodePoolInput::from_nodepool(&np, types, &used) {
                Ok(input) => nodepools.push(input),
                Err(error) => tracing::error!(
                    controller = "provisioner",
                    NodePool = %name,
                    error = %error_chain(&error),
                    "skipping, invalid nodepool"
                ),
            }
        }
        let mut existing: Vec<ExistingNode> = snapshot::existing_nodes(snapshot);
        let in_flight = Snapshot {
            nodeclaims: self.created.iter().map(|(_, c)| Arc::clone(c)).collect(),
            ..Default::default()
        };
        existing.extend(snapshot::existing_nodes(&in_flight));
        Some(SchedulingInput {
            pods,
            nodepools,
            existing_nodes: existing,
            daemonsets: snapshot::daemonset_pods(snapshot),
            namespace_labels: snapshot::namespace_labels(snapshot),
            volumes: snapshot::volume_input(snapshot),
            options: SchedulerOptions {
                min_values_policy: self.ctx.settings.min_values_policy,
                ..SchedulerOptions::default()
            },
        })
    }

    async fn apply(&mut self, snapshot: &Snapshot, input: &SchedulingInput, results: SchedulingResults) {
        let nodepools: BTreeMap<String, Arc<NodePool>> = snapshot
            .nodepools
            .iter()
            .map(|np| (np.metadata.name.clone().unwrap_or_default(), np.clone()))
            .collect();
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        let mut nominations: Vec<(usize, String)> = Vec::new();

        // New NodeClaims.
        let creations: Vec<(usize, NodeClaim)> = results
            .new_node_claims
            .iter()
            .enumerate()
            .filter_map(|(i, new)| Some((i, template::build(new, nodepools.get(&new.nodepool)?))))
            .collect();
        let created: Vec<(usize, Result<NodeClaim, kube::Error>)> = futures::stream::iter(creations)
            .map(|(i, claim)| {
                let api = api.clone();
                async move { (i, api.create(&PostParams::default(), &claim).await) }
            })
            .buffered(CREATE_CONCURRENCY)
            .collect()
            .await;
        for (i, result) in created {
            let Some(new) = results.new_node_claims.get(i) else { continue };
            match result {
                Ok(claim) => {
                    let name = claim.metadata.name.clone().unwrap_or_default();
                    tracing::info!(
                        controller = "provisioner",
                        NodePool = %new.nodepool,
                        NodeClaim = %name,
                        requests = %format_requests(&new.requests),
                        pods = new.pods.len(),
                        instance_types = %template::summarize_instance_types(&new.instance_type_names, 5),
                        "created nodeclaim"
                    );
                    self.ctx
                        .metrics
                        .nodeclaims_created
                        .get_or_create(&vec![
                            ("reason", "provisioning".to_string()),
                            ("nodepool", new.nodepool.clone()),
                            ("min_values_relaxed", new.min_values_relaxed.to_string()),
                        ])
                        .inc();
                    for p in &new.pods {
                        nominations.push((p.index, format!("nodeclaim/{name}")));
                    }
                    self.created.push((Instant::now(), Arc::new(claim)));
                }
                Err(error) => tracing::error!(
                    controller = "provisioner",
                    NodePool = %new.nodepool,
                    error = %error,
                    "creating nodeclaim"
                ),
            }
        }

        // Pods placed on capacity that is still coming up.
        let claims: HashSet<&str> = snapshot
            .nodeclaims
            .iter()
            .filter_map(|c| c.metadata.name.as_deref())
            .chain(self.created.iter().filter_map(|(_, c)| c.metadata.name.as_deref()))
            .collect();
        let uninitialized: HashSet<&str> =
            input.existing_nodes.iter().filter(|n| !n.initialized).map(|n| n.name.as_str()).collect();
        for placement in &results.existing_placements {
            if !uninitialized.contains(placement.node.as_str()) {
                continue;
            }
            let target = if claims.contains(placement.node.as_str()) { "nodeclaim" } else { "node" };
            for p in &placement.pods {
                nominations.push((p.index, format!("{target}/{}", placement.node)));
            }
        }

        let mut events: Vec<(Arc<Pod>, bool, &'static str, String)> = Vec::new();
        for (index, target) in nominations {
            if let Some(pod) = input.pods.get(index) {
                events.push((
                    Arc::clone(pod),
                    false,
                    reasons::NOMINATED,
                    format!("Pod should schedule on: {target}"),
                ));
            }
        }
        for error in &results.errors {
            if let Some(pod) = input.pods.get(error.pod.index) {
                let message = format!("Failed to schedule pod, {error}");
                tracing::error!(
                    controller = "provisioner",
                    Pod = %error.pod,
                    error = %error,
                    "could not schedule pod"
                );
                events.push((Arc::clone(pod), true, reasons::FAILED_SCHEDULING, message));
            }
        }
        let events: Vec<_> = events
            .into_iter()
            .filter(|(pod, _, _, message)| {
                let uid = pod.metadata.uid.clone().unwrap_or_else(|| pod_key(pod));
                self.told.insert(uid, message.clone()).as_ref() != Some(message)
            })
            .collect();
        let live: HashSet<&str> = input.pods.iter().filter_map(|p| p.metadata.uid.as_deref()).collect();
        self.told.retain(|uid, _| live.contains(uid.as_str()));
        let recorder = self.ctx.events.clone();
        futures::stream::iter(events)
            .for_each_concurrent(EVENT_CONCURRENCY, move |(pod, warning, reason, message)| {
                let recorder = recorder.clone();
                async move {
                    if warning {
                        recorder.warning(pod.as_ref(), reason, message).await;
                    } else {
                        recorder.normal(pod.as_ref(), reason, message).await;
                    }
                }
            })
            .await;
    }
}

fn summarize_pods(pods: &[Arc<Pod>], shown: usize) -> String {
    let mut out = pods.iter().take(shown).map(|p| pod_key(p)).collect::<Vec<_>>().join(", ");
    if pods.len() > shown {
        out.push_str(&format!(" and {} other(s)", pods.len() - shown));
    }
    out
}

fn format_requests(r: &crate::scheduling::Resources) -> String {
    r.to_list().iter().map(|(k, v)| format!("{k}: {}", v.0)).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real time, scaled down; only bounds that cannot depend on the machine's speed are asserted.
    #[tokio::test]
    async fn a_batch_closes_when_idle() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(Change::Pod).unwrap();
        let sender = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                tx.send(Change::Pod).unwrap();
            }
            // Keep the channel open.
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let window = next_batch(&mut rx, Duration::from_millis(100), Duration::from_secs(30)).await.unwrap();
        // Three more pods kept it open past the first idle window; then it closed for being idle,
        // long before the maximum.
        assert!(window >= Duration::from_millis(250) && window < Duration::from_secs(30), "{window:?}");
        sender.abort();
    }

    #[tokio::test]
    async fn a_busy_batch_closes_at_the_maximum() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(Change::Pod).unwrap();
        let sender = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(30)).await;
                if tx.send(Change::Pod).is_err() {
                    break;
                }
            }
        });
        let window = next_batch(&mut rx, Duration::from_millis(100), Duration::from_secs(1)).await.unwrap();
        // Pods kept coming faster than the idle window: only the maximum closed it.
        assert!(window >= Duration::from_secs(1), "{window:?}");
        sender.abort();
    }

    #[tokio::test]
    async fn a_closed_channel_ends_batching() {
        let (tx, mut rx) = mpsc::unbounded_channel::<Change>();
        drop(tx);
        assert!(next_batch(&mut rx, Duration::from_secs(1), Duration::from_secs(10)).await.is_none());
    }
}
