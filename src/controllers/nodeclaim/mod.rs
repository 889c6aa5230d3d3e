//! Controllers of NodeClaims: their lifecycle from launch to finalization, drift marking, the
//! consolidatable state disruption reads, expiration, and the garbage collection of instances no
//! NodeClaim accounts for.

pub mod consolidatable;
pub mod drift;
pub mod expiration;
pub mod garbagecollection;
pub mod lifecycle;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::apis::NodeClaim;
use crate::apis::labels::ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP;

/// Deletes this very NodeClaim: the uid precondition makes the call fail rather than delete a
/// claim of the same name made since. `Ok(true)` when the API server took the deletion,
/// `Ok(false)` when the claim is gone or its name now belongs to another claim. The expiration,
/// repair and interruption controllers delete through here.
pub async fn delete(client: &Client, claim: &NodeClaim) -> Result<bool, kube::Error> {
    let params = DeleteParams {
        preconditions: claim.uid().map(|uid| Preconditions { uid: Some(uid), resource_version: None }),
        ..DeleteParams::default()
    };
    match Api::<NodeClaim>::all(client.clone()).delete(&claim.name_any(), &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}

/// Sets the claim's `karpenter.sh/nodeclaim-termination-timestamp` to `at` (whole seconds), so
/// that its drain stops waiting for PodDisruptionBudgets and do-not-disrupt pods at that time.
/// Call it after [`delete`]: a deadline written on a claim whose deletion then failed would let a
/// later ordinary disruption of it skip its budgets. `Ok(false)` when the claim is gone or is
/// another claim now.
pub async fn set_termination_deadline(
    client: &Client,
    controller: &'static str,
    claim: &NodeClaim,
    at: Timestamp,
) -> Result<bool, kube::Error> {
    let deadline = lifecycle::logic::timestamp(at);
    // The uid makes the write fail rather than annotate a claim of the same name made since.
    let patch = json!({"metadata": {"uid": claim.uid(), "annotations": {ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP: deadline}}});
    let api = Api::<NodeClaim>::all(client.clone());
    match api.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(controller, NodeClaim = %claim.name_any(), "karpenter.sh/nodeclaim-termination-timestamp" = %deadline, "annotated nodeclaim");
            Ok(true)
        }
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 || s.code == 422 => Ok(false),
        Err(error) => Err(error),
    }
}
