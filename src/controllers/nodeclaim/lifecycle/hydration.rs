//! Hydration: the node class's label (`karpenter.k8s.aws/ec2nodeclass: <name>`) on every claim
//! and its Node. Claims made from a NodePool carry it from creation; this puts it on those made
//! before it was set, and on claims applied by hand, as upstream's hydration controllers do.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Error, State};
use crate::apis::NodeClaim;
use crate::apis::labels::node_class_label_key;

/// The label (key and value) naming `claim`'s node class.
pub(super) fn class_label(claim: &NodeClaim) -> (String, String) {
    let class = &claim.spec.node_class_ref;
    (node_class_label_key(&class.group, &class.kind), class.name.clone())
}

/// Whether `object` lacks `label` (or has another value for its key).
fn lacks<K: Resource>(object: &K, (key, value): &(String, String)) -> bool {
    object.labels().get(key) != Some(value)
}

fn label_patch((key, value): &(String, String)) -> serde_json::Value {
    json!({ "metadata": { "labels": { key: value } } })
}

/// Labels `claim` with its node class unless it is; returns the claim as written.
pub(super) async fn hydrate_claim(claim: NodeClaim, state: &State) -> Result<NodeClaim, Error> {
    let label = class_label(&claim);
    if !lacks(&claim, &label) {
        return Ok(claim);
    }
    let written = state
        .claims
        .patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&label_patch(&label)))
        .await
        .map_err(Error::kube("labelling the claim with its node class"))?;
    state.wrote_over(&claim);
    Ok(written)
}

/// Labels the claim's registered `node` with the claim's node class unless it is.
pub(super) async fn hydrate_node(claim: &NodeClaim, node: &Node, state: &State) -> Result<(), Error> {
    let label = class_label(claim);
    if !lacks(node, &label) {
        return Ok(());
    }
    let name = node.name_any();
    state
        .nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&label_patch(&label)))
        .await
        .map_err(Error::kube(format!("labelling node {name} with its node class")))?;
    Ok(())
}
