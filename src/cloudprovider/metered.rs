//! A [`CloudProvider`] decorator that times every call and counts failures, as
//! `karpenter_cloudprovider_duration_seconds` and `karpenter_cloudprovider_errors_total`.

use std::sync::Arc;
use std::time::Instant;

use super::{BoxFuture, CloudProvider, CloudProviderError, DriftReason, Instance, Result};
use crate::apis::{NodeClaim, NodePool};
use crate::metrics::{Metrics, observe};
use crate::scheduling::InstanceType;

/// Wraps a provider and records metrics about its calls.
pub struct Metered {
    inner: Arc<dyn CloudProvider>,
    metrics: Arc<Metrics>,
}

impl Metered {
    /// Meters `inner`.
    pub fn new(inner: Arc<dyn CloudProvider>, metrics: Arc<Metrics>) -> Self {
        Metered { inner, metrics }
    }

    async fn timed<T>(&self, method: &'static str, fut: BoxFuture<'_, Result<T>>) -> Result<T> {
        let start = Instant::now();
        let result = fut.await;
        self.observe(method, start.elapsed(), result.as_ref().err());
        result
    }

    /// Records one call of `method` that took `elapsed` and failed with `error`, if it did.
    fn observe(
        &self,
        method: &'static str,
        elapsed: std::time::Duration,
        error: Option<&CloudProviderError>,
    ) {
        let provider = self.inner.name().to_string();
        observe(
            &self.metrics.cloudprovider_duration,
            vec![
                ("controller", String::new()),
                ("method", method.to_string()),
                ("provider", provider.clone()),
            ],
            elapsed,
        );
        if let Some(error) = error
            && !error.is_not_found()
        {
            self.metrics
                .cloudprovider_errors
                .get_or_create(&vec![
                    ("controller", String::new()),
                    ("method", method.to_string()),
                    ("provider", provider),
                    ("error", error_kind(error).to_string()),
                ])
                .inc();
        }
    }
}

/// A short, bounded name of the error for the metric label.
fn error_kind(error: &CloudProviderError) -> &'static str {
    match error {
        CloudProviderError::NotFound(_) => "NotFound",
        CloudProviderError::InsufficientCapacity { .. } => "InsufficientCapacity",
        CloudProviderError::NodeClassNotReady { .. } => "NodeClassNotReady",
        CloudProviderError::NodeClassNotFound { .. } => "NodeClassNotFound",
        CloudProviderError::NoCompatibleInstanceTypes { .. } => "NoCompatibleInstanceTypes",
        CloudProviderError::InvalidProviderId(_) => "InvalidProviderID",
        CloudProviderError::Api { .. } => "APIError",
        CloudProviderError::UnexpectedResponse { .. } => "UnexpectedResponse",
        CloudProviderError::Config(_) => "Config",
        CloudProviderError::InvalidNodeClaim { .. } => "InvalidNodeClaim",
        CloudProviderError::AwaitingOverlayEvaluation(_) => "UnevaluatedNodePool",
    }
}

impl CloudProvider for Metered {
    fn create<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Instance>> {
        Box::pin(self.timed("Create", self.inner.create(node_claim)))
    }

    fn delete<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.timed("Delete", self.inner.delete(node_claim)))
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<Instance>> {
        Box::pin(self.timed("Get", self.inner.get(provider_id)))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>>> {
        Box::pin(self.timed("List", self.inner.list()))
    }

    fn instance_types<'a>(
        &'a self,
        node_pool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
        Box::pin(self.timed("GetInstanceTypes", self.inner.instance_types(node_pool)))
    }

    fn is_drifted<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Option<DriftReason>>> {
        Box::pin(self.timed("IsDrifted", self.inner.is_drifted(node_claim)))
    }

    fn are_drifted<'a>(
        &'a self,
        node_claims: &'a [&'a NodeClaim],
    ) -> BoxFuture<'a, Vec<Result<Option<DriftReason>>>> {
        Box::pin(async move {
            let start = Instant::now();
            let out = self.inner.are_drifted(node_claims).await;
            self.observe("IsDrifted", start.elapsed(), out.iter().find_map(|r| r.as_ref().err()));
            out
        })
    }

    fn repair_policies(&self) -> Vec<crate::disruption::repair::RepairPolicy> {
        self.inner.repair_policies()
    }

    fn node_class_readiness(
        &self,
        reference: &crate::apis::NodeClassReference,
        class: Option<&crate::apis::EC2NodeClass>,
    ) -> std::result::Result<(), crate::state::nodeclass::NodeClassProblem> {
        self.inner.node_class_readiness(reference, class)
    }

    fn name(&self) -> &'static str {
        self.inner.name()
    }
}
