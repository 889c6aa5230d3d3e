//! The cloud provider: what the controllers ask of the cloud (launch, find, terminate instances,
//! list the instance types a NodePool may use, detect drift), behind one trait.
//!
//! [`aws`] implements it for EC2, [`kwok`] with Node objects that kwok keeps alive.

pub mod aws;
pub mod catalog;
pub mod kwok;
pub mod metered;
pub mod overlay;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use thiserror::Error;

use crate::apis::{NodeClaim, NodePool, ResourceList};
use crate::scheduling::instancetypes::InstanceType;
use crate::scheduling::{Requirements, Resources};

/// A boxed, sendable future: the trait's methods return these so that `dyn CloudProvider` works.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Result of a cloud provider call.
pub type Result<T, E = CloudProviderError> = std::result::Result<T, E>;

/// The cloud as the controllers see it.
///
/// The methods return boxed futures rather than being `async fn` so that the trait stays
/// dyn-compatible: controllers hold an `Arc<dyn CloudProvider>` and tests may swap it.
pub trait CloudProvider: Send + Sync {
    /// Launches an instance for `node_claim`. Idempotent: when an instance tagged with the claim's
    /// name already exists, it is returned instead of launching another one.
    fn create<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Instance>>;

    /// Terminates the instance of `node_claim` (by its provider ID). Returns
    /// [`CloudProviderError::NotFound`] once the instance is gone, so callers can tell when
    /// termination has finished.
    fn delete<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<()>>;

    /// The instance with `provider_id`, or [`CloudProviderError::NotFound`].
    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<Instance>>;

    /// Every live instance this cluster's Karpenter launched.
    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>>>;

    /// The instance types `node_pool` may launch, with their offerings and current availability.
    fn instance_types<'a>(&'a self, node_pool: &'a NodePool)
    -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>>;

    /// Whether the instance of `node_claim` no longer matches its node class, and why.
    fn is_drifted<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Option<DriftReason>>>;

    /// [`CloudProvider::is_drifted`] for each of `node_claims`, in order. A provider that can
    /// look at many instances in one call answers with few calls (AWS: one DescribeInstances per
    /// 200 claims); by default, one call per claim.
    fn are_drifted<'a>(
        &'a self,
        node_claims: &'a [&'a NodeClaim],
    ) -> BoxFuture<'a, Vec<Result<Option<DriftReason>>>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(node_claims.len());
            for claim in node_claims {
                out.push(self.is_drifted(claim).await);
            }
            out
        })
    }

    /// Whether `class`, the node class `reference` names (`None`: it does not exist), can launch
    /// nodes, and why not. The NodeClaim lifecycle and the NodePool status ask here. By default the
    /// shared judgement of [`crate::state::nodeclass::readiness`]: an EC2NodeClass whose `Ready`
    /// condition is True and that is not being deleted.
    fn node_class_readiness(
        &self,
        reference: &crate::apis::NodeClassReference,
        class: Option<&crate::apis::EC2NodeClass>,
    ) -> std::result::Result<(), crate::state::nodeclass::NodeClassProblem> {
        crate::state::nodeclass::readiness(reference, class)
    }

    /// The node conditions that make a node unhealthy enough to be replaced, and for how long
    /// each is tolerated (node repair, behind the `NodeRepair` feature gate). None by default.
    fn repair_policies(&self) -> Vec<crate::disruption::repair::RepairPolicy> {
        Vec::new()
    }

    /// Name of the provider (`aws`).
    fn name(&self) -> &'static str;
}

/// A launched instance, as a NodeClaim's status and labels record it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Instance {
    /// `aws:///<zone>/<instance-id>`.
    pub provider_id: String,
    /// Instance type name.
    pub instance_type: String,
    /// Availability zone.
    pub zone: String,
    /// `spot` or `on-demand`.
    pub capacity_type: String,
    /// Image the instance boots.
    pub image_id: String,
    /// Name of the NodeClaim the instance was launched for (from its tags).
    pub node_claim: Option<String>,
    /// Name of the NodePool (from its tags).
    pub node_pool: Option<String>,
    /// Lifecycle state (`pending`, `running`, `shutting-down`, ...).
    pub state: String,
    /// Launch time (RFC 3339), when known.
    pub launch_time: Option<String>,
    /// Resources of the instance type (empty when the type is not in the catalog).
    pub capacity: ResourceList,
    /// Capacity minus the node's overhead.
    pub allocatable: ResourceList,
    /// Labels the node gets: the instance type's single-valued labels, zone, capacity type, ...
    pub labels: BTreeMap<String, String>,
    /// Annotations for the NodeClaim (the node-class hash used for drift detection).
    pub annotations: BTreeMap<String, String>,
}

/// One offering that was tried: instance type, zone and capacity type.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OfferingKey {
    /// Instance type name.
    pub instance_type: String,
    /// Availability zone.
    pub zone: String,
    /// `spot` or `on-demand`.
    pub capacity_type: String,
}

impl fmt::Display for OfferingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.instance_type, self.zone, self.capacity_type)
    }
}

/// Why an instance no longer matches its node class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriftReason {
    /// The instance's AMI is no longer among the class's AMIs.
    Ami,
    /// The instance's subnet is no longer among the class's subnets.
    Subnet,
    /// The instance's security groups differ from the class's.
    SecurityGroup,
    /// The class spec changed since the instance was launched.
    NodeClass,
    /// The node is not in the placement group the class resolves to now (or is in one the
    /// class no longer names).
    PlacementGroup,
    /// The instance is in a capacity reservation the class no longer selects.
    CapacityReservation,
}

impl DriftReason {
    /// The reason as upstream Karpenter writes it in the Drifted condition.
    pub fn as_str(&self) -> &'static str {
        match self {
            DriftReason::Ami => "AMIDrift",
            DriftReason::Subnet => "SubnetDrift",
            DriftReason::SecurityGroup => "SecurityGroupDrift",
            DriftReason::NodeClass => "NodeClassDrift",
            DriftReason::PlacementGroup => "PlacementGroupDrift",
            DriftReason::CapacityReservation => "CapacityReservationDrift",
        }
    }
}

impl fmt::Display for DriftReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the cloud provider.
#[derive(Debug, Error)]
pub enum CloudProviderError {
    /// The instance does not exist (any more).
    #[error("instance {0} not found")]
    NotFound(String),
    /// None of the offerings tried had capacity.
    #[error("insufficient capacity in all {} offerings tried: {}", offerings.len(), list(offerings))]
    InsufficientCapacity {
        /// The offerings tried.
        offerings: Vec<OfferingKey>,
    },
    /// The node class is missing or has not been resolved (subnets, AMIs, ...) successfully.
    #[error("node class {name} is not ready: {reason}")]
    NodeClassNotReady {
        /// Name of the node class.
        name: String,
        /// What is missing.
        reason: String,
    },
    /// The node class the NodeClaim references does not exist, or is of a kind the provider does
    /// not serve: the NodeClaim cannot launch, ever.
    #[error("node class {name} not found: {reason}")]
    NodeClassNotFound {
        /// Name of the node class.
        name: String,
        /// Details.
        reason: String,
    },
    /// No instance type satisfies the NodeClaim's requirements and resource requests.
    #[error("no instance type satisfies the requirements of node claim {node_claim}: {reason}")]
    NoCompatibleInstanceTypes {
        /// Name of the NodeClaim.
        node_claim: String,
        /// Details.
        reason: String,
    },
    /// The NodeClaim handed to the provider is malformed (no provider ID where one is needed,
    /// requirements or requests that do not parse, ...).
    #[error("node claim {name:?} is malformed: {reason}")]
    InvalidNodeClaim {
        /// Name of the NodeClaim.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A provider ID that is not of the provider's form (`aws:///<zone>/<instance-id>`,
    /// `kwok://<node name>`).
    #[error("invalid provider ID {0:?}")]
    InvalidProviderId(String),
    /// A cloud API call failed.
    #[error("{operation} failed: {code}: {message}")]
    Api {
        /// The API operation (`CreateFleet`, ...).
        operation: &'static str,
        /// The error code returned (empty when the call failed before a response).
        code: String,
        /// The error message.
        message: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The cloud answered something the provider cannot use.
    #[error("unexpected response from {operation}: {message}")]
    UnexpectedResponse {
        /// The API operation.
        operation: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The provider's configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The NodeOverlays have not been evaluated against the NodePool's instance types yet (it is
    /// new, or the overlay controller has not run since start): the NodePool waits.
    #[error("applying nodeoverlays")]
    AwaitingOverlayEvaluation(#[from] crate::scheduling::overlay::AwaitingEvaluation),
}

impl CloudProviderError {
    /// Whether the error means the instance is gone.
    pub fn is_not_found(&self) -> bool {
        matches!(self, CloudProviderError::NotFound(_))
    }

    /// The error code of a failed API call.
    pub fn api_code(&self) -> Option<&str> {
        match self {
            CloudProviderError::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

fn list(offerings: &[OfferingKey]) -> String {
    offerings.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

/// The requirements and resource requests of a NodeClaim, or
/// [`CloudProviderError::InvalidNodeClaim`] naming the field that does not parse.
pub fn claim_requirements(node_claim: &NodeClaim, claim_name: &str) -> Result<(Requirements, Resources)> {
    let invalid =
        |reason: String| CloudProviderError::InvalidNodeClaim { name: claim_name.to_string(), reason };
    let reqs = Requirements::from_nodepool(&node_claim.spec.requirements)
        .map_err(|e| invalid(format!("spec.requirements: {e}")))?;
    let requests = node_claim
        .spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .map(Resources::from_list)
        .transpose()
        .map_err(|e| invalid(format!("spec.resources.requests: {e}")))?
        .unwrap_or_default();
    Ok((reqs, requests))
}

/// Parses `aws:///<zone>/<instance-id>` into `(zone, instance-id)`.
pub fn parse_provider_id(provider_id: &str) -> Result<(String, String)> {
    let invalid = || CloudProviderError::InvalidProviderId(provider_id.to_string());
    let rest = provider_id.strip_prefix("aws:///").ok_or_else(invalid)?;
    let (zone, id) = rest.split_once('/').ok_or_else(invalid)?;
    if zone.is_empty() || !id.starts_with("i-") || id.contains('/') {
        return Err(invalid());
    }
    Ok((zone.to_string(), id.to_string()))
}

/// Formats the provider ID of instance `id` in `zone`.
pub fn provider_id(zone: &str, id: &str) -> String {
    format!("aws:///{zone}/{id}")
}

/// A named task of a provider's controllers, ending when its stop signal turns true.
pub type ProviderTask = (&'static str, BoxFuture<'static, ()>);

/// What a provider runs besides answering [`CloudProvider`]: its own controllers (the AWS
/// provider's node-class status, refreshes, interruption handling; kwok's node-class status).
/// The operator starts them with the others when this process leads, without naming the provider.
pub trait ProviderControllers: Send + Sync {
    /// The provider's controllers over `state`, each stopping when `stop` turns true, and a signal
    /// that completes once the provider has fetched what launches need (instance types, prices):
    /// the provisioner waits a little for it.
    fn start(
        &self,
        ctx: &crate::controllers::Context,
        state: &crate::state::ClusterState,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> (Vec<ProviderTask>, Option<tokio::sync::oneshot::Receiver<()>>);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_round_trip() {
        let id = provider_id("us-west-2a", "i-0123");
        assert_eq!(id, "aws:///us-west-2a/i-0123");
        assert_eq!(parse_provider_id(&id).unwrap(), ("us-west-2a".into(), "i-0123".into()));
        for bad in ["", "aws://us-west-2a/i-1", "aws:///i-1", "aws:///z/x-1", "gce:///z/i-1"] {
            assert!(matches!(parse_provider_id(bad), Err(CloudProviderError::InvalidProviderId(_))), "{bad}");
        }
    }

    #[test]
    fn errors_render() {
        let e = CloudProviderError::InsufficientCapacity {
            offerings: vec![OfferingKey {
                instance_type: "m5.large".into(),
                zone: "us-west-2a".into(),
                capacity_type: "spot".into(),
            }],
        };
        assert_eq!(e.to_string(), "insufficient capacity in all 1 offerings tried: m5.large/us-west-2a/spot");
        assert!(CloudProviderError::NotFound("x".into()).is_not_found());
        assert_eq!(DriftReason::Ami.to_string(), "AMIDrift");
    }
}
