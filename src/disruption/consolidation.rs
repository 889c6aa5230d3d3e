//! Consolidation: whether a set of nodes can go, deleted outright or replaced by one cheaper
//! NodeClaim, as upstream decides it.
//!
//! The candidates' reschedulable pods (and the pending pods, so that consolidation never takes
//! room they need) are simulated onto the rest of the cluster with the one scheduler-input builder
//! ([`crate::state::input`]). Then:
//! - a pod of the candidates that fits nowhere, or that would only fit on a node not initialized
//!   yet, keeps them;
//! - no new NodeClaim needed: the candidates are **deleted**;
//! - more than one: they stay (consolidation never turns N nodes into more than one);
//! - one: they are **replaced** by it, keeping only the instance types whose worst launch price
//!   (the dearest available offering of the first tier the requirements allow: reserved, then
//!   spot, then on-demand) is below what the candidates cost together. A replacement that may be
//!   spot or on-demand is pinned to spot, so that a spot shortage never falls back to a dearer
//!   on-demand node. Spot candidates are replaced by spot only with the
//!   `SpotToSpotConsolidation` gate, and a single spot node only when at least 15 types are
//!   cheaper (the 15 cheapest are launched), so that spot capacity stays diverse.
//!
//! [`multi_node`] looks for the longest prefix of the candidates (ordered by price over disruption
//! cost, dearest first) that one command can remove; [`single_node`] tries one candidate at a
//! time. Both return why each node they looked at was not consolidated.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::apis::pod::Pod;
use k8s_openapi::jiff::Timestamp;

use crate::apis::NodePool;
use crate::apis::labels::{
    CAPACITY_TYPE_ON_DEMAND as ON_DEMAND, CAPACITY_TYPE_RESERVED as RESERVED, CAPACITY_TYPE_SPOT as SPOT,
    LABEL_CAPACITY_TYPE, LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_ZONE,
};
use crate::apis::nodepool::ConsolidationPolicy;
use crate::scheduling::{InstanceType, NewNodeClaim, Requirement, SchedulerOptions, schedule};
use crate::state::StateNode;
use crate::state::input::Base;
use crate::state::snapshot::Snapshot;

use super::emptiness::{consolidatable_at, is_empty, reschedule_cost};
use super::record::{Code, Why};

/// How many cheaper types a single spot node's spot replacement needs, and how many it launches.
pub const SPOT_TO_SPOT_MIN_TYPES: usize = 15;
/// Balanced consolidation approves a move whose savings share is at least its disruption share
/// over this.
pub const BALANCED_K: f64 = 2.0;

/// The cluster a consolidation decision looks at.
pub struct World<'a> {
    /// The snapshot, with the NodePools' instance types.
    pub snapshot: &'a Snapshot,
    /// Its StateNodes (nodes of commands under way count as marked for deletion).
    pub nodes: &'a [StateNode],
    /// What every simulation starts from (built once; each set of candidates weighed is a cheap
    /// scenario of it).
    pub base: Base<'a>,
    /// The `SpotToSpotConsolidation` feature gate.
    pub spot_to_spot: bool,
    /// The NodePools, by name.
    pub pools: &'a BTreeMap<String, Arc<NodePool>>,
    /// Now.
    pub now: Timestamp,
    /// NodeClaims a consolidation launched less than [`CHURN_GUARD`] ago: not consolidated again
    /// yet (emptiness still removes them).
    pub young: HashSet<String>,
}

/// What a [`World`] is made of besides the snapshot.
pub struct Setting<'a> {
    /// The snapshot's StateNodes.
    pub nodes: &'a [StateNode],
    /// Pods waiting for capacity (consolidation never takes room they need).
    pub pending: Vec<Arc<Pod>>,
    /// Scheduler tunables.
    pub options: SchedulerOptions,
    /// The `SpotToSpotConsolidation` feature gate.
    pub spot_to_spot: bool,
    /// The NodePools, by name.
    pub pools: &'a BTreeMap<String, Arc<NodePool>>,
    /// Now.
    pub now: Timestamp,
    /// See [`World::young`].
    pub young: HashSet<String>,
}

impl<'a> World<'a> {
    /// The world of `snapshot`, its simulations' base built once.
    pub fn new(snapshot: &'a Snapshot, setting: Setting<'a>) -> Self {
        World {
            snapshot,
            nodes: setting.nodes,
            base: Base::new(snapshot, setting.nodes, setting.pending, setting.options),
            spot_to_spot: setting.spot_to_spot,
            pools: setting.pools,
            now: setting.now,
            young: setting.young,
        }
    }
}

/// How long a NodeClaim launched by consolidation is left alone by consolidation.
pub const CHURN_GUARD: std::time::Duration = std::time::Duration::from_secs(60);
/// Why a node [`CHURN_GUARD`] protects is not consolidated.
pub const YOUNG: &str = "Node was launched by consolidation less than a minute ago";

/// Delete the candidates, or replace them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Remove them; their pods fit on the rest of the cluster.
    Delete,
    /// Launch one cheaper NodeClaim first.
    Replace,
}

impl Decision {
    /// As metrics and logs spell it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Decision::Delete => "delete",
            Decision::Replace => "replace",
        }
    }
}

/// A way to remove some nodes.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Names of the StateNodes to remove.
    pub candidates: Vec<String>,
    /// Delete or replace.
    pub decision: Decision,
    /// The replacements, for [`Decision::Replace`] (consolidation makes one at most; drift as
    /// many as the pods need).
    pub replacements: Vec<NewNodeClaim>,
    /// What the candidates cost per hour.
    pub candidate_price: f64,
    /// Hourly savings at the replacement's cheapest offering.
    pub savings: f64,
    /// Pods (`namespace/name`) that go to a remaining node leaving a preference unmet (see
    /// [`Moves`]).
    pub preferences_broken: Vec<String>,
}

impl Plan {
    /// The instance types of the (first) replacement.
    pub fn replacement_types(&self) -> Vec<String> {
        self.replacements.first().map(|r| r.instance_type_names.to_vec()).unwrap_or_default()
    }
}

/// Orders candidates as upstream: dearest per unit of disruption first.
pub fn sort_candidates(candidates: &mut [&StateNode]) {
    let key = |n: &StateNode| n.price.unwrap_or(0.0) / reschedule_cost(n);
    candidates.sort_by(|a, b| key(b).total_cmp(&key(a)).then_with(|| a.name.cmp(&b.name)));
}

/// A candidate left to emptiness.
pub const EMPTY: &str = "Node is empty";
/// A candidate whose NodePool's budget allows no more disruptions now.
pub const NO_BUDGET: &str = "No allowed disruptions due to blocking budget";
/// A candidate whose `consolidateAfter` has not passed.
pub const NOT_CONSOLIDATABLE_YET: &str = "Node is not consolidatable yet (consolidateAfter has not passed)";

/// Whether a reason becomes an `Unconsolidatable` event (upstream reports neither emptiness, nor
/// a pending `consolidateAfter`, nor a budget that allows nothing more that way, nor a node of a
/// static NodePool).
pub fn is_reported(why: &Why) -> bool {
    !matches!(
        why.code,
        Code::Empty | Code::ConsolidateAfter | Code::Budget | Code::NotReached | Code::StaticNodePool
    )
}

/// Why a candidate cannot be consolidated by a non-empty method whatever the simulation says
/// (upstream's filter-time `Unconsolidatable` messages); `None` if it may be.
pub fn filter(node: &StateNode, pool: &NodePool, now: Timestamp) -> Option<Why> {
    let pool_name = pool.metadata.name.as_deref().unwrap_or_default();
    for label in [LABEL_INSTANCE_TYPE, LABEL_CAPACITY_TYPE, LABEL_TOPOLOGY_ZONE] {
        if !node.labels.contains_key(label) {
            return Some(Why::new(Code::MissingLabel, format!("Node does not have label {label:?}")));
        }
    }
    if pool.spec.disruption.consolidate_after.trim() == "Never" {
        return Some(Why::new(
            Code::ConsolidationDisabled,
            format!("NodePool {pool_name:?} has consolidation disabled"),
        ));
    }
    if is_empty(node) {
        // Emptiness' business.
        return Some(Why::new(Code::Empty, EMPTY));
    }
    if pool.spec.disruption.consolidation_policy == ConsolidationPolicy::WhenEmpty {
        return Some(Why::new(
            Code::WhenEmptyPolicy,
            format!("NodePool {pool_name:?} has consolidation policy WhenEmpty, but node is not empty"),
        ));
    }
    match consolidatable_at(node, pool) {
        Some(at) if at <= now => None,
        _ => Some(Why::new(Code::ConsolidateAfter, NOT_CONSOLIDATABLE_YET)),
    }
}

/// Which tier a replacement launches from, and the dearest price there, for `it` under `reqs`.
fn worst_launch_price(it: &InstanceType, reqs: &crate::scheduling::Requirements) -> Option<f64> {
    for tier in [RESERVED, SPOT, ON_DEMAND] {
        let worst = it
            .compatible_offerings(reqs)
            .filter(|o| o.capacity_type == tier)
            .map(|o| o.price)
            .max_by(f64::total_cmp);
        if worst.is_some() {
            return worst;
        }
    }
    None
}

fn allows(claim: &NewNodeClaim, capacity_type: &str) -> bool {
    claim.requirements.get(LABEL_CAPACITY_TYPE).is_none_or(|r| r.has(capacity_type))
}

/// Narrows `claim` to `types`.
pub(crate) fn set_types(claim: &mut NewNodeClaim, types: Vec<Arc<InstanceType>>) {
    claim.instance_type_names = types.iter().map(|t| t.name.clone()).collect();
    claim.requirements.remove(LABEL_INSTANCE_TYPE);
    claim
        .requirements
        .add(LABEL_INSTANCE_TYPE, Requirement::in_values(claim.instance_type_names.iter().cloned()));
    claim.instance_type_options = types.into();
}

/// Simulates the cluster without `candidates`: the one NodeClaim their pods need (`None` if none)
/// and the pods left with a preference unmet (see [`Moves`]), or why they cannot go.
pub fn simulate(
    world: &World<'_>,
    candidates: &[&StateNode],
) -> Result<(Option<NewNodeClaim>, Vec<String>), Why> {
    let Moves { mut replacements, preferences_broken } = simulate_all(world, candidates)?;
    match replacements.len() {
        0 | 1 => Ok((replacements.pop(), preferences_broken)),
        n => Err(Why::new(
            Code::MoreThanOneReplacement,
            format!("Can't remove without creating {n} candidates"),
        )),
    }
}

/// Where the pods of some candidates would go.
#[derive(Clone, Debug, Default)]
pub struct Moves {
    /// The NodeClaims they need (none, one or more).
    pub replacements: Vec<NewNodeClaim>,
    /// Those (`namespace/name`) that would land on a remaining node with a preference left
    /// unmet: kube-scheduler would place them there, where honouring the preference needed new
    /// capacity (`CONSOLIDATION_PREFERENCE_POLICY=Soft`).
    pub preferences_broken: Vec<String>,
}

impl Moves {
    /// A plan removing `candidates` (costing `candidate_price`) with these moves, saving
    /// `savings`.
    pub fn plan(self, candidates: Vec<String>, candidate_price: f64, savings: f64) -> Plan {
        let decision = if self.replacements.is_empty() { Decision::Delete } else { Decision::Replace };
        Plan {
            candidates,
            decision,
            replacements: self.replacements,
            candidate_price,
            savings,
            preferences_broken: self.preferences_broken,
        }
    }
}

/// Simulates the cluster without `candidates`: where their pods go, or why they cannot go.
pub fn simulate_all(world: &World<'_>, candidates: &[&StateNode]) -> Result<Moves, Why> {
    let without: HashSet<String> = candidates.iter().map(|c| c.name.clone()).collect();
    let pending_count = world.base.pending_count();
    let (pdbs, now) = (&world.snapshot.pdbs, world.now);
    let input = world.base.scenario_keeping(&without, &|pod| super::candidates::moves(pod, pdbs, now)).input;
    let results = schedule(&input);
    let displaced = |index: usize| index >= pending_count;
    let unfit: Vec<String> = results
        .errors
        .iter()
        .filter(|e| displaced(e.pod.index))
        .map(|e| format!("{} => {e}", e.pod))
        .collect();
    if !unfit.is_empty() {
        let shown = unfit.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = if unfit.len() > 5 { format!(" and {} other(s)", unfit.len() - 5) } else { String::new() };
        return Err(Why::new(
            Code::PodsWouldNotSchedule,
            format!("Not all pods would schedule, {shown}{more}"),
        ));
    }
    // A candidate's pod may not count on a node that is not initialized yet. The pods of nodes
    // already going away may (as upstream): their move was decided before, and the node they
    // land on is most likely the replacement launched for them.
    let going = world.base.going_pods();
    let candidate_pod = |index: usize| displaced(index) && !going.contains(&index);
    let uninitialized: HashSet<&str> =
        input.existing_nodes.iter().filter(|n| !n.initialized).map(|n| n.name.as_str()).collect();
    for placement in &results.existing_placements {
        if uninitialized.contains(placement.node.as_str())
            && placement.pods.iter().any(|p| candidate_pod(p.index))
        {
            return Err(Why::new(
                Code::UninitializedTarget,
                format!("Would schedule against uninitialized node {}", placement.node),
            ));
        }
    }
    let preferences_broken = results
        .preferences_broken
        .iter()
        .filter(|p| candidate_pod(p.index))
        .map(|p| format!("{}/{}", p.namespace, p.name))
        .collect();
    let replacements =
        results.new_node_claims.into_iter().filter(|c| c.pods.iter().any(|p| displaced(p.index))).collect();
    Ok(Moves { replacements, preferences_broken })
}

/// Whether `candidates` can be removed together now, and how; else why not (the text of an
/// `Unconsolidatable` event). `single` applies the one-node spot-to-spot rule.
pub fn evaluate(world: &World<'_>, candidates: &[&StateNode], single: bool) -> Result<Plan, Why> {
    let candidate_price: f64 = candidates.iter().map(|c| c.price.unwrap_or(0.0)).sum();
    let names = candidates.iter().map(|c| c.name.clone()).collect();
    let (replacement, preferences_broken) = simulate(world, candidates)?;
    let Some(mut replacement) = replacement else {
        return Ok(Moves { replacements: vec![], preferences_broken }.plan(
            names,
            candidate_price,
            candidate_price,
        ));
    };
    let all_spot = candidates.iter().all(|c| c.capacity_type() == Some(SPOT));
    let spot_to_spot = all_spot && allows(&replacement, SPOT);
    if spot_to_spot {
        if !world.spot_to_spot {
            return Err(Why::new(
                Code::SpotToSpotDisabled,
                "SpotToSpotConsolidation is disabled, can't replace a spot node with a spot node",
            ));
        }
        replacement.requirements.add(LABEL_CAPACITY_TYPE, Requirement::in_values([SPOT]));
    }
    let mut cheaper: Vec<(f64, Arc<InstanceType>)> = replacement
        .instance_type_options
        .iter()
        .filter_map(|it| Some((worst_launch_price(it, &replacement.requirements)?, Arc::clone(it))))
        .filter(|(price, _)| *price < candidate_price)
        .collect();
    if candidates.len() > 1 {
        // Replacing nodes with a node of the same type only reshuffles: such an option must be
        // cheaper than the cheapest candidate of that type.
        let same_type_cap = candidates
            .iter()
            .filter(|c| cheaper.iter().any(|(_, it)| Some(it.name.as_str()) == c.instance_type()))
            .map(|c| c.price.unwrap_or(0.0))
            .min_by(f64::total_cmp);
        if let Some(cap) = same_type_cap {
            cheaper.retain(|(price, _)| *price < cap);
        }
    }
    cheaper.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.name.cmp(&b.1.name)));
    if cheaper.is_empty() {
        return Err(Why::new(Code::NoCheaperReplacement, "Can't replace with a cheaper node"));
    }
    if let Some(min_values) = replacement.requirements.get(LABEL_INSTANCE_TYPE).and_then(|r| r.min_values())
        && cheaper.len() < min_values
    {
        return Err(Why::new(
            Code::MinValues,
            format!(
                "Filtering by price: minValues requirement is not met for {LABEL_INSTANCE_TYPE} ({} cheaper types, {min_values} needed)",
                cheaper.len()
            ),
        ));
    }
    if spot_to_spot && single {
        if cheaper.len() < SPOT_TO_SPOT_MIN_TYPES {
            return Err(Why::new(
                Code::SpotToSpotOptions,
                format!(
                    "SpotToSpotConsolidation requires {SPOT_TO_SPOT_MIN_TYPES} cheaper instance type options than the current candidate to consolidate, got {}",
                    cheaper.len()
                ),
            ));
        }
        let keep = replacement
            .requirements
            .get(LABEL_INSTANCE_TYPE)
            .and_then(|r| r.min_values())
            .unwrap_or(0)
            .max(SPOT_TO_SPOT_MIN_TYPES);
        cheaper.truncate(keep);
    }
    if !spot_to_spot && allows(&replacement, SPOT) && allows(&replacement, ON_DEMAND) {
        // Priced as spot: never fall back to a dearer on-demand node.
        replacement.requirements.add(LABEL_CAPACITY_TYPE, Requirement::in_values([SPOT]));
    }
    set_types(&mut replacement, cheaper.into_iter().map(|(_, it)| it).collect());
    let cheapest = replacement
        .instance_type_options
        .iter()
        .filter_map(|it| it.cheapest_price(&replacement.requirements))
        .min_by(f64::total_cmp)
        .unwrap_or(candidate_price);
    Ok(Moves { replacements: vec![replacement], preferences_broken }.plan(
        names,
        candidate_price,
        candidate_price - cheapest,
    ))
}

/// What a Balanced NodePool weighs a move against.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolTotals {
    /// What its nodes cost per hour.
    pub cost: f64,
    /// The disruption cost of all its nodes.
    pub disruption: f64,
}

/// Each NodePool's totals, for Balanced scoring.
pub fn pool_totals(nodes: &[StateNode]) -> BTreeMap<String, PoolTotals> {
    let mut out: BTreeMap<String, PoolTotals> = BTreeMap::new();
    for node in nodes.iter().filter(|n| n.managed && n.initialized) {
        let Some(pool) = node.nodepool() else { continue };
        let totals = out.entry(pool.to_string()).or_default();
        totals.cost += node.price.unwrap_or(0.0);
        totals.disruption += reschedule_cost(node);
    }
    out
}

/// A Balanced NodePool's verdict on a move.
#[derive(Clone, Debug, PartialEq)]
pub struct Score {
    /// The NodePool.
    pub nodepool: String,
    /// Its share of the savings over its share of the disruption.
    pub score: f64,
    /// Savings as a share of the pool's cost, in percent.
    pub savings_percent: f64,
    /// Disruption as a share of the pool's, in percent.
    pub disruption_percent: f64,
}

impl Score {
    /// Whether the move is worth it.
    pub fn approves(&self) -> bool {
        self.score >= 1.0 / BALANCED_K
    }
}

/// The scores of the Balanced NodePools `plan` touches (savings split by the candidates' price
/// share); a move is made only if every one approves.
pub fn balanced_scores(
    plan: &Plan,
    candidates: &[&StateNode],
    pools: &BTreeMap<String, Arc<NodePool>>,
    totals: &BTreeMap<String, PoolTotals>,
) -> Vec<Score> {
    let mut by_pool: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
    for c in candidates {
        let Some(pool) = c.nodepool() else { continue };
        let entry = by_pool.entry(pool).or_default();
        entry.0 += c.price.unwrap_or(0.0);
        entry.1 += reschedule_cost(c);
    }
    let mut scores = Vec::new();
    for (pool, (price, disruption)) in by_pool {
        let balanced = pools
            .get(pool)
            .is_some_and(|p| p.spec.disruption.consolidation_policy == ConsolidationPolicy::Balanced);
        if !balanced {
            continue;
        }
        let share = if plan.candidate_price > 0.0 { price / plan.candidate_price } else { 0.0 };
        let savings = plan.savings * share;
        let t = totals.get(pool).copied().unwrap_or_default();
        let cost = if t.cost > 0.0 { t.cost } else { plan.candidate_price };
        let (savings_part, disruption_part) = if cost > 0.0 && t.disruption > 0.0 {
            (savings / cost, disruption / t.disruption)
        } else {
            (0.0, 0.0)
        };
        let score =
            if savings <= 0.0 || disruption_part <= 0.0 { 0.0 } else { savings_part / disruption_part };
        scores.push(Score {
            nodepool: pool.to_string(),
            score,
            savings_percent: savings_part * 100.0,
            disruption_percent: disruption_part * 100.0,
        });
    }
    scores
}

/// Why the nodes a method looked at were not consolidated, by StateNode name.
pub type Reasons = BTreeMap<String, Why>;

/// Multi-node consolidation: of `candidates` (sorted, budget-filtered, at least two), the longest
/// prefix that one command removes (binary search; every candidate is considered). `approve`
/// vets a plan (Balanced scoring).
pub fn multi_node(
    world: &World<'_>,
    candidates: &[&StateNode],
    approve: &dyn Fn(&Plan, &[&StateNode]) -> bool,
) -> Option<Plan> {
    if candidates.len() < 2 {
        return None;
    }
    let (mut lo, mut hi) = (1usize, candidates.len() - 1);
    let mut best = None;
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        let prefix = &candidates[..=mid];
        match evaluate(world, prefix, false) {
            Ok(plan) if approve(&plan, prefix) => {
                best = Some(plan);
                lo = mid + 1;
            }
            _ => hi = mid - 1,
        }
    }
    best
}

/// Single-node consolidation: the first of `candidates` (sorted) whose NodePool's budget allows
/// one more (`budgets`, by pool) and that can be removed alone; and why the others it looked at
/// could not.
pub fn single_node(
    world: &World<'_>,
    candidates: &[&StateNode],
    budgets: &BTreeMap<String, usize>,
    approve: &dyn Fn(&Plan, &[&StateNode]) -> bool,
) -> (Option<Plan>, Reasons) {
    let mut reasons = Reasons::new();
    for candidate in candidates {
        let pool = candidate.nodepool().unwrap_or_default();
        if budgets.get(pool).copied().unwrap_or(0) == 0 {
            reasons.insert(candidate.name.clone(), Why::new(Code::Budget, NO_BUDGET));
            continue;
        }
        match evaluate(world, std::slice::from_ref(candidate), true) {
            Ok(plan) if approve(&plan, std::slice::from_ref(candidate)) => return (Some(plan), reasons),
            Ok(_) => {
                reasons.insert(
                    candidate.name.clone(),
                    Why::new(Code::BalancedScore, "Savings do not outweigh the disruption (Balanced)"),
                );
            }
            Err(why) => {
                reasons.insert(candidate.name.clone(), why);
            }
        }
    }
    (None, reasons)
}
