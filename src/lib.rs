//! karpenter-rs: a drop-in compatible implementation of Karpenter, the Kubernetes node
//! autoscaler, for AWS EKS.
//!
//! The crate is organised as upstream's concepts are: [`apis`] holds the custom resources and the
//! well-known names; the binary in `main.rs` wires the subcommands.

pub mod apis;
pub mod cloudprovider;
pub mod scheduling;
