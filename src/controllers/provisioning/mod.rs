//! The provisioner: batches pending pods, simulates where they fit, creates NodeClaims for the
//! rest and tells each pod what was decided for it.
//!
//! A batch opens with the first provisionable pod and closes after `BATCH_IDLE_DURATION` without
//! a new one, or at `BATCH_MAX_DURATION`. Pods that came while a pass ran have waited since that
//! pass began, at most, and the batch they open closes `BATCH_MAX_DURATION` after that: no pod
//! waits for more than one batch window and the pass that decides it.
//!
//! Each pass works on a snapshot of the cluster state in which nodes, in-flight NodeClaims (and
//! the ones this process created but has not seen come back through its watch yet) are existing
//! capacity, so a burst of pods never produces duplicate claims.

pub mod created;
pub mod relaunch;
pub mod template;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::apis::pod::Pod;
use futures::StreamExt;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::PostParams;
use tokio::sync::watch;

use crate::apis::{NodeClaim, NodePool};
use crate::controllers::Context;
use crate::controllers::departures;
use crate::controllers::events::{EventType, reasons};
use crate::controllers::kit::{Next, Options, Wake, run_singleton};
use crate::metrics::observe;
use crate::scheduling::{SchedulingInput, SchedulingResults, schedule};
use crate::state::buffers::{self, is_virtual};
use crate::state::input::{Built, Scenario, scheduling_input};
use crate::state::marks::nomination_window;
use crate::state::pods::key as pod_key;
use crate::state::statenode::state_nodes;
use crate::state::{
    BuffersPlaced, Changes, ClusterState, Interest, Notice, Registration, Snapshot, Subscription,
};
use crate::util::bucket::TokenBucket;

/// Name of the controller, in logs.
pub const CONTROLLER: &str = "provisioner";
/// A pass also runs this often, so that pods left pending (no capacity, limits reached) are
/// retried when the world changes in ways no watch reports.
const RESYNC: Duration = Duration::from_secs(60);
/// Events sent at once.
const EVENT_CONCURRENCY: usize = 32;
/// Upstream's deduplication of a pod's `Nominated` event (its recorder's default window), whatever
/// the NodeClaim it names: a pod that the next passes place on another claim coming up is not told
/// again.
const NOMINATED_WINDOW: SignedDuration = SignedDuration::from_mins(2);
/// Upstream's limit of `Nominated` events: 5 a second, bursts of 10; the others are dropped.
const NOMINATED_PER_SECOND: u32 = 5;
const NOMINATED_BURST: u32 = 10;
/// Upstream's deduplication of a pod's `FailedScheduling` event, whatever its message.
const FAILED_SCHEDULING_WINDOW: SignedDuration = SignedDuration::from_mins(5);
/// NodeClaims created at once. Upstream creates a pass's claims all at once, paced only by the
/// client's rate limit (`KUBE_CLIENT_QPS`, `KUBE_CLIENT_BURST`); this bound keeps what is in
/// flight small while letting that limit, not the wait for each answer, pace a large pass (at
/// 0.65 s an answer on a busy API server, 16 at once created 1,040 claims in 40 s, and the pods
/// that came meanwhile waited for them).
const CREATE_CONCURRENCY: usize = 128;

/// The changes that open a batch: a provisionable pod, a node or NodeClaim going away (its pods
/// need a place), a NodeClaim changing (a launch frees room under a limit), a NodePool changing,
/// the NodeOverlays evaluated anew (a NodePool that awaited them can launch), a CapacityBuffer's
/// placeholders changing.
fn interest() -> Interest {
    Interest {
        provisionable_pods: true,
        nodeclaims: true,
        nodeclaim_deletions: true,
        node_deletions: true,
        nodepools: true,
        nodeclasses: true,
        overlays: true,
        buffers: true,
        ..Interest::default()
    }
}

/// Runs the provisioner until `stop` turns true: a pass at start (pods already pending), after
/// each batch, and every [`RESYNC`].
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let pass_began = Arc::new(Mutex::new(None));
    let batches = Batches {
        changes: state.feed().subscribe(interest()),
        idle: ctx.settings.batch_idle_duration,
        max: ctx.settings.batch_max_duration,
        metrics: ctx.metrics.clone(),
        pass_began: pass_began.clone(),
    };
    let metrics = ctx.metrics.clone();
    let provisioner = Arc::new(tokio::sync::Mutex::new(Provisioner::new(ctx, state)));
    run_singleton(Options::new(CONTROLLER), Some(metrics), batches, stop, || {
        let provisioner = provisioner.clone();
        let pass_began = pass_began.clone();
        async move {
            *pass_began.lock().unwrap_or_else(PoisonError::into_inner) = Some(tokio::time::Instant::now());
            provisioner.lock().await.reconcile().await;
            Ok::<_, std::convert::Infallible>(Next::After(RESYNC))
        }
    })
    .await;
}

/// What wakes the provisioner: the close of a batch of changes (see [`next_batch`]), whose
/// window is recorded.
struct Batches {
    changes: Subscription,
    idle: Duration,
    max: Duration,
    metrics: Arc<crate::metrics::Metrics>,
    /// When the last pass began.
    pass_began: Arc<Mutex<Option<tokio::time::Instant>>>,
}

impl Wake for Batches {
    async fn changed(&mut self) {
        // Changes that came while the last pass ran have waited since it began, at most.
        let waiting_since = match self.changes.has_changed() {
            true => *self.pass_began.lock().unwrap_or_else(PoisonError::into_inner),
            false => None,
        };
        let window = next_batch(&mut self.changes, self.idle, self.max, waiting_since).await;
        observe(&self.metrics.provisioner_batch_window_duration, vec![], window);
    }
}

/// Waits for a batch and returns how long it stayed open. Any change the provisioner follows
/// opens a batch; only new provisionable pods keep it open, for at most `max` (NodeClaim updates
/// come in bursts while nodes launch and would otherwise delay the pass). The batch counts as
/// open since `waiting_since` when changes have waited since then (they came while a pass ran),
/// so that it closes `max` after the first of them at the latest.
async fn next_batch(
    changes: &mut Subscription,
    idle: Duration,
    max: Duration,
    waiting_since: Option<tokio::time::Instant>,
) -> Duration {
    let mut seen: Changes = changes.next().await;
    let now = tokio::time::Instant::now();
    let start = waiting_since.map_or(now, |t| t.min(now));
    let mut last = now;
    loop {
        let deadline = (last + idle).min(start + max);
        tokio::select! {
            now = changes.next() => {
                if now.provisionable_pods != seen.provisionable_pods {
                    last = tokio::time::Instant::now();
                }
                seen = now;
            }
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    start.elapsed()
}

struct Provisioner {
    ctx: Context,
    state: ClusterState,
    /// Claims created by this process, until the watch reports them.
    created: Arc<Mutex<created::Created>>,
    /// `Nominated` events a second (and burst), across pods, as upstream limits them.
    nominations: Arc<TokenBucket>,
    /// Pods placed on new NodeClaims and the workloads backing off; the pod watch reports
    /// bounces into it.
    relaunches: Arc<Mutex<relaunch::Relaunches>>,
    /// Pods deleted from nodes going away whose successor is not seen yet (see [`departures`]);
    /// the pod watch reports deletions into it.
    departures: Arc<Mutex<departures::Departures>>,
    /// Reports bounces into `relaunches`.
    _pod_watch: Registration,
    /// Reports deletions into `departures`.
    _departures_watch: Registration,
    /// Clears `created` as the watch reports the claims.
    _created_watch: Registration,
}

impl Provisioner {
    fn new(ctx: Context, state: ClusterState) -> Self {
        let relaunches = Arc::new(Mutex::new(relaunch::Relaunches::default()));
        let (departures, departures_watch) = departures::follow(&state);
        let (created, created_watch) = created::follow(&state);
        let pod_watch = {
            let (relaunches, times) = (relaunches.clone(), state.pod_times.clone());
            state.on_pod(move |notice| {
                let (Notice::Applied(pod) | Notice::Deleted(pod)) = notice else { return };
                // When the pod was first seen provisionable, for the pod metrics.
                match notice {
                    Notice::Applied(_) if crate::state::pods::is_provisionable(pod) => {
                        times.ack(&pod_key(pod), Timestamp::now())
                    }
                    Notice::Deleted(_) => times.forget(&pod_key(pod)),
                    _ => {}
                }
                let Some(uid) = pod.metadata.uid.as_deref() else { return };
                if relaunch::is_bounced(pod) {
                    let mut relaunches = relaunches.lock().unwrap_or_else(PoisonError::into_inner);
                    if relaunches.follows(uid) {
                        relaunches.removed(uid, tokio::time::Instant::now());
                    }
                }
            })
        };
        Provisioner {
            ctx,
            state,
            created,
            nominations: Arc::new(TokenBucket::new(NOMINATED_PER_SECOND, NOMINATED_BURST)),
            relaunches,
            departures,
            _pod_watch: pod_watch,
            _departures_watch: departures_watch,
            _created_watch: created_watch,
        }
    }

    /// Whether a pass has anything to place: provisionable pods, stand-ins, or pods of nodes
    /// going away.
    fn has_work(snapshot: &Snapshot, pending: &[Arc<Pod>], stand_ins: &[Arc<Pod>]) -> bool {
        if !pending.is_empty() || !stand_ins.is_empty() {
            return true;
        }
        // Building every node view costs a pass over every pod: only when something is going.
        crate::state::statenode::any_marked_for_deletion(snapshot)
            && state_nodes(snapshot)
                .iter()
                .any(|n| n.marked_for_deletion && n.reschedulable_pods().next().is_some())
    }

    async fn reconcile(&mut self) {
        let start = Instant::now();
        let mut snapshot = self.state.snapshot();
        let pending = self.hold_back_bouncing_pods(&snapshot, snapshot.provisionable_pods()).await;
        let mut stand_ins = {
            let mut departures = self.departures.lock().unwrap_or_else(PoisonError::into_inner);
            if departures.is_empty() {
                Vec::new()
            } else {
                departures.stand_ins(&state_nodes(&snapshot), &snapshot.pods, Timestamp::now())
            }
        };
        // CapacityBuffers' placeholders are placed last, as the stand-ins: capacity is launched
        // for them, and nothing about them reaches a pod.
        stand_ins.extend(snapshot.virtual_pods.iter().cloned());
        if !Self::has_work(&snapshot, &pending, &stand_ins) {
            // Nothing pending: nothing ignored, nothing unschedulable, no placeholder anywhere.
            self.record_pod_counts(PodCounts::default());
            self.state.set_buffers_placed(BuffersPlaced::default());
            return;
        }
        if !pending.is_empty() {
            self.ctx.metrics.provisioner_batch_size.get_or_create(&vec![]).set(pending.len() as f64);
            tracing::info!(
                controller = CONTROLLER,
                Pods = %summarize_pods(&pending, 10),
                count = pending.len(),
                duration = ?start.elapsed(),
                "found provisionable pod(s)"
            );
        }

        // Claims this process created count as capacity until the watch reports them.
        let awaited = self.created.lock().unwrap_or_else(PoisonError::into_inner).awaited(Instant::now());
        if !awaited.is_empty() {
            let known: HashSet<&str> =
                snapshot.nodeclaims.iter().filter_map(|c| c.metadata.name.as_deref()).collect();
            let awaited: Vec<Arc<NodeClaim>> = awaited
                .into_iter()
                .filter(|c| !c.metadata.name.as_deref().is_some_and(|n| known.contains(n)))
                .collect();
            snapshot.nodeclaims.extend(awaited);
        }
        let snapshot = crate::controllers::snapshot::with_instance_types_of_pools(
            snapshot,
            self.ctx.cloud.as_ref(),
            CONTROLLER,
        )
        .await;
        let nodes = state_nodes(&snapshot);
        let pending_count = pending.len();
        let stand_in_count = stand_ins.len();
        let scenario =
            Scenario { options: self.ctx.settings.scheduler_options(), stand_ins, ..Scenario::default() };
        let Built { input, skipped_pools, displaced_pods } =
            scheduling_input(&snapshot, &nodes, pending, &scenario);
        for (pool, why) in &skipped_pools {
            // A static pool is left out by design, not for a fault.
            let is_static =
                snapshot.nodepools.iter().any(|np| np.metadata.name.as_ref() == Some(pool) && np.is_static());
            if snapshot.pool_types.contains_key(pool) && !is_static {
                tracing::error!(controller = CONTROLLER, NodePool = %pool, error = %why, "skipping, invalid nodepool");
            }
        }
        if displaced_pods > 0 {
            tracing::debug!(
                controller = CONTROLLER,
                pods = displaced_pods,
                stand_ins = stand_in_count,
                "placing the pods of nodes going away"
            );
        }
        let sim_start = Instant::now();
        let _unfinished =
            crate::metrics::UnfinishedWork::start(&self.ctx.metrics, CONTROLLER, input.pods.len());
        let results = match tokio::task::spawn_blocking(move || {
            let results = schedule(&input);
            (input, results)
        })
        .await
        {
            Ok(r) => r,
            Err(error) => {
                tracing::error!(controller = CONTROLLER, error = %error, "scheduling simulation failed");
                return;
            }
        };
        observe(
            &self.ctx.metrics.scheduler_scheduling_duration,
            vec![("controller", CONTROLLER.into())],
            sim_start.elapsed(),
        );
        let (input, results) = results;
        self.record_pod_counts(pod_counts(&results, pending_count));
        self.record_decisions(&input, &results, pending_count);
        self.record_effective_zones(&input, pending_count);
        if !results.new_node_claims.is_empty() {
            tracing::info!(
                controller = CONTROLLER,
                nodeclaims = results.new_node_claims.len(),
                pods = results.new_node_claims.iter().map(|c| c.pods.len()).sum::<usize>(),
                duration = ?sim_start.elapsed(),
                "computed new nodeclaim(s) to fit pod(s)"
            );
        }
        // The snapshot and the rest of the input are let go before the NodeClaims are created and
        // the pods told: held across those requests, they would keep every object they name alive
        // beside the newer versions the watches bring meanwhile.
        let decided = Decided::new(&snapshot, input);
        drop((nodes, snapshot));
        self.apply(decided, pending_count, results).await;
        observe(&self.ctx.metrics.provisioner_scheduling_duration, vec![], start.elapsed());
    }

    /// Sets `karpenter_scheduler_unschedulable_pods_count{controller="provisioner"}` and
    /// `karpenter_scheduler_ignored_pods_count` to `counts`.
    fn record_pod_counts(&self, counts: PodCounts) {
        let metrics = &self.ctx.metrics;
        metrics
            .scheduler_unschedulable_pods_count
            .get_or_create(&vec![("controller", CONTROLLER.to_string())])
            .set(counts.unschedulable as f64);
        metrics.scheduler_ignored_pods_count.get_or_create(&vec![]).set(counts.ignored as f64);
    }

    /// Notes the pass's decision about each pending pod (a place, or none) for the pod metrics,
    /// and observes `karpenter_pods_scheduling_decision_duration_seconds` for the pods decided
    /// about for the first time.
    fn record_decisions(&self, input: &SchedulingInput, results: &SchedulingResults, pending_count: usize) {
        let now = Timestamp::now();
        let placed = results
            .new_node_claims
            .iter()
            .flat_map(|c| c.pods.iter())
            .chain(results.existing_placements.iter().flat_map(|p| p.pods.iter()))
            .map(|p| (p.index, true));
        let failed = results.errors.iter().map(|e| (e.pod.index, false));
        for (index, ok) in placed.chain(failed) {
            let Some(pod) = input.pods.get(index).filter(|_| index < pending_count) else { continue };
            if let Some(took) = self.state.pod_times.decided(&pod_key(pod), ok, now) {
                self.ctx
                    .metrics
                    .pods_scheduling_decision_duration
                    .get_or_create(&vec![])
                    .observe(took.as_secs_f64().max(0.0));
            }
        }
    }

    /// Sets `karpenter_scheduler_pending_pods_by_effective_zone_count{controller="provisioner"}`:
    /// the pass's pending pods by the one zone they can go to.
    fn record_effective_zones(&self, input: &SchedulingInput, pending_count: usize) {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for pod in input.pods.iter().take(pending_count) {
            *counts.entry(crate::scheduling::zones::effective_zone(pod, &input.volumes)).or_default() += 1;
        }
        let family = &self.ctx.metrics.scheduler_pending_pods_by_effective_zone;
        family.clear();
        for (zone, count) in counts {
            family
                .get_or_create(&vec![("controller", CONTROLLER.to_string()), ("zone", zone)])
                .set(count as f64);
        }
    }

    fn relaunches(&self) -> std::sync::MutexGuard<'_, relaunch::Relaunches> {
        self.relaunches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pending pods the relaunch guard lets have new NodeClaims (see [`relaunch`]); the first
    /// pod of a workload that just went over its limit gets a warning. A pending pod whose
    /// NodeClaim's node will not take it ([`relaunch::misses`]) counts as bounced first.
    async fn hold_back_bouncing_pods(
        &mut self,
        snapshot: &Snapshot,
        pending: Vec<Arc<Pod>>,
    ) -> Vec<Arc<Pod>> {
        let now = tokio::time::Instant::now();
        let mut kept = Vec::with_capacity(pending.len());
        let mut warnings = Vec::new();
        {
            let mut relaunches = self.relaunches();
            relaunches.forget_old(now);
            let followed: Vec<(&Arc<Pod>, String)> = pending
                .iter()
                .filter_map(|p| Some((p, relaunches.claim_of(p.metadata.uid.as_deref()?)?.to_string())))
                .collect();
            if !followed.is_empty() {
                let nodes = state_nodes(snapshot);
                let wall = Timestamp::now();
                for (pod, claim) in followed {
                    let Some(node) = nodes.iter().find(|n| n.claim_name() == Some(claim.as_str())) else {
                        continue;
                    };
                    if let Some(why) = relaunch::misses(pod, node, wall) {
                        tracing::debug!(controller = CONTROLLER, Pod = %pod_key(pod), NodeClaim = %claim, reason = %why, "the capacity launched for the pod did not take it");
                        relaunches.removed(&pod_uid(pod), now);
                    }
                }
            }
            for pod in pending {
                match relaunches.verdict(&relaunch::workload(&pod), now) {
                    relaunch::Verdict::Place => kept.push(pod),
                    relaunch::Verdict::Waiting => {}
                    relaunch::Verdict::BackOff { bounces, until } => warnings.push((pod, bounces, until)),
                }
            }
        }
        for (pod, bounces, until) in warnings {
            let wait = until.saturating_duration_since(now);
            let message = format!(
                "Pods of this workload needed a new nodeclaim {bounces} times within {} after being placed on one; no new nodeclaim for them for {}",
                relaunch::go_duration(relaunch::WINDOW),
                relaunch::go_duration(wait),
            );
            tracing::warn!(controller = CONTROLLER, Pod = %pod_key(&pod), bounces, wait = ?wait, "backing off provisioning for pod");
            self.ctx.events.warning(pod.as_ref(), reasons::PROVISIONING_BACKOFF, message).await;
        }
        kept
    }

    async fn apply(&mut self, decided: Decided, pending_count: usize, results: SchedulingResults) {
        let Decided { nodepools, claims, uninitialized, pods } = decided;
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        let window = nomination_window(self.ctx.settings.batch_max_duration);
        let mut nominations: Vec<(usize, String)> = Vec::new();

        // New NodeClaims, of NodePools that did not change while the pass ran (their next pass
        // decides with the new spec, limits included).
        let creations: Vec<(usize, NodeClaim)> = results
            .new_node_claims
            .iter()
            .enumerate()
            .filter_map(|(i, new)| {
                let pool = nodepools.get(&new.nodepool)?;
                if pool_changed(pool, self.state.nodepool(&new.nodepool).as_deref()) {
                    tracing::info!(controller = CONTROLLER, NodePool = %new.nodepool, "nodepool changed during the pass, deciding again");
                    return None;
                }
                Some((i, template::build(new, pool)))
            })
            .collect();
        // Each creation is logged and followed up as soon as it is answered, not after the batch.
        let mut created = futures::stream::iter(creations)
            .map(|(i, claim)| {
                let api = api.clone();
                async move { (i, api.create(&PostParams::default(), &claim).await) }
            })
            .buffer_unordered(CREATE_CONCURRENCY);
        let mut buffer_claims: Vec<String> = Vec::new();
        while let Some((i, result)) = created.next().await {
            let Some(new) = results.new_node_claims.get(i) else { continue };
            match result {
                Ok(claim) => {
                    let name = claim.metadata.name.clone().unwrap_or_default();
                    if new.pods.iter().any(|p| pods.get(p.index).is_some_and(|pod| is_virtual(pod))) {
                        buffer_claims.push(name.clone());
                    }
                    tracing::info!(
                        controller = CONTROLLER,
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
                            ("reason", "provisioned".to_string()),
                            ("nodepool", new.nodepool.clone()),
                            ("min_values_relaxed", new.min_values_relaxed.to_string()),
                        ])
                        .inc();
                    self.state.marks.nominate(&name, window);
                    let now = tokio::time::Instant::now();
                    for p in &new.pods {
                        nominations.push((p.index, format!("nodeclaim/{name}")));
                        if p.index < pending_count
                            && let Some(pod) = pods.get(p.index)
                        {
                            self.relaunches().placed(&pod_uid(pod), &relaunch::workload(pod), &name, now);
                        }
                    }
                    // Unless the watch was quicker than this answer and the cache has it already.
                    if self.state.nodeclaim(&name).is_none() {
                        self.created
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .add(Arc::new(claim), Instant::now());
                    }
                }
                Err(error) => tracing::error!(
                    controller = CONTROLLER,
                    NodePool = %new.nodepool,
                    error = %error,
                    "creating nodeclaim"
                ),
            }
        }

        // Where the CapacityBuffers' placeholders went: emptiness leaves those nodes, and the
        // buffers' status says whether they fit on existing capacity.
        let mut placed = BuffersPlaced::new(buffers::placements(&pods, &results));
        placed.hosts.extend(buffer_claims);
        self.state.set_buffers_placed(placed);

        // Pods placed on existing capacity: the node is nominated (not to be disrupted while
        // they come), and pods headed for capacity still coming up are told where they go.
        for placement in &results.existing_placements {
            // A node that only a CapacityBuffer's placeholders would use is not held for them.
            if placement.pods.iter().all(|p| pods.get(p.index).is_some_and(|pod| is_virtual(pod))) {
                continue;
            }
            self.state.marks.nominate(&placement.node, window);
            if !uninitialized.contains(placement.node.as_str()) {
                continue;
            }
            let target = if claims.contains(placement.node.as_str()) { "nodeclaim" } else { "node" };
            for p in &placement.pods {
                nominations.push((p.index, format!("{target}/{}", placement.node)));
            }
        }

        // Events go to the pending pods only: the pods of nodes going away are bound.
        let mut events: Vec<(Arc<Pod>, bool, &'static str, String)> = Vec::new();
        for (index, target) in nominations {
            if index < pending_count
                && let Some(pod) = pods.get(index)
            {
                events.push((
                    Arc::clone(pod),
                    false,
                    reasons::NOMINATED,
                    format!("Pod should schedule on: {target}"),
                ));
            }
        }
        for error in &results.errors {
            let Some(pod) = pods.get(error.pod.index) else { continue };
            if is_virtual(pod) {
                tracing::debug!(controller = CONTROLLER, Pod = %error.pod, error = %error, "no room for a capacity buffer's placeholder");
                continue;
            }
            // As upstream: a pod waiting for a capacity reservation is placed by the next run.
            if error.reserved {
                tracing::debug!(controller = CONTROLLER, Pod = %error.pod, error = %error, "waiting for a capacity reservation");
                continue;
            }
            tracing::error!(controller = CONTROLLER, Pod = %error.pod, error = %error, "could not schedule pod");
            if error.pod.index < pending_count {
                events.push((
                    Arc::clone(pod),
                    true,
                    reasons::FAILED_SCHEDULING,
                    format!("Failed to schedule pod, {error}"),
                ));
            }
        }
        let recorder = self.ctx.events.clone();
        let nominations = Arc::clone(&self.nominations);
        futures::stream::iter(events)
            .for_each_concurrent(EVENT_CONCURRENCY, move |(pod, warning, reason, message)| {
                let (recorder, nominations) = (recorder.clone(), Arc::clone(&nominations));
                async move {
                    if warning {
                        let window = FAILED_SCHEDULING_WINDOW;
                        recorder.deduped(pod.as_ref(), EventType::Warning, reason, "", window, message).await;
                    } else {
                        let event = (pod.as_ref(), EventType::Normal, reason);
                        recorder.limited(event, NOMINATED_WINDOW, &nominations, message).await;
                    }
                }
            })
            .await;
    }
}

/// What creating a pass's NodeClaims and telling its pods needs of the pass's snapshot and input.
struct Decided {
    /// The NodePools decided with, by name.
    nodepools: BTreeMap<String, Arc<NodePool>>,
    /// The NodeClaims the snapshot had.
    claims: HashSet<String>,
    /// The existing nodes not initialized yet.
    uninitialized: HashSet<String>,
    /// The input's pods: the pending ones first, then the others placed.
    pods: Vec<Arc<Pod>>,
}

impl Decided {
    /// What a pass over `snapshot` with `input` hands on; the rest of the input goes here.
    fn new(snapshot: &Snapshot, input: SchedulingInput) -> Self {
        Decided {
            nodepools: crate::state::input::nodepools_by_name(snapshot),
            claims: snapshot.nodeclaims.iter().filter_map(|c| c.metadata.name.clone()).collect(),
            uninitialized: input
                .existing_nodes
                .iter()
                .filter(|n| !n.initialized)
                .map(|n| n.name.clone())
                .collect(),
            pods: input.pods,
        }
    }
}

/// What a provisioning pass could not do, as upstream's scheduler metrics count it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodCounts {
    /// Pods the simulation could place nowhere, ignored pods aside.
    pub unschedulable: usize,
    /// Pending pods left out as invalid (see [`SchedulingResults::ignored`]).
    pub ignored: usize,
}

/// The [`PodCounts`] of a pass whose first `pending_count` input pods were the pending ones (the
/// rest belong to nodes going away). Upstream validates only the pending pods and leaves the
/// invalid ones out of the simulation: they are ignored, not unschedulable; an invalid pod of a
/// node going away stays a scheduling error.
pub fn pod_counts(results: &SchedulingResults, pending_count: usize) -> PodCounts {
    let ignored = results.ignored.iter().filter(|p| p.index < pending_count).count();
    PodCounts { unschedulable: results.errors.len().saturating_sub(ignored), ignored }
}

/// Whether the NodePool a pass `decided` with is no longer the one the cluster has (`now`): gone,
/// being deleted, or its spec changed (a new generation).
fn pool_changed(decided: &NodePool, now: Option<&NodePool>) -> bool {
    now.is_none_or(|now| {
        now.metadata.deletion_timestamp.is_some() || now.metadata.generation != decided.metadata.generation
    })
}

/// A pod's identity across passes: its uid (its namespace/name if it has none).
fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_else(|| pod_key(pod))
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
    use crate::scheduling::{PodError, PodRef};
    use crate::state::Feed;

    #[test]
    fn a_nodepool_changed_during_the_pass_gets_no_claim_from_it() {
        let pool = |generation: i64, status: serde_json::Value| -> NodePool {
            serde_json::from_value(serde_json::json!({"apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                "metadata": {"name": "default", "generation": generation},
                "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                    "requirements": []}}}, "status": status}))
            .unwrap()
        };
        let decided = pool(2, serde_json::json!({}));
        assert!(
            !pool_changed(&decided, Some(&pool(2, serde_json::json!({"resources": {"cpu": "4"}})))),
            "status only"
        );
        assert!(pool_changed(&decided, Some(&pool(3, serde_json::json!({})))), "limits or template changed");
        assert!(pool_changed(&decided, None), "deleted");
        let mut deleting = pool(2, serde_json::json!({}));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
        assert!(pool_changed(&decided, Some(&deleting)));
    }

    #[test]
    fn ignored_pending_pods_are_not_unschedulable() {
        let pod = |index: usize| PodRef { index, namespace: "ns".into(), name: format!("p{index}") };
        let error = |index: usize| PodError {
            pod: pod(index),
            nodepools: vec![],
            reason: Some("no".into()),
            reserved: false,
        };
        // Pods 0 and 1 were pending, 2 and 3 on nodes going away; 1 and 3 are invalid.
        let results = SchedulingResults {
            errors: vec![error(0), error(1), error(2), error(3)],
            ignored: vec![pod(1), pod(3)],
            ..SchedulingResults::default()
        };
        assert_eq!(pod_counts(&results, 2), PodCounts { unschedulable: 3, ignored: 1 });
        assert_eq!(pod_counts(&SchedulingResults::default(), 0), PodCounts::default());
    }

    // Real time, scaled down; only bounds that cannot depend on the machine's speed are asserted.
    #[tokio::test]
    async fn a_batch_closes_when_idle() {
        let feed = Arc::new(Feed::default());
        let mut sub = feed.subscribe(interest());
        feed.bump(|c| c.provisionable_pods += 1);
        let f = feed.clone();
        let sender = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                f.bump(|c| c.provisionable_pods += 1);
            }
        });
        let window = next_batch(&mut sub, Duration::from_millis(100), Duration::from_secs(30), None).await;
        // Three more pods kept it open past the first idle window; then it closed for being idle,
        // long before the maximum.
        assert!(window >= Duration::from_millis(250) && window < Duration::from_secs(30), "{window:?}");
        sender.abort();
    }

    #[tokio::test]
    async fn a_busy_batch_closes_at_the_maximum() {
        let feed = Arc::new(Feed::default());
        let mut sub = feed.subscribe(interest());
        feed.bump(|c| c.provisionable_pods += 1);
        let f = feed.clone();
        let sender = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(30)).await;
                f.bump(|c| c.provisionable_pods += 1);
            }
        });
        let window = next_batch(&mut sub, Duration::from_millis(100), Duration::from_secs(1), None).await;
        // Pods kept coming faster than the idle window: only the maximum closed it.
        assert!(window >= Duration::from_secs(1), "{window:?}");
        sender.abort();
    }

    /// Pods arriving every 30 ms, the first after `first`.
    fn pods_arriving(feed: &Arc<Feed>, first: Duration) -> tokio::task::JoinHandle<()> {
        let f = feed.clone();
        tokio::spawn(async move {
            tokio::time::sleep(first).await;
            loop {
                f.bump(|c| c.provisionable_pods += 1);
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    }

    /// The provisioner's batches with a 100 ms idle window and a 1 s maximum.
    fn batches(feed: &Feed, pass_began: Option<tokio::time::Instant>) -> Batches {
        let mut registry = prometheus_client::registry::Registry::default();
        Batches {
            changes: feed.subscribe(interest()),
            idle: Duration::from_millis(100),
            max: Duration::from_secs(1),
            metrics: Arc::new(crate::metrics::Metrics::new(&mut registry)),
            pass_began: Arc::new(Mutex::new(pass_began)),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn pods_that_came_during_a_pass_wait_one_window_from_its_start() {
        let feed = Arc::new(Feed::default());
        let mut batches = batches(&feed, Some(tokio::time::Instant::now()));
        let sender = pods_arriving(&feed, Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(800)).await;
        let entered = tokio::time::Instant::now();
        batches.changed().await;
        // The pods have waited since the pass began: the batch closes 1 s after that.
        let waited = entered.elapsed();
        assert!(waited >= Duration::from_millis(200) && waited < Duration::from_millis(230), "{waited:?}");
        sender.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_opened_after_a_pass_counts_from_its_first_pod() {
        let feed = Arc::new(Feed::default());
        // The last pass began 800 ms ago, and nothing came while it ran.
        let mut batches = batches(&feed, Some(tokio::time::Instant::now()));
        tokio::time::sleep(Duration::from_millis(800)).await;
        let sender = pods_arriving(&feed, Duration::from_millis(50));
        let entered = tokio::time::Instant::now();
        batches.changed().await;
        // Opened by the first pod 50 ms later, kept open by the others for the whole second.
        let waited = entered.elapsed();
        assert!(waited >= Duration::from_millis(1050) && waited < Duration::from_millis(1100), "{waited:?}");
        sender.abort();
    }

    #[tokio::test]
    async fn nodeclaim_updates_open_a_batch_but_do_not_keep_it_open() {
        let feed = Arc::new(Feed::default());
        let mut sub = feed.subscribe(interest());
        feed.bump(|c| c.nodeclaims += 1);
        let f = feed.clone();
        let sender = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(30)).await;
                f.bump(|c| c.nodeclaims += 1);
            }
        });
        let window = next_batch(&mut sub, Duration::from_millis(200), Duration::from_secs(10), None).await;
        assert!(window < Duration::from_secs(10), "{window:?}");
        sender.abort();
    }
}
