//! Launch: asks the cloud provider for the claim's instance once its node class is Ready and
//! records the instance on the claim. Insufficient capacity or a missing node class deletes the
//! claim so that the provisioner decides again; a node class that is not Ready yet is waited for.
//! An instance launched for a claim whose status write failed is reused, never launched twice.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;

use super::logic::{self, reasons};
use super::{CONTROLLER, Error, State, count_disruption, delete_claim};
use crate::apis::common::{ConditionUpdate, set_condition};
use crate::apis::nodeclaim::conditions::LAUNCHED;
use crate::apis::{EC2NodeClass, NodeClaim};
use crate::cloudprovider::{CloudProviderError, Instance};
use crate::controllers::events::reasons as event_reasons;
use crate::state::nodeclass::{self, NodeClassProblem};
use crate::util::error_chain;

/// How often a claim whose node class is not ready retries its launch.
const NODE_CLASS_RETRY: Duration = Duration::from_secs(15);

/// Outcome of the launch step.
pub(super) enum Launch {
    Launched(Box<Instance>),
    Deleted,
    Retry(Duration),
    Failed(Error),
}

pub(super) async fn launch(claim: &mut NodeClaim, state: &State, now: Timestamp) -> Launch {
    let name = claim.name_any();
    let generation = claim.metadata.generation;
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let remembered = state.launched().get(&uid).cloned();
    let result = match remembered {
        Some(instance) => {
            tracing::info!(
                controller = CONTROLLER,
                nodeclaim = %name,
                "provider-id" = %instance.provider_id,
                "using the instance of an earlier launch whose status was not written"
            );
            Ok(instance)
        }
        None => match check_node_class(claim, state).await {
            Ok(()) => state.ctx.cloud.create(claim).await,
            Err(error) => Err(error),
        },
    };
    match result {
        Ok(instance) => {
            if !uid.is_empty() {
                state.launched().insert(uid, instance.clone());
            }
            logic::apply_instance(claim, &instance);
            let update = ConditionUpdate::true_(reasons::LAUNCHED);
            set_condition(conditions_mut(claim), LAUNCHED, update, generation, now);
            Launch::Launched(Box::new(instance))
        }
        // Upstream treats a missing node class like insufficient capacity: the claim goes, and the
        // provisioner decides again.
        Err(
            error @ (CloudProviderError::InsufficientCapacity { .. }
            | CloudProviderError::NodeClassNotFound { .. }),
        ) => {
            let (reason, metric_reason) = match error {
                CloudProviderError::NodeClassNotFound { .. } => {
                    (event_reasons::NODE_CLASS_NOT_FOUND, "nodeclass_not_found")
                }
                _ => (event_reasons::INSUFFICIENT_CAPACITY_ERROR, "insufficient_capacity"),
            };
            let message = error.to_string();
            tracing::error!(
                controller = CONTROLLER,
                nodeclaim = %name,
                error = %message,
                "failed launching nodeclaim"
            );
            state.ctx.events.warning(&*claim, reason, message).await;
            match delete_claim(claim, state).await {
                Ok(()) => {
                    count_disruption(claim, state, metric_reason);
                    Launch::Deleted
                }
                Err(error) => Launch::Failed(error),
            }
        }
        Err(error @ CloudProviderError::NodeClassNotReady { .. }) => {
            let message = error.to_string();
            tracing::info!(controller = CONTROLLER, nodeclaim = %name, reason = %message, "waiting for the node class");
            let update = ConditionUpdate::false_(reasons::NODE_CLASS_NOT_READY, message.clone());
            set_condition(conditions_mut(claim), LAUNCHED, update, generation, now);
            state.ctx.events.warning(&*claim, event_reasons::NODE_CLASS_NOT_READY, message).await;
            Launch::Retry(NODE_CLASS_RETRY)
        }
        Err(error) => {
            // Unknown, as upstream: the next attempt may launch it.
            let message = logic::launch_failure_message(&error_chain(&error));
            let update = ConditionUpdate::unknown(reasons::LAUNCH_FAILED, message);
            set_condition(conditions_mut(claim), LAUNCHED, update, generation, now);
            Launch::Failed(Error::Cloud { method: "create", source: error })
        }
    }
}

/// Whether the claim's node class exists and is Ready, for either provider. A class the cache does
/// not have is looked up on the API server before the claim is given up on, so a class created a
/// moment ago is never taken for a missing one.
async fn check_node_class(claim: &NodeClaim, state: &State) -> Result<(), CloudProviderError> {
    let reference = &claim.spec.node_class_ref;
    let cached = state.cluster.nodeclass(&reference.name).filter(|_| nodeclass::is_served(reference));
    let class = match cached {
        Some(class) => Some(class),
        None if nodeclass::is_served(reference) => {
            let api: Api<EC2NodeClass> = Api::all(state.ctx.client.clone());
            api.get_opt(&reference.name)
                .await
                .map_err(|e| CloudProviderError::UnexpectedResponse {
                    operation: "GetEC2NodeClass",
                    message: error_chain(&e),
                })?
                .map(Arc::new)
        }
        None => None,
    };
    state.ctx.cloud.node_class_readiness(reference, class.as_deref()).map_err(|problem| match problem {
        NodeClassProblem::NotFound(reason) => {
            CloudProviderError::NodeClassNotFound { name: reference.name.clone(), reason }
        }
        NodeClassProblem::NotReady(reason) => {
            CloudProviderError::NodeClassNotReady { name: reference.name.clone(), reason }
        }
    })
}

fn conditions_mut(claim: &mut NodeClaim) -> &mut Vec<crate::apis::Condition> {
    &mut claim.status.get_or_insert_with(Default::default).conditions
}
