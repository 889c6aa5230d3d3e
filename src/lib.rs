//! karpenter-rs: a drop-in compatible implementation of Karpenter, the Kubernetes node
//! autoscaler, for AWS EKS.
//!
//! The crate is organised as upstream's concepts are: [`apis`] holds the custom resources and the
//! well-known names; [`scheduling`] the pure bin-packing simulation that decides what to launch;
//! [`cloudprovider`] the one trait through which the cloud is reached, and its EC2
//! implementation; [`operator`] the settings, leader election and endpoints around the
//! controllers; [`simulate`] the offline `karpenter simulate` command; the binary in `main.rs`
//! wires the subcommands.

pub mod apis;
pub mod cloudprovider;
pub mod controllers;
pub mod convert;
pub mod disruption;
pub mod operator;
pub mod scheduling;
pub mod simulate;
pub mod state;
pub mod tools;
