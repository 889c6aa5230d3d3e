//! The kwok cloud provider: "instances" are Node objects that this provider creates directly in
//! the cluster and that [kwok](https://kwok.sigs.k8s.io) then keeps ready, for tests, demos and
//! scale runs without a cloud.
//!
//! - The catalog is fixed at construction (by default the embedded EC2 catalog, see
//!   the operator's `--kwok-instance-types`) and serves every NodePool, whatever its node class: an EC2NodeClass is
//!   taken as ready.
//! - [`CloudProvider::create`] picks the cheapest available offering of a catalog type that the
//!   NodeClaim's requirements allow and whose allocatable resources hold its requests
//!   ([`select_offering`]), and creates a Node named after the NodeClaim (NodeClaim names are
//!   unique, which makes the launch idempotent) with the provider ID `kwok://<node name>`, the
//!   type's labels, the NodeClaim's labels and taints, the startup taints, the
//!   `karpenter.sh/unregistered` taint and the type's capacity and allocatable. Its conditions are
//!   left to kwok.
//! - With a registration delay the Node is created that long after `create` returns, by a
//!   background task; until then the launch is known to this provider only, and `get`, `list`
//!   and `delete` see it as a launched instance. With no delay the Node exists when `create`
//!   returns.
//! - `list` returns the Nodes whose provider ID starts with `kwok://` and that carry
//!   `karpenter.sh/nodepool`; `delete` deletes the Node of the NodeClaim's `status.providerID`
//!   and returns [`CloudProviderError::NotFound`] once it is gone; nothing ever drifts.

pub mod controllers;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint as NodeTaint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Api, Client};
use thiserror::Error;
use tokio::task::AbortHandle;

use super::{
    BoxFuture, CloudProvider, CloudProviderError, DriftReason, Instance, OfferingKey, Result,
    claim_requirements,
};
use crate::apis::labels::{
    LABEL_CAPACITY_TYPE, LABEL_HOSTNAME, LABEL_INSTANCE_TYPE, LABEL_NODEPOOL, LABEL_TOPOLOGY_ZONE,
    TAINT_UNREGISTERED,
};
use crate::apis::{NodeClaim, NodePool, Taint, TaintEffect};
use crate::cloudprovider::aws::embedded::EmbeddedCatalogError;
use crate::cloudprovider::catalog::CatalogError;
use crate::util::api::{is_conflict, is_not_found};

use crate::scheduling::{InstanceType, Offering, Requirements, Resources};

/// Nodes listed per request when the provider lists its instances.
const LIST_PAGE: u32 = 100;

/// Prefix of the provider IDs of kwok nodes: `kwok://<node name>`.
pub const PROVIDER_ID_PREFIX: &str = "kwok://";
/// Annotation marking a Node as simulated, with [`KWOK_NODE_VALUE`].
pub const ANNOTATION_KWOK_NODE: &str = "kwok.x-k8s.io/node";
/// Value of [`ANNOTATION_KWOK_NODE`].
pub const KWOK_NODE_VALUE: &str = "fake";
/// Annotation marking the Nodes this provider created (its "instances"), with
/// [`MANAGED_BY_VALUE`].
pub const ANNOTATION_MANAGED_BY: &str = "karpenter.sh/managed-by";
/// Value of [`ANNOTATION_MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "karpenter";
/// Image ID reported for every kwok instance (there is no image).
pub const IMAGE_ID: &str = "kwok-image";
/// State reported for every kwok instance.
pub const STATE_RUNNING: &str = "running";

/// The kwok provider cannot be set up.
#[derive(Debug, Error)]
pub enum KwokError {
    /// The catalog (file or generated) cannot be loaded.
    #[error("loading the kwok instance-type catalog")]
    Catalog(#[source] CatalogError),
    /// The embedded EC2 catalog cannot be used.
    #[error("loading the embedded aws instance-type catalog")]
    AwsCatalog(#[source] EmbeddedCatalogError),
}

/// Launches that wait for their registration delay, by provider ID.
type Pending = Arc<Mutex<HashMap<String, (Instance, AbortHandle)>>>;

/// The kwok cloud provider (see the module documentation).
#[derive(Clone)]
pub struct KwokCloudProvider {
    client: Client,
    instance_types: Arc<Vec<Arc<InstanceType>>>,
    registration_delay: Duration,
    pending: Pending,
    adjustments: crate::cloudprovider::overlay::Adjustments,
}

impl std::fmt::Debug for KwokCloudProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KwokCloudProvider")
            .field("instance_types", &self.instance_types.len())
            .field("registration_delay", &self.registration_delay)
            .finish_non_exhaustive()
    }
}

impl KwokCloudProvider {
    /// A provider launching `instance_types`, whose Nodes appear `registration_delay` after a
    /// launch.
    pub fn new(client: Client, instance_types: Vec<Arc<InstanceType>>, registration_delay: Duration) -> Self {
        KwokCloudProvider {
            client,
            instance_types: Arc::new(instance_types),
            registration_delay,
            pending: Arc::default(),
            adjustments: Default::default(),
        }
    }

    /// Launches see a claim's instance types as its NodePool's adjustments leave them (the
    /// NodeOverlays, the learned extended resources), as the decision that planned the claim did.
    pub fn with_adjustments(mut self, adjustments: crate::cloudprovider::overlay::Adjustments) -> Self {
        self.adjustments = adjustments;
        self
    }

    /// The catalog.
    pub fn catalog(&self) -> &[Arc<InstanceType>] {
        &self.instance_types
    }

    /// The delay between a launch and the creation of its Node.
    pub fn registration_delay(&self) -> Duration {
        self.registration_delay
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    fn pending_instance(&self, provider_id: &str) -> Option<Instance> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).get(provider_id).map(|(i, _)| i.clone())
    }

    /// The Node of `provider_id`, if it exists and carries that provider ID.
    async fn node(&self, provider_id: &str) -> Result<Option<Node>> {
        let name = node_name(provider_id)?;
        let node = self.nodes().get_opt(name).await.map_err(|e| api_error("GetNode", e))?;
        Ok(node.filter(|n| n.spec.as_ref().and_then(|s| s.provider_id.as_deref()) == Some(provider_id)))
    }

    async fn create_impl(&self, node_claim: &NodeClaim) -> Result<Instance> {
        let claim_name = node_claim.metadata.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| {
            CloudProviderError::InvalidNodeClaim {
                name: String::new(),
                reason: "the NodeClaim has no name".to_string(),
            }
        })?;
        let provider_id = format!("{PROVIDER_ID_PREFIX}{claim_name}");
        if let Some(instance) = self.pending_instance(&provider_id) {
            return Ok(instance);
        }
        // A delayed launch creates its Node later: a previous launch (before a restart) may have
        // made it already. An immediate one finds out from its create (below), sparing a request.
        if !self.registration_delay.is_zero()
            && let Some(node) = self.node(&provider_id).await?
        {
            return Ok(previous_launch(&claim_name, &node));
        }

        let (reqs, requests) = claim_requirements(node_claim, &claim_name)?;
        let overlaid;
        let types: &[Arc<InstanceType>] = if self.adjustments.is_empty() {
            &self.instance_types
        } else {
            let pool = node_claim.metadata.labels.as_ref().and_then(|l| l.get(LABEL_NODEPOOL));
            overlaid = self.adjustments.for_launch(pool.map(String::as_str), &self.instance_types);
            &overlaid
        };
        let (it, offering) = select_offering(types, &claim_name, &reqs, &requests)?;
        let node = build_node(node_claim, &claim_name, it, offering)?;
        let instance = node_instance(&node);

        if self.registration_delay.is_zero() {
            if let Some(conflict) = create_node(&self.nodes(), &node).await? {
                return match self.node(&provider_id).await? {
                    Some(node) => Ok(previous_launch(&claim_name, &node)),
                    // A Node of that name with another provider ID (or gone since).
                    None => Err(api_error("CreateNode", conflict)),
                };
            }
            tracing::info!(node_claim = %claim_name, instance_type = %it.name, zone = %offering.zone,
                capacity_type = %offering.capacity_type, "created kwok node");
            return Ok(instance);
        }
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let nodes = self.nodes();
        let delay = self.registration_delay;
        let registry = Arc::clone(&self.pending);
        let id = provider_id.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            match create_node(&nodes, &node).await {
                Ok(_) => tracing::info!(node = %id, "created kwok node after the registration delay"),
                Err(e) => tracing::warn!(node = %id, error = %e, "creating kwok node failed"),
            }
            registry.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
        });
        pending.insert(provider_id, (instance.clone(), task.abort_handle()));
        tracing::info!(node_claim = %claim_name, instance_type = %it.name, zone = %offering.zone,
            capacity_type = %offering.capacity_type, delay = ?delay, "launched kwok instance");
        Ok(instance)
    }

    async fn delete_impl(&self, node_claim: &NodeClaim) -> Result<()> {
        let claim_name = node_claim.metadata.name.clone().unwrap_or_default();
        let provider_id = node_claim
            .status
            .as_ref()
            .and_then(|s| s.provider_id.clone())
            .filter(|p| !p.is_empty())
            .ok_or_else(|| CloudProviderError::InvalidNodeClaim {
                name: claim_name.clone(),
                reason: "status.providerID is not set".to_string(),
            })?;
        let name = node_name(&provider_id)?.to_string();
        let was_pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&provider_id);
        if let Some((_, task)) = &was_pending {
            task.abort();
        }
        let Some(node) = self.node(&provider_id).await? else {
            return match was_pending {
                Some(_) => Ok(()),
                None => Err(CloudProviderError::NotFound(provider_id)),
            };
        };
        // A kwok instance is its Node: once the Node's deletion has been accepted the instance is
        // gone, even while finalizers (the node termination controller's) keep the object.
        if node.metadata.deletion_timestamp.is_some() {
            return Err(CloudProviderError::NotFound(provider_id));
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: node.metadata.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match self.nodes().delete(&name, &params).await {
            Ok(_) => {
                tracing::info!(node_claim = %claim_name, node = %name, "deleted kwok node");
                Ok(())
            }
            Err(e) if is_not_found(&e) => Err(CloudProviderError::NotFound(provider_id)),
            Err(e) => Err(api_error("DeleteNode", e)),
        }
    }

    async fn get_impl(&self, provider_id: &str) -> Result<Instance> {
        // A provider ID of another scheme names no instance this provider made: not found (as
        // upstream's kwok provider answers), so that garbage collection removes a NodeClaim that
        // claims one.
        if node_name(provider_id).is_err() {
            return Err(CloudProviderError::NotFound(provider_id.to_string()));
        }
        if let Some(node) = self.node(provider_id).await? {
            return Ok(node_instance(&node));
        }
        self.pending_instance(provider_id)
            .ok_or_else(|| CloudProviderError::NotFound(provider_id.to_string()))
    }

    /// Every instance: the Nodes it made, listed a page at a time (as EC2 pages DescribeInstances)
    /// so that only one page of whole Node objects is held at once, and those not created yet.
    async fn list_impl(&self) -> Result<Vec<Instance>> {
        let mut out: Vec<Instance> = Vec::new();
        let mut params = ListParams::default().limit(LIST_PAGE);
        loop {
            let page = self.nodes().list(&params).await.map_err(|e| api_error("ListNodes", e))?;
            out.extend(page.items.iter().filter(|n| is_instance(n)).map(node_instance));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => break,
            }
        }
        let listed: std::collections::HashSet<String> = out.iter().map(|i| i.provider_id.clone()).collect();
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        out.extend(
            pending.iter().filter(|(id, _)| !listed.contains(*id)).map(|(_, (instance, _))| instance.clone()),
        );
        drop(pending);
        out.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
        Ok(out)
    }
}

impl CloudProvider for KwokCloudProvider {
    fn create<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Instance>> {
        Box::pin(self.create_impl(node_claim))
    }

    fn delete<'a>(&'a self, node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.delete_impl(node_claim))
    }

    fn get<'a>(&'a self, provider_id: &'a str) -> BoxFuture<'a, Result<Instance>> {
        Box::pin(self.get_impl(provider_id))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>>> {
        Box::pin(self.list_impl())
    }

    fn instance_types<'a>(
        &'a self,
        _node_pool: &'a NodePool,
    ) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
        let types = self.instance_types.as_ref().clone();
        Box::pin(std::future::ready(Ok(types)))
    }

    fn is_drifted<'a>(&'a self, _node_claim: &'a NodeClaim) -> BoxFuture<'a, Result<Option<DriftReason>>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    fn repair_policies(&self) -> Vec<crate::disruption::repair::RepairPolicy> {
        crate::disruption::repair::KUBELET_REPAIR_POLICIES.to_vec()
    }

    fn name(&self) -> &'static str {
        "kwok"
    }
}

/// The node name of a `kwok://<node name>` provider ID.
pub fn node_name(provider_id: &str) -> Result<&str> {
    provider_id
        .strip_prefix(PROVIDER_ID_PREFIX)
        .filter(|n| !n.is_empty() && !n.contains('/'))
        .ok_or_else(|| CloudProviderError::InvalidProviderId(provider_id.to_string()))
}

/// The cheapest available offering, of a type of `types` that `reqs` allow and on which
/// `requests` fit, that `reqs` allow; ties go to the first type (in catalog order), then the
/// first offering.
///
/// Errors: [`CloudProviderError::NoCompatibleInstanceTypes`] when no type is compatible and fits
/// or none has an offering `reqs` allow, [`CloudProviderError::InsufficientCapacity`] when every
/// offering `reqs` allow is unavailable.
pub fn select_offering<'a>(
    types: &'a [Arc<InstanceType>],
    node_claim: &str,
    reqs: &Requirements,
    requests: &Resources,
) -> Result<(&'a InstanceType, &'a Offering)> {
    let mut best: Option<(&InstanceType, &Offering)> = None;
    let mut unavailable = Vec::new();
    let mut compatible_types = 0usize;
    for it in types {
        if !it.fits(requests) || it.requirements.intersects(reqs).is_err() {
            continue;
        }
        compatible_types += 1;
        for o in it.offerings.iter().filter(|o| o.is_compatible(reqs)) {
            if !o.available {
                unavailable.push(OfferingKey {
                    instance_type: it.name.clone(),
                    zone: o.zone.clone(),
                    capacity_type: o.capacity_type.clone(),
                });
                continue;
            }
            if best.is_none_or(|(_, b)| o.price < b.price) {
                best = Some((it, o));
            }
        }
    }
    if let Some(found) = best {
        return Ok(found);
    }
    if !unavailable.is_empty() {
        return Err(CloudProviderError::InsufficientCapacity { offerings: unavailable });
    }
    let reason = if compatible_types == 0 {
        format!("none of {} instance types is compatible and fits {requests}", types.len())
    } else {
        format!(
            "none of the {compatible_types} compatible instance types has an offering the requirements allow"
        )
    };
    Err(CloudProviderError::NoCompatibleInstanceTypes { node_claim: node_claim.to_string(), reason })
}

fn node_taint(t: &Taint) -> NodeTaint {
    NodeTaint {
        key: t.key.clone(),
        value: t.value.clone(),
        effect: t.effect.as_str().to_string(),
        time_added: None,
    }
}

/// The Node of a launch of `it` at `offering` for `node_claim`, named `name`.
pub fn build_node(
    node_claim: &NodeClaim,
    name: &str,
    it: &InstanceType,
    offering: &Offering,
) -> Result<Node> {
    let claim_labels = node_claim.metadata.labels.clone().unwrap_or_default();
    // A NodeClaim made for a NodePool names it; one created on its own (standalone) has none.
    let node_pool = claim_labels.get(LABEL_NODEPOOL).cloned().or_else(|| {
        Requirements::from_nodepool(&node_claim.spec.requirements)
            .ok()?
            .get(LABEL_NODEPOOL)?
            .single()
            .map(str::to_string)
    });
    let mut labels: BTreeMap<String, String> = it.requirements.single_valued_labels();
    labels.insert(LABEL_INSTANCE_TYPE.to_string(), it.name.clone());
    labels.insert(LABEL_TOPOLOGY_ZONE.to_string(), offering.zone.clone());
    labels.insert(LABEL_CAPACITY_TYPE.to_string(), offering.capacity_type.clone());
    labels.extend(claim_labels);
    if let Some(pool) = node_pool {
        labels.insert(LABEL_NODEPOOL.to_string(), pool);
    }
    labels.insert(LABEL_HOSTNAME.to_string(), name.to_string());

    let mut taints: Vec<NodeTaint> = node_claim.spec.taints.iter().map(node_taint).collect();
    taints.extend(node_claim.spec.startup_taints.iter().map(node_taint));
    taints.push(node_taint(&Taint::new(TAINT_UNREGISTERED, TaintEffect::NoExecute)));

    Ok(Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([
                (ANNOTATION_KWOK_NODE.to_string(), KWOK_NODE_VALUE.to_string()),
                (ANNOTATION_MANAGED_BY.to_string(), MANAGED_BY_VALUE.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(format!("{PROVIDER_ID_PREFIX}{name}")),
            taints: Some(taints),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(it.capacity.to_list()),
            allocatable: Some(it.allocatable().to_list()),
            ..NodeStatus::default()
        }),
    })
}

/// Whether `node` is an instance of this provider: a `kwok://` provider ID, and created by it
/// ([`ANNOTATION_MANAGED_BY`]; Nodes made by earlier versions carry a NodePool label instead).
pub fn is_instance(node: &Node) -> bool {
    let ours = node.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_MANAGED_BY))
        || node.metadata.labels.as_ref().is_some_and(|l| l.contains_key(LABEL_NODEPOOL));
    ours && node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .is_some_and(|p| p.starts_with(PROVIDER_ID_PREFIX))
}

/// The instance a kwok Node stands for.
pub fn node_instance(node: &Node) -> Instance {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let status = node.status.as_ref();
    Instance {
        provider_id: node.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default(),
        instance_type: labels.get(LABEL_INSTANCE_TYPE).cloned().unwrap_or_default(),
        zone: labels.get(LABEL_TOPOLOGY_ZONE).cloned().unwrap_or_default(),
        capacity_type: labels.get(LABEL_CAPACITY_TYPE).cloned().unwrap_or_default(),
        image_id: IMAGE_ID.to_string(),
        node_claim: node.metadata.name.clone(),
        node_pool: labels.get(LABEL_NODEPOOL).cloned(),
        state: STATE_RUNNING.to_string(),
        launch_time: node.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()),
        capacity: status.and_then(|s| s.capacity.clone()).unwrap_or_default(),
        allocatable: status.and_then(|s| s.allocatable.clone()).unwrap_or_default(),
        labels,
        annotations: BTreeMap::new(),
    }
}

/// The instance of a Node a previous launch of `claim_name` made.
fn previous_launch(claim_name: &str, node: &Node) -> Instance {
    tracing::info!(node_claim = %claim_name, node = %claim_name, "found the node of a previous launch");
    node_instance(node)
}

/// Creates `node`. A Node of its name that already exists is no failure: the API server's
/// conflict is returned, for a caller that must check whose Node it is.
async fn create_node(nodes: &Api<Node>, node: &Node) -> Result<Option<kube::Error>> {
    match nodes.create(&PostParams::default(), node).await {
        Ok(_) => Ok(None),
        Err(e) if is_conflict(&e) => Ok(Some(e)),
        Err(e) => Err(api_error("CreateNode", e)),
    }
}

fn api_error(operation: &'static str, err: kube::Error) -> CloudProviderError {
    let (code, message) = match &err {
        kube::Error::Api(status) => (status.reason.clone(), status.message.clone()),
        other => (String::new(), other.to_string()),
    };
    CloudProviderError::Api { operation, code, message, source: Box::new(err) }
}

#[cfg(test)]
mod tests;
