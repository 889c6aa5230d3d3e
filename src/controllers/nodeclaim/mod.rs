//! Controllers of NodeClaims: their lifecycle from launch to finalization, drift marking, and the
//! garbage collection of instances no NodeClaim accounts for.

pub mod drift;
pub mod garbagecollection;
pub mod lifecycle;
