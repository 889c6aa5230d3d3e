//! Finalization: every claim not being deleted carries the `karpenter.sh/termination` finalizer.
//! A deleted claim taints and deletes its Node and waits for it to go (the node termination
//! controller drains it), then terminates the instance until the cloud provider reports it gone,
//! then removes the finalizer.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::logic::{self, reasons};
use super::{CONTROLLER, Error, State, claims_nodes, write};
use crate::apis::NodeClaim;
use crate::apis::common::{ConditionUpdate, set_condition};
use crate::apis::labels::{ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP, FINALIZER_TERMINATION};
use crate::apis::nodeclaim::conditions::INSTANCE_TERMINATING;
use crate::cloudprovider::CloudProviderError;
use crate::controllers::events::reasons as event_reasons;
use crate::controllers::kit::Next;
use crate::metrics::observe;
use crate::util::api::is_not_found;

/// How often a claim waiting on its Node's deletion or its instance's termination is checked.
const TERMINATION_POLL: Duration = Duration::from_secs(5);

fn has_finalizer<K: Resource>(object: &K) -> bool {
    object.finalizers().iter().any(|f| f == FINALIZER_TERMINATION)
}

/// Adds the termination finalizer to `claim` unless it has it; returns the claim as written.
pub(super) async fn ensure_finalizer(claim: &NodeClaim, state: &State) -> Result<NodeClaim, Error> {
    if has_finalizer(claim) {
        return Ok(claim.clone());
    }
    let mut finalizers = claim.finalizers().to_vec();
    finalizers.push(FINALIZER_TERMINATION.to_string());
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": claim.resource_version() }
    });
    let written = state
        .claims
        .patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube("adding the termination finalizer"))?;
    state.wrote_over(claim);
    Ok(written)
}

/// Takes a deleted claim one step towards letting it go.
pub(super) async fn finalize(claim: &NodeClaim, state: &State, now: Timestamp) -> Result<Next, Error> {
    if !has_finalizer(claim) {
        return Ok(Next::Wait);
    }
    // Nothing new lands on a node whose claim is going: the taint comes first.
    for node in claims_nodes(claim, state).iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
        crate::controllers::node::taint_disrupted(&state.ctx.client, node)
            .await
            .map_err(Error::kube(format!("tainting node {}", node.name_any())))?;
    }
    let claim = &annotate_termination_deadline(claim, state).await?;
    let name = claim.name_any();
    let nodes = claims_nodes(claim, state);
    if !nodes.is_empty() {
        for node in nodes.iter().filter(|n| n.metadata.deletion_timestamp.is_none()) {
            let node_name = node.name_any();
            let params = DeleteParams {
                preconditions: Some(Preconditions { uid: node.uid(), resource_version: None }),
                ..DeleteParams::default()
            };
            match state.nodes.delete(&node_name, &params).await {
                Ok(_) => {
                    tracing::info!(controller = CONTROLLER, nodeclaim = %name, node = %node_name, "deleting node")
                }
                Err(error) if is_not_found(&error) => {}
                Err(source) => {
                    return Err(Error::Kube { action: format!("deleting node {node_name}"), source });
                }
            }
        }
        return Ok(Next::After(TERMINATION_POLL));
    }

    if !instances_terminated(claim, state).await? {
        let mut updated = claim.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        let update = ConditionUpdate::true_(reasons::INSTANCE_TERMINATING);
        if set_condition(&mut status.conditions, INSTANCE_TERMINATING, update, claim.metadata.generation, now)
        {
            write(claim, &updated, state).await?;
        }
        return Ok(Next::After(TERMINATION_POLL));
    }
    let labels = logic::terminated_labels(claim);
    let nodepool = logic::nodepool(claim);
    if let Some(since) =
        claim.condition(INSTANCE_TERMINATING).and_then(|c| c.last_transition_time.parse::<Timestamp>().ok())
    {
        let elapsed = logic::elapsed(since, now);
        observe(
            &state.ctx.metrics.nodeclaims_instance_termination_duration,
            vec![("nodepool", nodepool.clone())],
            elapsed,
        );
    }

    let finalizers: Vec<&String> =
        claim.finalizers().iter().filter(|f| *f != FINALIZER_TERMINATION).collect();
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": claim.resource_version() }
    });
    match state.claims.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(error) if is_not_found(&error) => return Ok(Next::Wait),
        Err(source) => {
            return Err(Error::Kube { action: "removing the termination finalizer".into(), source });
        }
    }
    tracing::info!(
        controller = CONTROLLER,
        nodeclaim = %name,
        nodepool = %nodepool,
        "provider-id" = %claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default(),
        "deleted nodeclaim"
    );
    state.ctx.metrics.nodeclaims_terminated.get_or_create(&labels).inc();
    if let Some(deleted) = &claim.metadata.deletion_timestamp {
        let elapsed = logic::elapsed(deleted.0, now);
        observe(&state.ctx.metrics.nodeclaims_termination_duration, vec![("nodepool", nodepool)], elapsed);
    }
    Ok(Next::Wait)
}

/// Records by when the claim's node must be gone, for the node termination controller.
async fn annotate_termination_deadline(claim: &NodeClaim, state: &State) -> Result<NodeClaim, Error> {
    let Some(deadline) = logic::termination_deadline(claim) else {
        return Ok(claim.clone());
    };
    let patch = json!({
        "metadata": {
            "resourceVersion": claim.resource_version(),
            "annotations": { ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP: deadline },
        }
    });
    let name = claim.name_any();
    let updated = state
        .claims
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube("annotating the termination deadline"))?;
    tracing::info!(
        controller = CONTROLLER,
        nodeclaim = %name,
        "karpenter.sh/nodeclaim-termination-timestamp" = %deadline,
        "annotated nodeclaim"
    );
    let message = format!("All pods will be deleted by {deadline}");
    state.ctx.events.warning(claim, event_reasons::TERMINATION_GRACE_PERIOD_EXPIRING, message).await;
    Ok(updated)
}

/// Asks the cloud provider to terminate the claim's instance; true once it reports the instance
/// gone. A claim without a provider ID may still have an instance (a launch whose answer was lost):
/// it is looked up by the claim's name.
async fn instances_terminated(claim: &NodeClaim, state: &State) -> Result<bool, Error> {
    let has_provider_id =
        claim.status.as_ref().and_then(|s| s.provider_id.as_deref()).is_some_and(|p| !p.is_empty());
    let targets = if has_provider_id {
        vec![claim.clone()]
    } else {
        let name = claim.name_any();
        let instances =
            state.ctx.cloud.list().await.map_err(|source| Error::Cloud { method: "list", source })?;
        instances
            .into_iter()
            .filter(|i| i.node_claim.as_deref() == Some(name.as_str()))
            .map(|i| {
                let mut target = claim.clone();
                target.status.get_or_insert_with(Default::default).provider_id = Some(i.provider_id);
                target
            })
            .collect()
    };
    let mut terminated = true;
    for target in &targets {
        match state.ctx.cloud.delete(target).await {
            Err(error) if error.is_not_found() => {}
            // An instance this provider cannot name (another provider's, or a provider ID that does
            // not parse) can never be terminated here: it counts as gone, so the claim can go.
            Err(CloudProviderError::InvalidProviderId(pid)) => {
                let message = format!(
                    "The {} cloud provider cannot act on provider ID {pid:?}: the instance is treated as gone",
                    state.ctx.cloud.name()
                );
                tracing::warn!(controller = CONTROLLER, nodeclaim = %claim.name_any(), "provider-id" = %pid, "{message}");
                state.ctx.events.warning(claim, event_reasons::INVALID_PROVIDER_ID, message).await;
            }
            Ok(()) => terminated = false,
            Err(source) => return Err(Error::Cloud { method: "delete", source }),
        }
    }
    Ok(terminated)
}
