//! The NodeClaim tagging controller (upstream's `nodeclaim.tagging`): once a NodeClaim's Node is
//! known, its instance gets the `Name` tag (the Node's name, which the EC2 console shows), and
//! `karpenter.sh/nodeclaim` and `eks:eks-cluster-name` when it lacks them; then the NodeClaim is
//! annotated `karpenter.k8s.aws/tagged: "true"` (and upstream's compatibility annotation
//! `compatibility.karpenter.k8s.aws/cluster-name-tagged`), so that it is not looked at again.
//!
//! Tags the instance already has are left alone (a `Name` set in the class's `tags` wins), and
//! CreateTags calls are at least a second apart, as upstream's, since they share EC2's rate limit
//! with launches. An instance that is gone is not retried: the NodeClaim's lifecycle deals with
//! it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::sync::watch;

use super::super::AwsCloudProvider;
use super::super::instance;
use super::super::launchtemplate::ec2_tags;
use crate::apis::NodeClaim;
use crate::apis::labels::{
    ANNOTATION_CLUSTER_NAME_TAGGED, ANNOTATION_INSTANCE_TAGGED, TAG_EKS_CLUSTER_NAME, TAG_NAME, TAG_NODECLAIM,
};
use crate::cloudprovider::{CloudProviderError, parse_provider_id};
use crate::controllers::kit::{Next, Options, Queue, Reconcile, run_keyed};
use crate::state::{ClusterState, Notice};

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "nodeclaim.tagging";
/// The least time between two CreateTags calls.
pub const PAUSE: Duration = Duration::from_secs(1);

/// Why tagging failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or tagging the instance failed.
    #[error("tagging nodeclaim {name}")]
    Tag {
        /// The NodeClaim.
        name: String,
        /// The provider's error.
        #[source]
        source: CloudProviderError,
    },
    /// Annotating the NodeClaim failed.
    #[error("annotating nodeclaim {name} as tagged")]
    Annotate {
        /// The NodeClaim.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// Whether `claim`'s instance is still to be tagged: its Node is known, it is not being deleted,
/// and it lacks either annotation.
pub fn taggable(claim: &NodeClaim) -> bool {
    let annotated = |key: &str| claim.annotations().get(key).is_some_and(|v| v == "true");
    let node = claim.status.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default();
    let tagged = annotated(ANNOTATION_INSTANCE_TAGGED) && annotated(ANNOTATION_CLUSTER_NAME_TAGGED);
    !tagged && !node.is_empty() && claim.metadata.deletion_timestamp.is_none()
}

/// The tags `claim`'s instance should get, less those it has (`existing`).
pub fn missing_tags(
    claim: &NodeClaim,
    cluster: &str,
    existing: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let node = claim.status.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    let wanted =
        [(TAG_NAME, node), (TAG_NODECLAIM, claim.name_any()), (TAG_EKS_CLUSTER_NAME, cluster.to_string())];
    wanted.into_iter().filter(|(k, _)| !existing.contains_key(*k)).map(|(k, v)| (k.to_string(), v)).collect()
}

struct Reconciler {
    client: kube::Client,
    cluster: ClusterState,
    provider: Arc<AwsCloudProvider>,
}

impl Reconcile for Reconciler {
    type Key = String;
    type Error = Error;

    async fn reconcile(&self, name: &String) -> Result<Next, Error> {
        let Some(claim) = self.cluster.nodeclaim(name) else { return Ok(Next::Wait) };
        if !taggable(&claim) {
            return Ok(Next::Wait);
        }
        let provider_id = claim.status.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default();
        let id = match parse_provider_id(&provider_id) {
            Ok((_, id)) => id,
            // Not retried until the provider ID changes.
            Err(e) => {
                tracing::error!(NodeClaim = %name, provider_id, error = %e, "failed parsing instance id");
                return Ok(Next::Wait);
            }
        };
        let ec2 = &self.provider.clients().ec2;
        let tag_error = |source| Error::Tag { name: name.clone(), source };
        let existing = match instance::get(ec2, &id).await {
            Ok(i) => i.tags,
            Err(e) if e.is_not_found() => return Ok(Next::Wait),
            Err(e) => return Err(tag_error(e)),
        };
        let tags = missing_tags(&claim, &self.provider.cluster().name, &existing);
        if !tags.is_empty() {
            let sent = ec2
                .create_tags()
                .resources(&id)
                .set_tags(Some(ec2_tags(&tags)))
                .send()
                .await
                .map_err(|e| super::super::sdk_error("CreateTags", e));
            // CreateTags shares EC2's rate limit with launches.
            tokio::time::sleep(PAUSE).await;
            match sent {
                Ok(_) => {
                    let keys: Vec<&String> = tags.keys().collect();
                    tracing::debug!(NodeClaim = %name, instance = %id, tags = ?keys, "tagged instance");
                }
                Err(e) if e.api_code().is_some_and(|c| c.starts_with("InvalidInstanceID")) => {
                    return Ok(Next::Wait);
                }
                Err(e) => return Err(tag_error(e)),
            }
        }
        let patch = json!({"metadata": {"annotations": {
            ANNOTATION_INSTANCE_TAGGED: "true",
            ANNOTATION_CLUSTER_NAME_TAGGED: "true",
        }}});
        let api: Api<NodeClaim> = Api::all(self.client.clone());
        match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(Next::Wait),
            Err(e) if crate::util::api::is_not_found(&e) => Ok(Next::Wait),
            Err(source) => Err(Error::Annotate { name: name.clone(), source }),
        }
    }
}

/// Runs the tagging controller until `stop` turns true.
pub async fn run(
    client: kube::Client,
    cluster: ClusterState,
    provider: Arc<AwsCloudProvider>,
    stop: watch::Receiver<bool>,
) {
    let queue: Arc<Queue<String>> = Arc::new(Queue::new());
    let _claims = {
        let queue = queue.clone();
        cluster.on_nodeclaim(move |notice| match notice {
            Notice::Applied(claim) if taggable(claim) => queue.add(claim.name_any()),
            Notice::Applied(_) => {}
            gone => queue.forget(&gone.name()),
        })
    };
    for claim in cluster.nodeclaims.state() {
        if taggable(&claim) {
            queue.add(claim.name_any());
        }
    }
    let reconciler = Arc::new(Reconciler { client, cluster, provider });
    // One worker, as upstream's: CreateTags calls one at a time.
    run_keyed(reconciler, queue, Options::new(CONTROLLER), None, stop).await;
    tracing::info!("nodeclaim tagging controller stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(node: Option<&str>, annotations: &[(&str, &str)]) -> NodeClaim {
        serde_json::from_value(json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "default-abc", "annotations": annotations.iter().cloned().collect::<BTreeMap<_, _>>()},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                     "requirements": []},
            "status": {"providerID": "aws:///us-west-2a/i-0123456789abcdef0", "nodeName": node},
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_is_tagged_once_its_node_is_known() {
        assert!(!taggable(&claim(None, &[])), "no node yet");
        assert!(taggable(&claim(Some("ip-10-0-0-1.ec2.internal"), &[])));
        let half = claim(Some("n"), &[(ANNOTATION_INSTANCE_TAGGED, "true")]);
        assert!(taggable(&half), "upstream's compatibility annotation is missing");
        let done = claim(
            Some("n"),
            &[(ANNOTATION_INSTANCE_TAGGED, "true"), (ANNOTATION_CLUSTER_NAME_TAGGED, "true")],
        );
        assert!(!taggable(&done));
        let mut deleting = claim(Some("n"), &[]);
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(!taggable(&deleting));
    }

    #[test]
    fn only_the_tags_the_instance_lacks_are_added() {
        let c = claim(Some("ip-10-0-0-1.ec2.internal"), &[]);
        let launched = BTreeMap::from([
            (TAG_NODECLAIM.to_string(), "default-abc".to_string()),
            (TAG_EKS_CLUSTER_NAME.to_string(), "demo".to_string()),
        ]);
        assert_eq!(
            missing_tags(&c, "demo", &launched),
            BTreeMap::from([(TAG_NAME.to_string(), "ip-10-0-0-1.ec2.internal".to_string())])
        );
        // A Name of the class's own tags wins.
        let named = BTreeMap::from([(TAG_NAME.to_string(), "mine".to_string())]);
        let got = missing_tags(&c, "demo", &named);
        assert_eq!(got.keys().map(String::as_str).collect::<Vec<_>>(), [TAG_EKS_CLUSTER_NAME, TAG_NODECLAIM]);
        assert_eq!(got[TAG_EKS_CLUSTER_NAME], "demo");
    }
}
