//! Controllers of Nodes: termination (drain, then the instance) of the nodes Karpenter launched.

pub mod termination;
