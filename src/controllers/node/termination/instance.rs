//! The last steps of a node's termination: once the node is drained and its volumes detached,
//! its instance is terminated through the cloud provider until the provider reports it gone, its
//! NodeClaim is deleted if nobody has yet, and the finalizer is removed, which lets the node go.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::DeleteParams;
use kube::{Api, ResourceExt};

use super::{Error, Step, Termination, Terminator, lifetime, remove_finalizer, uid_precondition};
use crate::apis::NodeClaim;
use crate::cloudprovider::CloudProviderError;
use crate::controllers::Context;
use crate::controllers::kit::Next;
use crate::metrics::observe;
use crate::util::api::is_stale;

/// Delay between two checks of an instance that is shutting down.
const INSTANCE_POLL: Duration = Duration::from_secs(5);

/// Terminates the instance of the node's NodeClaim, stopping the reconcile until the cloud
/// provider reports it gone, then deletes the NodeClaim. A node without NodeClaim has no instance
/// to wait for.
pub(super) async fn terminate(t: &Terminator, term: &Termination) -> Result<Step, Error> {
    let Some(claim) = &term.node_claim else { return Ok(Step::Continue(())) };
    if let Step::Stop(next) = terminate_instance(t, term, claim).await? {
        return Ok(Step::Stop(next));
    }
    delete_node_claim(&t.ctx, claim).await?;
    Ok(Step::Continue(()))
}

/// Asks the cloud provider to terminate the instance of `claim`: goes on once it is gone (or not
/// the provider's), and counts how long it took.
async fn terminate_instance(t: &Terminator, term: &Termination, claim: &NodeClaim) -> Result<Step, Error> {
    let (ctx, name, claim_name) = (&t.ctx, &term.name, &term.claim_name);
    t.with_progress(name, |p| {
        p.instance_termination_started.get_or_insert_with(Instant::now);
    });
    match ctx.cloud.delete(claim).await {
        Ok(()) => {
            tracing::info!(node = %name, nodeclaim = %claim_name, "terminating instance");
            return Ok(Step::Stop(Next::After(INSTANCE_POLL)));
        }
        // Not this provider's to terminate (see the NodeClaim lifecycle): treated as gone.
        Err(CloudProviderError::InvalidProviderId(pid)) => {
            tracing::warn!(node = %name, nodeclaim = %claim_name, "provider-id" = %pid, "the cloud provider cannot act on this provider ID: the instance is treated as gone");
        }
        Err(error) if error.is_not_found() => {
            if let Some(started) = t.with_progress(name, |p| p.instance_termination_started.take()) {
                observe(
                    &ctx.metrics.nodeclaims_instance_termination_duration,
                    vec![("nodepool", term.nodepool.clone())],
                    started.elapsed(),
                );
            }
        }
        Err(source) => return Err(Error::Cloud { node_claim: claim_name.clone(), source }),
    }
    Ok(Step::Continue(()))
}

/// Deletes `claim`, unless it is being deleted already (or is gone, or was replaced).
async fn delete_node_claim(ctx: &Context, claim: &NodeClaim) -> Result<(), Error> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let claim_name = claim.name_any();
    let claims: Api<NodeClaim> = Api::all(ctx.client.clone());
    let params = DeleteParams { preconditions: uid_precondition(claim.uid()), ..Default::default() };
    match claims.delete(&claim_name, &params).await {
        Ok(_) => Ok(()),
        Err(e) if is_stale(&e) => Ok(()),
        Err(source) => Err(Error::Kube { action: format!("delete nodeclaim {claim_name}"), source }),
    }
}

/// Removes the finalizer of the node, which lets it go, and counts its termination; `now` is when
/// its drain was planned, the end of its termination for `nodes_termination_duration`.
pub(super) async fn release(t: &Terminator, term: &Termination, now: Timestamp) -> Result<Next, Error> {
    remove_finalizer(&t.ctx, &term.node).await?;
    tracing::info!(node = %term.name, nodeclaim = %term.claim_name, "deleted node");
    record_termination(&t.ctx, term, now);
    t.forget(&term.name);
    Ok(Next::Wait)
}

/// Counts the node in `nodes_terminated`, and observes its lifetime and how long its termination
/// took.
fn record_termination(ctx: &Context, term: &Termination, now: Timestamp) {
    let nodepool = &term.nodepool;
    ctx.metrics.nodes_terminated.get_or_create(&vec![("nodepool", nodepool.clone())]).inc();
    if let Some(lived) = lifetime(&term.node, Timestamp::now()) {
        observe(&ctx.metrics.nodes_lifetime_duration, vec![("nodepool", nodepool.clone())], lived);
    }
    let elapsed = now.duration_since(term.deleted_at);
    ctx.metrics.nodes_termination_duration.observe(
        &vec![("nodepool", nodepool.clone())],
        Duration::try_from(elapsed).unwrap_or_default().as_secs_f64(),
    );
}
