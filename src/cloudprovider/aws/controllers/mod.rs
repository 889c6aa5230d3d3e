//! Controllers only the AWS provider has: the EC2NodeClass status, the refresh of instance
//! types, prices and launch templates, interruption (the SQS queue and EC2 status checks), the
//! instance tags added after registration, the instance-type metrics, and the expiration of
//! capacity blocks. [`Controllers`] starts them for the operator.

pub mod interruption;
pub mod metrics;
pub mod nodeclass;
pub mod refresh;
pub mod reservations;
pub mod tagging;

use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use crate::cloudprovider::aws::AwsCloudProvider;
use crate::cloudprovider::{ProviderControllers, ProviderTask};
use crate::controllers::Context;
use crate::state::ClusterState;

/// The AWS provider's controllers, with the settings they take.
pub struct Controllers {
    /// The provider they feed and read.
    pub provider: Arc<AwsCloudProvider>,
    /// `ISOLATED_VPC`: no public pricing API; on-demand prices stay those of the built-in table.
    pub isolated_vpc: bool,
    /// `INTERRUPTION_QUEUE`, when set.
    pub interruption_queue: Option<String>,
}

impl ProviderControllers for Controllers {
    fn start(
        &self,
        ctx: &Context,
        state: &ClusterState,
        stop: &watch::Receiver<bool>,
    ) -> (Vec<ProviderTask>, Option<oneshot::Receiver<()>>) {
        let aws = &self.provider;
        // Launches after a restart must not wait for the node-class controller to resolve the
        // classes again: the provisioner and the NodeClaim lifecycle start from the status a
        // previous run resolved.
        let seeded = aws.node_classes().seed(state.nodeclasses.state().iter().map(|c| (**c).clone()));
        tracing::debug!(count = seeded, "node classes known from the API");
        let (fetched_tx, fetched) = oneshot::channel();
        let mut tasks: Vec<ProviderTask> = vec![(
            "aws.refresh",
            Box::pin(refresh::run(aws.clone(), self.isolated_vpc, fetched_tx, stop.clone())),
        )];
        if let Some(queue) = &self.interruption_queue {
            tasks.push((
                interruption::CONTROLLER,
                Box::pin(interruption::run_queue(
                    ctx.clone(),
                    state.clone(),
                    aws.clone(),
                    queue.clone(),
                    stop.clone(),
                )),
            ));
        }
        tasks.push((
            interruption::STATUS_CONTROLLER,
            Box::pin(interruption::run_instance_status(
                ctx.clone(),
                state.clone(),
                aws.clone(),
                stop.clone(),
            )),
        ));
        tasks.push((
            metrics::CONTROLLER,
            Box::pin(metrics::run(ctx.clone(), state.clone(), aws.clone(), stop.clone())),
        ));
        tasks.push((
            nodeclass::CONTROLLER,
            Box::pin(nodeclass::run(
                ctx.client.clone(),
                state.clone(),
                aws.clone(),
                ctx.events.clone(),
                stop.clone(),
            )),
        ));
        tasks.push((
            tagging::CONTROLLER,
            Box::pin(tagging::run(ctx.client.clone(), state.clone(), aws.clone(), stop.clone())),
        ));
        if aws.reserved_capacity() {
            tasks.push((
                reservations::CONTROLLER,
                Box::pin(reservations::run(ctx.clone(), state.clone(), stop.clone())),
            ));
            tasks.push((
                reservations::CAPACITY_TYPE_CONTROLLER,
                Box::pin(reservations::run_capacity_type(
                    ctx.clone(),
                    state.clone(),
                    ctx.cloud.clone(),
                    stop.clone(),
                )),
            ));
        }
        (tasks, Some(fetched))
    }
}
