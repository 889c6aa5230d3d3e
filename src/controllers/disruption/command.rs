//! Running a validated disruption command, so that a failure or a crash at any point loses no
//! pod and leaves no node half-disrupted:
//!
//! 1. the candidates are tainted `karpenter.sh/disrupted:NoSchedule` and their NodeClaims get the
//!    `DisruptionReason` condition (nothing new lands on them from now on);
//! 2. their pods are listed from the API server, not the cache: a pod that arrived since the
//!    decision (or a do-not-disrupt pod) abandons the command, so no node that just received a
//!    pod is deleted;
//! 3. the replacement NodeClaim, if any, is created, and once the cluster state has it the
//!    candidates are marked for deletion (the provisioner then counts the replacement as the
//!    capacity for their pods, instead of launching its own);
//! 4. the replacement must become Initialized within [`TIMEOUT`];
//! 5. only then are the candidates' NodeClaims deleted; the termination controller drains them.
//!
//! A failure in steps 1–4 undoes everything but a launched replacement (which, unused, is empty
//! and goes the way of empty nodes): the taint and the condition are removed and the marks taken
//! back. A crash leaves the taint and condition, which the next pass of the controller (of
//! whichever replica leads) removes from every node no command is working on.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::apis::pod::Pod;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::apis::common::{ConditionUpdate, remove_condition, set_condition};
use crate::apis::nodeclaim::conditions::{DISRUPTION_REASON, INITIALIZED, LAUNCHED};
use crate::apis::{NodeClaim, NodePool};
use crate::controllers::Context;
use crate::controllers::events::reasons;
use crate::controllers::kit::count_disrupted;
use crate::controllers::nodeclaim::{Written, write_conditions};
use crate::controllers::provisioning::template;
use crate::disruption::decide::{Command, Method};
use crate::state::marks::nomination_window;
use crate::state::pods::{self, DoNotDisrupt};
use crate::state::{ClusterState, StateNode};
use crate::util::api::is_not_found;
use crate::util::error_chain;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "disruption";

/// Names of the nodes commands under way are working on, each with whether its command launches
/// replacements. The nodes of a command that only deletes count as going at once; those of a
/// command that replaces them only once the command marks them, when its replacements are in the
/// cache: until then a pass would find their pods a home neither on the node nor on the
/// replacement it cannot see yet, and launch a second one.
pub type InFlight = Arc<Mutex<HashMap<String, bool>>>;
/// NodeClaims commands launched, with when they initialized (see
/// [`crate::disruption::consolidation::CHURN_GUARD`]).
pub type Launched = Arc<Mutex<BTreeMap<String, Instant>>>;

/// How long a replacement may take to initialize before the command is abandoned.
pub const TIMEOUT: Duration = Duration::from_secs(600);
/// How often the replacement is looked at.
const POLL: Duration = Duration::from_secs(1);
/// How long the cluster state may take to show a NodeClaim just created.
const CACHE_WAIT: Duration = Duration::from_secs(10);

/// A command and what it needs to run.
pub struct Run {
    /// The controllers' context.
    pub ctx: Context,
    /// The cluster state.
    pub state: ClusterState,
    /// The nodes commands are working on; this one's leave it when it ends.
    pub in_flight: InFlight,
    /// Replacements launched by commands; this one's joins it once initialized.
    pub launched: Launched,
    /// The command.
    pub command: Command,
    /// Its candidates as validated.
    pub nodes: Vec<StateNode>,
    /// The NodePools, by name (a replacement whose NodePool is gone fails the command).
    pub pools: std::collections::BTreeMap<String, Arc<NodePool>>,
    /// How long the replacement has to initialize ([`TIMEOUT`]).
    pub timeout: Duration,
}

/// `<delete|replace>: [nodes] -> [N replacement(s)]`, as upstream logs a command, and the pods
/// whose preferences the command leaves unmet.
pub fn describe(command: &Command) -> String {
    let plan = &command.plan;
    let replacements = match plan.replacements.len() {
        0 => String::new(),
        n => format!(" -> [{n} replacement(s)]"),
    };
    let broken = match plan.preferences_broken.is_empty() {
        true => String::new(),
        false => {
            format!(" (preferences left unmet for {})", crate::util::summarise_pods(&plan.preferences_broken))
        }
    };
    format!("{}: [{}]{replacements}{broken}", plan.decision.as_str(), plan.candidates.join(", "))
}

/// Why a command stopped.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("tainting node {node}")]
    Taint {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing the pods of node {node}")]
    ListPods {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("node {node} received pod {pod} since the decision")]
    NewPod { node: String, pod: String },
    #[error("pod {pod} on node {node} may not be disrupted now")]
    DoNotDisrupt { node: String, pod: String },
    #[error("the nodepool {0} of the replacement is gone")]
    NoPool(String),
    #[error("creating the replacement nodeclaim")]
    Create(#[source] kube::Error),
    #[error("replacement nodeclaim {0} was deleted before it initialized")]
    ReplacementGone(String),
    #[error("replacement nodeclaim {0} did not initialize within {1:?}")]
    Timeout(String, Duration),
}

impl Run {
    /// The candidates' NodeClaims as `(uid, name)`.
    fn claim_ids(&self) -> Vec<(String, String)> {
        self.nodes
            .iter()
            .filter_map(|n| n.claim.as_deref())
            .filter_map(|c| Some((c.metadata.uid.clone()?, c.name_any())))
            .collect()
    }

    /// Runs the command to its end; the nodes leave the in-flight set when it is over.
    pub async fn execute(self) {
        let reason = self.command.reason();
        let kind = self.command.method.consolidation_type();
        let decision = self.command.plan.decision.as_str();
        tracing::info!(
            controller = CONTROLLER,
            reason = reason.as_str(),
            decision,
            consolidation_type = kind,
            command = %describe(&self.command),
            nodes = %self.command.plan.candidates.join(", "),
            nodepools = %self.pools().join(", "),
            replacements = self.command.plan.replacements.len(),
            savings = %format!("${:.2}", self.command.plan.savings),
            "disrupting node(s)"
        );
        let mut replacement_names = Vec::new();
        let outcome = self.steps(&mut replacement_names).await;
        match outcome {
            Ok(()) => {}
            Err(failure) => {
                tracing::error!(
                    controller = CONTROLLER,
                    reason = reason.as_str(),
                    command = %describe(&self.command),
                    replacements = %replacement_names.join(", "),
                    error = %error_chain(&failure),
                    "disruption command failed, undoing it"
                );
                self.ctx
                    .metrics
                    .disruption_queue_failures
                    .get_or_create(&vec![
                        ("decision", decision.to_string()),
                        ("reason", reason.metric_label().to_string()),
                        ("consolidation_type", kind.to_string()),
                    ])
                    .inc();
                self.undo().await;
            }
        }
        let mut in_flight = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
        for name in &self.command.plan.candidates {
            in_flight.remove(name);
        }
    }

    fn pools(&self) -> Vec<String> {
        let mut pools: Vec<String> =
            self.nodes.iter().filter_map(|n| n.nodepool().map(str::to_string)).collect();
        pools.sort();
        pools.dedup();
        pools
    }

    async fn steps(&self, replacement_names: &mut Vec<String>) -> Result<(), Failure> {
        let reason = self.command.reason().as_str();
        // 1. Taint, and say why on the NodeClaims.
        for node in &self.nodes {
            if let Some(k8s) = &node.node {
                crate::controllers::node::add_disrupted_taint(&self.ctx.client, k8s, false)
                    .await
                    .map_err(|source| Failure::Taint { node: node.name.clone(), source })?;
            }
            if let Some(claim) = &node.claim {
                set_disruption_reason(&self.ctx.client, claim, reason).await;
            }
        }
        // 2. Nothing arrived since the decision.
        self.check_pods().await?;
        let replacements = &self.command.plan.replacements;
        if !replacements.is_empty() && self.command.method != Method::Drift {
            let message = format!(
                "Consolidation candidate: {} (savings: ${:.2})",
                describe(&self.command),
                self.command.plan.savings
            );
            for node in &self.nodes {
                if let Some(k8s) = &node.node {
                    self.ctx
                        .events
                        .normal(k8s.as_ref(), reasons::CONSOLIDATION_CANDIDATE, message.clone())
                        .await;
                }
            }
        }
        // 3. The replacements.
        let mut created = Vec::new();
        for replacement in replacements {
            let pool = self
                .pools
                .get(&replacement.nodepool)
                .ok_or_else(|| Failure::NoPool(replacement.nodepool.clone()))?;
            let claim = template::build(replacement, pool);
            let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
            let made = api.create(&PostParams::default(), &claim).await.map_err(Failure::Create)?;
            let name = made.name_any();
            replacement_names.push(name.clone());
            tracing::info!(
                controller = CONTROLLER,
                NodePool = %replacement.nodepool,
                NodeClaim = %name,
                instance_types = %template::summarize_instance_types(&replacement.instance_type_names, 5),
                "created nodeclaim"
            );
            self.ctx
                .metrics
                .nodeclaims_created
                .get_or_create(&vec![
                    ("reason", self.command.reason().metric_label().to_string()),
                    ("nodepool", replacement.nodepool.clone()),
                    ("min_values_relaxed", replacement.min_values_relaxed.to_string()),
                ])
                .inc();
            created.push((name, made));
        }
        for (name, _) in &created {
            let deadline = Instant::now() + CACHE_WAIT;
            while self.state.nodeclaim(name).is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            self.state.marks.nominate(name, nomination_window(self.ctx.settings.batch_max_duration));
        }
        self.mark();
        self.count_decision();
        // 4. Wait for them.
        for (name, made) in &created {
            self.await_initialized(name, made).await?;
        }
        // 5. Delete the old NodeClaims.
        self.delete().await;
        Ok(())
    }

    fn mark(&self) {
        let claims = self.claim_ids();
        self.state.marks.mark_for_deletion(claims.iter().map(|(uid, name)| (uid.as_str(), name.as_str())));
    }

    fn count_decision(&self) {
        let m = &self.ctx.metrics;
        let decision = self.command.plan.decision.as_str().to_string();
        let reason = self.command.reason().metric_label().to_string();
        let kind = self.command.method.consolidation_type().to_string();
        m.disruption_decisions
            .get_or_create(&vec![
                ("decision", decision.clone()),
                ("reason", reason.clone()),
                ("consolidation_type", kind.clone()),
            ])
            .inc();
        for pool in self.pools() {
            m.disruption_decisions_by_nodepool
                .get_or_create(&vec![
                    ("nodepool", pool),
                    ("decision", decision.clone()),
                    ("reason", reason.clone()),
                    ("consolidation_type", kind.clone()),
                ])
                .inc();
        }
    }

    /// Lists the candidates' pods from the API server and compares them with the decision's.
    async fn check_pods(&self) -> Result<(), Failure> {
        let api: Api<Pod> = Api::all(self.ctx.client.clone());
        let now = Timestamp::now();
        for node in &self.nodes {
            let Some(name) = node.node_name() else { continue };
            // Drift of a claim with a terminationGracePeriod is not held by its pods.
            let grace_bounded = self.command.method == Method::Drift
                && node.claim.as_ref().is_some_and(|c| c.spec.termination_grace_period.is_some());
            let known: HashSet<&str> =
                node.reschedulable_pods().filter_map(|p| p.metadata.uid.as_deref()).collect();
            let params = ListParams::default().fields(&format!("spec.nodeName={name}"));
            let live = api
                .list(&params)
                .await
                .map_err(|source| Failure::ListPods { node: name.to_string(), source })?;
            for pod in &live.items {
                if !pods::is_active(pod) {
                    continue;
                }
                if !grace_bounded && matches!(pods::do_not_disrupt(pod, now), DoNotDisrupt::Active { .. }) {
                    return Err(Failure::DoNotDisrupt { node: name.to_string(), pod: pods::key(pod) });
                }
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                if pods::is_reschedulable(pod) && !known.contains(uid) {
                    return Err(Failure::NewPod { node: name.to_string(), pod: pods::key(pod) });
                }
            }
        }
        Ok(())
    }

    async fn await_initialized(&self, name: &str, created: &NodeClaim) -> Result<(), Failure> {
        let reason = self.command.reason().as_str();
        let start = Instant::now();
        let (mut told_launching, mut told_waiting) = (false, false);
        loop {
            let claim = match self.state.nodeclaim(name) {
                Some(cached)
                    if cached.metadata.uid == created.metadata.uid
                        && cached.metadata.deletion_timestamp.is_none() =>
                {
                    Some(cached)
                }
                // The cache may lag behind: only the API server says the replacement is gone.
                _ => match self.live_replacement(name, created).await {
                    Live::Here(claim) => Some(claim),
                    Live::Gone => return Err(Failure::ReplacementGone(name.to_string())),
                    Live::Unknown => None,
                },
            };
            let Some(claim) = claim else {
                if start.elapsed() >= self.timeout {
                    return Err(Failure::Timeout(name.to_string(), self.timeout));
                }
                tokio::time::sleep(POLL).await;
                continue;
            };
            if claim.is_true(INITIALIZED) {
                self.launched
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(name.to_string(), Instant::now());
                return Ok(());
            }
            if !told_launching {
                told_launching = true;
                self.ctx
                    .events
                    .normal(created, reasons::DISRUPTION_LAUNCHING, format!("Launching NodeClaim: {reason}"))
                    .await;
            }
            if claim.is_true(LAUNCHED) && !told_waiting {
                told_waiting = true;
                self.ctx
                    .events
                    .normal(
                        created,
                        reasons::DISRUPTION_WAITING_READINESS,
                        "Waiting on readiness to continue disruption".to_string(),
                    )
                    .await;
            }
            if start.elapsed() >= self.timeout {
                return Err(Failure::Timeout(name.to_string(), self.timeout));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The replacement `created` as the API server has it.
    async fn live_replacement(&self, name: &str, created: &NodeClaim) -> Live {
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        match api.get_opt(name).await {
            Ok(Some(claim))
                if claim.metadata.uid == created.metadata.uid
                    && claim.metadata.deletion_timestamp.is_none() =>
            {
                Live::Here(Arc::new(claim))
            }
            Ok(_) => Live::Gone,
            Err(error) => {
                tracing::warn!(controller = CONTROLLER, NodeClaim = %name, error = %error_chain(&error), "reading the replacement nodeclaim");
                Live::Unknown
            }
        }
    }

    async fn delete(&self) {
        let reason = self.command.reason();
        let api: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        for node in &self.nodes {
            let Some(claim) = &node.claim else { continue };
            match api.delete(&claim.name_any(), &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => continue,
                Err(e) => {
                    // Its taint stays until the next pass heals it; the node keeps running.
                    tracing::error!(controller = CONTROLLER, NodeClaim = %claim.name_any(), error = %error_chain(&e), "deleting nodeclaim");
                    self.state.marks.unmark(claim.metadata.uid.as_deref());
                    continue;
                }
            }
            if let Some(k8s) = &node.node {
                self.ctx
                    .events
                    .normal(
                        k8s.as_ref(),
                        reasons::DISRUPTION_TERMINATING,
                        format!("Disrupting Node: {}", reason.as_str()),
                    )
                    .await;
            }
            self.ctx
                .events
                .normal(
                    claim.as_ref(),
                    reasons::DISRUPTION_TERMINATING,
                    format!("Disrupting NodeClaim: {}", reason.as_str()),
                )
                .await;
            count_disrupted(&self.ctx.metrics, claim, reason.metric_label());
        }
    }

    /// Removes the taint and the condition, unless the node or its NodeClaim is being deleted
    /// meanwhile. Read from the API server, not the cache: a command that fails right after
    /// tainting would otherwise see a cached node without the taint and leave it (until the next
    /// pass healed it), and a cache may not show a deletion yet.
    async fn undo(&self) {
        let claims = self.claim_ids();
        self.state.marks.unmark(claims.iter().map(|(uid, _)| uid.as_str()));
        let nodes: Api<Node> = Api::all(self.ctx.client.clone());
        let claims: Api<NodeClaim> = Api::all(self.ctx.client.clone());
        for node in &self.nodes {
            if let Some(name) = node.node_name() {
                // A node whose NodeClaim is being deleted meanwhile (expiry, interruption, a user)
                // keeps its taint: it is draining.
                let removed = match nodes.get_opt(name).await {
                    Ok(Some(current)) => crate::controllers::node::remove_disrupted_taint(
                        &self.ctx.client,
                        &current,
                        node.claim_name(),
                    )
                    .await
                    .map(|_| ()),
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                };
                if let Err(e) = removed {
                    tracing::warn!(controller = CONTROLLER, Node = %name, error = %error_chain(&e), "removing the disrupted taint");
                }
            }
            if let Some(name) = node.claim_name() {
                match claims.get_opt(name).await {
                    // A NodeClaim being deleted keeps saying why.
                    Ok(Some(claim)) if claim.metadata.deletion_timestamp.is_none() => {
                        clear_disruption_reason(&self.ctx.client, &claim).await
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(controller = CONTROLLER, NodeClaim = %name, error = %error_chain(&e), "removing the DisruptionReason condition")
                    }
                }
            }
        }
    }
}

/// What the API server says of a replacement.
enum Live {
    /// There, not being deleted.
    Here(Arc<NodeClaim>),
    /// Deleted, being deleted, or another NodeClaim of the same name.
    Gone,
    /// The API server did not answer.
    Unknown,
}

/// Sets `DisruptionReason=True` with `reason` on `claim` (best effort: the taint is what keeps
/// pods away; the condition tells users why).
async fn set_disruption_reason(client: &Client, claim: &NodeClaim, reason: &str) {
    let mut conditions = claim.conditions().to_vec();
    let update = ConditionUpdate { message: String::new(), ..ConditionUpdate::true_(reason) };
    if !set_condition(&mut conditions, DISRUPTION_REASON, update, claim.metadata.generation, Timestamp::now())
    {
        return;
    }
    write_disruption_reason(client, claim, &conditions).await;
}

/// Removes the `DisruptionReason` condition from `claim`.
pub async fn clear_disruption_reason(client: &Client, claim: &NodeClaim) {
    let mut conditions = claim.conditions().to_vec();
    if !remove_condition(&mut conditions, DISRUPTION_REASON) {
        return;
    }
    write_disruption_reason(client, claim, &conditions).await;
}

/// Writes `conditions`, with or without `DisruptionReason`, on `claim`; a claim gone or changed
/// meanwhile is left to the next pass.
async fn write_disruption_reason(client: &Client, claim: &NodeClaim, conditions: &[crate::apis::Condition]) {
    match write_conditions(client, claim, conditions).await {
        Ok(Written::Done | Written::Gone | Written::Changed) => {}
        Err(e) => {
            tracing::warn!(controller = CONTROLLER, NodeClaim = %claim.name_any(), error = %error_chain(&e), "writing the DisruptionReason condition")
        }
    }
}
