//! The cluster state as the decisions read it: a snapshot with the instance types the cloud
//! provider offers each NodePool.

use std::collections::BTreeMap;

use crate::cloudprovider::CloudProvider;
use crate::state::Snapshot;
use crate::util::error_chain;

/// `snapshot` with the instance types of each live NodePool, from `cloud`. A NodePool whose node
/// class is missing or not ready (as the provider judges it) is left out, as upstream leaves out
/// NodePools that are not ready, whatever the provider; so is one whose types cannot be resolved
/// (logged). Why is kept in [`Snapshot::pool_errors`] for the decisions' reasons.
pub async fn with_instance_types_of_pools(
    snapshot: Snapshot,
    cloud: &dyn CloudProvider,
    controller: &str,
) -> Snapshot {
    let mut types = BTreeMap::new();
    let mut errors = BTreeMap::new();
    for np in snapshot.live_nodepools() {
        let name = np.metadata.name.clone().unwrap_or_default();
        if let Err(problem) =
            cloud.node_class_readiness(&np.spec.template.spec.node_class_ref, snapshot.node_class_of(np))
        {
            // The NodePool's NodeClassReady condition says so; no log at every pass.
            tracing::debug!(controller, NodePool = %name, reason = %problem, "skipping, nodepool is not ready");
            errors.insert(name, problem.to_string());
            continue;
        }
        match cloud.instance_types(np).await {
            Ok(found) => {
                types.insert(name, found);
            }
            Err(error @ crate::cloudprovider::CloudProviderError::AwaitingOverlayEvaluation(_)) => {
                // The overlay controller evaluates a new NodePool within moments.
                tracing::debug!(controller, NodePool = %name, "skipping, awaiting nodeoverlay evaluation");
                errors.insert(name, error_chain(&error));
            }
            Err(error) => {
                tracing::error!(
                    controller,
                    NodePool = %name,
                    error = %error_chain(&error),
                    "skipping, unable to resolve instance types"
                );
                errors.insert(name, error_chain(&error));
            }
        }
    }
    let mut snapshot = snapshot.with_instance_types(types);
    snapshot.pool_errors = errors;
    snapshot
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::apis::{EC2NodeClass, NodePool};
    use crate::cloudprovider::kwok::KwokCloudProvider;

    fn pool(name: &str, class: &str) -> Arc<NodePool> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name},
                "spec": {"template": {"spec": {"requirements": [],
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": class}}}},
            }))
            .unwrap(),
        )
    }

    fn class(name: &str, ready: &str) -> Arc<EC2NodeClass> {
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": name},
                "spec": {"amiSelectorTerms": [{"alias": "al2023@latest"}], "role": "r",
                    "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]},
                "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "R", "message": "m",
                    "lastTransitionTime": "2026-11-24T11:00:00Z"}]},
            }))
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn pools_whose_class_is_missing_or_not_ready_get_no_types_with_any_provider() {
        // The kwok provider offers its catalog to every NodePool: the class decides.
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:1".parse().unwrap())).unwrap();
        let cloud = KwokCloudProvider::new(
            client,
            crate::cloudprovider::catalog::kwok_instance_types(),
            Duration::ZERO,
        );
        let snapshot = Snapshot {
            nodepools: vec![pool("ready", "good"), pool("unready", "bad"), pool("orphan", "missing")],
            nodeclasses: vec![class("good", "True"), class("bad", "False")],
            ..Snapshot::default()
        };
        let snapshot = with_instance_types_of_pools(snapshot, &cloud, "test").await;
        assert!(snapshot.pool_types.contains_key("ready"));
        assert!(!snapshot.pool_types.contains_key("unready") && !snapshot.pool_types.contains_key("orphan"));
        assert!(snapshot.pool_errors["unready"].contains("not ready"), "{:?}", snapshot.pool_errors);
        assert!(snapshot.pool_errors["orphan"].contains("not found"), "{:?}", snapshot.pool_errors);
    }
}
