//! Initialization: a registered claim's Node is initialized once it is Ready, its start-up and
//! ephemeral taints are gone and the requested extended resources are allocatable; the Node is
//! then labelled initialized and the claim's Initialized condition turns true.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::logic::{self, reasons};
use super::{Error, State};
use crate::apis::NodeClaim;
use crate::apis::common::{ConditionUpdate, set_condition};
use crate::apis::labels::LABEL_INITIALIZED;
use crate::apis::nodeclaim::conditions::INITIALIZED;

/// Checks the claim's Node and marks both initialized once it is; true when that happened now.
pub(super) async fn initialize(
    claim: &mut NodeClaim,
    node: &Node,
    state: &State,
    now: Timestamp,
) -> Result<bool, Error> {
    let generation = claim.metadata.generation;
    if claim.is_true(INITIALIZED) {
        return Ok(false);
    }
    if let Err(update) = logic::initialization(claim, node) {
        let status = claim.status.get_or_insert_with(Default::default);
        set_condition(&mut status.conditions, INITIALIZED, update, generation, now);
        return Ok(false);
    }
    if node.labels().get(LABEL_INITIALIZED).map(String::as_str) != Some("true") {
        let patch = json!({ "metadata": { "labels": { LABEL_INITIALIZED: "true" } } });
        let name = node.name_any();
        state
            .nodes
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!("labelling node {name} initialized")))?;
    }
    let status = claim.status.get_or_insert_with(Default::default);
    set_condition(
        &mut status.conditions,
        INITIALIZED,
        ConditionUpdate::true_(reasons::INITIALIZED),
        generation,
        now,
    );
    Ok(true)
}
