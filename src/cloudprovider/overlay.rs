//! NodeOverlays in the instance types every decision sees: [`Overlaid`] decorates the one
//! [`CloudProvider`] so that a NodePool's instance types come with the overlays applied, from the
//! [`Overlays`] the NodeOverlay controller keeps current. The controller itself reads the
//! undecorated provider, as upstream's does.

use std::sync::{Arc, PoisonError, RwLock};

use super::{BoxFuture, CloudProvider, DriftReason, Instance, Result};
use crate::apis::{NodeClaim, NodePool};
use crate::scheduling::InstanceType;
use crate::scheduling::overlay::OverlayStore;

/// The latest evaluation of the NodeOverlays, shared by the controller that writes it and the
/// readers that apply it.
#[derive(Debug, Default)]
pub struct Overlays(RwLock<Arc<OverlayStore>>);

impl Overlays {
    /// No evaluation yet: every NodePool awaits one.
    pub fn new() -> Arc<Self> {
        Arc::new(Overlays::default())
    }

    /// The latest evaluation.
    pub fn current(&self) -> Arc<OverlayStore> {
        Arc::clone(&self.0.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Replaces the evaluation.
    pub fn replace(&self, store: OverlayStore) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(store);
    }

    /// `types` of the NodePool `pool` as the overlays change them, for a launch: the claim's
    /// NodePool was evaluated when it was planned; if it no longer is (a standalone claim, a
    /// NodePool deleted since), the provider's own figures.
    pub fn for_launch(&self, pool: Option<&str>, types: &[Arc<InstanceType>]) -> Vec<Arc<InstanceType>> {
        match pool {
            Some(pool) => self.current().apply(pool, types.to_vec()).unwrap_or_else(|_| types.to_vec()),
            None => types.to_vec(),
        }
    }
}

/// A provider whose instance types carry the NodeOverlays.
pub struct Overlaid {
    inner: Arc<dyn CloudProvider>,
    overlays: Arc<Overlays>,
}

impl Overlaid {
    /// Decorates `inner` with `overlays`.
    pub fn new(inner: Arc<dyn CloudProvider>, overlays: Arc<Overlays>) -> Self {
        Overlaid { inner, overlays }
    }
}

impl CloudProvider for Overlaid {
    fn create<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Instance>> {
        self.inner.create(node_claim)
    }

    fn delete<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        self.inner.delete(node_claim)
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<Instance>> {
        self.inner.get(provider_id)
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>>> {
        self.inner.list()
    }

    fn instance_types<'a>(
        &'a self,
        node_pool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
        Box::pin(async move {
            let types = self.inner.instance_types(node_pool).await?;
            let name = node_pool.metadata.name.as_deref().unwrap_or_default();
            Ok(self.overlays.current().apply(name, types)?)
        })
    }

    fn is_drifted<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Option<DriftReason>>> {
        self.inner.is_drifted(node_claim)
    }

    fn are_drifted<'a>(
        &'a self,
        node_claims: &'a [&'a NodeClaim],
    ) -> BoxFuture<'a, Vec<Result<Option<DriftReason>>>> {
        self.inner.are_drifted(node_claims)
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
