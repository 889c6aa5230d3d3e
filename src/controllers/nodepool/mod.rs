//! Controllers of NodePools: their status (resources, node count, conditions) and hash.

pub mod status;
