//! The Karpenter APIs: `NodePool` and `NodeClaim` (karpenter.sh/v1), `EC2NodeClass`
//! (karpenter.k8s.aws/v1), `NodeOverlay` (karpenter.sh/v1alpha1) and `CapacityBuffer`
//! (autoscaling.x-k8s.io/v1beta1), with the schema, CEL validation rules and printer columns of upstream's
//! CRDs, and the well-known names in [`labels`].

// Repeated `printcolumn(...)` arguments of the CustomResource derive are distinct columns, not
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod capacitybuffer;
pub mod common;
pub mod crds;
pub mod ec2nodeclass;
pub mod hash;
pub mod hashstructure;
pub mod labels;
pub mod nodeclaim;
pub mod nodelabels;
pub mod nodeoverlay;
pub mod nodepool;
pub mod pod;
pub mod values;

pub use capacitybuffer::{CapacityBuffer, CapacityBufferSpec, CapacityBufferStatus};
pub use common::{
    Condition, ConditionStatus, NodeClassReference, NodeSelectorRequirementWithMinValues, Operator,
    ResourceList, Taint, TaintEffect,
};
pub use ec2nodeclass::{EC2NodeClass, EC2NodeClassSpec, EC2NodeClassStatus};
pub use nodeclaim::{NodeClaim, NodeClaimSpec, NodeClaimStatus};
pub use nodeoverlay::{NodeOverlay, NodeOverlaySpec, NodeOverlayStatus};
pub use nodepool::{NodePool, NodePoolSpec, NodePoolStatus};
