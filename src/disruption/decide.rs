//! One pass of voluntary disruption over a snapshot: which nodes are candidates, and the first
//! method in upstream's order that finds something to do (emptiness, drift replacement,
//! multi-node, then single-node consolidation).
//!
//! The pass is pure: the controller builds the [`World`], calls [`decide`], and acts on the
//! command it returns; every node looked at and left alone carries its reason in [`Pass`], which
//! becomes its `DisruptionBlocked` or `Unconsolidatable` event.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;

use crate::apis::NodePool;
use crate::apis::labels::{
    CAPACITY_TYPE_SPOT, LABEL_CAPACITY_TYPE, LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_ZONE,
};
use crate::apis::nodeclaim::conditions::{DRIFTED, REBALANCE_RECOMMENDED};
use crate::apis::nodepool::DisruptionReason;
use crate::scheduling::{NewNodeClaim, SchedulerOptions};
use crate::state::StateNode;
use crate::state::snapshot::Snapshot;
use crate::state::statenode::state_nodes;

use super::budgets::{self, PoolBudget};
use super::candidates::{self, Blocked, InvalidAnnotation};
use super::consolidation::{self, Plan, Reasons, Score, Setting, World};
use super::emptiness;
use super::record::{Code, NodeDecision, Outcome, Record, Why};

/// Everything a pass decides on, owned (the controller moves it to a blocking thread; `karpenter
/// explain` builds one from a snapshot of the live cluster).
pub struct Inputs {
    /// The snapshot, with the NodePools' instance types.
    pub snapshot: Snapshot,
    /// Its StateNodes.
    pub nodes: Vec<StateNode>,
    /// The NodePools not being deleted, by name.
    pub pools: BTreeMap<String, Arc<NodePool>>,
    /// Scheduler tunables.
    pub options: SchedulerOptions,
    /// The `SpotToSpotConsolidation` feature gate.
    pub spot_to_spot: bool,
    /// Now.
    pub now: Timestamp,
    /// See [`World::young`].
    pub young: HashSet<String>,
    /// Pods that left a node going away and whose successor is not seen yet: they keep the room
    /// they need, as pending pods do (see `controllers::departures`).
    pub stand_ins: Vec<Arc<crate::apis::pod::Pod>>,
}

impl Inputs {
    /// The inputs of `snapshot` at `now`.
    pub fn of(
        snapshot: Snapshot,
        options: SchedulerOptions,
        spot_to_spot: bool,
        now: Timestamp,
        young: HashSet<String>,
    ) -> Self {
        let nodes = state_nodes(&snapshot);
        let pools = crate::state::input::nodepools_by_name(&snapshot)
            .into_iter()
            .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
            .collect();
        // As upstream's disruption simulations: a held reservation is no reason to keep a pod.
        let options = SchedulerOptions { reserved_fallback: true, ..options };
        Inputs { snapshot, nodes, pools, options, spot_to_spot, now, young, stand_ins: Vec::new() }
    }

    /// These inputs with `stand_ins` among the pending pods.
    pub fn with_stand_ins(mut self, stand_ins: Vec<Arc<crate::apis::pod::Pod>>) -> Self {
        self.stand_ins = stand_ins;
        self
    }

    /// The world a pass looks at (pending pods keep the room they need).
    pub fn world(&self) -> World<'_> {
        World::new(
            &self.snapshot,
            Setting {
                nodes: &self.nodes,
                pending: {
                    let mut pending = self.snapshot.provisionable_pods();
                    pending.extend(self.stand_ins.iter().cloned());
                    // CapacityBuffers' headroom is kept as for pending pods.
                    pending.extend(self.snapshot.virtual_pods.iter().cloned());
                    pending
                },
                options: self.options.clone(),
                spot_to_spot: self.spot_to_spot,
                pools: &self.pools,
                now: self.now,
                young: self.young.clone(),
            },
        )
    }
}

/// How a command was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// Empty nodes, deleted together.
    Emptiness,
    /// A drifted node, replaced by what its pods need.
    Drift,
    /// Several nodes removed by one command.
    MultiNode,
    /// One node.
    SingleNode,
}

impl Method {
    /// The `consolidation_type` metric label.
    pub fn consolidation_type(self) -> &'static str {
        match self {
            Method::Emptiness => "empty",
            Method::Drift => "",
            Method::MultiNode => "multi",
            Method::SingleNode => "single",
        }
    }

    /// The disruption reason its commands carry.
    pub fn reason(self) -> DisruptionReason {
        match self {
            Method::Emptiness => DisruptionReason::Empty,
            Method::Drift => DisruptionReason::Drifted,
            Method::MultiNode | Method::SingleNode => DisruptionReason::Underutilized,
        }
    }
}

/// What a pass decided to do.
#[derive(Clone, Debug)]
pub struct Command {
    /// The method that found it.
    pub method: Method,
    /// The nodes and what becomes of them.
    pub plan: Plan,
    /// Balanced NodePools' scores of the move.
    pub scores: Vec<Score>,
}

impl Command {
    /// Why the nodes go.
    pub fn reason(&self) -> DisruptionReason {
        self.method.reason()
    }
}

/// The outcome of a pass.
#[derive(Clone, Debug, Default)]
pub struct Pass {
    /// The command to validate and run, if any.
    pub command: Option<Command>,
    /// Nodes that are not candidates, and why.
    pub blocked: BTreeMap<String, Blocked>,
    /// Pods whose do-not-disrupt annotation is ignored.
    pub invalid: Vec<InvalidAnnotation>,
    /// Candidates consolidation looked at and left, and why.
    pub unconsolidatable: Reasons,
    /// NodePools with nodes whose budget allows nothing, with the reason.
    pub budget_blocked: BTreeSet<(String, DisruptionReason)>,
    /// Candidates, per method.
    pub eligible: BTreeMap<&'static str, usize>,
    /// Whether a budget kept a method from acting (then the no-op is not remembered).
    pub budget_constrained: bool,
    /// Whether a node is blocked for a while only (then the no-op is not remembered either).
    pub transient: bool,
}

/// Remaining budget per NodePool for `reason`.
fn remaining(world: &World<'_>, reason: DisruptionReason, pass: &mut Pass) -> BTreeMap<String, usize> {
    let counts = budgets::pool_nodes(world.nodes);
    let by_pool: BTreeMap<String, PoolBudget> =
        budgets::budgets(world.pools.values(), &counts, reason, world.now);
    by_pool
        .into_iter()
        .map(|(pool, b)| {
            if b.allowed == 0 && counts.get(&pool).is_some_and(|c| c.total > 0) {
                pass.budget_blocked.insert((pool.clone(), reason));
            }
            (pool, b.remaining)
        })
        .collect()
}

/// The nodes that may be disrupted now (not in `in_flight`, passing the candidate checks).
pub fn candidates<'a>(
    world: &'a World<'_>,
    in_flight: &HashSet<String>,
    pass: &mut Pass,
) -> Vec<&'a StateNode> {
    let pool_names: BTreeSet<String> = world.pools.keys().cloned().collect();
    let mut out = Vec::new();
    for node in world.nodes.iter().filter(|n| n.managed && n.claim.is_some()) {
        if in_flight.contains(&node.name) {
            continue;
        }
        let verdict = candidates::check(node, &pool_names, &world.snapshot.pdbs, false, world.now);
        pass.invalid.extend(verdict.invalid);
        pass.transient |= verdict.transient && verdict.blocked.is_some();
        match verdict.blocked {
            Some(blocked) => {
                pass.blocked.insert(node.name.clone(), blocked);
            }
            None => out.push(node),
        }
    }
    out
}

/// One pass: the first method that finds a command wins.
pub fn decide(world: &World<'_>, in_flight: &HashSet<String>) -> Pass {
    let mut pass = Pass::default();
    // A static NodePool's nodes are neither emptied nor consolidated: its count is `replicas`.
    let (fixed, candidates): (Vec<&StateNode>, Vec<&StateNode>) =
        candidates(world, in_flight, &mut pass).into_iter().partition(|n| of_static_pool(world, n));
    for node in fixed {
        pass.unconsolidatable.insert(node.name.clone(), static_pool_why());
    }

    // Emptiness.
    let mut empty_budget = remaining(world, DisruptionReason::Empty, &mut pass);
    let mut empty: Vec<&StateNode> = Vec::new();
    for node in candidates.iter().copied().filter(|n| emptiness::is_empty(n)) {
        if world.snapshot.buffers_placed.holds(node) {
            // The provisioner keeps a CapacityBuffer's headroom there, as upstream.
            pass.unconsolidatable.insert(node.name.clone(), buffer_pods_why(node));
        } else {
            empty.push(node);
        }
    }
    pass.eligible.insert("empty", empty.len());
    // Budgets are counts, or usize::MAX when unlimited: asked whether any is left, never summed.
    let budget_left = empty_budget.values().any(|left| *left > 0);
    let chosen = emptiness::empty_nodes(&empty, world.pools, &mut empty_budget, world.now);
    if !chosen.is_empty() {
        let price = empty.iter().filter(|n| chosen.contains(&n.name)).map(|n| n.price.unwrap_or(0.0)).sum();
        pass.command = Some(Command {
            method: Method::Emptiness,
            plan: consolidation::Moves::default().plan(chosen, price, price),
            scores: vec![],
        });
        return pass;
    }
    let consolidatable_empty = empty.iter().any(|n| {
        n.nodepool()
            .and_then(|p| world.pools.get(p))
            .and_then(|p| emptiness::consolidatable_at(n, p))
            .is_some_and(|at| at <= world.now)
    });
    if consolidatable_empty && !budget_left {
        pass.budget_constrained = true;
    }

    // Drift.
    if let Some(command) = drift(world, in_flight, &mut pass) {
        pass.command = Some(command);
        return pass;
    }

    // Consolidation of non-empty nodes.
    let mut movable: Vec<&StateNode> = Vec::new();
    for node in candidates.iter().copied().filter(|n| !emptiness::is_empty(n)) {
        let Some(pool) = node.nodepool().and_then(|p| world.pools.get(p)) else { continue };
        if node.claim_name().is_some_and(|c| world.young.contains(c)) {
            pass.unconsolidatable
                .insert(node.name.clone(), Why::new(Code::RecentlyLaunched, consolidation::YOUNG));
            pass.transient = true;
            continue;
        }
        match consolidation::filter(node, pool, world.now) {
            None => movable.push(node),
            Some(why) => {
                pass.unconsolidatable.insert(node.name.clone(), why);
            }
        }
    }
    consolidation::sort_candidates(&mut movable);
    pass.eligible.insert("underutilized", movable.len());
    let totals = consolidation::pool_totals(world.nodes);
    let last_scores = std::cell::RefCell::new(Vec::new());
    let approve = |plan: &Plan, nodes: &[&StateNode]| {
        let scores = consolidation::balanced_scores(plan, nodes, world.pools, &totals);
        let ok = scores.iter().all(Score::approves);
        *last_scores.borrow_mut() = scores;
        ok
    };
    let budget = remaining(world, DisruptionReason::Underutilized, &mut pass);
    let mut multi_budget = budget.clone();
    let within: Vec<&StateNode> = movable
        .iter()
        .copied()
        .filter(|n| {
            let pool = n.nodepool().unwrap_or_default();
            match multi_budget.get_mut(pool) {
                Some(b) if *b > 0 => {
                    *b -= 1;
                    true
                }
                _ => false,
            }
        })
        .collect();
    if within.len() < movable.len() {
        pass.budget_constrained = true;
    }
    if let Some(plan) = consolidation::multi_node(world, &within, &approve) {
        // A plan of one node is single-node consolidation's to make (with its spot rule).
        if plan.candidates.len() > 1 {
            let nodes: Vec<&StateNode> =
                within.iter().copied().filter(|n| plan.candidates.contains(&n.name)).collect();
            approve(&plan, &nodes);
            let scores = last_scores.borrow().clone();
            pass.command = Some(Command { method: Method::MultiNode, plan, scores });
            return pass;
        }
    }
    let (plan, reasons) = consolidation::single_node(world, &movable, &budget, &approve);
    pass.unconsolidatable.extend(reasons);
    if let Some(plan) = plan {
        let scores = last_scores.borrow().clone();
        pass.command = Some(Command { method: Method::SingleNode, plan, scores });
    }
    pass
}

/// Whether `node` belongs to a static NodePool (`spec.replicas`).
fn of_static_pool(world: &World<'_>, node: &StateNode) -> bool {
    node.nodepool().and_then(|p| world.pools.get(p)).is_some_and(|p| p.is_static())
}

/// Why an empty node that holds a CapacityBuffer's placeholders is not emptied.
pub fn buffer_pods_why(node: &StateNode) -> Why {
    Why::new(Code::BufferPods, format!("Node {:?} has buffer pods", node.name))
}

/// Why a node of a static NodePool is neither emptied nor consolidated.
pub fn static_pool_why() -> Why {
    Why::new(Code::StaticNodePool, "Node belongs to a static NodePool: spec.replicas sets its node count")
}

/// What replaces a drifted node of the static NodePool `pool` (upstream's `StaticDrift`): one
/// NodeClaim of its template, whatever the pods, unless the pool has more claims than replicas
/// (a scale-down is under way) or `limits.nodes` allows no other. Why not, otherwise.
pub fn static_replacement(world: &World<'_>, pool: &NodePool) -> Result<Vec<NewNodeClaim>, Why> {
    let name = pool.metadata.name.as_deref().unwrap_or_default();
    let none = BTreeSet::new();
    let unseen = super::static_capacity::Unseen { created: &none, deleted: &none };
    let counts = super::static_capacity::counts(name, world.nodes, &unseen);
    if counts.active > pool.spec.replicas.unwrap_or(0) {
        return Err(Why::new(Code::NotReached, "static NodePool is scaling down"));
    }
    if super::static_capacity::node_limit(pool).is_some_and(|limit| counts.active >= limit) {
        return Err(Why::new(Code::Budget, "static NodePool has reached its node limit"));
    }
    let types = world.snapshot.pool_types.get(name).cloned().unwrap_or_default();
    let input = crate::scheduling::NodePoolInput::from_nodepool(pool, types, &Default::default())
        .map_err(|e| Why::new(Code::NotReached, crate::util::error_chain(&e)))?;
    Ok(vec![input.static_claim()])
}

/// Drift: of the drifted nodes that may be disrupted (a NodeClaim with a `terminationGracePeriod`
/// is not held by its pods: the grace period bounds the wait), empty ones first, then by how
/// long they have been drifted, the first whose NodePool's `Drifted` budget allows one more and
/// whose pods fit on the rest of the cluster plus as many new NodeClaims as they need (no price
/// check). A drifted node whose pods would not fit is blocked (it says why) and the next one is
/// tried, its budget untouched.
fn drift(world: &World<'_>, in_flight: &HashSet<String>, pass: &mut Pass) -> Option<Command> {
    let pool_names: BTreeSet<String> = world.pools.keys().cloned().collect();
    let mut drifted: Vec<(&StateNode, String)> = Vec::new();
    for node in world.nodes.iter().filter(|n| n.managed && !in_flight.contains(&n.name)) {
        let Some(claim) = node.claim.as_deref() else { continue };
        let conditions = claim.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
        // A spot node EC2 recommended moving off (`REBALANCE_REPLACEMENT`) is replaced the same way.
        let Some(since) = conditions.iter().find(|c| {
            (c.type_ == DRIFTED || c.type_ == REBALANCE_RECOMMENDED)
                && c.status == crate::apis::common::ConditionStatus::True
        }) else {
            continue;
        };
        let ignore_pods = claim.spec.termination_grace_period.is_some();
        let verdict = candidates::check(node, &pool_names, &world.snapshot.pdbs, ignore_pods, world.now);
        if verdict.blocked.is_some() {
            continue;
        }
        drifted.push((node, since.last_transition_time.clone()));
    }
    pass.eligible.insert("drifted", drifted.len());
    if drifted.is_empty() {
        // No budget to look at (nor to report as blocking).
        return None;
    }
    drifted.sort_by(|(a, at), (b, bt)| {
        emptiness::is_empty(b)
            .cmp(&emptiness::is_empty(a))
            .then_with(|| at.cmp(bt))
            .then_with(|| a.name.cmp(&b.name))
    });
    // Only a command that acts spends budget: a node whose pods would not fit is skipped without
    // taking its NodePool's slot, so one stuck node never holds back the others.
    let budget = remaining(world, DisruptionReason::Drifted, pass);
    for (node, _) in drifted {
        let pool = node.nodepool().unwrap_or_default();
        if budget.get(pool).is_none_or(|b| *b == 0) {
            pass.budget_constrained = true;
            continue;
        }
        let moving_off = !node.claim.as_deref().is_some_and(|c| c.is_true(DRIFTED));
        let static_pool = world.pools.get(pool).filter(|p| p.is_static());
        let simulated = match static_pool {
            Some(p) => static_replacement(world, p)
                .map(|replacements| consolidation::Moves { replacements, ..Default::default() }),
            None => consolidation::simulate_all(world, &[node]).and_then(|moves| {
                if moving_off {
                    let replacements = without_offering_of(node, moves.replacements)?;
                    Ok(consolidation::Moves { replacements, ..moves })
                } else {
                    Ok(moves)
                }
            }),
        };
        match simulated {
            Ok(moves) => {
                let plan = moves.plan(vec![node.name.clone()], node.price.unwrap_or(0.0), 0.0);
                return Some(Command { method: Method::Drift, plan, scores: vec![] });
            }
            Err(why) => {
                pass.blocked.insert(node.name.clone(), why);
            }
        }
    }
    None
}

/// The replacements of a spot node EC2 recommended moving off (`REBALANCE_REPLACEMENT`), kept out
/// of the node's own spot offering: a replacement that may launch as spot in the node's zone loses
/// the node's instance type. Why not, when no type is left.
fn without_offering_of(node: &StateNode, replacements: Vec<NewNodeClaim>) -> Result<Vec<NewNodeClaim>, Why> {
    let (Some(instance_type), Some(zone)) =
        (node.labels.get(LABEL_INSTANCE_TYPE), node.labels.get(LABEL_TOPOLOGY_ZONE))
    else {
        return Ok(replacements);
    };
    if node.capacity_type() != Some(CAPACITY_TYPE_SPOT) {
        return Ok(replacements);
    }
    let allows =
        |r: &NewNodeClaim, key: &str, value: &str| r.requirements.get(key).is_none_or(|q| q.has(value));
    replacements
        .into_iter()
        .map(|mut r| {
            if !(allows(&r, LABEL_CAPACITY_TYPE, CAPACITY_TYPE_SPOT) && allows(&r, LABEL_TOPOLOGY_ZONE, zone)) {
                return Ok(r);
            }
            let others: Vec<_> =
                r.instance_type_options.iter().filter(|t| &t.name != instance_type).cloned().collect();
            if others.is_empty() {
                return Err(Why::new(
                    Code::NoOtherOffering,
                    format!("No offering to move to other than the recommended one (spot {instance_type} in {zone})"),
                ));
            }
            consolidation::set_types(&mut r, others);
            Ok(r)
        })
        .collect()
}

/// Why a validated command may not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// A candidate is no longer one.
    Churn(String),
    /// The budgets no longer allow it.
    Budget(String),
    /// The new simulation disagrees.
    Scheduling(String),
}

impl Rejection {
    /// The `reason` of a rejection, as events spell it.
    pub fn label(&self) -> &'static str {
        match self {
            Rejection::Churn(_) => "churn",
            Rejection::Budget(_) => "budget",
            Rejection::Scheduling(_) => "scheduling",
        }
    }

    /// What changed.
    pub fn detail(&self) -> &str {
        match self {
            Rejection::Churn(d) | Rejection::Budget(d) | Rejection::Scheduling(d) => d,
        }
    }
}

/// Drift alone: the pass run while another decision waits for its validation (whose nodes the
/// caller puts in `in_flight`, and counts as disrupting in the snapshot).
pub fn decide_drift(world: &World<'_>, in_flight: &HashSet<String>) -> Pass {
    let mut pass = Pass::default();
    pass.command = drift(world, in_flight, &mut pass);
    pass
}

/// What validation made of a command.
#[derive(Clone, Debug)]
pub struct Validated {
    /// The command to run: the one validated, or, where a part may go on without the rest, the
    /// part still valid.
    pub command: Command,
    /// The candidates left out, and why.
    pub dropped: Vec<(String, Rejection)>,
}

/// Checks `command` again on a fresh snapshot (`world`): every candidate still one (and still
/// empty for emptiness), the budgets still allow them, and a new simulation makes the same
/// decision with the same replacement types.
///
/// Emptiness keeps the candidates still valid, as upstream's does, within the budgets taken in
/// the command's order. So do deletions by multi-node consolidation outside Balanced pools (a
/// choice of this implementation; upstream abandons the whole command): the part still valid is
/// simulated again on its own and goes ahead if its pods still fit on the nodes that stay. At
/// 2,000 nodes a command of 200 is otherwise abandoned whenever one of its nodes was nominated
/// for a pod evicted by the command before it. Any other command is all or nothing.
pub fn validate(
    world: &World<'_>,
    command: &Command,
    in_flight: &HashSet<String>,
) -> Result<Validated, Rejection> {
    let mut scratch = Pass::default();
    let candidates = candidates(world, in_flight, &mut scratch);
    let empty_only = command.method == Method::Emptiness;
    let partial = empty_only
        || (command.method == Method::MultiNode
            && command.plan.decision == consolidation::Decision::Delete
            && command.scores.is_empty());
    let counts = budgets::pool_nodes(world.nodes);
    let budget = budgets::budgets(world.pools.values(), &counts, command.reason(), world.now);
    let mut remaining: BTreeMap<&str, usize> =
        budget.iter().map(|(p, b)| (p.as_str(), b.remaining)).collect();
    let mut wanted: BTreeMap<&str, usize> = BTreeMap::new();
    for node in candidates.iter().filter(|n| command.plan.candidates.contains(&n.name)) {
        *wanted.entry(node.nodepool().unwrap_or_default()).or_default() += 1;
    }
    let mut chosen: Vec<&StateNode> = Vec::new();
    let mut dropped: Vec<(String, Rejection)> = Vec::new();
    for name in &command.plan.candidates {
        let problem = match candidates.iter().find(|n| &n.name == name) {
            None => {
                let why = scratch
                    .blocked
                    .get(name)
                    .map(|b| b.message.clone())
                    .unwrap_or_else(|| "gone".to_string());
                Rejection::Churn(format!("{name}: {why}"))
            }
            Some(node) => {
                let pool_name = node.nodepool().unwrap_or_default();
                let consolidatable = world
                    .pools
                    .get(pool_name)
                    .and_then(|p| emptiness::consolidatable_at(node, p))
                    .is_some_and(|at| at <= world.now);
                let left = remaining.entry(pool_name).or_default();
                if !consolidatable {
                    Rejection::Churn(format!("{}: no longer consolidatable", node.name))
                } else if empty_only && !emptiness::is_empty(node) {
                    Rejection::Churn(format!("{}: no longer empty", node.name))
                } else if *left == 0 {
                    let allowed = budget.get(pool_name).map(|b| b.remaining).unwrap_or(0);
                    let needed = wanted.get(pool_name).copied().unwrap_or(0);
                    Rejection::Budget(format!("nodepool {pool_name} allows {allowed} more, {needed} needed"))
                } else {
                    *left -= 1;
                    chosen.push(node);
                    continue;
                }
            }
        };
        if !partial {
            return Err(problem);
        }
        dropped.push((name.clone(), problem));
    }
    if chosen.is_empty() {
        return Err(dropped
            .into_iter()
            .next()
            .map(|(_, rejection)| rejection)
            .unwrap_or_else(|| Rejection::Churn("the command has no candidate".to_string())));
    }
    let kept = |plan: Plan| Command { plan, ..command.clone() };
    if empty_only {
        let plan = if dropped.is_empty() {
            command.plan.clone()
        } else {
            let price: f64 = chosen.iter().map(|c| c.price.unwrap_or(0.0)).sum();
            let names = chosen.iter().map(|c| c.name.clone()).collect();
            consolidation::Moves::default().plan(names, price, price)
        };
        return Ok(Validated { command: kept(plan), dropped });
    }
    let fresh = consolidation::evaluate(world, &chosen, command.method == Method::SingleNode)
        .map_err(|why| Rejection::Scheduling(why.message))?;
    if fresh.decision != command.plan.decision {
        return Err(Rejection::Scheduling(format!(
            "the decision changed from {} to {}",
            command.plan.decision.as_str(),
            fresh.decision.as_str()
        )));
    }
    let fresh_types: HashSet<String> = fresh.replacement_types().into_iter().collect();
    if let Some(missing) = command.plan.replacement_types().into_iter().find(|t| !fresh_types.contains(t)) {
        return Err(Rejection::Scheduling(format!("instance type {missing} is no longer a cheaper option")));
    }
    let plan = if dropped.is_empty() { command.plan.clone() } else { fresh };
    Ok(Validated { command: kept(plan), dropped })
}

/// Records are made from passes.
impl Record {
    /// The record of `pass` over `nodes` at `at`; `in_flight` are nodes of commands under way and
    /// `command` describes the pass's command.
    pub fn of(
        pass: &Pass,
        nodes: &[StateNode],
        in_flight: &HashSet<String>,
        at: Timestamp,
        command: Option<String>,
    ) -> Self {
        let chosen: HashSet<&str> =
            pass.command.iter().flat_map(|c| c.plan.candidates.iter().map(String::as_str)).collect();
        let mut out = BTreeMap::new();
        for node in nodes.iter().filter(|n| n.managed && n.claim.is_some()) {
            let (outcome, why) = if chosen.contains(node.name.as_str()) {
                let reason = pass.command.as_ref().map(|c| c.reason().as_str()).unwrap_or_default();
                (Outcome::Disrupting, Why::new(Code::Disrupting, format!("Disrupting node ({reason})")))
            } else if in_flight.contains(&node.name) {
                (Outcome::Disrupting, Why::new(Code::InProgress, "A disruption command is under way"))
            } else if let Some(blocked) = pass.blocked.get(&node.name) {
                (Outcome::Blocked, blocked.clone())
            } else if let Some(why) = pass.unconsolidatable.get(&node.name) {
                (Outcome::Unconsolidatable, why.clone())
            } else {
                (Outcome::Candidate, Why::new(Code::NotReached, "Candidate; not reached by this pass"))
            };
            out.insert(
                node.name.clone(),
                NodeDecision {
                    nodeclaim: node.claim_name().map(str::to_string),
                    nodepool: node.nodepool().map(str::to_string),
                    outcome,
                    code: why.code,
                    message: why.message,
                },
            );
        }
        Record { at: Some(at), command, nodes: out }
    }
}
