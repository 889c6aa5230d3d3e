//! Registration: finds the Node with the claim's provider ID and, the first time, syncs the claim
//! onto it: the claim's labels, annotations and taints, an owner reference and the termination
//! finalizer, without the unregistered taint. No Node, or more than one, leaves the claim
//! unregistered with the reason in its conditions.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::logic::{self, reasons};
use super::{Error, State, claims_nodes};
use crate::apis::NodeClaim;
use crate::apis::common::{ConditionUpdate, is_true, set_condition};
use crate::apis::labels::LABEL_INITIALIZED;
use crate::apis::nodeclaim::conditions::{INITIALIZED, REGISTERED};

/// Finds the claim's Node and, on first registration, syncs the claim onto it. Returns the Node.
pub(super) async fn register(
    claim: &mut NodeClaim,
    state: &State,
    now: Timestamp,
) -> Result<Option<(Node, bool)>, Error> {
    let generation = claim.metadata.generation;
    let found = claims_nodes(claim, state);
    let registered = claim.is_true(REGISTERED);
    let status = claim.status.get_or_insert_with(Default::default);
    let node = match found.as_slice() {
        [] => {
            if !registered {
                let update =
                    ConditionUpdate::unknown(reasons::NODE_NOT_FOUND, reasons::NODE_NOT_FOUND_MESSAGE);
                set_condition(&mut status.conditions, REGISTERED, update, generation, now);
            }
            if !is_true(&status.conditions, INITIALIZED) {
                let update =
                    ConditionUpdate::unknown(reasons::NODE_NOT_FOUND, reasons::NODE_NOT_FOUND_MESSAGE);
                set_condition(&mut status.conditions, INITIALIZED, update, generation, now);
            }
            return Ok(None);
        }
        [node] => node.clone(),
        many => {
            let names: Vec<String> = many.iter().map(|n| n.name_any()).collect();
            let update = ConditionUpdate::false_(
                reasons::MULTIPLE_NODES_FOUND,
                format!("invariant violated, matched multiple nodes [{}]", names.join(", ")),
            );
            set_condition(&mut status.conditions, REGISTERED, update, generation, now);
            return Ok(None);
        }
    };
    if registered {
        super::hydration::hydrate_node(claim, &node, state).await?;
        return Ok(Some(((*node).clone(), false)));
    }
    let mut desired = logic::registered_node(claim, &node);
    // A node that is initialized as soon as it registers (ready, no startup taint) gets both in
    // one write.
    if logic::initialization(claim, &desired).is_ok() {
        desired.labels_mut().insert(LABEL_INITIALIZED.to_string(), "true".to_string());
    }
    let node = if desired == *node { desired } else { patch_node(&node, &desired, state).await? };
    let status = claim.status.get_or_insert_with(Default::default);
    status.node_name = Some(node.name_any());
    set_condition(
        &mut status.conditions,
        REGISTERED,
        ConditionUpdate::true_(reasons::REGISTERED),
        generation,
        now,
    );
    Ok(Some((node, true)))
}

/// Writes the metadata and taints `after` adds to `before`, conditional on `before`'s resource
/// version so that lists (finalizers, owners, taints) written whole replace nothing unseen.
async fn patch_node(before: &Node, after: &Node, state: &State) -> Result<Node, Error> {
    let mut metadata = serde_json::Map::new();
    metadata.insert("resourceVersion".into(), json!(before.resource_version()));
    let m = &after.metadata;
    for (key, value) in [
        ("labels", m.labels.as_ref().map(|v| json!(v))),
        ("annotations", m.annotations.as_ref().map(|v| json!(v))),
        ("finalizers", m.finalizers.as_ref().map(|v| json!(v))),
        ("ownerReferences", m.owner_references.as_ref().map(|v| json!(v))),
    ] {
        if let Some(value) = value {
            metadata.insert(key.into(), value);
        }
    }
    let mut patch = json!({ "metadata": metadata });
    if let Some(taints) = after.spec.as_ref().and_then(|s| s.taints.as_ref()) {
        patch["spec"] = json!({ "taints": taints });
    }
    let name = before.name_any();
    state
        .nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!("syncing node {name}")))
}
