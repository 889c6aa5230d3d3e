//! The scheduling engine: given a snapshot of pending pods, NodePools with their instance types,
//! and existing nodes, decide where each pod goes and which NodeClaims to launch.
//!
//! This is pure code over its input: no I/O, no clock, no randomness; the same input always
//! produces the same output.
//!
//! # Using it
//!
//! 1. Describe each NodePool with [`NodePoolInput::from_nodepool`] (template requirements and
//!    labels, taints, weight, and limits minus the resources its nodes use now) and the
//!    [`InstanceType`]s the cloud provider offers for it (shared as `Arc`s).
//! 2. Describe existing nodes and in-flight NodeClaims as [`ExistingNode`]s: labels, taints,
//!    allocatable, the requests already bound (including DaemonSet pods still to come on nodes
//!    that are not initialized) and the bound pods (for topology and host ports).
//! 3. Pass the pending pods (shared as `Arc`s, like the bound pods, so the cluster-state cache's
//!    copies serve as they are), one pod per DaemonSet (built from its template), namespace
//!    labels (for affinity namespace selectors) and the claims, volumes, storage classes and
//!    CSINodes (a [`VolumeInput`]) in a [`SchedulingInput`] to [`schedule`].
//! 4. Create a NodeClaim for each [`NewNodeClaim`] (its `node_selector_requirements()`, `labels`,
//!    `taints`, `startup_taints` and `requests.to_list()`), nominate the pods of
//!    [`ExistingPlacement`]s, and report every [`PodError`] as an event on its pod.
//!
//! # What is modelled
//!
//! Resource requests (init containers, sidecars, overhead), node selectors and required node
//! affinity (ORed terms tried in turn), preferred node affinity, taints and tolerations (startup
//! and known ephemeral taints ignored on nodes not yet initialized), host ports, topology spread
//! constraints (`DoNotSchedule`, and `ScheduleAnyway` until relaxed; `nodeAffinityPolicy` and
//! `nodeTaintsPolicy` decide which nodes, existing or new, count), required and preferred pod
//! affinity and anti-affinity including the inverse direction, NodePool weights, limits and
//! `minValues`, DaemonSet overhead, volume zones (bound PersistentVolumes and StorageClass
//! `allowedTopologies`) and CSI attach limits of existing nodes (see [`volumes`]), and the
//! instances capacity reservations have left (see [`reservations`]). Not modelled: pod
//! priority/preemption.
//!
//! # Choosing instance types
//!
//! Under [`Packing::CostAware`] (the default) a NodeClaim closes at the size where it is cheapest
//! per unit of its binding resource, exotic types (bare metal, GPUs, accelerators; see
//! [`InstanceType::is_exotic`]) are left off NodeClaims that other types can hold, and CPU-heavy
//! and memory-heavy pods alternate so that nodes fill both; [`Packing::LargestFit`] is the
//! previous rule, kept for comparison. [`cost`] prices plans and bounds what any plan could cost.

pub mod cost;
pub mod daemonsets;
pub mod defaultspread;
pub mod hostports;
pub mod instancetypes;
pub mod learned;
pub mod overlay;
pub mod requirements;
pub mod reservations;
pub mod resources;
pub mod scheduler;
pub mod taints;
pub mod topology;
pub mod values;
pub mod volumes;
pub mod zones;

mod input;
mod pools;

pub use input::template_requirements;
pub use instancetypes::{InstanceType, Offering, Overhead, OverlayMarks, Reservation};
pub use requirements::{Requirement, Requirements};
pub use resources::Resources;
pub use scheduler::{
    ExistingNode, ExistingPlacement, FEWER_NODES_MARGIN, MinValuesPolicy, NewNodeClaim, NodePoolInput,
    Packing, PodError, PodRef, PreferencePolicy, PreparedRun, SchedulerOptions, SchedulingError,
    SchedulingInput, SchedulingResults, prepare, schedule,
};
pub use values::ValueSet;
pub use volumes::VolumeInput;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
