//! Controllers of Nodes: termination (drain, then the instance) of the nodes Karpenter launched,
//! repair of unhealthy ones (`health`), the node, utilisation and cost metrics (`metrics`); and the writes to Nodes that several controllers make
//! (the `karpenter.sh/disrupted` taint).

pub mod health;
pub mod metrics;
pub mod termination;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::apis::NodeClaim;
use crate::apis::labels::TAINT_DISRUPTED;
use crate::util::api::is_conflict;

/// The label that takes a node out of external load balancers while it drains (as upstream sets
/// it), with the value upstream gives it.
pub const LABEL_EXCLUDE_FROM_LOAD_BALANCERS: (&str, &str) =
    ("node.kubernetes.io/exclude-from-external-load-balancers", "karpenter");

/// The node's taints with `karpenter.sh/disrupted:NoSchedule` added, or `None` when it is there.
pub fn with_disrupted_taint(taints: &[Taint]) -> Option<Vec<Taint>> {
    if taints.iter().any(|t| t.key == TAINT_DISRUPTED && t.effect == "NoSchedule") {
        return None;
    }
    let mut taints = taints.to_vec();
    taints.push(Taint {
        key: TAINT_DISRUPTED.into(),
        effect: "NoSchedule".into(),
        value: None,
        time_added: None,
    });
    Some(taints)
}

/// Attempts of [`taint_disrupted`] before a conflict is returned.
const TAINT_ATTEMPTS: usize = 3;

/// Taints `node` `karpenter.sh/disrupted:NoSchedule` (and labels it out of external load
/// balancers), unless it already is, as termination does. Returns the tainted node.
pub async fn taint_disrupted(client: &Client, node: &Node) -> Result<Option<Node>, kube::Error> {
    add_disrupted_taint(client, node, true).await
}

/// Removes the `karpenter.sh/disrupted:NoSchedule` taint of `node`, unless the node or its
/// NodeClaim `claim` is being deleted: a draining node keeps it, or new pods would land there.
/// Both are read from the API server (a cache may not show a deletion yet) before the write, and
/// again before each retry after a conflict. Returns the node as written, `None` when the taint
/// stays or was not there.
pub async fn remove_disrupted_taint(
    client: &Client,
    node: &Node,
    claim: Option<&str>,
) -> Result<Option<Node>, kube::Error> {
    write_taint(client, node, false, false, claim).await
}

/// Adds the `karpenter.sh/disrupted:NoSchedule` taint to `node`, and with
/// `exclude_from_load_balancers` labels it out of external load balancers. The taints are written
/// whole, conditional on the version they were read at, so a taint someone else adds meanwhile is
/// never lost: on a conflict the node is read again and the write retried at once. Returns the
/// node as written, `None` when there was nothing to change.
pub async fn add_disrupted_taint(
    client: &Client,
    node: &Node,
    exclude_from_load_balancers: bool,
) -> Result<Option<Node>, kube::Error> {
    write_taint(client, node, true, exclude_from_load_balancers, None).await
}

async fn write_taint(
    client: &Client,
    node: &Node,
    present: bool,
    exclude_from_load_balancers: bool,
    claim: Option<&str>,
) -> Result<Option<Node>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let claims: Api<NodeClaim> = Api::all(client.clone());
    let mut current = if present { node.clone() } else { nodes.get(&node.name_any()).await? };
    for attempt in 1..=TAINT_ATTEMPTS {
        if !present {
            let claim_going = match claim {
                Some(name) => {
                    claims.get_opt(name).await?.is_some_and(|c| c.metadata.deletion_timestamp.is_some())
                }
                None => false,
            };
            if current.metadata.deletion_timestamp.is_some() || claim_going {
                tracing::debug!(node = %node.name_any(), "leaving the disrupted taint of a node being deleted");
                return Ok(None);
            }
        }
        let taints = current.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
        let taints = if present { with_disrupted_taint(taints) } else { without_disrupted_taint(taints) };
        let Some(taints) = taints else { return Ok(None) };
        let mut patch = json!({
            "metadata": { "resourceVersion": current.resource_version() },
            "spec": { "taints": taints },
        });
        if exclude_from_load_balancers {
            let (label, value) = LABEL_EXCLUDE_FROM_LOAD_BALANCERS;
            patch["metadata"]["labels"] = json!({ label: value });
        }
        match nodes.patch(&node.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(patched) => {
                if present {
                    tracing::info!(node = %node.name_any(), "taint.Key" = TAINT_DISRUPTED, "taint.Effect" = "NoSchedule", "tainted node");
                } else {
                    tracing::info!(node = %node.name_any(), "taint.Key" = TAINT_DISRUPTED, "taint.Effect" = "NoSchedule", "untainted node");
                }
                return Ok(Some(patched));
            }
            Err(e) if is_conflict(&e) && attempt < TAINT_ATTEMPTS => {
                current = nodes.get(&node.name_any()).await?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The node's taints without `karpenter.sh/disrupted:NoSchedule`, or `None` when it is not there.
pub fn without_disrupted_taint(taints: &[Taint]) -> Option<Vec<Taint>> {
    let kept: Vec<Taint> =
        taints.iter().filter(|t| !(t.key == TAINT_DISRUPTED && t.effect == "NoSchedule")).cloned().collect();
    (kept.len() != taints.len()).then_some(kept)
}
