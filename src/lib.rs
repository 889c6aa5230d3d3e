//! karpenter-rs: a drop-in compatible implementation of Karpenter, the Kubernetes node
//! autoscaler, for AWS EKS.
//!
//! The crate is organised as upstream's concepts are, in layers whose imports point down only
//! (`hack/layering.py` checks it), lowest first:
//! - [`util`] and [`metrics`]: errors as text, durations, the Prometheus registry;
//! - [`apis`]: the custom resources and the well-known names;
//! - [`scheduling`]: the pure bin-packing simulation that decides what to launch;
//! - [`state`]: the cluster state the controllers share, and the pure views of a snapshot;
//! - [`disruption`]: the pure decisions of what to disrupt and why;
//! - [`controllers`] and [`cloudprovider`]: the reconcilers, and the one trait through which the
//!   cloud is reached with its EC2 and kwok implementations;
//! - [`operator`]: the wiring: settings, leader election, endpoints, the controller process;
//! - [`tools`]: the commands (`simulate`, `explain`, `top`, `convert`); the binary in `main.rs`
//!   wires them.

pub mod apis;
pub mod cloudprovider;
pub mod controllers;
pub mod disruption;
pub mod metrics;
pub mod operator;
pub mod scheduling;
pub mod state;
pub mod tools;
pub mod util;
