//! The lifecycle's decisions as pure functions of the NodeClaim, its Node and the time: no client,
//! no cloud, so every rule is tested directly.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint as NodeTaint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use k8s_openapi::jiff::Timestamp;
use kube::{Resource, ResourceExt};

use crate::apis::common::{ConditionUpdate, condition, is_true, set_condition};
use crate::apis::labels::{
    ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP, FINALIZER_TERMINATION, LABEL_CAPACITY_TYPE,
    LABEL_DO_NOT_SYNC_TAINTS, LABEL_INSTANCE_TYPE, LABEL_NODEPOOL, LABEL_REGISTERED, LABEL_TOPOLOGY_ZONE,
    TAINT_EXTERNAL_CLOUD_PROVIDER, TAINT_NODE_NOT_READY, TAINT_NODE_UNREACHABLE, TAINT_UNREGISTERED,
    is_restricted_label,
};
use crate::apis::nodeclaim::conditions::{INITIALIZED, LAUNCHED, READY, REGISTERED};
use crate::apis::{Condition, ConditionStatus, NodeClaim, Taint};
use crate::cloudprovider::Instance;
use crate::scheduling::requirements::Requirements;
use crate::scheduling::resources::parse_quantity;
use crate::util::parse_duration;

/// How long a NodeClaim may take to launch, counted from its creation.
pub const LAUNCH_TTL: Duration = Duration::from_secs(5 * 60);
/// How long a launched NodeClaim's node may take to register, counted from the launch.
pub const REGISTRATION_TTL: Duration = Duration::from_secs(15 * 60);

/// Condition reasons and messages the lifecycle writes.
pub mod reasons {
    /// A dependent condition nobody has computed yet.
    pub const AWAITING_RECONCILIATION: &str = "AwaitingReconciliation";
    /// Message of [`AWAITING_RECONCILIATION`].
    pub const AWAITING_RECONCILIATION_MESSAGE: &str = "object is awaiting reconciliation";
    /// Launched=True.
    pub const LAUNCHED: &str = "Launched";
    /// Launched=False: the cloud provider failed.
    pub const LAUNCH_FAILED: &str = "LaunchFailed";
    /// Launched=False: the node class cannot be used yet.
    pub const NODE_CLASS_NOT_READY: &str = "NodeClassNotReady";
    /// Registered=True.
    pub const REGISTERED: &str = "Registered";
    /// Registered/Initialized=Unknown: no Node has the claim's provider ID yet.
    pub const NODE_NOT_FOUND: &str = "NodeNotFound";
    /// Message of [`NODE_NOT_FOUND`].
    pub const NODE_NOT_FOUND_MESSAGE: &str = "Node not registered with cluster";
    /// Registered=False: several Nodes have the claim's provider ID.
    pub const MULTIPLE_NODES_FOUND: &str = "MultipleNodesFound";
    /// Initialized=True.
    pub const INITIALIZED: &str = "Initialized";
    /// Initialized=Unknown: the Node's Ready condition is not True.
    pub const NODE_NOT_READY: &str = "NodeNotReady";
    /// Initialized=Unknown: a startup taint of the claim is still on the Node.
    pub const STARTUP_TAINTS_EXIST: &str = "StartupTaintsExist";
    /// Initialized=Unknown: a taint the node's components remove on start-up is still there.
    pub const KNOWN_EPHEMERAL_TAINTS_EXIST: &str = "KnownEphemeralTaintsExist";
    /// Initialized=Unknown: a requested extended resource is not allocatable on the Node yet.
    pub const RESOURCE_NOT_REGISTERED: &str = "ResourceNotRegistered";
    /// Ready=True.
    pub const READY: &str = "Ready";
    /// Ready=False/Unknown: one of Launched, Registered, Initialized is not True.
    pub const UNHEALTHY_DEPENDENTS: &str = "UnhealthyDependents";
    /// Ready is Unknown: no dependent is False, some are not True yet.
    pub const RECONCILING_DEPENDENTS: &str = "ReconcilingDependents";
    /// InstanceTerminating=True.
    pub const INSTANCE_TERMINATING: &str = "InstanceTerminating";
}

/// The conditions Ready depends on, in lifecycle order.
pub const DEPENDENTS: [&str; 3] = [LAUNCHED, REGISTERED, INITIALIZED];

/// Taints that the kubelet, the node lifecycle controller, a cloud controller manager or
/// registration place on a starting node and remove once it is usable; a node carrying one is not
/// initialized.
pub const KNOWN_EPHEMERAL_TAINTS: [&str; 4] =
    [TAINT_NODE_NOT_READY, TAINT_NODE_UNREACHABLE, TAINT_EXTERNAL_CLOUD_PROVIDER, TAINT_UNREGISTERED];

/// Time from `since` to `now`; zero when `since` lies in the future.
pub fn elapsed(since: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or_default()
}

/// Adds Launched, Registered and Initialized as Unknown when missing, so that a new claim shows
/// what it is waiting for.
pub fn initialize_conditions(conditions: &mut Vec<Condition>, generation: Option<i64>, now: Timestamp) {
    for type_ in DEPENDENTS {
        if condition(conditions, type_).is_none() {
            let update = ConditionUpdate::unknown(
                reasons::AWAITING_RECONCILIATION,
                reasons::AWAITING_RECONCILIATION_MESSAGE,
            );
            set_condition(conditions, type_, update, generation, now);
        }
    }
}

/// The Ready condition: True once Launched, Registered and Initialized are; otherwise False when
/// one of them is False (`UnhealthyDependents`), else Unknown (`ReconcilingDependents`), naming
/// the conditions that are not True, as upstream's condition sets do.
pub fn ready(conditions: &[Condition]) -> ConditionUpdate {
    let mut pending = Vec::new();
    let mut failed = false;
    for type_ in DEPENDENTS {
        let status = condition(conditions, type_).map_or(ConditionStatus::Unknown, |c| c.status);
        match status {
            ConditionStatus::True => {}
            ConditionStatus::False => {
                failed = true;
                pending.push(format!("{type_}=False"));
            }
            ConditionStatus::Unknown => pending.push(format!("{type_}=Unknown")),
        }
    }
    if pending.is_empty() {
        ConditionUpdate::true_(reasons::READY)
    } else if failed {
        ConditionUpdate::false_(reasons::UNHEALTHY_DEPENDENTS, pending.join(", "))
    } else {
        ConditionUpdate::unknown(reasons::RECONCILING_DEPENDENTS, pending.join(", "))
    }
}

/// Sets Ready from the dependents; returns whether it changed.
pub fn update_ready(conditions: &mut Vec<Condition>, generation: Option<i64>, now: Timestamp) -> bool {
    let update = ready(conditions);
    set_condition(conditions, READY, update, generation, now)
}

/// Writes what the cloud provider reports about the launched `instance` into `claim`: provider ID,
/// image, capacity and allocatable into the status; the instance's labels, the labels the claim's
/// requirements pin to one value, and the claim's own labels (which win, in that order) into the
/// labels; the instance's annotations over the claim's.
pub fn apply_instance(claim: &mut NodeClaim, instance: &Instance) {
    let mut labels = instance.labels.clone();
    for (key, value) in [
        (LABEL_INSTANCE_TYPE, &instance.instance_type),
        (LABEL_TOPOLOGY_ZONE, &instance.zone),
        (LABEL_CAPACITY_TYPE, &instance.capacity_type),
    ] {
        if !value.is_empty() {
            labels.entry(key.to_string()).or_insert_with(|| value.clone());
        }
    }
    if let Ok(requirements) = Requirements::from_nodepool(&claim.spec.requirements) {
        labels
            .extend(requirements.single_valued_labels().into_iter().filter(|(k, _)| !is_restricted_label(k)));
    }
    labels.extend(claim.labels().iter().map(|(k, v)| (k.clone(), v.clone())));
    *claim.labels_mut() = labels;
    let annotations = claim.annotations_mut();
    annotations.extend(instance.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));

    let status = claim.status.get_or_insert_with(Default::default);
    status.provider_id = Some(instance.provider_id.clone());
    if !instance.image_id.is_empty() {
        status.image_id = Some(instance.image_id.clone());
    }
    if !instance.capacity.is_empty() {
        status.capacity = Some(instance.capacity.clone());
    }
    if !instance.allocatable.is_empty() {
        status.allocatable = Some(instance.allocatable.clone());
    }
}

/// What liveness decides for a claim that is not being deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Keep the claim; check again after the given time, if a deadline is running.
    Alive(Option<Duration>),
    /// Delete the claim: it did not launch or register in time.
    Expired {
        /// Event reason.
        reason: &'static str,
        /// The `reason` label of `nodeclaims_disrupted`.
        metric_reason: &'static str,
        /// Why, for the event and the log.
        message: String,
    },
}

/// Whether `claim` launched within [`LAUNCH_TTL`] of its creation and registered within
/// [`REGISTRATION_TTL`] of its launch.
pub fn liveness(claim: &NodeClaim, now: Timestamp) -> Liveness {
    let conditions = claim.conditions();
    let created = claim.metadata.creation_timestamp.as_ref().map(|t| t.0);
    if !is_true(conditions, LAUNCHED) {
        let Some(created) = created else { return Liveness::Alive(None) };
        let age = elapsed(created, now);
        return match LAUNCH_TTL.checked_sub(age) {
            Some(left) if !left.is_zero() => Liveness::Alive(Some(left)),
            _ => Liveness::Expired {
                reason: crate::controllers::events::reasons::LAUNCH_FAILED,
                metric_reason: "launch_timeout",
                message: format!("NodeClaim did not launch within {}s of its creation", LAUNCH_TTL.as_secs()),
            },
        };
    }
    if is_true(conditions, REGISTERED) {
        return Liveness::Alive(None);
    }
    let launched = condition(conditions, LAUNCHED)
        .and_then(|c| c.last_transition_time.parse::<Timestamp>().ok())
        .or(created);
    let Some(launched) = launched else { return Liveness::Alive(None) };
    match REGISTRATION_TTL.checked_sub(elapsed(launched, now)) {
        Some(left) if !left.is_zero() => Liveness::Alive(Some(left)),
        _ => Liveness::Expired {
            reason: crate::controllers::events::reasons::REGISTRATION_TIMEOUT,
            metric_reason: "registration_timeout",
            message: format!(
                "Node did not register within {}s of the NodeClaim's launch",
                REGISTRATION_TTL.as_secs()
            ),
        },
    }
}

/// The time by which a deleted claim's node must be gone, `deletionTimestamp +
/// spec.terminationGracePeriod` (RFC 3339), when it is not yet recorded in the
/// `karpenter.sh/nodeclaim-termination-timestamp` annotation the node termination controller reads.
pub fn termination_deadline(claim: &NodeClaim) -> Option<String> {
    if claim.annotations().contains_key(ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP) {
        return None;
    }
    let deleted = claim.metadata.deletion_timestamp.as_ref()?.0;
    let grace = parse_duration(claim.spec.termination_grace_period.as_deref()?).ok()?;
    deleted.checked_add(grace).ok().map(crate::apis::common::transition_time)
}

/// Shortens a cloud provider's error message for a condition, as upstream does.
pub fn launch_failure_message(message: &str) -> String {
    const MAX: usize = 300;
    if message.len() <= MAX {
        return message.to_string();
    }
    let mut end = MAX;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

/// Whether `node` is initialized for `claim`: Ready, without the claim's startup taints or known
/// ephemeral taints, and with every extended resource the claim requested allocatable. Otherwise
/// the Initialized condition to write.
pub fn initialization(claim: &NodeClaim, node: &Node) -> Result<(), ConditionUpdate> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if !ready {
        return Err(ConditionUpdate::unknown(reasons::NODE_NOT_READY, "Node status is NotReady"));
    }
    let taints = node_taints(node);
    if let Some(t) = claim.spec.startup_taints.iter().find(|s| taints.iter().any(|t| same_taint(s, t))) {
        return Err(ConditionUpdate::unknown(
            reasons::STARTUP_TAINTS_EXIST,
            format!("StartupTaint {:?} still exists", describe(t)),
        ));
    }
    if let Some(t) = taints.iter().find(|t| KNOWN_EPHEMERAL_TAINTS.contains(&t.key.as_str())) {
        return Err(ConditionUpdate::unknown(
            reasons::KNOWN_EPHEMERAL_TAINTS_EXIST,
            format!("KnownEphemeralTaint {:?} still exists", t.key),
        ));
    }
    let requests = claim.spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    for (name, quantity) in requests.into_iter().flatten() {
        if !is_extended_resource(name) || is_zero(&quantity.0) {
            continue;
        }
        if allocatable.and_then(|a| a.get(name)).is_none_or(|q| is_zero(&q.0)) {
            return Err(ConditionUpdate::unknown(
                reasons::RESOURCE_NOT_REGISTERED,
                format!("Resource {name:?} was requested but not registered"),
            ));
        }
    }
    Ok(())
}

/// Whether `name` is an extended resource (a device plugin's, like `nvidia.com/gpu`), not one of
/// Kubernetes' own.
pub fn is_extended_resource(name: &str) -> bool {
    match name.split_once('/') {
        Some((domain, _)) => {
            domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io") && !name.starts_with("requests.")
        }
        None => false,
    }
}

fn is_zero(quantity: &str) -> bool {
    parse_quantity(quantity, 1000).is_none_or(|v| v <= 0)
}

fn node_taints(node: &Node) -> &[NodeTaint] {
    node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default()
}

fn same_taint(claim: &Taint, node: &NodeTaint) -> bool {
    claim.key == node.key
        && claim.effect.as_str() == node.effect
        && claim.value.as_deref().unwrap_or_default() == node.value.as_deref().unwrap_or_default()
}

fn describe(t: &Taint) -> String {
    match &t.value {
        Some(v) => format!("{}={}:{}", t.key, v, t.effect.as_str()),
        None => format!("{}:{}", t.key, t.effect.as_str()),
    }
}

/// The Node `node` becomes once registered for `claim`: the termination finalizer, an owner
/// reference to the claim, the claim's labels and annotations, `karpenter.sh/registered=true`,
/// the claim's taints (and, at registration, its startup taints, which other agents remove later)
/// unless the Node itself is labelled `karpenter.sh/do-not-sync-taints=true`, and no
/// `karpenter.sh/unregistered` taint.
pub fn registered_node(claim: &NodeClaim, node: &Node) -> Node {
    let sync_taints = node.labels().get(LABEL_DO_NOT_SYNC_TAINTS).is_none_or(|v| v != "true");
    let mut out = node.clone();
    let meta = &mut out.metadata;
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers.iter().any(|f| f == FINALIZER_TERMINATION) {
        finalizers.push(FINALIZER_TERMINATION.to_string());
    }
    if let Some(reference) = owner_reference(claim) {
        let owners = meta.owner_references.get_or_insert_with(Vec::new);
        if !owners.iter().any(|o| o.uid == reference.uid) {
            owners.push(reference);
        }
    }
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.extend(claim.labels().iter().map(|(k, v)| (k.clone(), v.clone())));
    labels.insert(LABEL_REGISTERED.to_string(), "true".to_string());
    if !claim.annotations().is_empty() {
        let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
        annotations.extend(claim.annotations().iter().map(|(k, v)| (k.clone(), v.clone())));
    }

    let mut taints: Vec<NodeTaint> =
        node_taints(node).iter().filter(|t| t.key != TAINT_UNREGISTERED).cloned().collect();
    let mut wanted: Vec<&Taint> = if sync_taints { claim.spec.taints.iter().collect() } else { Vec::new() };
    if sync_taints && !claim.is_true(REGISTERED) {
        wanted.extend(claim.spec.startup_taints.iter());
    }
    for t in wanted {
        if !taints.iter().any(|n| n.key == t.key && n.effect == t.effect.as_str()) {
            taints.push(t.to_k8s());
        }
    }
    let had_taints = node.spec.as_ref().is_some_and(|s| s.taints.is_some());
    if had_taints || !taints.is_empty() {
        out.spec.get_or_insert_with(Default::default).taints = Some(taints);
    }
    out
}

/// The owner reference a claim's Node carries (none without a uid).
pub fn owner_reference(claim: &NodeClaim) -> Option<OwnerReference> {
    let uid = claim.metadata.uid.clone()?;
    Some(OwnerReference {
        api_version: NodeClaim::api_version(&()).into_owned(),
        kind: NodeClaim::kind(&()).into_owned(),
        name: claim.name_any(),
        uid,
        block_owner_deletion: Some(true),
        controller: None,
    })
}

/// The NodePool label of a claim (`""` when missing), for metrics.
pub fn nodepool(claim: &NodeClaim) -> String {
    claim.labels().get(LABEL_NODEPOOL).cloned().unwrap_or_default()
}

/// Labels of `nodeclaims_terminated`: nodepool, capacity type and zone.
pub fn terminated_labels(claim: &NodeClaim) -> crate::metrics::Labels {
    let label = |k: &str| claim.labels().get(k).cloned().unwrap_or_default();
    vec![
        ("nodepool", label(LABEL_NODEPOOL)),
        ("capacity_type", label(LABEL_CAPACITY_TYPE)),
        ("zone", label(LABEL_TOPOLOGY_ZONE)),
    ]
}

/// Whether `node` is the claim's: its provider ID equals the claim's.
pub fn is_claims_node(claim: &NodeClaim, node: &Node) -> bool {
    let claimed = claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty());
    let actual = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    claimed.is_some() && claimed == actual
}
