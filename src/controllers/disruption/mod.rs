//! The disruption controller: voluntary disruption of the nodes Karpenter launched (emptiness,
//! drift replacement and consolidation), one singleton loop as upstream's.
//!
//! Each pass:
//! 1. heals what a crash left behind: a `karpenter.sh/disrupted` taint or a `DisruptionReason`
//!    condition on a node no command of this process is working on and that is not going away;
//! 2. unless nothing changed since a pass that found nothing (at most 5 minutes), asks the pure
//!    [`crate::disruption::decide`] for the first command of emptiness, drift, multi-node and
//!    single-node consolidation, and publishes why the other nodes were left alone
//!    (`DisruptionBlocked`, `Unconsolidatable`, the NodePool's blocking budget);
//! 3. waits 15 s and validates the command on a fresh snapshot (same candidates, budgets, a new
//!    simulation; drift commands start at once, as upstream's); then starts it ([`command`]) and
//!    looks for the next one at once. Idle, it
//!    looks again after 10 s, or 2 s after nodes or NodeClaims went away or a NodePool changed
//!    (a command's nodes gone free the budget the next one needs).
//!
//! A command taints its nodes, launches its replacement and waits until it is initialized, and
//! only then deletes the old NodeClaims (the termination controller drains them); see
//! [`command`] for how a failure or a crash at any point is undone.

#[cfg(test)]
mod cluster_tests;
pub mod command;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::apis::pod::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::apis::labels::TAINT_DISRUPTED;
use crate::apis::nodeclaim::conditions::DISRUPTION_REASON;
use crate::controllers::Context;
use crate::controllers::departures::{self, Departures};
use crate::controllers::events::{EventType, reasons};
use crate::controllers::kit::{Coalesced, Next, Options, run_singleton};
use crate::disruption::consolidation;
use crate::disruption::decide::{self, Command, Inputs, Method, Pass, Rejection};
use crate::disruption::emptiness;
use crate::disruption::record::{Code, Outcome, Record, Why};
use crate::metrics::observe;
use crate::state::statenode::state_nodes;
use crate::state::{Changes, ClusterState, Interest, Registration, Snapshot, StateNode};

pub use command::{CONTROLLER, InFlight, Launched};
/// Wait between passes that found nothing to do.
pub const IDLE: Duration = Duration::from_secs(10);
/// How long a burst of deletions is let settle before a pass looks at the budget they freed.
pub const SETTLE: Duration = Duration::from_secs(2);
/// Wait between a decision and its validation.
pub const VALIDATION_DELAY: Duration = Duration::from_secs(15);
/// A pass that found nothing is not repeated before the cluster changes, or this long.
pub const MEMO: Duration = Duration::from_secs(300);
/// The same `DisruptionBlocked` message about one node at most this often (unlike upstream, a
/// new reason is told at once rather than hidden behind the previous one's window, except among
/// the passing states of [`passing`]).
const BLOCKED_EVENT_WINDOW: SignedDuration = SignedDuration::from_mins(2);
/// `Unconsolidatable` about one node at most this often.
const UNCONSOLIDATABLE_EVENT_WINDOW: SignedDuration = SignedDuration::from_mins(15);
/// The NodePool's blocking-budget event at most this often.
const BUDGET_EVENT_WINDOW: SignedDuration = SignedDuration::from_mins(1);

/// The controller's memory between passes.
struct Controller {
    ctx: Context,
    state: ClusterState,
    in_flight: InFlight,
    launched: Launched,
    commands: Mutex<JoinSet<()>>,
    /// The changes seen by the last pass that found nothing, and until when that holds.
    memo: Mutex<Option<(Changes, Instant)>>,
    /// Pods deleted from nodes going away whose successor is not seen yet; the pod watch
    /// reports deletions into it.
    departures: Arc<Mutex<Departures>>,
    /// The decision waiting for its validation, if any.
    awaiting: Mutex<Option<Awaiting>>,
    _pod_watch: Registration,
}

/// A decision waiting for its validation, and when that is due.
struct Awaiting {
    command: Command,
    due: Instant,
}

/// Runs until `stop` turns true; the commands under way stop with it (a command cut short is
/// healed by the next leader's first pass).
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let (departures, pod_watch) = departures::follow(&state);
    let controller = Arc::new(Controller {
        ctx: ctx.clone(),
        departures,
        _pod_watch: pod_watch,
        state,
        in_flight: InFlight::default(),
        launched: Launched::default(),
        commands: Mutex::new(JoinSet::new()),
        memo: Mutex::new(None),
        awaiting: Mutex::new(None),
    });
    let c = controller.clone();
    // Besides its timer, a pass follows nodes and NodeClaims going away (budget freed) and
    // NodePool edits, NodeOverlay re-evaluations (prices changed) and CapacityBuffer changes
    // (headroom kept or released), once a burst of them has settled.
    let interest = Interest {
        node_deletions: true,
        nodeclaim_deletions: true,
        nodepools: true,
        overlays: true,
        buffers: true,
        ..Interest::default()
    };
    let wake = Coalesced { changes: controller.state.feed().subscribe(interest), settle: SETTLE };
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, move || {
        let c = c.clone();
        async move { Ok::<_, std::convert::Infallible>(c.pass().await) }
    })
    .await;
    controller.commands.lock().unwrap_or_else(PoisonError::into_inner).abort_all();
}

/// The snapshot a pass decides on: the cluster state, the nodes of commands under way counted as
/// going away, the NodePools' instance types.
async fn take_snapshot(ctx: &Context, state: &ClusterState, in_flight: &HashMap<String, bool>) -> Snapshot {
    let mut snapshot = state.snapshot();
    let deleting = |name: &str| in_flight.get(name) == Some(&false);
    for node in &mut snapshot.nodes {
        let name = node.name_any();
        if deleting(&name) {
            snapshot.marked_for_deletion.insert(name);
        } else if in_flight.contains_key(&name) {
            // Being replaced: nothing new goes there, even before the cache shows the taint.
            let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
            if let Some(taints) = crate::controllers::node::with_disrupted_taint(taints) {
                Arc::make_mut(node).spec.get_or_insert_with(Default::default).taints = Some(taints);
            }
        }
    }
    let claims_of_in_flight: Vec<String> = state_nodes(&snapshot)
        .iter()
        .filter(|n| deleting(&n.name))
        .filter_map(|n| n.claim_name().map(str::to_string))
        .collect();
    snapshot.marked_for_deletion.extend(claims_of_in_flight);
    crate::controllers::snapshot::with_instance_types_of_pools(snapshot, ctx.cloud.as_ref(), CONTROLLER).await
}

/// The inputs of a pass over `snapshot` (NodeClaims consolidation launched lately are `young`).
fn pass_inputs(ctx: &Context, snapshot: Snapshot, launched: &Launched) -> Inputs {
    let young = {
        let mut launched = launched.lock().unwrap_or_else(PoisonError::into_inner);
        launched.retain(|_, at| at.elapsed() < consolidation::CHURN_GUARD);
        launched.keys().cloned().collect()
    };
    let options = ctx.settings.disruption_options();
    let spot_to_spot = ctx.settings.feature_gates.spot_to_spot_consolidation;
    Inputs::of(snapshot, options, spot_to_spot, Timestamp::now(), young)
}

impl Controller {
    fn in_flight(&self) -> HashMap<String, bool> {
        self.in_flight.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The inputs of a decision over `snapshot`: [`pass_inputs`], with stand-ins keeping the room
    /// of pods that just left nodes going away.
    fn decision_inputs(&self, snapshot: Snapshot) -> Inputs {
        let inputs = pass_inputs(&self.ctx, snapshot, &self.launched);
        let stand_ins = {
            let mut departures = self.departures.lock().unwrap_or_else(PoisonError::into_inner);
            departures.stand_ins(&inputs.nodes, &inputs.snapshot.pods, inputs.now)
        };
        inputs.with_stand_ins(stand_ins)
    }

    async fn pass(self: &Arc<Self>) -> Next {
        if !self.state.is_synced() {
            return Next::After(Duration::from_secs(1));
        }
        // Reap finished commands.
        {
            let mut commands = self.commands.lock().unwrap_or_else(PoisonError::into_inner);
            while commands.try_join_next().is_some() {}
        }
        // A decision waiting for its validation is validated once due; until then drift goes on
        // beside it (upstream's controller waits), and nothing else is decided.
        let awaiting = self.awaiting.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(awaiting) = awaiting {
            if Instant::now() >= awaiting.due {
                return self.validate(awaiting.command).await;
            }
            let next = self.drift_beside(&awaiting.command).await;
            let left = awaiting.due.saturating_duration_since(Instant::now());
            *self.awaiting.lock().unwrap_or_else(PoisonError::into_inner) = Some(awaiting);
            return next.min(Next::After(left));
        }
        let going = self.in_flight();
        let snapshot = take_snapshot(&self.ctx, &self.state, &going).await;
        let in_flight: HashSet<String> = going.into_keys().collect();
        self.heal(&snapshot, &in_flight).await;
        let changes = self.state.feed().current();
        if let Some((seen, until)) = *self.memo.lock().unwrap_or_else(PoisonError::into_inner)
            && !Interest::ALL.differs(&seen, &changes)
            && Instant::now() < until
        {
            return Next::After(IDLE);
        }
        let start = Instant::now();
        let inputs = self.decision_inputs(snapshot);
        let decided = {
            let in_flight = in_flight.clone();
            tokio::task::spawn_blocking(move || {
                let pass = decide::decide(&inputs.world(), &in_flight);
                (inputs, pass)
            })
            .await
        };
        let (inputs, pass) = match decided {
            Ok(d) => d,
            Err(error) => {
                tracing::error!(controller = CONTROLLER, error = %error, "disruption decision failed");
                return Next::After(IDLE);
            }
        };
        let elapsed = start.elapsed();
        tracing::debug!(
            controller = CONTROLLER,
            nodes = inputs.nodes.len(),
            blocked = pass.blocked.len(),
            unconsolidatable = pass.unconsolidatable.len(),
            command = pass.command.as_ref().map(command::describe).unwrap_or_default(),
            duration = ?elapsed,
            "evaluated disruption"
        );
        self.record(&inputs, &pass, &in_flight, elapsed).await;
        let Some(command) = pass.command else {
            if !pass.budget_constrained && !pass.transient {
                let until = Instant::now() + self.memo_for(&inputs);
                *self.memo.lock().unwrap_or_else(PoisonError::into_inner) = Some((changes, until));
            }
            return Next::After(IDLE);
        };
        *self.memo.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if command.method == Method::Drift {
            // Drift is not validated after a wait, as upstream: the node has to go anyway.
            self.start(&inputs, command).await;
            return Next::After(Duration::ZERO);
        }

        // Validated on a fresh snapshot after a while; drift may start meanwhile.
        let due = Instant::now() + VALIDATION_DELAY;
        *self.awaiting.lock().unwrap_or_else(PoisonError::into_inner) = Some(Awaiting { command, due });
        Next::After(Duration::ZERO)
    }

    /// The drift pass run while `awaiting` waits for its validation. Its nodes are counted as
    /// being replaced (tainted in the snapshot): they hold their budget, are not replaced by
    /// drift, and no drifted node's pods are planned onto them.
    async fn drift_beside(self: &Arc<Self>, awaiting: &Command) -> Next {
        let mut going = self.in_flight();
        for name in &awaiting.plan.candidates {
            going.entry(name.clone()).or_insert(true);
        }
        let snapshot = take_snapshot(&self.ctx, &self.state, &going).await;
        let in_flight: HashSet<String> = going.into_keys().collect();
        let inputs = self.decision_inputs(snapshot);
        let decided = tokio::task::spawn_blocking(move || {
            let pass = decide::decide_drift(&inputs.world(), &in_flight);
            (inputs, pass)
        })
        .await;
        match decided {
            Ok((inputs, Pass { command: Some(command), .. })) => {
                self.start(&inputs, command).await;
                Next::After(Duration::ZERO)
            }
            Ok(_) => Next::Wait,
            Err(error) => {
                tracing::error!(controller = CONTROLLER, error = %error, "disruption decision failed");
                Next::Wait
            }
        }
    }

    /// Validates `command` on a fresh snapshot, then starts or abandons it.
    async fn validate(self: &Arc<Self>, command: Command) -> Next {
        let going = self.in_flight();
        let fresh =
            pass_inputs(&self.ctx, take_snapshot(&self.ctx, &self.state, &going).await, &self.launched);
        let in_flight: HashSet<String> = going.into_keys().collect();
        let validated = {
            let command = command.clone();
            tokio::task::spawn_blocking(move || {
                let result = decide::validate(&fresh.world(), &command, &in_flight);
                (fresh, result)
            })
            .await
        };
        let (fresh, result) = match validated {
            Ok(v) => v,
            Err(error) => {
                tracing::error!(controller = CONTROLLER, error = %error, "disruption validation failed");
                return Next::After(IDLE);
            }
        };
        match result {
            Ok(validated) => {
                if !validated.dropped.is_empty() {
                    self.leave_out(&validated);
                }
                self.start(&fresh, validated.command).await;
                Next::After(Duration::ZERO)
            }
            Err(rejection) => {
                self.reject(&fresh, &command, &rejection).await;
                Next::After(Duration::ZERO)
            }
        }
    }

    /// How long a pass that found nothing holds: until the next node turns consolidatable, at
    /// most [`MEMO`].
    fn memo_for(&self, inputs: &Inputs) -> Duration {
        let next = inputs
            .nodes
            .iter()
            .filter_map(|n| emptiness::consolidatable_at(n, inputs.pools.get(n.nodepool()?)?))
            .filter(|at| *at > inputs.now)
            .min();
        match next {
            Some(at) => Duration::try_from(at.duration_since(inputs.now)).unwrap_or(MEMO).min(MEMO),
            None => MEMO,
        }
    }

    /// Removes the disrupted taint and the `DisruptionReason` condition from nodes no command is
    /// working on and that are not going away.
    async fn heal(&self, snapshot: &Snapshot, in_flight: &HashSet<String>) {
        for node in state_nodes(snapshot) {
            if in_flight.contains(&node.name) || node.marked_for_deletion || !node.managed {
                continue;
            }
            if let Some(k8s) = &node.node
                && node.taints.iter().any(|t| {
                    t.key == TAINT_DISRUPTED && t.effect == crate::apis::common::TaintEffect::NoSchedule
                })
                && let Err(error) =
                    crate::controllers::node::remove_disrupted_taint(&self.ctx.client, k8s, node.claim_name())
                        .await
            {
                tracing::warn!(controller = CONTROLLER, Node = %node.name, error = %crate::util::error_chain(&error), "removing a stale disrupted taint");
            }
            if let Some(claim) = &node.claim
                && claim
                    .status
                    .as_ref()
                    .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == DISRUPTION_REASON))
            {
                command::clear_disruption_reason(&self.ctx.client, claim).await;
            }
        }
    }

    /// Metrics and events of a pass.
    async fn record(&self, inputs: &Inputs, pass: &Pass, in_flight: &HashSet<String>, elapsed: Duration) {
        let m = &self.ctx.metrics;
        for (reason, n) in &pass.eligible {
            m.disruption_eligible_nodes.get_or_create(&vec![("reason", reason.to_string())]).set(*n as f64);
        }
        let consolidation_type = pass.command.as_ref().map(|c| c.method.consolidation_type()).unwrap_or("");
        let reason = pass.command.as_ref().map(|c| c.reason().metric_label()).unwrap_or("underutilized");
        observe(
            &m.disruption_evaluation_duration,
            vec![("reason", reason.into()), ("consolidation_type", consolidation_type.into())],
            elapsed,
        );
        let by_name: BTreeMap<&str, &StateNode> = inputs.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let events = &self.ctx.events;
        let record = Record::of(
            pass,
            &inputs.nodes,
            in_flight,
            inputs.now,
            pass.command.as_ref().map(command::describe),
        );
        for (name, decision) in &record.nodes {
            let Some(node) = by_name.get(name.as_str()) else { continue };
            let why = Why::new(decision.code, decision.message.clone());
            match decision.outcome {
                Outcome::Blocked => {
                    let message = upper_first(&why.message);
                    // A node's passing states (no Node yet, not initialized, nominated, going
                    // away) are told once per window between them, as upstream's recorder
                    // does with every reason: a new node passes through three in its first
                    // minute. Any other reason is told at once.
                    let key = if passing(why.code) { "passing" } else { message.as_str() };
                    self.tell(node, reasons::DISRUPTION_BLOCKED, key, BLOCKED_EVENT_WINDOW, &message).await;
                }
                Outcome::Unconsolidatable if consolidation::is_reported(&why) => {
                    let reason = reasons::UNCONSOLIDATABLE;
                    self.tell(node, reason, &why.message, UNCONSOLIDATABLE_EVENT_WINDOW, &why.message).await;
                }
                _ => {}
            }
        }
        self.ctx.decisions.set(record);
        for invalid in &pass.invalid {
            let Some(pod) = find_pod(&inputs.snapshot, &invalid.pod) else { continue };
            let message = format!(
                "Invalid karpenter.sh/do-not-disrupt annotation: {}, ignoring annotation",
                invalid.error
            );
            let reason = reasons::INVALID_DO_NOT_DISRUPT_ANNOTATION;
            events.deduped(pod.as_ref(), EventType::Warning, reason, "", BLOCKED_EVENT_WINDOW, message).await;
        }
        for (pool, reason) in &pass.budget_blocked {
            let Some(np) = inputs.pools.get(pool) else { continue };
            let message = format!(
                "No allowed disruptions for disruption reason {} due to blocking budget",
                reason.as_str()
            );
            events
                .deduped(
                    np.as_ref(),
                    EventType::Normal,
                    reasons::DISRUPTION_BLOCKED,
                    reason.as_str(),
                    BUDGET_EVENT_WINDOW,
                    message,
                )
                .await;
        }
    }

    /// A Normal event about the node and its NodeClaim, at most once per `window` for the same
    /// `key` (an event with another key is told at once).
    async fn tell(&self, node: &StateNode, reason: &str, key: &str, window: SignedDuration, message: &str) {
        let events = &self.ctx.events;
        if let Some(k8s) = &node.node {
            events.deduped(k8s.as_ref(), EventType::Normal, reason, key, window, message.to_string()).await;
        }
        if let Some(claim) = &node.claim {
            events.deduped(claim.as_ref(), EventType::Normal, reason, key, window, message.to_string()).await;
        }
    }

    /// Counts and logs the candidates validation left out of a command that goes ahead without
    /// them.
    fn leave_out(&self, validated: &decide::Validated) {
        let command = &validated.command;
        self.ctx
            .metrics
            .disruption_failed_validations
            .get_or_create(&vec![("consolidation_type", command.method.consolidation_type().to_string())])
            .inc_by(validated.dropped.len() as u64);
        let detail: Vec<String> = validated
            .dropped
            .iter()
            .map(|(_, rejection)| format!("{}: {}", rejection.label(), rejection.detail()))
            .collect();
        tracing::info!(
            controller = CONTROLLER,
            reason = command.reason().as_str(),
            decision = command.plan.decision.as_str(),
            nodes = %validated.dropped.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>().join(", "),
            detail = %detail.join("; "),
            "leaving nodes out of a disruption, validation failed for them"
        );
    }

    async fn reject(&self, inputs: &Inputs, command: &Command, rejection: &Rejection) {
        let kind = command.method.consolidation_type();
        self.ctx
            .metrics
            .disruption_failed_validations
            .get_or_create(&vec![("consolidation_type", kind.to_string())])
            .inc();
        tracing::info!(
            controller = CONTROLLER,
            reason = command.reason().as_str(),
            decision = command.plan.decision.as_str(),
            nodes = %command.plan.candidates.join(", "),
            rejection = rejection.label(),
            detail = rejection.detail(),
            "abandoning disruption, validation failed"
        );
        if command.method == Method::Emptiness {
            return;
        }
        let message = format!(
            "Consolidation rejected: {}, reason: {} (savings: ${:.2})",
            command::describe(command),
            rejection.label(),
            command.plan.savings
        );
        for name in &command.plan.candidates {
            let Some(node) = inputs.nodes.iter().find(|n| &n.name == name) else { continue };
            if let Some(k8s) = &node.node {
                self.ctx.events.normal(k8s.as_ref(), reasons::CONSOLIDATION_REJECTED, message.clone()).await;
            }
        }
    }

    async fn start(self: &Arc<Self>, inputs: &Inputs, command: Command) {
        let nodes: Vec<StateNode> =
            inputs.nodes.iter().filter(|n| command.plan.candidates.contains(&n.name)).cloned().collect();
        {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
            let replacing = !command.plan.replacements.is_empty();
            in_flight.extend(command.plan.candidates.iter().map(|c| (c.clone(), replacing)));
        }
        for score in &command.scores {
            let labels = vec![
                ("decision", command.plan.decision.as_str().to_string()),
                ("nodepool", score.nodepool.clone()),
                ("policy", "Balanced".to_string()),
            ];
            self.ctx.metrics.consolidation_moves.get_or_create(&labels).inc();
            self.ctx.metrics.consolidation_score.get_or_create(&labels).observe(score.score);
            let message = format!(
                "score {:.2} >= threshold {:.2} (k: {}, savings {:.1}%, disruption {:.1}%)",
                score.score,
                1.0 / consolidation::BALANCED_K,
                consolidation::BALANCED_K,
                score.savings_percent,
                score.disruption_percent
            );
            // One node: on it and its NodeClaim; several: on their NodePool.
            if let [single] = nodes.as_slice() {
                let reason = reasons::CONSOLIDATION_APPROVED;
                self.tell(single, reason, &message, SignedDuration::ZERO, &message).await;
            } else if let Some(pool) = inputs.pools.get(&score.nodepool) {
                self.ctx.events.normal(pool.as_ref(), reasons::CONSOLIDATION_APPROVED, message).await;
            }
        }
        let run = command::Run {
            ctx: self.ctx.clone(),
            state: self.state.clone(),
            in_flight: self.in_flight.clone(),
            launched: self.launched.clone(),
            command,
            nodes,
            pools: inputs.pools.clone(),
            timeout: command::TIMEOUT,
        };
        self.commands.lock().unwrap_or_else(PoisonError::into_inner).spawn(run.execute());
    }
}

/// Whether a node blocked for `code` is only passing through: a new node on its way to
/// initialized and used, or a node on its way out. Such states pass without anyone acting.
fn passing(code: Code) -> bool {
    matches!(code, Code::NoNode | Code::NotInitialized | Code::Nominated | Code::Deleting)
}

fn find_pod(snapshot: &Snapshot, key: &str) -> Option<Arc<Pod>> {
    snapshot.pods.iter().find(|p| crate::state::pods::key(p) == key).cloned()
}

/// The message with its first letter upper-cased, as upstream's events read.
pub fn upper_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}
