//! What the cluster changes in the instance types every decision sees: [`Overlaid`] decorates the
//! one [`CloudProvider`] so that a NodePool's instance types come with its [`Adjustments`]
//! applied: the NodeOverlays, from the [`Overlays`] the NodeOverlay controller keeps current, then
//! the extended resources the NodePool learned from its nodes ([`crate::scheduling::learned`]),
//! which only add what a type still lacks. The NodeOverlay controller reads the provider without
//! either, as upstream's does; the learned-resources controller reads it with the overlays only.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use super::{BoxFuture, CloudProvider, DriftReason, Instance, Result};
use crate::apis::{NodeClaim, NodePool};
use crate::scheduling::InstanceType;
use crate::scheduling::learned::Learned;
use crate::scheduling::overlay::{AwaitingEvaluation, OverlayStore};

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

/// What every NodePool learned, as its learned-resources controller last read (and wrote) it: the
/// launches read it, since a NodeClaim names its NodePool but does not carry it. Decisions read
/// the NodePool's own annotation, which is as current as the NodePool they plan with.
#[derive(Debug, Default)]
pub struct LearnedStore(RwLock<Arc<BTreeMap<String, Learned>>>);

impl LearnedStore {
    /// Nothing learned yet.
    pub fn new() -> Arc<Self> {
        Arc::new(LearnedStore::default())
    }

    /// What `pool` learned.
    pub fn of_pool(&self, pool: &str) -> Option<Learned> {
        self.0.read().unwrap_or_else(PoisonError::into_inner).get(pool).cloned()
    }

    /// Replaces what every NodePool learned; whether it changed.
    pub fn replace(&self, learned: BTreeMap<String, Learned>) -> bool {
        let mut current = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if **current == learned {
            return false;
        }
        *current = Arc::new(learned);
        true
    }
}

/// What the cluster changes in the instance types, each part present when it is on: the
/// NodeOverlays (the `NodeOverlay` gate) and the learned extended resources.
#[derive(Clone, Debug, Default)]
pub struct Adjustments {
    /// The NodeOverlays' evaluation.
    pub overlays: Option<Arc<Overlays>>,
    /// What the NodePools learned, for launches.
    pub learned: Option<Arc<LearnedStore>>,
}

impl Adjustments {
    /// Whether nothing is adjusted.
    pub fn is_empty(&self) -> bool {
        self.overlays.is_none() && self.learned.is_none()
    }

    /// The instance types of `node_pool`, as decisions see them: the overlays, then what the
    /// NodePool's annotation says it learned (an annotation that cannot be read adds nothing;
    /// the learned-resources controller reports it).
    pub fn for_nodepool(
        &self,
        node_pool: &NodePool,
        types: Vec<Arc<InstanceType>>,
    ) -> std::result::Result<Vec<Arc<InstanceType>>, AwaitingEvaluation> {
        let name = node_pool.metadata.name.as_deref().unwrap_or_default();
        let types = match &self.overlays {
            Some(overlays) => overlays.current().apply(name, types)?,
            None => types,
        };
        Ok(match &self.learned {
            Some(_) => Learned::of_nodepool(node_pool).map(|l| l.apply(types.clone())).unwrap_or(types),
            None => types,
        })
    }

    /// `types` as a launch for the NodePool `pool` sees them: the overlays (when the NodePool was
    /// evaluated; a standalone claim, or one whose NodePool is gone, gets the provider's own
    /// figures), then what the NodePool learned.
    pub fn for_launch(&self, pool: Option<&str>, types: &[Arc<InstanceType>]) -> Vec<Arc<InstanceType>> {
        let Some(pool) = pool else { return types.to_vec() };
        let types = match &self.overlays {
            Some(overlays) => overlays.for_launch(Some(pool), types),
            None => types.to_vec(),
        };
        match self.learned.as_ref().and_then(|l| l.of_pool(pool)) {
            Some(learned) => learned.apply(types),
            None => types,
        }
    }
}

/// A provider whose instance types carry the [`Adjustments`].
pub struct Overlaid {
    inner: Arc<dyn CloudProvider>,
    adjustments: Adjustments,
}

impl Overlaid {
    /// Decorates `inner` with `adjustments`.
    pub fn new(inner: Arc<dyn CloudProvider>, adjustments: Adjustments) -> Self {
        Overlaid { inner, adjustments }
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
            Ok(self.adjustments.for_nodepool(node_pool, types)?)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::NodeOverlay;
    use crate::disruption::tests::catalog;
    use crate::scheduling::overlay::{PoolTypes, evaluate};

    #[test]
    fn a_launch_sees_the_overlays_then_what_its_nodepool_learned() {
        let overlay: NodeOverlay = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1alpha1", "kind": "NodeOverlay", "metadata": {"name": "fuse"},
            "spec": {"requirements": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["small"]}],
                "capacity": {"example.com/fuse": "4"}}}))
        .unwrap();
        let types = catalog();
        let labels = BTreeMap::new();
        let pools = [PoolTypes { name: "default", labels: &labels, types: &types }];
        let overlays = Overlays::new();
        overlays.replace(evaluate([&overlay], &pools).store);
        let learned = LearnedStore::new();
        let taught =
            Learned::parse(r#"{"small":{"example.com/fuse":"20"},"large":{"example.com/fuse":"8"}}"#)
                .unwrap();
        assert!(learned.replace(BTreeMap::from([("default".to_string(), taught)])));
        let adjustments = Adjustments { overlays: Some(overlays), learned: Some(learned) };
        let fuse = |types: &[Arc<InstanceType>], name: &str| {
            types.iter().find(|t| t.name == name).unwrap().capacity.get("example.com/fuse")
        };
        let launched = adjustments.for_launch(Some("default"), &types);
        assert_eq!(fuse(&launched, "small"), 4, "the overlay wins");
        assert_eq!(fuse(&launched, "large"), 8, "learned where the type lacks it");
        let standalone = adjustments.for_launch(None, &types);
        assert_eq!((fuse(&standalone, "small"), fuse(&standalone, "large")), (0, 0));
        let other = adjustments.for_launch(Some("other"), &types);
        assert_eq!(fuse(&other, "large"), 0, "what one NodePool learned is its own");
    }
}
