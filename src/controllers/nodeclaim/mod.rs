//! Controllers of NodeClaims: their lifecycle from launch to finalization, drift marking, the
//! consolidatable state disruption reads, expiration, and the garbage collection of instances no
//! NodeClaim accounts for.

pub mod consolidatable;
pub mod drift;
pub mod expiration;
pub mod garbagecollection;
pub mod lifecycle;
