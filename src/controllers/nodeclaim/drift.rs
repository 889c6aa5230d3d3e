//! Drift detection: marks launched NodeClaims that no longer match their NodePool or node class
//! with the `Drifted` status condition (the DRIFTED column of `kubectl get nodeclaim -o wide`),
//! and clears it when they match again.
//!
//! A NodeClaim has drifted, checked in this order, when:
//! 1. its `karpenter.sh/nodepool-hash` annotation differs from its NodePool's current hash: the
//!    NodePool's template changed (`NodePoolDrifted`). The hash is upstream's (version `v3`), so
//!    a claim upstream Karpenter made is compared as it is. A claim whose hash is of another
//!    scheme (`karpenter.sh/nodepool-hash-version`: an older one of upstream's, or `rs-v2`, this
//!    controller's former one) is re-stamped with the current hash instead, as upstream does when
//!    its scheme changes (a claim already drifted keeps its hash);
//! 2. its NodePool's requirements no longer allow one of its labels, or require a key it has
//!    neither a label nor a launch requirement for (`RequirementsDrifted`);
//! 3. it is older than an hour and its instance type, or an offering of it in its zone and
//!    capacity type, is no longer one its NodePool can launch (`InstanceTypeNotFound`);
//! 4. the cloud provider says so, e.g. a new AMI or other subnets (`AMIDrift`, `SubnetDrift`,
//!    `SecurityGroupDrift`, `NodeClassDrift`).
//!
//! Every NodeClaim is looked at every 5 minutes, and within seconds of a NodePool, node class or
//! NodeClaim change; a round woken by a NodeClaim change asks the cloud provider only about the
//! claims it was not asked about in the last 5 minutes (or since a NodePool's spec or a node
//! class changed). Marking is all this controller does: the disruption controller replaces
//! drifted nodes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use super::{Written, write_conditions};
use crate::apis::common::{ConditionUpdate, remove_condition, set_condition};
use crate::apis::labels::{
    ANNOTATION_NODEPOOL_HASH, ANNOTATION_NODEPOOL_HASH_VERSION, CAPACITY_TYPE_ON_DEMAND,
    CAPACITY_TYPE_RESERVED, LABEL_CAPACITY_TYPE, LABEL_INSTANCE_TYPE, LABEL_NODEPOOL, LABEL_TOPOLOGY_ZONE,
};
use crate::apis::nodeclaim::conditions::{DRIFTED, LAUNCHED};
use crate::apis::nodepool::NODEPOOL_HASH_VERSION;
use crate::apis::{NodeClaim, NodePool};
use crate::cloudprovider::{CloudProvider, CloudProviderError};
use crate::controllers::Context;
use crate::controllers::kit::{Backoff, Coalesced, Next, Options, run_singleton};
use crate::scheduling::Requirements;
use crate::scheduling::instancetypes::InstanceType;
use crate::state::{ClusterState, Interest};
use crate::util::api::is_stale;
use crate::util::error_chain;

/// Delay between two looks at every NodeClaim (as upstream's drift requeue).
const INTERVAL: Duration = Duration::from_secs(300);
/// A provider check that failed (throttling, a 5xx) is asked again after this backoff, not a
/// whole [`INTERVAL`] later: an AMI rollout must not wait five minutes on one throttled call.
const RETRY: Backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(60));
/// The NodePool's template changed since the NodeClaim was made.
pub const NODEPOOL_DRIFTED: &str = "NodePoolDrifted";
/// A label of the NodeClaim is no longer allowed by its NodePool.
pub const REQUIREMENTS_DRIFTED: &str = "RequirementsDrifted";
/// The NodeClaim's instance type (or its offering) is no longer one its NodePool can launch.
pub const INSTANCE_TYPE_NOT_FOUND: &str = "InstanceTypeNotFound";
/// Claims younger than this are not checked for [`INSTANCE_TYPE_NOT_FOUND`], as upstream: a
/// catalog that briefly lacks a type (a failed refresh) does not drift new nodes.
const INSTANCE_TYPE_CHECK_AGE: SignedDuration = SignedDuration::from_hours(1);

/// Whether `claim`'s NodePool hash is of the current scheme (else it is re-stamped, not
/// compared).
pub fn current_hash_scheme(claim: &NodeClaim) -> bool {
    claim.annotations().get(ANNOTATION_NODEPOOL_HASH_VERSION).map(String::as_str)
        == Some(NODEPOOL_HASH_VERSION)
}

/// Whether `claim` drifted from `pool` without asking the cloud provider: the reason, if so.
pub fn static_drift(claim: &NodeClaim, pool: &NodePool) -> Option<&'static str> {
    if current_hash_scheme(claim)
        && claim.annotations().get(ANNOTATION_NODEPOOL_HASH).is_some_and(|h| !pool.hash_matches(h))
    {
        return Some(NODEPOOL_DRIFTED);
    }
    // A requirement that no longer parses is reported by the NodePool's own validation.
    let requirements = Requirements::from_nodepool(&pool.spec.template.spec.requirements).ok()?;
    (!node_requirements(claim).is_compatible(&requirements, false)).then_some(REQUIREMENTS_DRIFTED)
}

/// What the node of `claim` is: its labels, and for a key it has no label for (a NodePool key
/// allowed several values, say), the requirement it was launched with. As upstream, a NodePool
/// requirement on a key the node has neither is drift, unless it only excludes values
/// (`NotIn`, `DoesNotExist`): a requirement added to the NodePool rolls the nodes made before it.
fn node_requirements(claim: &NodeClaim) -> Requirements {
    let mut node = Requirements::from_labels(claim.labels());
    if let Ok(launched) = Requirements::from_nodepool(&claim.spec.requirements) {
        for (key, req) in launched.iter() {
            if !node.has(key) {
                node.add(key, req.clone());
            }
        }
    }
    node
}

/// Whether `claim` is old enough at `now` to be checked for [`INSTANCE_TYPE_NOT_FOUND`].
pub fn checks_instance_type(claim: &NodeClaim, now: Timestamp) -> bool {
    claim
        .metadata
        .creation_timestamp
        .as_ref()
        .is_some_and(|created| now.duration_since(created.0) > INSTANCE_TYPE_CHECK_AGE)
}

/// Whether `claim`'s instance type is missing from `types` (what its NodePool can launch now),
/// or has no offering in the claim's zone and capacity type. A reserved claim also matches an
/// on-demand offering: its reservation may have ended, the type is still launchable. Whether
/// an offering is available right now does not matter (a type out of capacity is not drift).
///
/// Offerings exist only where the provider knows a price, and spot prices may not be fetched
/// yet (at start, or while the price API fails): a type with no offering of the claim's capacity
/// type anywhere is not judged, nor is anything when `types` is empty.
pub fn instance_type_not_found(claim: &NodeClaim, types: &[Arc<InstanceType>]) -> bool {
    if types.is_empty() {
        return false;
    }
    let labels = claim.labels();
    let Some(name) = labels.get(LABEL_INSTANCE_TYPE) else { return false };
    let Some(it) = types.iter().find(|t| t.name == *name) else { return true };
    let zone = labels.get(LABEL_TOPOLOGY_ZONE);
    let capacity_type = labels.get(LABEL_CAPACITY_TYPE);
    let mut priced = it
        .offerings
        .iter()
        .filter(|o| {
            capacity_type.is_none_or(|c| {
                o.capacity_type == *c
                    || (c == CAPACITY_TYPE_RESERVED && o.capacity_type == CAPACITY_TYPE_ON_DEMAND)
            })
        })
        .peekable();
    if priced.peek().is_none() {
        return false;
    }
    !priced.any(|o| zone.is_none_or(|z| o.zone == *z))
}

/// When the cloud provider was last asked about each NodeClaim (by UID), so that a round woken
/// by a NodeClaim change asks only about the claims not asked lately.
#[derive(Debug, Default)]
pub struct Asked {
    at: HashMap<String, Instant>,
    /// Consecutive failed checks per UID: such a claim is due again after [`RETRY`].
    failures: HashMap<String, u32>,
    /// [`drift_inputs_fingerprint`] when the answers were given.
    inputs: u64,
}

impl Asked {
    /// Whether `claim` is due for the provider's check: never asked, or not within [`INTERVAL`].
    fn due(&self, claim: &NodeClaim, now: Instant) -> bool {
        let Some(uid) = claim.metadata.uid.as_ref() else { return true };
        self.at.get(uid).is_none_or(|t| now.duration_since(*t) >= self.wait(uid))
    }

    /// How long after the last check `uid` is asked again.
    fn wait(&self, uid: &str) -> Duration {
        self.failures.get(uid).map_or(INTERVAL, |n| RETRY.delay(*n))
    }

    /// Notes the provider's answer about `uid`, given at `now`.
    fn answered(&mut self, uid: &str, failed: bool, now: Instant) {
        self.at.insert(uid.to_string(), now);
        if failed {
            *self.failures.entry(uid.to_string()).or_default() += 1;
        } else {
            self.failures.remove(uid);
        }
    }

    /// How long until the first failed check is due again, if any failed.
    fn next_retry(&self, now: Instant) -> Option<Duration> {
        self.failures
            .keys()
            .filter_map(|uid| self.at.get(uid).map(|t| (*t + self.wait(uid)).saturating_duration_since(now)))
            .min()
    }

    /// Forgets every answer when what drift depends on changed, and the claims that are gone.
    fn refresh(&mut self, claims: &[Arc<NodeClaim>], inputs: u64) {
        if inputs != self.inputs {
            self.at.clear();
            self.inputs = inputs;
        }
        let live: std::collections::HashSet<&str> =
            claims.iter().filter_map(|c| c.metadata.uid.as_deref()).collect();
        self.at.retain(|uid, _| live.contains(uid.as_str()));
        self.failures.retain(|uid, _| self.at.contains_key(uid));
    }
}

/// Looks at every launched NodeClaim and writes the changes; returns how many changed. The
/// checks that need no cloud call run for every claim; the provider is asked about the claims
/// `asked` says are due.
pub async fn round(
    client: &Client,
    cloud: &dyn CloudProvider,
    claims: &[Arc<NodeClaim>],
    pools: &[Arc<NodePool>],
    asked: &mut Asked,
) -> usize {
    let pools: HashMap<String, &NodePool> = pools.iter().map(|p| (p.name_any(), p.as_ref())).collect();
    let api: Api<NodeClaim> = Api::all(client.clone());
    // Static checks first; the claims they do not settle are asked of the provider together.
    let mut settled: Vec<(&NodeClaim, Option<&'static str>)> = Vec::new();
    let mut ask: Vec<&NodeClaim> = Vec::new();
    // What each NodePool can launch, asked once per round and only when an old claim needs it.
    let mut types: HashMap<String, Option<Vec<Arc<InstanceType>>>> = HashMap::new();
    let now = Timestamp::now();
    for claim in claims {
        if claim.metadata.deletion_timestamp.is_some() || !claim.is_true(LAUNCHED) {
            continue;
        }
        let pool = claim.labels().get(LABEL_NODEPOOL).and_then(|p| pools.get(p).copied());
        if let Some(pool) = pool
            && !current_hash_scheme(claim)
        {
            // The claim changed: the next round looks at it again.
            restamp(&api, claim, pool).await;
            continue;
        }
        if let Some(reason) = pool.and_then(|p| static_drift(claim, p)) {
            settled.push((claim, Some(reason)));
            continue;
        }
        if let Some(pool) = pool
            && checks_instance_type(claim, now)
        {
            let name = pool.name_any();
            if !types.contains_key(&name) {
                let answer = match cloud.instance_types(pool).await {
                    Ok(t) => Some(t),
                    Err(crate::cloudprovider::CloudProviderError::AwaitingOverlayEvaluation(_)) => None,
                    Err(e) => {
                        tracing::warn!(NodePool = %name, error = %error_chain(&e), "listing instance types to check nodeclaims for drift");
                        None
                    }
                };
                types.insert(name.clone(), answer);
            }
            if types.get(&name).and_then(Option::as_deref).is_some_and(|t| instance_type_not_found(claim, t))
            {
                settled.push((claim, Some(INSTANCE_TYPE_NOT_FOUND)));
                continue;
            }
        }
        if asked.due(claim, Instant::now()) {
            ask.push(claim);
        }
    }
    let answers = cloud.are_drifted(&ask).await;
    let now = Instant::now();
    for (claim, answer) in ask.iter().zip(answers) {
        if let Some(uid) = claim.metadata.uid.as_deref() {
            let failed = matches!(
                &answer,
                Err(e) if !matches!(e, CloudProviderError::NotFound(_) | CloudProviderError::InvalidProviderId(_))
            );
            asked.answered(uid, failed, now);
        }
        match answer {
            Ok(r) => settled.push((claim, r.map(|r| r.as_str()))),
            // An instance that is gone, or one another provider launched, is the lifecycle's
            // business, not drift.
            Err(e @ (CloudProviderError::NotFound(_) | CloudProviderError::InvalidProviderId(_))) => {
                tracing::debug!(NodeClaim = %claim.name_any(), error = %error_chain(&e), "not checking the nodeclaim for drift");
            }
            Err(e) => {
                tracing::warn!(NodeClaim = %claim.name_any(), error = %error_chain(&e), "checking the nodeclaim for drift");
            }
        }
    }
    let mut changed = 0;
    for (claim, reason) in settled {
        let now = Timestamp::now();
        let mut conditions = claim.conditions().to_vec();
        let update = match reason {
            Some(reason) => set_condition(
                &mut conditions,
                DRIFTED,
                ConditionUpdate { message: reason.to_string(), ..ConditionUpdate::true_(reason) },
                claim.metadata.generation,
                now,
            ),
            None => remove_condition(&mut conditions, DRIFTED),
        };
        if !update {
            continue;
        }
        match write_conditions(client, claim, &conditions).await {
            Ok(Written::Done) => {
                changed += 1;
                match reason {
                    Some(reason) => {
                        tracing::info!(NodeClaim = %claim.name_any(), reason, "marked nodeclaim as drifted")
                    }
                    None => tracing::info!(NodeClaim = %claim.name_any(), "nodeclaim no longer drifted"),
                }
            }
            // Gone or changed meanwhile: the next round looks again.
            Ok(Written::Gone | Written::Changed) => {}
            Err(e) => {
                tracing::warn!(NodeClaim = %claim.name_any(), error = %error_chain(&e), "writing the Drifted condition");
            }
        }
    }
    changed
}

/// Writes `pool`'s current hash onto `claim`, whose hash is of another scheme. As upstream, a
/// claim already drifted keeps its old hash (only the version changes), so it stays drifted: a
/// new scheme cannot tell whether it would still differ, and a roll under way is not cancelled.
async fn restamp(api: &Api<NodeClaim>, claim: &NodeClaim, pool: &NodePool) {
    let mut annotations = serde_json::Map::new();
    annotations.insert(ANNOTATION_NODEPOOL_HASH_VERSION.into(), NODEPOOL_HASH_VERSION.into());
    if !claim.is_true(DRIFTED) {
        annotations.insert(ANNOTATION_NODEPOOL_HASH.into(), pool.hash().into());
    }
    let patch = json!({
        "metadata": { "resourceVersion": claim.resource_version(), "annotations": annotations },
    });
    match api.patch(&claim.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => tracing::debug!(NodeClaim = %claim.name_any(), "re-stamped the nodeclaim's nodepool hash"),
        Err(e) if is_stale(&e) => {}
        Err(e) => {
            tracing::warn!(NodeClaim = %claim.name_any(), error = %error_chain(&e), "re-stamping the nodeclaim's nodepool hash")
        }
    }
}

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "nodeclaim.disruption.drift";

/// Runs the controller until `stop` turns true.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    // NodePool and node class edits are what drift most claims at once: looked at within seconds,
    // as are new and changed NodeClaims (a claim launched since, one re-stamped).
    let interest = Interest { nodepools: true, nodeclasses: true, nodeclaims: true, ..Interest::default() };
    let wake = Coalesced { changes: state.feed().subscribe(interest), settle: Duration::from_secs(2) };
    let asked = Arc::new(tokio::sync::Mutex::new(Asked::default()));
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), wake, stop, || async {
        let claims = state.nodeclaims.state();
        let mut asked = asked.lock().await;
        asked.refresh(&claims, drift_inputs_fingerprint(&state));
        round(&ctx.client, ctx.cloud.as_ref(), &claims, &state.nodepools.state(), &mut asked).await;
        let retry = asked.next_retry(Instant::now()).unwrap_or(INTERVAL);
        Ok::<_, std::convert::Infallible>(Next::After(retry.min(INTERVAL)))
    })
    .await;
}

/// A fingerprint of what the drift of every claim depends on besides the claim: the node classes
/// as cached (names and resourceVersions: a status update, say a newly resolved AMI, changes it)
/// and the NodePools' specs (names and generations: their status updates do not count). A claim
/// whose static checks stop finding drift is cleared by the provider's answer, so a change here
/// asks about every claim again.
fn drift_inputs_fingerprint(state: &ClusterState) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut classes: Vec<(String, String)> = state
        .nodeclasses
        .state()
        .iter()
        .map(|c| (c.name_any(), c.resource_version().unwrap_or_default()))
        .collect();
    classes.sort();
    let mut pools: Vec<(String, i64)> = state
        .nodepools
        .state()
        .iter()
        .map(|p| (p.name_any(), p.metadata.generation.unwrap_or_default()))
        .collect();
    pools.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (classes, pools).hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use kube::api::{DeleteParams, PostParams};

    use super::*;
    use crate::apis::ConditionStatus;
    use crate::cloudprovider::{BoxFuture, CloudProviderError, DriftReason, Instance, Result};
    use crate::scheduling::instancetypes::InstanceType;

    /// A NodePool whose template labels its nodes `team=<team>`.
    fn pool(team: &str, zones: &[&str]) -> NodePool {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
            "metadata": {"name": "default"},
            "spec": {"template": {"metadata": {"labels": {"team": team}}, "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": zones}],
            }}}
        }))
        .unwrap()
    }

    fn claim(name: &str, hash: &str, version: &str, zone: Option<&str>) -> NodeClaim {
        let mut labels = serde_json::Map::new();
        labels.insert(LABEL_NODEPOOL.into(), "default".into());
        if let Some(zone) = zone {
            labels.insert("topology.kubernetes.io/zone".into(), zone.into());
        }
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": name, "labels": labels, "annotations": {
                ANNOTATION_NODEPOOL_HASH: hash, ANNOTATION_NODEPOOL_HASH_VERSION: version}},
            "spec": {
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": [],
            }
        }))
        .unwrap()
    }

    /// A NodeClaim as upstream Karpenter writes it.
    fn upstream_claim() -> NodeClaim {
        serde_saphyr::from_str(include_str!("../../../tests/fixtures/upstream/nodeclaim.yaml")).unwrap()
    }

    #[test]
    fn a_claim_upstream_made_has_not_drifted_from_the_pool_it_came_from() {
        let claim = upstream_claim();
        // The getting-started NodePool, which that claim came from: no labels.
        let mut pool = pool("a", &["us-west-2a", "us-west-2b"]);
        pool.spec.template.metadata = None;
        pool.spec.template.spec.requirements = serde_json::from_value(json!([
            {"key": "karpenter.k8s.aws/instance-category", "operator": "In", "values": ["c", "m", "r"]},
            {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "karpenter.k8s.aws/instance-generation", "operator": "Gt", "values": ["4"]}]))
        .unwrap();
        // Upstream's scheme is this controller's: its hash is compared as it is, and matches.
        assert!(current_hash_scheme(&claim), "upstream's v3 hash is compared");
        assert_eq!(claim.annotations().get(ANNOTATION_NODEPOOL_HASH), Some(&pool.hash()));
        assert_eq!(static_drift(&claim, &pool), None);
        pool.spec.template.spec.requirements[0].values = ["c"].into();
        assert_eq!(static_drift(&claim, &pool), Some(REQUIREMENTS_DRIFTED), "m is no longer allowed");
        // A change of the template is drift, as upstream sees it.
        pool.spec.template.spec.expire_after = "24h".into();
        assert_eq!(static_drift(&claim, &pool), Some(NODEPOOL_DRIFTED));
    }

    #[test]
    fn static_drift_reasons() {
        let p = pool("a", &["us-west-2a", "us-west-2b"]);
        let (h, v) = (p.hash(), NODEPOOL_HASH_VERSION);
        assert_eq!(static_drift(&claim("c", &h, v, Some("us-west-2a")), &p), None);
        assert_eq!(static_drift(&claim("c", "0", v, Some("us-west-2a")), &p), Some(NODEPOOL_DRIFTED));
        // The template changed.
        let changed = pool("b", &["us-west-2a", "us-west-2b"]);
        assert_eq!(static_drift(&claim("c", &h, v, Some("us-west-2a")), &changed), Some(NODEPOOL_DRIFTED));
        // A hash of another scheme (this controller's former rs-v2, an older one of upstream's)
        // is not compared.
        assert_eq!(static_drift(&claim("c", "0", "rs-v2", Some("us-west-2a")), &p), None);
        assert_eq!(static_drift(&claim("c", "0", "v2", Some("us-west-2a")), &p), None);
        assert_eq!(static_drift(&claim("c", &h, v, Some("us-west-2c")), &p), Some(REQUIREMENTS_DRIFTED));
        // A required key the claim has no label for: drift, as upstream (a requirement added to
        // the NodePool after the claim was made)...
        assert_eq!(static_drift(&claim("c", &h, v, None), &p), Some(REQUIREMENTS_DRIFTED));
        // ... unless the claim was launched with a requirement on it the NodePool still allows
        // (a key allowed several values gets no label).
        let mut launched = claim("c", &h, v, None);
        launched.spec.requirements = serde_json::from_value(json!([
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2b", "us-west-2c"]}]))
        .unwrap();
        assert_eq!(static_drift(&launched, &p), None);
        launched.spec.requirements[0].values = ["us-west-2c"].into();
        assert_eq!(static_drift(&launched, &p), Some(REQUIREMENTS_DRIFTED));
        // A requirement that only excludes values is met by a node without the label.
        let mut excluding = pool("a", &["us-west-2a"]);
        excluding.spec.template.spec.requirements = serde_json::from_value(json!([
            {"key": "example.com/gpu", "operator": "DoesNotExist"},
            {"key": "example.com/team", "operator": "NotIn", "values": ["x"]}]))
        .unwrap();
        let h = excluding.hash();
        assert_eq!(static_drift(&claim("c", &h, v, Some("us-west-2a")), &excluding), None);
        // A new custom requirement drifts nodes made before it.
        excluding.spec.template.spec.requirements.extend(
            serde_json::from_value::<Vec<_>>(json!([
                {"key": "example.com/team", "operator": "In", "values": ["a"]}]))
            .unwrap(),
        );
        assert_eq!(
            static_drift(&claim("c", &h, v, Some("us-west-2a")), &excluding),
            Some(REQUIREMENTS_DRIFTED)
        );
    }

    #[test]
    fn instance_types_the_pool_can_no_longer_launch() {
        use crate::scheduling::instancetypes::{Offering, Overhead};
        use crate::scheduling::{Requirements, Resources};
        let offering = |zone: &str, capacity_type: &str| Offering::new(zone, capacity_type, 0.1, false);
        let m5 = Arc::new(InstanceType::new(
            "m5.large",
            Requirements::default(),
            Resources::default(),
            Overhead::default(),
            vec![offering("us-west-2a", "on-demand"), offering("us-west-2a", "spot")],
        ));
        let on = |it: &str, zone: &str, ct: &str| {
            let mut c = claim("c", "0", NODEPOOL_HASH_VERSION, Some(zone));
            c.labels_mut().insert(LABEL_INSTANCE_TYPE.into(), it.into());
            c.labels_mut().insert(LABEL_CAPACITY_TYPE.into(), ct.into());
            c
        };
        let types = [m5];
        assert!(
            !instance_type_not_found(&on("m5.large", "us-west-2a", "spot"), &types),
            "unavailable still counts"
        );
        assert!(
            !instance_type_not_found(&on("m5.large", "us-west-2a", "reserved"), &types),
            "reserved as on-demand"
        );
        assert!(
            instance_type_not_found(&on("m5.large", "us-west-2b", "spot"), &types),
            "no offering in the zone"
        );
        assert!(instance_type_not_found(&on("c5.large", "us-west-2a", "spot"), &types), "type gone");
        let mut unpriced = (*types[0]).clone();
        unpriced.offerings.retain(|o| o.capacity_type != "spot");
        let unpriced = [Arc::new(unpriced)];
        assert!(
            !instance_type_not_found(&on("m5.large", "us-west-2a", "spot"), &unpriced),
            "no spot price known anywhere (not fetched yet): not judged"
        );
        assert!(!instance_type_not_found(&on("c5.large", "us-west-2a", "spot"), &[]), "no types known");
        let mut unlabelled = claim("c", "0", NODEPOOL_HASH_VERSION, None);
        assert!(!instance_type_not_found(&unlabelled, &types), "no instance type label: nothing to check");

        // Only claims older than an hour are checked.
        let now: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
        assert!(!checks_instance_type(&unlabelled, now), "no creation time");
        let created =
            |at: &str| Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at.parse().unwrap()));
        unlabelled.metadata.creation_timestamp = created("2026-11-24T11:30:00Z");
        assert!(!checks_instance_type(&unlabelled, now));
        unlabelled.metadata.creation_timestamp = created("2026-11-24T10:59:00Z");
        assert!(checks_instance_type(&unlabelled, now));
    }

    /// A cloud whose instances drift when the test says so.
    struct DriftingCloud(Mutex<Option<DriftReason>>);

    impl CloudProvider for DriftingCloud {
        fn create<'a>(&'a self, c: &'a NodeClaim) -> BoxFuture<'a, Result<Instance>> {
            Box::pin(async move { Err(CloudProviderError::NotFound(c.name_any())) })
        }
        fn delete<'a>(&'a self, c: &'a NodeClaim) -> BoxFuture<'a, Result<()>> {
            Box::pin(async move { Err(CloudProviderError::NotFound(c.name_any())) })
        }
        fn get<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Instance>> {
            Box::pin(async move { Err(CloudProviderError::NotFound(id.to_string())) })
        }
        fn list(&self) -> BoxFuture<'_, Result<Vec<Instance>>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn instance_types<'a>(&'a self, _: &'a NodePool) -> BoxFuture<'a, Result<Vec<Arc<InstanceType>>>> {
            Box::pin(async { Ok(Vec::new()) })
        }
        fn is_drifted<'a>(&'a self, _: &'a NodeClaim) -> BoxFuture<'a, Result<Option<DriftReason>>> {
            let reason = self.0.lock().unwrap().clone();
            Box::pin(async move { Ok(reason) })
        }
        fn name(&self) -> &'static str {
            "drifting"
        }
    }

    #[test]
    fn a_failed_check_is_asked_again_after_a_backoff_not_an_interval() {
        let mut c = claim("a", "h", NODEPOOL_HASH_VERSION, None);
        c.metadata.uid = Some("uid-a".into());
        let mut asked = Asked::default();
        let t0 = Instant::now();
        assert!(asked.due(&c, t0), "never asked");
        asked.answered("uid-a", true, t0);
        assert!(!asked.due(&c, t0 + Duration::from_secs(1)));
        assert!(asked.due(&c, t0 + RETRY.base), "due after the first retry delay");
        assert_eq!(asked.next_retry(t0), Some(RETRY.base));
        asked.answered("uid-a", true, t0);
        assert!(!asked.due(&c, t0 + RETRY.base), "the delay doubles");
        assert!(asked.due(&c, t0 + RETRY.delay(2)));
        asked.answered("uid-a", false, t0);
        assert_eq!(asked.next_retry(t0), None, "an answer resets the backoff");
        assert!(!asked.due(&c, t0 + RETRY.cap), "an answered claim waits the interval");
        assert!(asked.due(&c, t0 + INTERVAL));
    }

    #[tokio::test]
    #[ignore = "needs the local control plane"]
    async fn marks_and_clears_the_drifted_condition() {
        let client = Client::try_default().await.unwrap();
        let api: Api<NodeClaim> = Api::all(client.clone());
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let name = format!("drift-{:x}-{nanos:x}", std::process::id());
        // Made by upstream Karpenter, its NodePool hash then stamped with this controller's
        // former scheme (rs-v2): re-stamped rather than compared.
        let mut upstream = upstream_claim();
        upstream.annotations_mut().insert(ANNOTATION_NODEPOOL_HASH_VERSION.into(), "rs-v2".into());
        upstream.metadata.name = Some(name.clone());
        upstream.metadata.finalizers = None;
        let status = json!({"status": upstream.status.take()});
        api.create(&PostParams::default(), &upstream).await.unwrap();
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();

        let cloud = DriftingCloud(Mutex::new(None));
        let pools = [Arc::new(pool("a", &["us-west-2a"]))];
        let drifted = |c: &NodeClaim| {
            c.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == DRIFTED)).cloned()
        };
        async fn look(
            client: &Client,
            name: &str,
            cloud: &DriftingCloud,
            pools: &[Arc<NodePool>],
        ) -> (usize, NodeClaim) {
            let api: Api<NodeClaim> = Api::all(client.clone());
            let current = Arc::new(api.get(name).await.unwrap());
            let changed = round(client, cloud, &[current], pools, &mut Asked::default()).await;
            (changed, api.get(name).await.unwrap())
        }

        let (changed, c) = look(&client, &name, &cloud, &pools).await;
        assert_eq!((changed, drifted(&c)), (0, None), "nothing drifted");
        let notes = c.annotations();
        assert_eq!(notes.get(ANNOTATION_NODEPOOL_HASH), Some(&pools[0].hash()), "re-stamped");
        assert_eq!(
            notes.get(ANNOTATION_NODEPOOL_HASH_VERSION).map(String::as_str),
            Some(NODEPOOL_HASH_VERSION)
        );
        let (changed, c) = look(&client, &name, &cloud, &pools).await;
        assert_eq!((changed, drifted(&c)), (0, None), "still nothing drifted");

        *cloud.0.lock().unwrap() = Some(DriftReason::Ami);
        let (changed, c) = look(&client, &name, &cloud, &pools).await;
        let condition = drifted(&c).expect("Drifted");
        assert_eq!(
            (changed, condition.status, condition.reason.as_str()),
            (1, ConditionStatus::True, "AMIDrift")
        );
        assert!(
            c.status.as_ref().unwrap().conditions.iter().any(|c| c.type_ == LAUNCHED),
            "other conditions stay"
        );
        let (changed, _) = look(&client, &name, &cloud, &pools).await;
        assert_eq!(changed, 0, "an unchanged condition is not written again");

        // The NodePool's template changed: that reason comes first.
        let changed_pool = [Arc::new(pool("b", &["us-west-2a"]))];
        let (_, c) = look(&client, &name, &cloud, &changed_pool).await;
        assert_eq!(drifted(&c).unwrap().reason, NODEPOOL_DRIFTED);

        *cloud.0.lock().unwrap() = None;
        let (changed, c) = look(&client, &name, &cloud, &pools).await;
        assert_eq!((changed, drifted(&c)), (1, None), "cleared once it matches again");

        api.delete(&name, &DeleteParams::default()).await.unwrap();
    }
}
