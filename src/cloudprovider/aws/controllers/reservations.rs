//! The capacity reservation controllers.
//!
//! - `capacityreservation.expiration` (upstream's): the NodeClaims launched into a capacity block
//!   are deleted once the block is `expiring` (its last 40 minutes), so that their nodes drain,
//!   and their pods move, before EC2 reclaims the instances. Which reservations are expiring is
//!   read from the EC2NodeClasses' status, which the node-class controller refreshes.
//! - `capacityreservation.capacitytype` (upstream's): a reserved node whose instance EC2 now runs
//!   as on-demand (its reservation was cancelled or expired) is relabelled
//!   `karpenter.sh/capacity-type: on-demand`, without its reservation's id and type, on its
//!   NodeClaim and its registered Node, so that it is priced, consolidated and counted as what it
//!   now is.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;

use super::super::reservations::STATE_EXPIRING;
use crate::apis::NodeClaim;
use crate::apis::ec2nodeclass::EC2NodeClass;
use crate::apis::labels::{
    CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_RESERVED, LABEL_CAPACITY_RESERVATION_ID,
    LABEL_CAPACITY_RESERVATION_TYPE, LABEL_CAPACITY_TYPE, LABEL_REGISTERED,
};
use crate::cloudprovider::CloudProvider;
use crate::controllers::Context;
use crate::controllers::kit::{Coalesced, Next, Options, run_singleton};
use crate::controllers::nodeclaim;
use crate::state::{ClusterState, Interest};

/// Name of the expiration controller, in logs and metrics.
pub const CONTROLLER: &str = "capacityreservation.expiration";
/// Name of the capacity type controller, in logs and metrics.
pub const CAPACITY_TYPE_CONTROLLER: &str = "capacityreservation.capacitytype";
/// How often they look (upstream's period). They also look as soon as an EC2NodeClass's status
/// changes: a reservation that turns `expiring`, or that is no longer listed, shows there first.
pub const PERIOD: Duration = Duration::from_secs(60);

/// What wakes them between periods: a change of an EC2NodeClass (its status), once settled.
fn class_changes(state: &ClusterState) -> Coalesced {
    Coalesced {
        changes: state.feed().subscribe(Interest { nodeclasses: true, ..Interest::default() }),
        settle: Duration::from_secs(1),
    }
}

/// The NodeClaims to delete: those not being deleted whose capacity reservation one of the
/// `classes` lists as expiring.
pub fn expiring<'a>(claims: &'a [Arc<NodeClaim>], classes: &[Arc<EC2NodeClass>]) -> Vec<&'a Arc<NodeClaim>> {
    let state: HashMap<&str, &str> = classes
        .iter()
        .filter_map(|c| c.status.as_ref())
        .flat_map(|s| &s.capacity_reservations)
        .map(|r| (r.id.as_str(), r.state.as_deref().unwrap_or_default()))
        .collect();
    claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| {
            c.labels()
                .get(LABEL_CAPACITY_RESERVATION_ID)
                .is_some_and(|id| state.get(id.as_str()) == Some(&STATE_EXPIRING))
        })
        .collect()
}

/// The NodeClaims labelled `reserved`, not being deleted, whose instance (by provider id in
/// `capacity_types`, the cloud provider's view) is on-demand now.
pub fn left_their_reservation<'a>(
    claims: &'a [Arc<NodeClaim>],
    capacity_types: &HashMap<&str, &str>,
) -> Vec<&'a Arc<NodeClaim>> {
    claims
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| c.labels().get(LABEL_CAPACITY_TYPE).map(String::as_str) == Some(CAPACITY_TYPE_RESERVED))
        .filter(|c| {
            let pid = c.status.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
            capacity_types.get(pid) == Some(&CAPACITY_TYPE_ON_DEMAND)
        })
        .collect()
}

/// The merge patch that relabels a reserved NodeClaim or Node on-demand (upstream removes the
/// reservation's id and type, and keeps `capacity-reservation-interruptible`).
pub fn on_demand_labels() -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": {
        LABEL_CAPACITY_TYPE: CAPACITY_TYPE_ON_DEMAND,
        LABEL_CAPACITY_RESERVATION_ID: null,
        LABEL_CAPACITY_RESERVATION_TYPE: null,
    }}})
}

/// Runs the capacity type controller until `stop`: a pass every [`PERIOD`], and when a class
/// changes.
pub async fn run_capacity_type(
    ctx: Context,
    state: ClusterState,
    cloud: Arc<dyn CloudProvider>,
    stop: watch::Receiver<bool>,
) {
    let wake = class_changes(&state);
    run_singleton(Options::new(CAPACITY_TYPE_CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || async {
        let instances = match cloud.list().await {
            Ok(instances) => instances,
            Err(error) => return Err(Error::List(error)),
        };
        let capacity_types: HashMap<&str, &str> =
            instances.iter().map(|i| (i.provider_id.as_str(), i.capacity_type.as_str())).collect();
        let claims = state.nodeclaims.state();
        let patch = Patch::Merge(on_demand_labels());
        let mut failed = None;
        for claim in left_their_reservation(&claims, &capacity_types) {
            let name = claim.name_any();
            let claims_api: Api<NodeClaim> = Api::all(ctx.client.clone());
            if let Err(error) = claims_api.patch(&name, &PatchParams::default(), &patch).await {
                failed = Some(Error::Patch { kind: "NodeClaim", name, source: error });
                continue;
            }
            // Its Node, once registered (until then the registration copies the claim's labels).
            let node = claim.status.as_ref().and_then(|s| s.node_name.as_deref()).and_then(|n| state.node(n));
            if let Some(node) = node.filter(|n| {
                n.metadata.deletion_timestamp.is_none()
                    && n.labels().get(LABEL_REGISTERED).is_some_and(|v| v == "true")
                    && n.labels().get(LABEL_CAPACITY_TYPE).map(String::as_str) == Some(CAPACITY_TYPE_RESERVED)
            }) {
                let nodes: Api<Node> = Api::all(ctx.client.clone());
                if let Err(error) = nodes.patch(&node.name_any(), &PatchParams::default(), &patch).await {
                    failed = Some(Error::Patch { kind: "Node", name: node.name_any(), source: error });
                    continue;
                }
            }
            tracing::info!(controller = CAPACITY_TYPE_CONTROLLER, NodeClaim = %name, "updated capacity type for nodeclaims");
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(Next::After(PERIOD)),
        }
    })
    .await;
}

/// Why a capacity type pass failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud provider's instances could not be listed.
    #[error("listing instances")]
    List(#[source] crate::cloudprovider::CloudProviderError),
    /// A NodeClaim or Node could not be relabelled.
    #[error("patching {kind} {name}")]
    Patch {
        /// `NodeClaim` or `Node`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// Runs the expiration controller until `stop`.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let wake = class_changes(&state);
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || async {
        let claims = state.nodeclaims.state();
        let classes = state.nodeclasses.state();
        let mut failed = None;
        for claim in expiring(&claims, &classes) {
            match nodeclaim::delete(&ctx.client, claim).await {
                Ok(true) => tracing::info!(
                    controller = CONTROLLER,
                    NodeClaim = %claim.name_any(),
                    capacity_reservation_id = claim.labels().get(LABEL_CAPACITY_RESERVATION_ID).map(String::as_str).unwrap_or_default(),
                    "initiating delete for capacity block expiration"
                ),
                Ok(false) => {}
                Err(error) => failed = Some(error),
            }
        }
        match failed {
            Some(error) => Err(error),
            None => Ok(Next::After(PERIOD)),
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, reservation: Option<&str>, deleting: bool) -> Arc<NodeClaim> {
        let mut labels = serde_json::Map::new();
        if let Some(id) = reservation {
            labels.insert(LABEL_CAPACITY_RESERVATION_ID.into(), id.into());
        }
        let mut c: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []}
        }))
        .unwrap();
        if deleting {
            c.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-11-24T11:00:00Z".parse().unwrap(),
            ));
        }
        Arc::new(c)
    }

    #[test]
    fn only_the_claims_of_expiring_blocks_go() {
        let class: EC2NodeClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass", "metadata": {"name": "default"},
            "spec": {"role": "r", "amiSelectorTerms": [{"alias": "al2023@latest"}],
                "subnetSelectorTerms": [{"id": "subnet-1"}], "securityGroupSelectorTerms": [{"id": "sg-1"}]},
            "status": {"capacityReservations": [
                {"id": "cr-block", "availabilityZone": "us-west-2a", "instanceType": "p5.48xlarge", "ownerID": "123456789012",
                 "instanceMatchCriteria": "targeted", "reservationType": "capacity-block", "state": "expiring"},
                {"id": "cr-odcr", "availabilityZone": "us-west-2a", "instanceType": "m5.large", "ownerID": "123456789012",
                 "instanceMatchCriteria": "targeted", "reservationType": "default", "state": "active"}]}
        }))
        .unwrap();
        let claims = [
            claim("block", Some("cr-block"), false),
            claim("block-deleting", Some("cr-block"), true),
            claim("odcr", Some("cr-odcr"), false),
            claim("plain", None, false),
        ];
        let got: Vec<String> = expiring(&claims, &[Arc::new(class)]).iter().map(|c| c.name_any()).collect();
        assert_eq!(got, vec!["block".to_string()]);
    }

    #[test]
    fn reserved_claims_whose_instance_is_on_demand_now_are_relabelled() {
        let with = |name: &str, capacity_type: &str, deleting: bool| {
            let mut c = (*claim(name, Some("cr-1"), deleting)).clone();
            c.labels_mut().insert(LABEL_CAPACITY_TYPE.into(), capacity_type.into());
            c.status = Some(crate::apis::NodeClaimStatus {
                provider_id: Some(format!("aws:///us-west-2a/i-{name}")),
                ..Default::default()
            });
            Arc::new(c)
        };
        let claims = [
            with("moved", "reserved", false),
            with("still", "reserved", false),
            with("going", "reserved", true),
            with("plain", "on-demand", false),
            with("unknown", "reserved", false),
        ];
        let types = HashMap::from([
            ("aws:///us-west-2a/i-moved", "on-demand"),
            ("aws:///us-west-2a/i-still", "reserved"),
            ("aws:///us-west-2a/i-going", "on-demand"),
            ("aws:///us-west-2a/i-plain", "on-demand"),
        ]);
        let got: Vec<String> = left_their_reservation(&claims, &types).iter().map(|c| c.name_any()).collect();
        assert_eq!(got, ["moved"]);
        let labels = &on_demand_labels()["metadata"]["labels"];
        assert_eq!(labels[LABEL_CAPACITY_TYPE], "on-demand");
        assert!(
            labels[LABEL_CAPACITY_RESERVATION_ID].is_null()
                && labels[LABEL_CAPACITY_RESERVATION_TYPE].is_null()
        );
    }
}
