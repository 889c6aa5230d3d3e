//! Controllers of NodePools: their status (resources, node count, conditions) and hash, and the
//! node count of static NodePools.

pub mod static_capacity;
pub mod status;
