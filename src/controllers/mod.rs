//! The controllers: thin reconcilers that observe the cluster, ask the pure parts
//! ([`crate::scheduling`]) or the cloud provider what to do, and apply the answer.
//!
//! Every controller receives the shared [`Context`]: the Kubernetes client, the one
//! [`CloudProvider`], the settings, the metrics and the event recorder.

pub mod capacitybuffer;
pub mod departures;
pub mod disruption;
pub mod events;
pub mod kit;
pub mod learned;
pub mod node;
pub mod nodeclaim;
pub mod nodeoverlay;
pub mod nodepool;
pub mod pod_metrics;
pub mod provisioning;
pub mod settings;
pub mod snapshot;
pub mod status_metrics;
pub mod surge;

use std::sync::Arc;

use kube::Client;

use crate::cloudprovider::CloudProvider;
use crate::metrics::Metrics;

pub use events::Events;
pub use settings::Settings;

/// What every controller shares.
#[derive(Clone)]
pub struct Context {
    /// The API server.
    pub client: Client,
    /// The cloud, through its one trait.
    pub cloud: Arc<dyn CloudProvider>,
    /// The controller's settings.
    pub settings: Arc<Settings>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Kubernetes events.
    pub events: Events,
    /// The disruption controller's latest per-node decisions, served on the metrics port.
    pub decisions: crate::disruption::record::Decisions,
    /// Whether surges of opted-in workloads may be under way.
    pub surges: Arc<surge::Surges>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("cloud", &self.cloud.name()).finish_non_exhaustive()
    }
}
