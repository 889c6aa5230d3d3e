//! The scheduling engine: given a snapshot of pending pods, NodePools with their instance types,
//! and existing nodes, decide where each pod goes and which NodeClaims to launch.
//!
//! This is pure code over its input: no I/O, no clock, no randomness; the same input always
//! produces the same output.

pub mod instancetypes;
pub mod requirements;
pub mod resources;
pub mod taints;
