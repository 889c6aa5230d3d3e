//! The capacity block expiration controller (upstream's `capacityreservation.expiration`): the
//! NodeClaims launched into a capacity block are deleted once the block is `expiring` (its last
//! 40 minutes), so that their nodes drain, and their pods move, before EC2 reclaims the
//! instances. Which reservations are expiring is read from the EC2NodeClasses' status, which the
//! node-class controller refreshes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use tokio::sync::watch;

use super::super::reservations::STATE_EXPIRING;
use crate::apis::NodeClaim;
use crate::apis::ec2nodeclass::EC2NodeClass;
use crate::apis::labels::LABEL_CAPACITY_RESERVATION_ID;
use crate::controllers::Context;
use crate::controllers::kit::{Next, Options, Timer, run_singleton};
use crate::controllers::nodeclaim;
use crate::state::ClusterState;

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "capacityreservation.expiration";
/// How often it looks (upstream's period).
pub const PERIOD: Duration = Duration::from_secs(60);

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

/// Runs the controller until `stop`.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), Timer, stop, || async {
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
}
