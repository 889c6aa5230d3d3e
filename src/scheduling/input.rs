//! What a scheduling run takes and gives: the pods, NodePools and existing nodes of a
//! [`SchedulingInput`] with its [`SchedulerOptions`], and the [`SchedulingResults`] of new
//! NodeClaims, placements on existing nodes and errors per pod.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::apis::pod::Pod;
use thiserror::Error;

use crate::apis::labels::{LABEL_NODEPOOL, node_class_label_key};
use crate::apis::nodelabels::NodeLabels;
use crate::apis::values::Values;
use crate::apis::{NodePool, NodeSelectorRequirementWithMinValues, Taint};

use super::defaultspread::DefaultSpread;
use super::hostports::{HostPort, pod_host_ports};
use super::instancetypes::InstanceType;
use super::requirements::{Requirement, RequirementError, Requirements};
use super::resources::{QuantityError, Resources, parse_quantity_for};
use super::volumes::VolumeInput;

/// Errors building the scheduler's input from the API objects.
#[derive(Debug, Error)]
pub enum SchedulingError {
    /// A NodePool requirement is malformed.
    #[error("nodepool {nodepool}: {source}")]
    Requirement {
        /// The NodePool.
        nodepool: String,
        /// What is wrong.
        source: RequirementError,
    },
    /// A NodePool limit is not a quantity.
    #[error("nodepool {nodepool}: {source}")]
    Limit {
        /// The NodePool.
        nodepool: String,
        /// What is wrong.
        source: QuantityError,
    },
}

/// What to do when a NodeClaim cannot keep the `minValues` a NodePool asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MinValuesPolicy {
    /// The pod does not schedule on that NodePool.
    #[default]
    Strict,
    /// The NodeClaim is launched anyway and marked as relaxed.
    BestEffort,
}

impl std::str::FromStr for MinValuesPolicy {
    type Err = String;

    /// Parses upstream's spelling, as in `MIN_VALUES_POLICY`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Strict" => Ok(MinValuesPolicy::Strict),
            "BestEffort" => Ok(MinValuesPolicy::BestEffort),
            other => Err(format!("invalid minValues policy {other:?}: expected Strict or BestEffort")),
        }
    }
}

/// How preferred scheduling constraints are treated (`PREFERENCE_POLICY`), as upstream: preferred
/// node affinity, preferred pod (anti-)affinity and `ScheduleAnyway` topology spreads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PreferencePolicy {
    /// Honoured first, then relaxed one at a time when a pod cannot otherwise schedule.
    #[default]
    Respect,
    /// Left out of the simulation from the start.
    Ignore,
}

impl std::str::FromStr for PreferencePolicy {
    type Err = String;

    /// Parses upstream's spelling, as in `PREFERENCE_POLICY`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Respect" => Ok(PreferencePolicy::Respect),
            "Ignore" => Ok(PreferencePolicy::Ignore),
            other => Err(format!("invalid preference policy {other:?}: expected Respect or Ignore")),
        }
    }
}

/// How pods are ordered and how far a NodeClaim grows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Packing {
    /// Pods are taken largest first, alternating between those heavy in CPU and those heavy in
    /// memory (relative to all pending pods) so that NodeClaims fill both evenly. A NodeClaim
    /// stops growing once no instance type that can hold it comes within
    /// the fewer-nodes margin ([`FEWER_NODES_MARGIN`] by default) of the lowest price per unit of its binding resource among its
    /// allowed types (unless the pod rides free on the type it needs already), and exotic types
    /// (see [`InstanceType::is_exotic`]) are dropped from a NodeClaim that other types can hold.
    #[default]
    CostAware,
    /// The rule of upstream's scheduler, and of this one before [`Packing::CostAware`]: pods by
    /// CPU, then memory; a NodeClaim grows while any allowed type can hold it; exotic types stay.
    /// Kept so that benchmarks can compare the plans.
    LargestFit,
}

/// How much dearer per unit of its binding resource than the cheapest allowed type an instance
/// type may be and still let a NodeClaim grow into it, by default ([`SchedulerOptions`]'s
/// `fewer_nodes_margin`, the `FEWER_NODES_MARGIN` setting): a difference this small is noise
/// beside what every node brings besides its price (another DaemonSet set, IP address and API
/// traffic), so a near tie goes to the larger type and the plan with fewer nodes.
pub const FEWER_NODES_MARGIN: f64 = 0.03;

/// Tunables of a scheduling run.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// `minValues` policy.
    pub min_values_policy: MinValuesPolicy,
    /// Whether preferences are honoured at all.
    pub preference_policy: PreferencePolicy,
    /// Most instance types listed in a NodeClaim's `instance-type In` requirement.
    pub max_instance_types: usize,
    /// How pods are ordered and how far NodeClaims grow.
    pub packing: Packing,
    /// Whether a pod that could use a capacity reservation with no instance left to hold takes
    /// other capacity at once (the disruption simulations), rather than waiting for the next run
    /// (the provisioner; see [`super::reservations`]).
    pub reserved_fallback: bool,
    /// Under [`Packing::CostAware`], how much dearer per unit (a fraction) a larger type may be
    /// and still take a NodeClaim's next pods ([`FEWER_NODES_MARGIN`] by default).
    pub fewer_nodes_margin: f64,
    /// kube-scheduler's default topology spreads, given to pending pods of workloads that set
    /// none (none by default; the controllers' settings give kube-scheduler's).
    pub default_spread: Arc<DefaultSpread>,
    /// Whether a pod that fits on an existing node only without its preferences goes there
    /// rather than to new capacity that would honour them, as kube-scheduler, which only scores
    /// preferences, would place it (the disruption simulations, `CONSOLIDATION_PREFERENCE_POLICY`
    /// `Soft`). kube-scheduler's default spreads still hold (see [`super::defaultspread`]).
    pub preferences_yield_to_existing: bool,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            min_values_policy: MinValuesPolicy::Strict,
            preference_policy: PreferencePolicy::Respect,
            max_instance_types: 60,
            packing: Packing::default(),
            reserved_fallback: false,
            fewer_nodes_margin: FEWER_NODES_MARGIN,
            default_spread: Arc::new(DefaultSpread::none()),
            preferences_yield_to_existing: false,
        }
    }
}

/// A NodePool as the scheduler needs it.
#[derive(Clone, Debug)]
pub struct NodePoolInput {
    /// Name of the NodePool.
    pub name: String,
    /// Higher weights are tried first.
    pub weight: i32,
    /// Template requirements, template labels (as `In`), `karpenter.sh/nodepool In [name]` and,
    /// from a NodePool object, its node class's label (`karpenter.k8s.aws/ec2nodeclass In [name]`).
    pub requirements: Requirements,
    /// Template labels.
    pub labels: BTreeMap<String, String>,
    /// Taints of the nodes.
    pub taints: Vec<Taint>,
    /// Taints present only while the node starts.
    pub startup_taints: Vec<Taint>,
    /// Instance types the cloud provider offers for this NodePool.
    pub instance_types: Vec<Arc<InstanceType>>,
    /// Limits minus current usage, for the limited resources only (`nodes` counts NodeClaims);
    /// `None` when the pool has no limits.
    pub remaining_limits: Option<BTreeMap<String, i64>>,
}

/// The requirements of a NodePool's template: its requirements and one per template label.
pub fn template_requirements(np: &NodePool) -> Result<Requirements, RequirementError> {
    let mut reqs = Requirements::from_nodepool(&np.spec.template.spec.requirements)?;
    if let Some(meta) = &np.spec.template.metadata {
        reqs.add_all(&Requirements::from_labels(&meta.labels));
    }
    Ok(reqs)
}

impl NodePoolInput {
    /// The NodeClaim a static NodePool makes (for `replicas`, or in place of a drifted node): its
    /// template, for no pod, with no instance type named, so that the launch takes the cheapest
    /// the template allows, as upstream's static NodeClaims do.
    pub fn static_claim(&self) -> NewNodeClaim {
        let mut labels = self.labels.clone();
        labels.extend(self.requirements.single_valued_labels());
        NewNodeClaim {
            nodepool: self.name.clone(),
            requirements: self.requirements.clone(),
            instance_type_names: Values::default(),
            labels,
            taints: self.taints.clone(),
            startup_taints: self.startup_taints.clone(),
            requests: Resources::default(),
            daemonset_requests: Resources::default(),
            pods: Vec::new(),
            instance_type_options: Arc::from([]),
            min_values_relaxed: false,
        }
    }

    /// A NodePool without requirements, taints or limits.
    pub fn new(name: impl Into<String>, instance_types: Vec<Arc<InstanceType>>) -> Self {
        let name = name.into();
        let mut requirements = Requirements::new();
        requirements.add(LABEL_NODEPOOL, Requirement::in_values([name.clone()]));
        NodePoolInput {
            name,
            weight: 0,
            requirements,
            labels: BTreeMap::new(),
            taints: vec![],
            startup_taints: vec![],
            instance_types,
            remaining_limits: None,
        }
    }

    /// Adds NodePool-style requirements.
    pub fn with_requirements(
        mut self,
        reqs: &[NodeSelectorRequirementWithMinValues],
    ) -> Result<Self, RequirementError> {
        self.requirements.add_all(&Requirements::from_nodepool(reqs)?);
        Ok(self)
    }

    /// Builds the input from a NodePool object, its instance types and the resources its nodes
    /// use now (`nodes` in `usage.extended` counts its nodes).
    pub fn from_nodepool(
        np: &NodePool,
        instance_types: Vec<Arc<InstanceType>>,
        usage: &Resources,
    ) -> Result<Self, SchedulingError> {
        let name = np.metadata.name.clone().unwrap_or_default();
        let spec = &np.spec.template.spec;
        let labels = np.spec.template.metadata.as_ref().map(|m| m.labels.clone()).unwrap_or_default();
        let mut input = NodePoolInput::new(name.clone(), instance_types);
        let template = template_requirements(np)
            .map_err(|source| SchedulingError::Requirement { nodepool: name.clone(), source })?;
        input.requirements.add_all(&template);
        // As upstream: the claims carry their node class's name, and pods may select it.
        let class = &spec.node_class_ref;
        input.requirements.add(
            &node_class_label_key(&class.group, &class.kind),
            Requirement::in_values([class.name.clone()]),
        );
        input.labels = labels;
        input.weight = np.weight();
        input.taints = spec.taints.clone();
        input.startup_taints = spec.startup_taints.clone();
        if let Some(limits) = &np.spec.limits {
            let mut remaining = BTreeMap::new();
            for (k, q) in limits {
                let limit = parse_quantity_for(k, q)
                    .map_err(|source| SchedulingError::Limit { nodepool: name.clone(), source })?;
                remaining.insert(k.clone(), limit.saturating_sub(usage.get(k)));
            }
            input.remaining_limits = Some(remaining);
        }
        Ok(input)
    }
}

/// A node that exists or is being launched (an in-flight NodeClaim).
#[derive(Clone, Debug, Default)]
pub struct ExistingNode {
    /// Node name (or NodeClaim name while the node has not registered).
    pub name: String,
    /// Labels (for in-flight claims, the labels the node will have).
    pub labels: NodeLabels,
    /// Taints.
    pub taints: Vec<Taint>,
    /// Startup taints of its NodePool, ignored until the node is initialized.
    pub startup_taints: Vec<Taint>,
    /// Whether the node is initialized; if not, startup and known ephemeral taints are ignored.
    pub initialized: bool,
    /// Allocatable resources.
    pub allocatable: Resources,
    /// Requests of the pods bound to it, `pods` included (and, for nodes not initialized yet, of
    /// the DaemonSet pods it will run).
    pub requested: Resources,
    /// Pods bound to it, for topology and host ports; shared with the cluster-state cache.
    pub pods: Vec<Arc<Pod>>,
    /// What the scheduler derives from the fields above, computed on first use and kept for
    /// every later simulation of the same node (a disruption pass simulates the cluster once per
    /// candidate). Build a new `ExistingNode` rather than editing one that has been scheduled.
    pub(crate) derived: Derived,
}

impl ExistingNode {
    /// What the scheduler derives from the node, worked out on first use.
    pub(super) fn derived(&self) -> &DerivedNode {
        self.derived.0.get_or_init(|| DerivedNode {
            reqs: Requirements::from_labels(&self.labels),
            ports: self.pods.iter().flat_map(|p| pod_host_ports(p)).collect(),
            constrains: self.pods.iter().any(|p| super::topology::constrains_others(p)),
        })
    }
}

/// An [`ExistingNode`]'s derived data (not copied by `clone`: a copy may be edited).
#[derive(Default)]
pub(crate) struct Derived(std::sync::OnceLock<DerivedNode>);

impl Clone for Derived {
    fn clone(&self) -> Self {
        Derived::default()
    }
}

impl fmt::Debug for Derived {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("..")
    }
}

pub(super) struct DerivedNode {
    /// Requirements from its labels.
    pub(super) reqs: Requirements,
    /// Host ports its pods hold.
    pub(super) ports: Vec<HostPort>,
    /// Whether any of its pods has a topology spread or pod (anti-)affinity.
    pub(super) constrains: bool,
}

/// Everything a scheduling run looks at.
#[derive(Clone, Debug, Default)]
pub struct SchedulingInput {
    /// Pods to place; shared with the cluster-state cache.
    pub pods: Vec<Arc<Pod>>,
    /// NodePools that may launch nodes.
    pub nodepools: Vec<NodePoolInput>,
    /// Existing and in-flight nodes (shared, so that simulations of the same cluster without one
    /// node or another do not copy them).
    pub existing_nodes: Vec<Arc<ExistingNode>>,
    /// One pod per DaemonSet, built from its template: the overhead of every new node.
    pub daemonsets: Vec<Pod>,
    /// Labels of namespaces, for affinity terms with a namespace selector.
    pub namespace_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// Claims, volumes, storage classes and attach limits, for the pods' volumes.
    pub volumes: VolumeInput,
    /// Tunables.
    pub options: SchedulerOptions,
    /// The capacity reservations NodeClaims that are not launched yet hold, one entry per
    /// NodeClaim and reservation: their instances are not left for new NodeClaims.
    pub reservations_held: Vec<String>,
}

/// Identifies an input pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// Index in [`SchedulingInput::pods`].
    pub index: usize,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A NodeClaim to create.
#[derive(Clone, Debug)]
pub struct NewNodeClaim {
    /// The NodePool it comes from.
    pub nodepool: String,
    /// Requirements, including `node.kubernetes.io/instance-type In [...]` cheapest first.
    pub requirements: Requirements,
    /// Instance type names of that requirement, cheapest first (shared by the claims of a run
    /// that list the same).
    pub instance_type_names: Values,
    /// Labels of the node (template labels and single-valued requirements).
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<Taint>,
    /// Startup taints.
    pub startup_taints: Vec<Taint>,
    /// Requests of its pods plus the DaemonSet overhead.
    pub requests: Resources,
    /// DaemonSet overhead included in `requests`.
    pub daemonset_requests: Resources,
    /// The pods it will run.
    pub pods: Vec<PodRef>,
    /// Every instance type that can hold the pods, cheapest first (shared by the claims of a
    /// run that may launch as the same types).
    pub instance_type_options: Arc<[Arc<InstanceType>]>,
    /// Whether `minValues` had to be relaxed.
    pub min_values_relaxed: bool,
}

impl NewNodeClaim {
    /// The requirements as a NodeClaim spec lists them.
    pub fn node_selector_requirements(&self) -> Vec<NodeSelectorRequirementWithMinValues> {
        self.requirements.to_node_selector()
    }
}

/// Pods placed on an existing node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistingPlacement {
    /// The node.
    pub node: String,
    /// The pods.
    pub pods: Vec<PodRef>,
}

/// Why a pod could not be placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodError {
    /// The pod.
    pub pod: PodRef,
    /// Reason per NodePool, in the order they were tried.
    pub nodepools: Vec<(String, String)>,
    /// A reason not tied to a NodePool (invalid pod, no NodePool).
    pub reason: Option<String>,
    /// Whether the pod waits for a capacity reservation that other NodeClaims of the run hold
    /// (the next run places it: not a scheduling failure to report).
    pub reserved: bool,
}

impl fmt::Display for PodError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = &self.reason {
            return f.write_str(r);
        }
        let parts: Vec<String> =
            self.nodepools.iter().map(|(np, r)| format!("nodepool {np:?}: {r}")).collect();
        f.write_str(&parts.join("; "))
    }
}

/// The outcome of a scheduling run.
#[derive(Clone, Debug, Default)]
pub struct SchedulingResults {
    /// NodeClaims to create.
    pub new_node_claims: Vec<NewNodeClaim>,
    /// Pods that fit on existing or in-flight nodes.
    pub existing_placements: Vec<ExistingPlacement>,
    /// Pods that fit nowhere.
    pub errors: Vec<PodError>,
    /// The pods of `errors` the simulation did not try to place because upstream's provisioner
    /// would have left them out before scheduling (its `Validate`): node requirements that cannot
    /// be parsed, volumes that cannot be resolved. Upstream counts them as ignored pods.
    pub ignored: Vec<PodRef>,
    /// Pods placed on an existing node with a preference left unmet (preferred node or pod
    /// affinity, a `ScheduleAnyway` spread) where honouring it would have needed new capacity,
    /// under [`SchedulerOptions`]' `preferences_yield_to_existing`.
    pub preferences_broken: Vec<PodRef>,
}
