//! Why each node was or was not disrupted, in a form both people and programs read.
//!
//! Every reason a pass gives carries a [`Code`] (stable, machine-readable) and the message
//! upstream's events use. After each pass the controller turns the [`super::decide::Pass`] into a [`Record`]: one
//! [`NodeDecision`] per managed node. The `DisruptionBlocked` and `Unconsolidatable` events come
//! from it, and the controller serves the latest one as JSON (`/disruption` on the metrics port),
//! so "why is this node still here" has an answer without reading logs.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// What keeps a node from being disrupted, or what is being done to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Code {
    // Candidate checks (`DisruptionBlocked`).
    /// The node has no NodeClaim.
    NotManaged,
    /// The NodeClaim has no Node yet.
    NoNode,
    /// The node is not initialized.
    NotInitialized,
    /// The node is being deleted or is part of a command.
    Deleting,
    /// Pending pods were nominated to the node.
    Nominated,
    /// The node carries `karpenter.sh/do-not-disrupt: "true"`.
    DoNotDisruptNode,
    /// The node's NodePool does not exist.
    NodePoolNotFound,
    /// The node has no `karpenter.sh/nodepool` label.
    NoNodePoolLabel,
    /// A pod on the node carries an active `karpenter.sh/do-not-disrupt`.
    DoNotDisruptPod,
    /// A PodDisruptionBudget keeps a pod of the node from being evicted.
    PodDisruptionBudget,
    // Consolidation (`Unconsolidatable`).
    /// The node lacks the instance type, capacity type or zone label.
    MissingLabel,
    /// The NodePool's `consolidateAfter` is `Never`.
    ConsolidationDisabled,
    /// The node is empty: emptiness' business.
    Empty,
    /// The NodePool's policy is `WhenEmpty` and the node is not empty.
    WhenEmptyPolicy,
    /// `consolidateAfter` has not passed since the node's last pod event.
    ConsolidateAfter,
    /// Consolidation launched the node less than a minute ago.
    RecentlyLaunched,
    /// A pod of the node would fit nowhere else.
    PodsWouldNotSchedule,
    /// A pod of the node would only fit on a node not initialized yet.
    UninitializedTarget,
    /// Its pods would need more than one new node.
    MoreThanOneReplacement,
    /// A spot node would be replaced by spot without the `SpotToSpotConsolidation` gate.
    SpotToSpotDisabled,
    /// No replacement is cheaper.
    NoCheaperReplacement,
    /// Too few cheaper types to meet the requirements' `minValues`.
    MinValues,
    /// Too few cheaper types for a single spot node's spot replacement.
    SpotToSpotOptions,
    /// A spot node EC2 recommended moving off has nowhere to go but its own spot offering.
    NoOtherOffering,
    /// A Balanced NodePool's score of the move is too low.
    BalancedScore,
    /// The NodePool's disruption budget allows nothing more now.
    Budget,
    /// A candidate the pass did not reach (another command came first).
    NotReached,
    /// The node belongs to a static NodePool: only drift replaces it, and `replicas` counts it.
    StaticNodePool,
    /// The node is empty but holds a CapacityBuffer's headroom.
    BufferPods,
    // Acting.
    /// Part of the command this pass chose.
    Disrupting,
    /// Part of a command under way.
    InProgress,
}

/// A reason with its message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Why {
    /// What, for programs.
    pub code: Code,
    /// What, for people: the text of the node's event.
    pub message: String,
}

impl Why {
    /// A reason.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Why { code, message: message.into() }
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// How a node came out of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Outcome {
    /// Chosen for disruption, or being disrupted.
    Disrupting,
    /// Not a candidate (a `DisruptionBlocked` event).
    Blocked,
    /// A candidate consolidation left (an `Unconsolidatable` event unless it only waits).
    Unconsolidatable,
    /// A candidate nothing was decided about this pass.
    Candidate,
}

/// One node's decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDecision {
    /// Its NodeClaim.
    pub nodeclaim: Option<String>,
    /// Its NodePool.
    pub nodepool: Option<String>,
    /// The outcome.
    pub outcome: Outcome,
    /// Why.
    pub code: Code,
    /// The message.
    pub message: String,
}

/// Every managed node's decision in one pass.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Record {
    /// When the pass looked.
    pub at: Option<Timestamp>,
    /// The command chosen, described.
    pub command: Option<String>,
    /// By node name (the NodeClaim's name while it has no Node).
    pub nodes: BTreeMap<String, NodeDecision>,
}

/// The latest [`Record`], shared between the disruption controller that writes it and the
/// metrics port that serves it.
#[derive(Clone, Debug, Default)]
pub struct Decisions(std::sync::Arc<std::sync::RwLock<Record>>);

impl Decisions {
    /// Replaces the record.
    pub fn set(&self, record: Record) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = record;
    }

    /// The record.
    pub fn get(&self) -> Record {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The record as JSON (an empty one on a replica that is not the leader).
    pub fn json(&self) -> String {
        serde_json::to_string(&self.get())
            .unwrap_or_else(|error| format!("{{\"error\": {:?}}}", error.to_string()))
    }
}
