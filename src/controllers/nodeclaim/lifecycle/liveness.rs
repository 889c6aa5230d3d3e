//! Liveness: a claim not launched [`logic::LAUNCH_TTL`] after its creation, or not registered
//! [`logic::REGISTRATION_TTL`] after its launch, is deleted, with an event and a disruption count
//! naming why. The deadlines themselves are decided in [`logic::liveness`].

use kube::ResourceExt;

use super::{CONTROLLER, Error, State, count_disruption, delete_claim, logic};
use crate::apis::NodeClaim;

/// Deletes a claim that failed its liveness check, with an event and a disruption count.
pub(super) async fn expire(
    claim: &NodeClaim,
    state: &State,
    reason: &'static str,
    metric_reason: &'static str,
    message: String,
) -> Result<(), Error> {
    tracing::info!(
        controller = CONTROLLER,
        nodeclaim = %claim.name_any(),
        nodepool = %logic::nodepool(claim),
        reason,
        message = %message,
        "deleting nodeclaim, liveness check failed"
    );
    state.ctx.events.warning(claim, reason, message).await;
    delete_claim(claim, state).await?;
    count_disruption(claim, state, metric_reason);
    Ok(())
}
