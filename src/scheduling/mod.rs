//! The scheduling engine: given a snapshot of pending pods, NodePools with their instance types,
//! and existing nodes, decide where each pod goes and which NodeClaims to launch.
//!
//! This is pure code over its input: no I/O, no clock, no randomness; the same input always
//! produces the same output.

pub mod hostports;
pub mod instancetypes;
pub mod requirements;
pub mod resources;
pub mod scheduler;
pub mod taints;
pub mod topology;

pub use instancetypes::{InstanceType, Offering, Overhead};
pub use requirements::{Requirement, Requirements};
pub use resources::Resources;
pub use scheduler::{
    ExistingNode, ExistingPlacement, MinValuesPolicy, NewNodeClaim, NodePoolInput, PodError, PodRef,
    SchedulerOptions, SchedulingError, SchedulingInput, SchedulingResults, schedule,
};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
