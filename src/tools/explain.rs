//! `karpenter explain`: why a pod is where it is (or nowhere), and why a node is or is not being
//! disrupted, from a snapshot of the cluster and the controller's own pure decisions.
//!
//! - [`explain_pod`] simulates the provisioner once for every pending pod (where this one would
//!   go, and at what price), then once per NodePool with that NodePool alone and the existing
//!   nodes closed to the pod (they still count for topology and limits): the NodePool's own
//!   verdict for the pod, with the scheduler's reason when it cannot launch for it.
//! - [`explain_node`] applies the disruption pass's candidate checks to the node, then the
//!   method that concerns it (drift, emptiness, or consolidation of that one node, simulated
//!   as the controller would), the NodePool's budgets, and reports drift and expiry.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use crate::apis::pod::Pod;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::apis::common::ConditionStatus;
use crate::apis::nodeclaim::conditions::DRIFTED;
use crate::apis::nodepool::DisruptionReason;
use crate::apis::{Taint, TaintEffect};
use crate::controllers::nodeclaim::expiration::expires_at;
use crate::disruption::budgets;
use crate::disruption::candidates;
use crate::disruption::consolidation;
use crate::disruption::decide::{self, Inputs};
use crate::disruption::emptiness;
use crate::disruption::record::{Code, Why};
use crate::scheduling::{SchedulerOptions, SchedulingResults, schedule};
use crate::state::input::Base;
use crate::state::snapshot::Snapshot;
use crate::state::statenode::state_nodes;
use crate::state::{StateNode, pods};
use crate::tools::simulate::report::{NodeClaimReport, claim_report, push_table, round_price};

use super::{ToolError, price};

/// Where a pod is, or would go.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Placement {
    /// Already bound to a node.
    #[serde(rename_all = "camelCase")]
    Bound {
        /// The node.
        node: String,
    },
    /// Fits on an existing node (or a NodeClaim not registered yet).
    #[serde(rename_all = "camelCase")]
    ExistingNode {
        /// The node, or the NodeClaim.
        node: String,
    },
    /// A new NodeClaim would be launched for it.
    #[serde(rename_all = "camelCase")]
    NewNodeClaim {
        /// The NodeClaim.
        node_claim: NodeClaimReport,
    },
    /// It fits nowhere.
    #[serde(rename_all = "camelCase")]
    Unschedulable {
        /// The scheduler's reasons.
        reasons: Vec<String>,
    },
    /// Karpenter does not place it.
    #[serde(rename_all = "camelCase")]
    NotProvisionable {
        /// Why.
        reason: String,
    },
}

/// One NodePool's verdict for a pod.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolFit {
    /// The NodePool.
    pub nodepool: String,
    /// Whether it can launch a node for the pod.
    pub fits: bool,
    /// Why not (the failing requirement, taint, limit, topology or volume constraint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The NodeClaim it would launch for the pod alone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_claim: Option<NodeClaimReport>,
}

/// `karpenter explain pod`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodExplanation {
    /// `namespace/name`.
    pub pod: String,
    /// Its phase.
    pub phase: String,
    /// What kube-scheduler last said, when it could not place the pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler_message: Option<String>,
    /// Where the provisioner, simulating every pending pod now, puts it.
    pub placement: Placement,
    /// Each NodePool's verdict, as if the pod were pending and the NodePool alone.
    pub nodepools: Vec<PoolFit>,
}

/// A taint no pod tolerates unless it tolerates everything: closes the existing nodes to the pod
/// in the per-NodePool simulations without removing them (their pods still count).
const CLOSED: &str = "explain.karpenter.sh/closed";

fn scheduler_message(pod: &Pod) -> Option<String> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let c = conditions.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
    c.message.clone().filter(|m| !m.is_empty())
}

fn placement_of(key: &str, results: &SchedulingResults) -> Option<Placement> {
    if let Some(claim) = results.new_node_claims.iter().find(|c| c.pods.iter().any(|p| p.to_string() == key))
    {
        return Some(Placement::NewNodeClaim { node_claim: claim_report(claim) });
    }
    if let Some(p) = results.existing_placements.iter().find(|p| p.pods.iter().any(|p| p.to_string() == key))
    {
        return Some(Placement::ExistingNode { node: p.node.clone() });
    }
    let error = results.errors.iter().find(|e| e.pod.to_string() == key)?;
    let reasons = match &error.reason {
        Some(r) => vec![r.clone()],
        None => error.nodepools.iter().map(|(np, r)| format!("nodepool {np:?}: {r}")).collect(),
    };
    Some(Placement::Unschedulable { reasons })
}

/// Why `pod` of `snapshot` (with the NodePools' instance types) is where it is, and what each
/// NodePool makes of it.
pub fn explain_pod(snapshot: &Snapshot, pod: &Arc<Pod>, options: &SchedulerOptions) -> PodExplanation {
    let key = pods::key(pod);
    let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "Unknown".into());
    let nodes = state_nodes(snapshot);
    // The pod as the provisioner would see it if it were pending now.
    let mut pending = (**pod).clone();
    if let Some(spec) = pending.spec.as_mut() {
        spec.node_name = None;
    }
    let pending = Arc::new(pending);

    let placement = if let Some(node) = pods::node_name(pod) {
        Placement::Bound { node: node.to_string() }
    } else if pods::is_terminal(pod) {
        Placement::NotProvisionable { reason: format!("the pod has finished ({phase})") }
    } else if pods::is_terminating(pod) {
        Placement::NotProvisionable { reason: "the pod is being deleted".into() }
    } else if pods::is_owned_by_daemonset(pod) || pods::is_mirror(pod) {
        Placement::NotProvisionable {
            reason: "DaemonSet and static pods are placed on every node, not provisioned for".into(),
        }
    } else {
        let mut all = snapshot.provisionable_pods();
        if !all.iter().any(|p| pods::key(p) == key) {
            all.push(Arc::clone(&pending));
        }
        let base = Base::new(snapshot, &nodes, all, options.clone());
        let results = schedule(&base.scenario(&HashSet::new()).input);
        placement_of(&key, &results).unwrap_or_else(|| Placement::Unschedulable { reasons: vec![] })
    };

    let base = Base::new(snapshot, &nodes, vec![Arc::clone(&pending)], options.clone());
    let built = base.scenario(&HashSet::new());
    let mut fits: Vec<PoolFit> = built
        .skipped_pools
        .iter()
        .map(|(np, why)| PoolFit {
            nodepool: np.clone(),
            fits: false,
            reason: Some(why.clone()),
            node_claim: None,
        })
        .collect();
    let closed = Taint { key: CLOSED.into(), value: None, effect: TaintEffect::NoSchedule, time_added: None };
    let mut alone = built.input.clone();
    // The pod alone: not the pods of nodes going away that the builder adds after it.
    alone.pods.truncate(1);
    let uid = pod.metadata.uid.as_deref();
    alone.existing_nodes = built
        .input
        .existing_nodes
        .iter()
        .map(|n| {
            let mut n = (**n).clone();
            n.taints.push(closed.clone());
            // A running pod is taken off its node, so that it does not count against itself.
            if let Some(i) = n.pods.iter().position(|p| uid.is_some() && p.metadata.uid.as_deref() == uid) {
                let own = n.pods.remove(i);
                n.requested = n.requested.sub_floored(&crate::scheduling::resources::pod_requests(&own));
            }
            Arc::new(n)
        })
        .collect();
    for pool in &built.input.nodepools {
        let mut input = alone.clone();
        input.nodepools = vec![pool.clone()];
        let results = schedule(&input);
        let fit = match placement_of(&key, &results) {
            Some(Placement::NewNodeClaim { node_claim }) => PoolFit {
                nodepool: pool.name.clone(),
                fits: true,
                reason: None,
                node_claim: Some(node_claim),
            },
            Some(Placement::ExistingNode { node }) => PoolFit {
                nodepool: pool.name.clone(),
                fits: true,
                reason: Some(format!("the pod tolerates every taint and fits on existing node {node}")),
                node_claim: None,
            },
            Some(Placement::Unschedulable { reasons }) => {
                let reason = results
                    .errors
                    .iter()
                    .find(|e| e.pod.to_string() == key)
                    .and_then(|e| e.nodepools.iter().find(|(np, _)| np == &pool.name).map(|(_, r)| r.clone()))
                    .or_else(|| reasons.first().cloned());
                PoolFit { nodepool: pool.name.clone(), fits: false, reason, node_claim: None }
            }
            _ => PoolFit { nodepool: pool.name.clone(), fits: false, reason: None, node_claim: None },
        };
        fits.push(fit);
    }
    fits.sort_by(|a, b| a.nodepool.cmp(&b.nodepool));
    PodExplanation { pod: key, phase, scheduler_message: scheduler_message(pod), placement, nodepools: fits }
}

/// Finds `namespace/name` in the snapshot.
pub fn find_pod(snapshot: &Snapshot, namespace: &str, name: &str) -> Result<Arc<Pod>, ToolError> {
    snapshot
        .pods
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace) && p.metadata.name.as_deref() == Some(name)
        })
        .cloned()
        .ok_or_else(|| ToolError::NotFound { kind: "pod", name: format!("{namespace}/{name}") })
}

impl PodExplanation {
    /// As text.
    pub fn to_table(&self) -> String {
        let mut out = format!("Pod:        {}\nPhase:      {}\n", self.pod, self.phase);
        if let Some(m) = &self.scheduler_message {
            out.push_str(&format!("Scheduler:  {m}\n"));
        }
        let placement = match &self.placement {
            Placement::Bound { node } => format!("running on node {node}"),
            Placement::ExistingNode { node } => format!("fits on existing node {node}"),
            Placement::NewNodeClaim { node_claim: c } => format!(
                "a new NodeClaim of NodePool {}: {} ({}, {}) at {}{}",
                c.node_pool,
                c.instance_type,
                c.capacity_type,
                c.zone,
                price(Some(c.price_per_hour)),
                overlaid_by(&c.price_overlays)
            ),
            Placement::Unschedulable { reasons } if reasons.is_empty() => "fits nowhere".to_string(),
            // The NodePools' own verdicts below say why, unless one could launch for the pod
            // alone (then other pending pods took the room: the simulation's reasons say how).
            Placement::Unschedulable { .. }
                if !self.nodepools.is_empty() && !self.nodepools.iter().any(|f| f.fits) =>
            {
                "fits nowhere (each NodePool's reason below)".to_string()
            }
            Placement::Unschedulable { reasons } => format!("fits nowhere: {}", reasons.join("; ")),
            Placement::NotProvisionable { reason } => format!("not Karpenter's to place: {reason}"),
        };
        out.push_str(&format!("Placement:  {placement}\n\n"));
        if self.nodepools.is_empty() {
            out.push_str("No NodePools.\n");
            return out;
        }
        let mut rows =
            vec![["NODEPOOL", "FITS", "INSTANCE-TYPE", "$/H", "WHY NOT"].map(String::from).to_vec()];
        for f in &self.nodepools {
            let (it, p) = match &f.node_claim {
                Some(c) => (
                    format!("{} ({}, {})", c.instance_type, c.capacity_type, c.zone),
                    format!("{:.4}", c.price_per_hour),
                ),
                None => ("-".into(), "-".into()),
            };
            rows.push(vec![
                f.nodepool.clone(),
                if f.fits { "yes" } else { "no" }.into(),
                it,
                p,
                f.reason.clone().unwrap_or_default(),
            ]);
        }
        push_table(&mut out, &rows);
        out
    }
}

/// A NodePool's budget for one reason.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetReport {
    /// `Empty`, `Underutilized` or `Drifted`.
    pub reason: &'static str,
    /// How many nodes the budgets allow disrupting now (`None`: unlimited).
    pub allowed: Option<usize>,
    /// Nodes of the NodePool disrupting already.
    pub disrupting: usize,
    /// Why the budgets could not be read (nothing is allowed then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What a disruption of the node would do.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PlanReport {
    /// `delete` or `replace`.
    pub decision: &'static str,
    /// The replacements.
    pub replacements: Vec<NodeClaimReport>,
    /// What the node costs per hour.
    pub price_per_hour: f64,
    /// What the replacements cost per hour.
    pub replacement_price_per_hour: f64,
    /// Pods (`namespace/name`) the plan moves onto a remaining node with a preference left unmet.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preferences_broken: Vec<String>,
}

/// The node's drift.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriftReport {
    /// Whether the NodeClaim is `Drifted=True`.
    pub drifted: bool,
    /// The condition's reason (`NodePoolDrifted`, `AMIDrift`...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Since when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
}

/// The node's lifetime.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExpiryReport {
    /// `spec.expireAfter`.
    pub expire_after: String,
    /// When the NodeClaim expires (is deleted, forcefully).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// `spec.terminationGracePeriod`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_grace_period: Option<String>,
    /// The latest the node can live: expiry plus the grace period of its drain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gone_by: Option<Timestamp>,
    /// Why the above could not be computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// ` (priced by NodeOverlay a, b)` when overlays set a price; nothing otherwise.
fn overlaid_by(overlays: &[String]) -> String {
    if overlays.is_empty() {
        String::new()
    } else {
        format!(" (priced by NodeOverlay {})", overlays.join(", "))
    }
}

/// `karpenter explain node` / `nodeclaim`.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeExplanation {
    /// The Node, once registered.
    pub node: Option<String>,
    /// Its NodeClaim.
    pub nodeclaim: Option<String>,
    /// Its NodePool.
    pub nodepool: Option<String>,
    /// Instance type, capacity type and zone.
    pub instance_type: Option<String>,
    /// `spot`, `on-demand`, `reserved`.
    pub capacity_type: Option<String>,
    /// The zone.
    pub zone: Option<String>,
    /// What it costs in full (its offering's list price and what comes with the node).
    pub price_per_hour: Option<f64>,
    /// Its offering's list price.
    pub list_price_per_hour: Option<f64>,
    /// Pods that would have to move.
    pub reschedulable_pods: usize,
    /// The CapacityBuffers (`namespace/name`) whose headroom it keeps, with their placeholders on
    /// it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<(String, usize)>,
    /// Whether it is a disruption candidate now.
    pub candidate: bool,
    /// Why it is or is not being disrupted (the code and text of its event).
    pub code: Code,
    /// The message.
    pub message: String,
    /// What disrupting it would do, when a method would.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanReport>,
    /// The cheapest replacement consolidation found when none is cheaper than the node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cheapest_alternative: Option<NodeClaimReport>,
    /// When `consolidateAfter` has passed (or passes) for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consolidatable_at: Option<Timestamp>,
    /// Its NodePool's budgets now.
    pub budgets: Vec<BudgetReport>,
    /// What the controller's next pass over the whole cluster would do.
    pub next_pass: String,
    /// Drift.
    pub drift: DriftReport,
    /// Expiry.
    pub expiry: ExpiryReport,
    /// When this was worked out.
    pub at: Timestamp,
}

/// Finds a node by Node name or NodeClaim name.
pub fn find_node<'a>(nodes: &'a [StateNode], name: &str, claim: bool) -> Result<&'a StateNode, ToolError> {
    let found = if claim {
        nodes.iter().find(|n| n.claim_name() == Some(name))
    } else {
        nodes.iter().find(|n| n.node_name() == Some(name)).or_else(|| nodes.iter().find(|n| n.name == name))
    };
    found.ok_or_else(|| ToolError::NotFound {
        kind: if claim { "nodeclaim" } else { "node" },
        name: name.to_string(),
    })
}

fn plan_report(plan: &consolidation::Plan) -> PlanReport {
    let replacements: Vec<NodeClaimReport> = plan.replacements.iter().map(claim_report).collect();
    PlanReport {
        decision: plan.decision.as_str(),
        replacement_price_per_hour: round_price(replacements.iter().map(|r| r.price_per_hour).sum()),
        replacements,
        price_per_hour: round_price(plan.candidate_price),
        preferences_broken: plan.preferences_broken.clone(),
    }
}

fn drift_of(node: &StateNode) -> (DriftReport, Option<String>) {
    let Some(claim) = node.claim.as_deref() else { return (DriftReport::default(), None) };
    let conditions = claim.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    match conditions.iter().find(|c| c.type_ == DRIFTED && c.status == ConditionStatus::True) {
        Some(c) => (
            DriftReport {
                drifted: true,
                reason: Some(c.reason.clone()),
                since: Some(c.last_transition_time.clone()),
            },
            Some(c.last_transition_time.clone()),
        ),
        None => (DriftReport::default(), None),
    }
}

fn expiry_of(node: &StateNode) -> ExpiryReport {
    let Some(claim) = node.claim.as_deref() else { return ExpiryReport::default() };
    let mut out = ExpiryReport {
        expire_after: claim.spec.expire_after.clone(),
        termination_grace_period: claim.spec.termination_grace_period.clone(),
        ..ExpiryReport::default()
    };
    match expires_at(claim) {
        Ok(at) => out.expires_at = at,
        Err(e) => out.error = Some(e),
    }
    if let (Some(at), Some(grace)) = (out.expires_at, claim.spec.termination_grace_period.as_deref()) {
        match crate::util::parse_duration(grace)
            .map_err(|e| e.to_string())
            .and_then(|d| k8s_openapi::jiff::SignedDuration::try_from(d).map_err(|e| e.to_string()))
            .and_then(|d| at.checked_add(d).map_err(|e| e.to_string()))
        {
            Ok(end) => out.gone_by = Some(end),
            Err(e) => out.error = Some(format!("spec.terminationGracePeriod {grace:?}: {e}")),
        }
    } else if claim.spec.termination_grace_period.is_none() {
        out.gone_by = None;
    }
    out
}

/// Why `target` of `inputs` is or is not being disrupted now.
pub fn explain_node(inputs: &Inputs, target: &StateNode) -> NodeExplanation {
    let world = inputs.world();
    let now = inputs.now;
    let pool = target.nodepool().and_then(|p| inputs.pools.get(p));
    let pool_names: BTreeSet<String> = inputs.pools.keys().cloned().collect();
    let (drift, _) = drift_of(target);
    let budget_of = |reason: DisruptionReason| {
        let counts = budgets::pool_nodes(&inputs.nodes);
        pool.and_then(|p| {
            let name = p.metadata.name.clone()?;
            budgets::budgets([p], &counts, reason, now).remove(&name)
        })
    };
    let consolidatable_at = pool.and_then(|p| emptiness::consolidatable_at(target, p));

    let mut plan = None;
    let verdict = candidates::check(
        target,
        &pool_names,
        &inputs.snapshot.pdbs,
        drift.drifted && target.claim.as_ref().is_some_and(|c| c.spec.termination_grace_period.is_some()),
        now,
    );
    let method_reason = if drift.drifted {
        DisruptionReason::Drifted
    } else if emptiness::is_empty(target) {
        DisruptionReason::Empty
    } else {
        DisruptionReason::Underutilized
    };
    let why: Result<Why, Why> = match (verdict.blocked, pool) {
        (Some(blocked), _) => Err(blocked),
        (None, None) => Err(Why::new(Code::NodePoolNotFound, "NodePool not found")),
        (None, Some(pool)) => {
            let decided = if drift.drifted && pool.is_static() {
                decide::static_replacement(&world, pool).map(|replacements| {
                    consolidation::Moves { replacements, ..Default::default() }.plan(
                        vec![target.name.clone()],
                        target.price.unwrap_or(0.0),
                        0.0,
                    )
                })
            } else if pool.is_static() {
                Err(decide::static_pool_why())
            } else if drift.drifted {
                consolidation::simulate_all(&world, &[target])
                    .map(|moves| moves.plan(vec![target.name.clone()], target.price.unwrap_or(0.0), 0.0))
            } else if emptiness::is_empty(target) && inputs.snapshot.buffers_placed.holds(target) {
                Err(decide::buffer_pods_why(target))
            } else if emptiness::is_empty(target) {
                match consolidatable_at {
                    Some(at) if at <= now => Ok(consolidation::Moves::default().plan(
                        vec![target.name.clone()],
                        target.price.unwrap_or(0.0),
                        target.price.unwrap_or(0.0),
                    )),
                    _ => Err(Why::new(Code::ConsolidateAfter, consolidation::NOT_CONSOLIDATABLE_YET)),
                }
            } else {
                match consolidation::filter(target, pool, now) {
                    Some(why) => Err(why),
                    None => consolidation::evaluate(&world, &[target], true),
                }
            };
            decided.and_then(|p| {
                plan = Some(plan_report(&p));
                match budget_of(method_reason) {
                    Some(b) if b.remaining == 0 => Err(Why::new(
                        Code::Budget,
                        format!(
                            "No allowed disruptions for disruption reason {} due to blocking budget",
                            method_reason.as_str()
                        ),
                    )),
                    _ => Ok(Why::new(
                        Code::Disrupting,
                        format!("Can be disrupted now ({})", method_reason.metric_label()),
                    )),
                }
            })
        }
    };
    let candidate = why.is_ok() || matches!(&why, Err(w) if w.code == Code::Budget);
    let why = why.unwrap_or_else(|w| w);
    let cheapest_alternative = if why.code == Code::NoCheaperReplacement {
        consolidation::simulate(&world, &[target])
            .ok()
            .and_then(|(claim, _)| claim)
            .map(|claim| claim_report(&claim))
    } else {
        None
    };

    let pass = decide::decide(&world, &HashSet::new());
    let next_pass = match &pass.command {
        Some(c) => format!(
            "{} {} node(s) ({}): {}",
            c.plan.decision.as_str(),
            c.plan.candidates.len(),
            c.reason().metric_label(),
            c.plan.candidates.join(", ")
        ),
        None => "nothing to disrupt".to_string(),
    };
    let budgets = [DisruptionReason::Empty, DisruptionReason::Drifted, DisruptionReason::Underutilized]
        .into_iter()
        .filter_map(|r| {
            budget_of(r).map(|b| BudgetReport {
                reason: r.as_str(),
                allowed: (b.allowed != usize::MAX).then_some(b.allowed),
                disrupting: b.disrupting,
                error: b.error.map(|e| e.to_string()),
            })
        })
        .collect();
    NodeExplanation {
        node: target.node_name().map(str::to_string),
        nodeclaim: target.claim_name().map(str::to_string),
        nodepool: target.nodepool().map(str::to_string),
        instance_type: target.instance_type().map(str::to_string),
        capacity_type: target.capacity_type().map(str::to_string),
        zone: target.zone().map(str::to_string),
        price_per_hour: target.price.map(round_price),
        list_price_per_hour: target.list_price.map(round_price),
        reschedulable_pods: target.reschedulable_pods().count(),
        buffers: inputs
            .snapshot
            .buffers_placed
            .on(target)
            .into_iter()
            .map(|(buffer, placeholders)| (buffer.to_string(), placeholders))
            .collect(),
        candidate,
        code: why.code,
        message: why.message,
        plan,
        cheapest_alternative,
        consolidatable_at,
        budgets,
        next_pass,
        drift,
        expiry: expiry_of(target),
        at: now,
    }
}

/// `t` to the second.
fn secs(t: Timestamp) -> String {
    t.round(k8s_openapi::jiff::Unit::Second).unwrap_or(t).to_string()
}

impl NodeExplanation {
    /// As text: one `Label: value` line per fact.
    pub fn to_table(&self) -> String {
        let dash = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".into());
        let mut lines: Vec<(String, String)> = Vec::new();
        let mut line = |label: &str, value: String| lines.push((format!("{label}:"), value));
        line("Node", dash(&self.node));
        line("NodeClaim", dash(&self.nodeclaim));
        line("NodePool", dash(&self.nodepool));
        line(
            "Offering",
            format!(
                "{} {} {} at {}{}",
                dash(&self.instance_type),
                dash(&self.capacity_type),
                dash(&self.zone),
                price(self.price_per_hour),
                match self.list_price_per_hour {
                    Some(list) if Some(list) != self.price_per_hour =>
                        format!(" (list {})", price(Some(list))),
                    _ => String::new(),
                }
            ),
        );
        line("Pods to move", self.reschedulable_pods.to_string());
        for (buffer, placeholders) in &self.buffers {
            let s = if *placeholders == 1 { "" } else { "s" };
            line(
                "Buffer headroom",
                format!("CapacityBuffer {buffer} keeps room for {placeholders} placeholder{s} here"),
            );
        }
        let verdict = if self.code == Code::Disrupting {
            "yes"
        } else if self.candidate {
            "yes, but not now"
        } else {
            "no"
        };
        line("Disruptable", format!("{verdict}: {} ({:?})", self.message, self.code));
        if let Some(p) = &self.plan {
            let what = if p.replacements.is_empty() {
                format!("delete it, saving {}", price(Some(p.price_per_hour)))
            } else {
                let types: Vec<String> = p.replacements.iter().map(|r| r.instance_type.clone()).collect();
                format!(
                    "replace it ({}) by {} ({})",
                    price(Some(p.price_per_hour)),
                    types.join(", "),
                    price(Some(p.replacement_price_per_hour))
                )
            };
            line("Plan", what);
            if !p.preferences_broken.is_empty() {
                line(
                    "Preferences",
                    format!("left unmet for {}", crate::util::summarise_pods(&p.preferences_broken)),
                );
            }
        }
        if let Some(c) = &self.cheapest_alternative {
            line(
                "Cheapest option",
                format!(
                    "{} ({}, {}) at {}, not below {}",
                    c.instance_type,
                    c.capacity_type,
                    c.zone,
                    price(Some(c.price_per_hour)),
                    price(self.price_per_hour)
                ),
            );
        }
        if let Some(at) = self.consolidatable_at {
            let when = if at <= self.at {
                format!("since {}", secs(at))
            } else {
                format!("at {} (in {}s)", secs(at), at.duration_since(self.at).as_secs())
            };
            line("Consolidatable", when);
        }
        for b in &self.budgets {
            let allowed = b.allowed.map(|a| a.to_string()).unwrap_or_else(|| "unlimited".into());
            let error = b.error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default();
            line(
                &format!("Budget {}", b.reason),
                format!("{allowed} allowed, {} disrupting{error}", b.disrupting),
            );
        }
        line("Next pass", self.next_pass.clone());
        let drift = match (&self.drift.reason, &self.drift.since) {
            (Some(r), Some(s)) if self.drift.drifted => format!("yes ({r}, since {s})"),
            _ => "no".into(),
        };
        line("Drifted", drift);
        let e = &self.expiry;
        let expires = e.expires_at.map(secs).unwrap_or_else(|| "never".into());
        line("Expires", format!("{expires} (expireAfter {})", e.expire_after));
        if let Some(grace) = &e.termination_grace_period {
            let by = e.gone_by.map(|t| format!(", gone by {} at the latest", secs(t))).unwrap_or_default();
            line("Grace period", format!("{grace}{by}"));
        }
        if let Some(error) = &e.error {
            line("Lifetime error", error.clone());
        }
        let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
        lines.iter().map(|(l, v)| format!("{l:<width$} {v}\n")).collect()
    }
}

#[cfg(test)]
mod tests;
