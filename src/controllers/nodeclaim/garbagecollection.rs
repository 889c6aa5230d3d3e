//! Instance garbage collection: instances the cloud provider lists for this cluster that no
//! NodeClaim accounts for are terminated, and their Nodes deleted.
//!
//! Such instances are leaks: a NodeClaim removed by hand while its launch was under way, a
//! controller that crashed between CreateFleet and recording the instance, a NodeClaim
//! force-deleted without its finalizer. An instance counts as known when a NodeClaim records its
//! provider ID or is the one named by its `karpenter.sh/nodeclaim` tag. Instances launched less
//! than [`GRACE`] ago are left alone, since their NodeClaim may not be recorded yet.
//!
//! The controller runs every 10 s for its first rounds and every 2 min after that (as upstream).
//! Each round lists the instances first and then the NodeClaims, fresh from the API server and
//! as plain JSON: a NodeClaim this version cannot parse still protects its instance, and a stale
//! or empty cache can never make every instance look leaked.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::sync::watch;

use crate::apis::nodeclaim::conditions::LAUNCHED;
use crate::apis::{NodeClaim, NodeClaimSpec, NodeClaimStatus};
use crate::cloudprovider::{CloudProvider, Instance};
use crate::controllers::Context;
use crate::controllers::kit::{Backoff, Next, Options, Timer, run_singleton};
use crate::state::ClusterState;
use crate::util::api::{is_not_found, is_stale};
use crate::util::error_chain;

/// How old an instance must be before it can be collected.
pub const GRACE: Duration = Duration::from_secs(30);
/// Delay between rounds while the controller is young.
const FAST_INTERVAL: Duration = Duration::from_secs(10);
/// Successful rounds run at [`FAST_INTERVAL`].
const FAST_ROUNDS: u32 = 20;
/// Delay between rounds after that.
const INTERVAL: Duration = Duration::from_secs(120);

/// What garbage collection needs of a NodeClaim: its name and the provider ID it recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KnownClaim {
    /// The NodeClaim's name.
    pub name: String,
    /// Its `status.providerID`, once launched.
    pub provider_id: Option<String>,
    /// Its uid.
    pub uid: Option<String>,
    /// When its `Launched` condition turned true.
    pub launched_at: Option<Timestamp>,
    /// Whether it is being deleted already.
    pub deleting: bool,
}

/// How many NodeClaims one list request returns at most.
const LIST_PAGE: u32 = 250;

/// The two fields of a NodeClaim garbage collection reads; serde skips the rest without building
/// it, so that a thousand NodeClaims cost a few kilobytes, and one that the full type would reject
/// still counts.
#[derive(serde::Deserialize)]
struct SlimClaim {
    metadata: SlimMeta,
    #[serde(default)]
    status: Option<SlimStatus>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    deletion_timestamp: Option<String>,
}

#[derive(serde::Deserialize)]
struct SlimStatus {
    #[serde(default, rename = "providerID")]
    provider_id: Option<String>,
    #[serde(default)]
    conditions: Vec<SlimCondition>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct SlimCondition {
    #[serde(default, rename = "type")]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    last_transition_time: Option<String>,
}

#[derive(serde::Deserialize)]
struct SlimList {
    #[serde(default)]
    items: Vec<SlimClaim>,
    #[serde(default)]
    metadata: kube::api::ListMeta,
}

/// Every NodeClaim of the cluster, fresh from the API server, a page at a time.
pub async fn list_claims(client: &Client) -> Result<Vec<KnownClaim>, kube::Error> {
    let request = kube::core::Request::new(NodeClaim::url_path(&(), None));
    let mut out = Vec::new();
    let mut continue_token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(LIST_PAGE);
        if let Some(token) = continue_token.take() {
            params = params.continue_token(&token);
        }
        let http = request.list(&params).map_err(kube::Error::BuildRequest)?;
        let page: SlimList = client.request(http).await?;
        out.extend(page.items.into_iter().map(|c| {
            let launched_at = c.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == LAUNCHED && c.status == "True")
                    .and_then(|c| c.last_transition_time.as_deref()?.parse().ok())
            });
            KnownClaim {
                name: c.metadata.name,
                uid: c.metadata.uid,
                deleting: c.metadata.deletion_timestamp.is_some(),
                launched_at,
                provider_id: c.status.and_then(|s| s.provider_id).filter(|p| !p.is_empty()),
            }
        }));
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(token) => continue_token = Some(token),
            None => return Ok(out),
        }
    }
}

/// Instance states in which the instance is already going away.
const GOING: [&str; 2] = ["shutting-down", "terminated"];

/// The instances no NodeClaim accounts for, launched at least `grace` before `now`. An instance is
/// accounted for when a NodeClaim records its provider ID, or when the NodeClaim its
/// `karpenter.sh/nodeclaim` tag names exists and records no instance yet (its launch is under
/// way). An instance whose NodeClaim records another instance is a duplicate, and collected.
/// Instances without a launch time, or already shutting down, are never chosen.
pub fn orphans<'a>(
    instances: &'a [Instance],
    claims: &[KnownClaim],
    now: Timestamp,
    grace: Duration,
) -> Vec<&'a Instance> {
    let launching: HashSet<&str> =
        claims.iter().filter(|c| c.provider_id.is_none()).map(|c| c.name.as_str()).collect();
    let provider_ids: HashSet<&str> =
        claims.iter().filter_map(|c| c.provider_id.as_deref()).filter(|p| !p.is_empty()).collect();
    let cutoff = now.as_second().saturating_sub(i64::try_from(grace.as_secs()).unwrap_or(i64::MAX));
    instances
        .iter()
        .filter(|i| !GOING.contains(&i.state.as_str()))
        .filter(|i| !provider_ids.contains(i.provider_id.as_str()))
        .filter(|i| i.node_claim.as_deref().is_none_or(|n| !launching.contains(n)))
        .filter(|i| {
            i.launch_time
                .as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .is_some_and(|t| t.as_second() <= cutoff)
        })
        .collect()
}

/// The NodeClaims, launched at least `grace` before `now` and not being deleted, whose instance is
/// not among `instances` (every instance the cloud provider lists): their instance is gone (an
/// instance terminated behind Karpenter's back, a Node deleted by hand on kwok) and so should they.
/// A NodeClaim launched less than `grace` ago may not be listed yet, and is left alone.
pub fn claims_without_instance<'a>(
    claims: &'a [KnownClaim],
    instances: &[Instance],
    now: Timestamp,
    grace: Duration,
) -> Vec<&'a KnownClaim> {
    let live: HashSet<&str> = instances
        .iter()
        .filter(|i| !GOING.contains(&i.state.as_str()))
        .map(|i| i.provider_id.as_str())
        .collect();
    let cutoff = now.as_second().saturating_sub(i64::try_from(grace.as_secs()).unwrap_or(i64::MAX));
    claims
        .iter()
        .filter(|c| !c.deleting)
        .filter(|c| c.provider_id.as_deref().is_some_and(|p| !live.contains(p)))
        .filter(|c| c.launched_at.is_some_and(|t| t.as_second() <= cutoff))
        .collect()
}

/// Deletes the NodeClaims [`claims_without_instance`] chooses, once the cloud provider confirms
/// (asked for that one instance) that it is gone; returns their names. An instance of another
/// provider, or a provider ID that does not parse, is not this provider's to judge: such a claim is
/// left alone.
pub async fn collect_claims(
    client: &Client,
    cloud: &dyn CloudProvider,
    claims: &[KnownClaim],
    instances: &[Instance],
    now: Timestamp,
    grace: Duration,
) -> Vec<String> {
    let api: Api<NodeClaim> = Api::all(client.clone());
    let mut collected = Vec::new();
    for claim in claims_without_instance(claims, instances, now, grace) {
        let Some(pid) = claim.provider_id.as_deref() else { continue };
        match cloud.get(pid).await {
            Err(e) if e.is_not_found() => {}
            Ok(_) | Err(_) => continue,
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions { uid: claim.uid.clone(), resource_version: None }),
            ..DeleteParams::default()
        };
        match api.delete(&claim.name, &params).await {
            Ok(_) => {
                tracing::info!(NodeClaim = %claim.name, "provider-id" = %pid, "garbage collecting nodeclaim with no cloudprovider representation");
                collected.push(claim.name.clone());
            }
            Err(e) if is_stale(&e) => {}
            Err(e) => {
                tracing::error!(NodeClaim = %claim.name, error = %error_chain(&e), "deleting a nodeclaim whose instance is gone");
            }
        }
    }
    collected
}

/// A NodeClaim for `instance` as the provider's `delete` reads it: the provider ID in the status.
fn stand_in(instance: &Instance) -> NodeClaim {
    let spec = NodeClaimSpec {
        taints: Vec::new(),
        startup_taints: Vec::new(),
        requirements: Vec::new(),
        resources: None,
        node_class_ref: Default::default(),
        expire_after: String::new(),
        termination_grace_period: None,
    };
    let mut claim = NodeClaim::new(instance.node_claim.as_deref().unwrap_or_default(), spec);
    claim.status =
        Some(NodeClaimStatus { provider_id: Some(instance.provider_id.clone()), ..Default::default() });
    claim
}

/// Terminates those of `instances` that [`orphans`] chooses and returns them. An instance that
/// is already gone counts as collected; any other failure is logged with the instance and
/// skipped.
pub async fn collect_instances(
    cloud: &dyn CloudProvider,
    instances: &[Instance],
    claims: &[KnownClaim],
    now: Timestamp,
    grace: Duration,
) -> Vec<Instance> {
    let mut collected = Vec::new();
    for instance in orphans(instances, claims, now, grace) {
        match cloud.delete(&stand_in(instance)).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                tracing::error!("provider-id" = %instance.provider_id, error = %error_chain(&e), "garbage collecting cloudprovider instance");
                continue;
            }
        }
        tracing::info!("provider-id" = %instance.provider_id, NodeClaim = ?instance.node_claim, "garbage collected cloudprovider instance");
        collected.push(instance.clone());
    }
    collected
}

/// Why a round did not run.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// The cloud provider could not list its instances.
    #[error("listing cloudprovider instances")]
    Instances(#[source] crate::cloudprovider::CloudProviderError),
    /// The NodeClaims could not be listed.
    #[error("listing nodeclaims")]
    Claims(#[source] kube::Error),
}

/// One round: lists the instances, then the NodeClaims (in that order, so that a claim created
/// while the instances are listed is seen), collects the leaked instances and deletes the Nodes
/// the cluster state has for them. Returns how many instances were collected.
pub async fn round(
    client: &Client,
    cloud: &dyn CloudProvider,
    state: &ClusterState,
    grace: Duration,
) -> Result<usize, RoundError> {
    let instances = cloud.list().await.map_err(RoundError::Instances)?;
    let claims = list_claims(client).await.map_err(RoundError::Claims)?;
    let now = Timestamp::now();
    let collected = collect_instances(cloud, &instances, &claims, now, grace).await;
    collect_claims(client, cloud, &claims, &instances, now, grace).await;
    let api: Api<Node> = Api::all(client.clone());
    for instance in &collected {
        for node in state.nodes_with_provider_id(&instance.provider_id) {
            match api.delete(&node.name_any(), &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(Node = %node.name_any(), "provider-id" = %instance.provider_id, "garbage collected node");
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => {
                    tracing::error!(Node = %node.name_any(), error = %error_chain(&e), "deleting the node of a garbage-collected instance");
                }
            }
        }
    }
    Ok(collected.len())
}

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "instance.garbagecollection";

/// Runs the controller until `stop` turns true.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let rounds = std::sync::atomic::AtomicU32::new(0);
    let options = Options::new(CONTROLLER).backoff(Backoff::new(FAST_INTERVAL, INTERVAL));
    run_singleton(options, Some(ctx.metrics.clone()), Timer, stop, || async {
        round(&ctx.client, ctx.cloud.as_ref(), &state, GRACE).await?;
        let done = rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Ok::<_, RoundError>(Next::After(if done <= FAST_ROUNDS { FAST_INTERVAL } else { INTERVAL }))
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str, claim: Option<&str>, launched: &str, state: &str) -> Instance {
        Instance {
            provider_id: format!("aws:///us-west-2a/{id}"),
            node_claim: claim.map(str::to_string),
            launch_time: Some(launched.to_string()),
            state: state.to_string(),
            ..Default::default()
        }
    }

    fn claim(name: &str, provider_id: Option<&str>) -> KnownClaim {
        KnownClaim {
            name: name.to_string(),
            provider_id: provider_id.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn claims_whose_instance_is_gone() {
        let t = |s: &str| s.parse::<Timestamp>().unwrap();
        let launched = |name: &str, pid: &str, at: &str| KnownClaim {
            launched_at: Some(t(at)),
            ..claim(name, Some(pid))
        };
        let claims = [
            launched("alive", "aws:///us-west-2a/i-alive", "2026-01-01T00:00:00Z"),
            launched("gone", "aws:///us-west-2a/i-gone", "2026-01-01T00:00:00Z"),
            launched("young", "aws:///us-west-2a/i-young", "2026-01-01T00:00:50Z"),
            launched("terminated", "aws:///us-west-2a/i-terminated", "2026-01-01T00:00:00Z"),
            KnownClaim {
                deleting: true,
                ..launched("deleting", "aws:///us-west-2a/i-x", "2026-01-01T00:00:00Z")
            },
            claim("launching", None),
        ];
        let instances = [
            instance("i-alive", Some("alive"), "2026-01-01T00:00:00Z", "running"),
            instance("i-terminated", Some("terminated"), "2026-01-01T00:00:00Z", "terminated"),
        ];
        let got: Vec<&str> = claims_without_instance(&claims, &instances, t("2026-01-01T00:01:00Z"), GRACE)
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(got, ["gone", "terminated"]);
    }

    #[test]
    fn orphans_are_old_instances_no_claim_accounts_for() {
        let old = "2026-01-01T00:00:00Z";
        let instances = [
            instance("i-named", Some("a"), old, "running"),
            instance("i-recorded", Some("renamed"), old, "running"),
            instance("i-orphan", Some("b"), old, "running"),
            instance("i-untagged", None, old, "pending"),
            instance("i-young", Some("c"), "2026-01-01T00:00:45Z", "pending"),
            instance("i-going", Some("d"), old, "shutting-down"),
            instance("i-gone", Some("e"), old, "terminated"),
            Instance { launch_time: None, ..instance("i-undated", None, old, "running") },
        ];
        let claims = [claim("a", None), claim("x", Some("aws:///us-west-2a/i-recorded"))];
        let mut instances = instances.to_vec();
        // A second instance tagged for a NodeClaim that records the first one: a duplicate.
        instances.push(instance("i-duplicate", Some("x"), old, "running"));
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let got: Vec<&str> =
            orphans(&instances, &claims, now, GRACE).iter().map(|i| i.provider_id.as_str()).collect();
        assert_eq!(
            got,
            ["aws:///us-west-2a/i-orphan", "aws:///us-west-2a/i-untagged", "aws:///us-west-2a/i-duplicate"]
        );
        // At the grace period's end exactly, the young instance is due too.
        let later: Timestamp = "2026-01-01T00:01:15Z".parse().unwrap();
        assert_eq!(orphans(&instances, &claims, later, GRACE).len(), 4);
    }
}
