//! The kwok provider's EC2NodeClass status: a class it serves has nothing to resolve (no subnets,
//! images or instance profile exist), so it is Ready as soon as it exists, and says so in its
//! status, as the aws provider's classes do once resolved. NodePools and launches then judge a
//! class's readiness the same way with either provider.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::apis::EC2NodeClass;
use crate::apis::common::{ConditionUpdate, set_condition};
use crate::controllers::kit::{Next, Options, Queue, Reconcile, run_keyed};
use crate::state::{ClusterState, Notice};
use crate::util::api::is_not_found;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "nodeclass.kwok";
/// The condition type and reason of a ready class.
const READY: &str = "Ready";

/// The status conditions `class` should have, or `None` when it has them.
pub fn desired_conditions(class: &EC2NodeClass, now: Timestamp) -> Option<Vec<crate::apis::Condition>> {
    let mut conditions = class.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let changed =
        set_condition(&mut conditions, READY, ConditionUpdate::true_(READY), class.metadata.generation, now);
    changed.then_some(conditions)
}

struct Reconciler {
    client: Client,
    cluster: ClusterState,
}

impl Reconcile for Reconciler {
    type Key = String;
    type Error = kube::Error;

    async fn reconcile(&self, name: &String) -> Result<Next, kube::Error> {
        let Some(class) = self.cluster.nodeclass(name) else { return Ok(Next::Wait) };
        if class.metadata.deletion_timestamp.is_some() {
            return Ok(Next::Wait);
        }
        let Some(conditions) = desired_conditions(&class, Timestamp::now()) else {
            return Ok(Next::Wait);
        };
        let patch = json!({
            "metadata": { "resourceVersion": class.resource_version() },
            "status": { "conditions": conditions },
        });
        let api: Api<EC2NodeClass> = Api::all(self.client.clone());
        match api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {
                tracing::debug!(controller = CONTROLLER, ec2nodeclass = %name, "the class is ready");
                Ok(Next::Wait)
            }
            Err(e) if is_not_found(&e) => Ok(Next::Wait),
            Err(e) => Err(e),
        }
    }
}

/// Runs the controller until `stop` turns true.
pub async fn run(client: Client, cluster: ClusterState, stop: watch::Receiver<bool>) {
    let queue: Arc<Queue<String>> = Arc::new(Queue::new());
    let _classes = {
        let queue = queue.clone();
        cluster.on_nodeclass(move |notice| match notice {
            Notice::Applied(class) => queue.add(class.name_any()),
            gone => queue.forget(&gone.name()),
        })
    };
    for class in cluster.nodeclasses.state() {
        queue.add(class.name_any());
    }
    let reconciler = Arc::new(Reconciler { client, cluster });
    run_keyed(reconciler, queue, Options::new(CONTROLLER), None, stop).await;
}

/// The kwok provider's one controller: EC2NodeClasses are marked ready.
pub struct Controllers;

impl crate::cloudprovider::ProviderControllers for Controllers {
    fn start(
        &self,
        ctx: &crate::controllers::Context,
        state: &ClusterState,
        stop: &watch::Receiver<bool>,
    ) -> (Vec<crate::cloudprovider::ProviderTask>, Option<tokio::sync::oneshot::Receiver<()>>) {
        (vec![(CONTROLLER, Box::pin(run(ctx.client.clone(), state.clone(), stop.clone())))], None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ConditionStatus;

    #[test]
    fn a_class_is_ready_once_and_stays_so() {
        let mut class: EC2NodeClass = serde_json::from_value(json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
            "metadata": {"name": "default", "generation": 2},
            "spec": {"amiSelectorTerms": [{"alias": "al2023@latest"}], "role": "r",
                "subnetSelectorTerms": [{"tags": {"a": "b"}}], "securityGroupSelectorTerms": [{"tags": {"a": "b"}}]}
        }))
        .unwrap();
        let conditions = desired_conditions(&class, "2026-01-01T00:00:00Z".parse().unwrap()).unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!((conditions[0].type_.as_str(), conditions[0].status), (READY, ConditionStatus::True));
        assert_eq!(conditions[0].observed_generation, Some(2));
        class.status = Some(crate::apis::EC2NodeClassStatus { conditions, ..Default::default() });
        assert!(
            desired_conditions(&class, "2026-01-01T00:01:00Z".parse().unwrap()).is_none(),
            "nothing to write again"
        );
    }
}
