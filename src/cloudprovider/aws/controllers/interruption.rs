//! Interruption: what EC2 says is about to happen to the cluster's instances, acted on before it
//! happens.
//!
//! * `interruption` (only with `INTERRUPTION_QUEUE`): reads the SQS queue EventBridge feeds with
//!   spot interruption warnings, rebalance recommendations, instance state changes, AWS Health
//!   scheduled changes and capacity reservation interruptions (long polling, up to 10 messages at
//!   a time, handled concurrently). A message is deleted once handled, or when it cannot be
//!   parsed (it never will be); one whose handling failed stays for SQS to deliver again after
//!   its visibility timeout. Receive errors back off; the controller never stops on them.
//! * `interruption.instancestatus` (always): every minute, EC2's status checks of the running
//!   instances; a failed instance or system check for two minutes terminates the instance's
//!   NodeClaim forcefully, a scheduled event drains it.
//!
//! What is done about an instance is [`decide`]: delete its NodeClaim (no disruption budget; the
//! termination controller drains it, honouring PodDisruptionBudgets until the claim's
//! `terminationGracePeriod`, while the provisioner launches capacity for the evicted pods), with
//! the termination deadline set to now for a forceful termination; a spot interruption also
//! marks the instance's spot offering unavailable for three minutes, so that the replacement is
//! not launched into the capacity being reclaimed. A rebalance recommendation is only told.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio::sync::watch;

use crate::apis::NodeClaim;
use crate::apis::common::{ConditionUpdate, set_condition};
use crate::apis::labels::{
    ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP, LABEL_CAPACITY_RESERVATION_ID, LABEL_INSTANCE_TYPE,
    LABEL_TOPOLOGY_ZONE,
};
use crate::apis::nodeclaim::conditions::REBALANCE_RECOMMENDED;
use crate::cloudprovider::CloudProviderError;
use crate::cloudprovider::OfferingKey;
use crate::cloudprovider::aws::AwsCloudProvider;
use crate::cloudprovider::aws::instancestatus::{self, FirstSeen};
use crate::cloudprovider::aws::interruption::{self, Action, Kind};
use crate::cloudprovider::aws::sqs::{Queue, Received};
use crate::cloudprovider::aws::unavailable::Scope;
use crate::controllers::events::reasons;
use crate::controllers::kit::count_disrupted;
use crate::controllers::kit::{Backoff, Next, Options, Timer, run_singleton};
use crate::controllers::nodeclaim::{Written, write_conditions};
use crate::controllers::{Context, nodeclaim};
use crate::state::ClusterState;
use crate::util::error_chain;

/// Name of the queue controller, in logs and metrics.
pub const CONTROLLER: &str = "interruption";
/// Name of the instance status controller.
pub const STATUS_CONTROLLER: &str = "interruption.instancestatus";
/// How often the instance status checks are read, as upstream.
pub const STATUS_PERIOD: Duration = Duration::from_secs(60);
/// Longest wait for an SQS or status-check answer (every page of it): a receive waits up to
/// 20 s by itself. A connection that stalls must not freeze either loop.
const CALL_TIMEOUT: Duration = Duration::from_secs(35);
/// Backoff of failed receives (and of finding the queue).
const RECEIVE_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
/// The `message_type` label of messages that could not be parsed (upstream does not count them).
pub const MALFORMED: &str = "malformed";

/// What to do about one NodeClaim of an instance a notice is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Delete the claim (it is not being deleted yet).
    pub delete: bool,
    /// Set its termination deadline to now (unless it has one already due).
    pub deadline: bool,
    /// The offering to mark unavailable.
    pub unavailable: Option<OfferingKey>,
    /// The capacity reservation to take as having nothing left (its instances are being
    /// reclaimed).
    pub reclaimed: Option<String>,
    /// Mark the claim `RebalanceRecommended`, so that the disruption controller replaces it
    /// (replacement first) before the spot interruption comes.
    pub replace_first: bool,
}

/// What `kind` asks for `claim` at `now`; `rebalance_replacement` is the setting of that name.
pub fn decide(kind: &Kind, claim: &NodeClaim, now: Timestamp, rebalance_replacement: bool) -> Decision {
    let action = kind.action();
    let deleting = claim.metadata.deletion_timestamp.is_some();
    let label = |key: &str| claim.labels().get(key).filter(|v| !v.is_empty()).cloned();
    let unavailable = match (kind, label(LABEL_INSTANCE_TYPE), label(LABEL_TOPOLOGY_ZONE)) {
        (Kind::SpotInterruption, Some(instance_type), Some(zone)) => {
            Some(OfferingKey { instance_type, zone, capacity_type: "spot".to_string() })
        }
        _ => None,
    };
    let reclaimed = match kind {
        Kind::CapacityReservationInterruption => label(LABEL_CAPACITY_RESERVATION_ID),
        _ => None,
    };
    let deadline_due = claim
        .annotations()
        .get(ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP)
        .and_then(|t| t.parse::<Timestamp>().ok())
        .is_some_and(|t| t <= now);
    let recommended = claim.is_true(REBALANCE_RECOMMENDED);
    Decision {
        delete: matches!(action, Action::CordonAndDrain | Action::ForcefulTermination) && !deleting,
        deadline: action == Action::ForcefulTermination && !deadline_due,
        unavailable,
        reclaimed,
        replace_first: rebalance_replacement
            && *kind == Kind::RebalanceRecommendation
            && !deleting
            && !recommended,
    }
}

/// The upstream name of an action, in logs.
fn action_name(action: Action) -> &'static str {
    match action {
        Action::CordonAndDrain => "CordonAndDrain",
        Action::ForcefulTermination => "ForcefulTermination",
        Action::EventOnly | Action::Nothing => "NoAction",
    }
}

/// Acts on `kind` for the instance `instance_id`: events, offering marked, NodeClaim deleted. An
/// instance the cluster has no NodeClaim for is left alone.
async fn act(
    ctx: &Context,
    state: &ClusterState,
    aws: &AwsCloudProvider,
    controller: &'static str,
    kind: &Kind,
    instance_id: &str,
    deleted: &Mutex<HashSet<String>>,
) -> Result<(), ActError> {
    let (claims, nodes) = state.with_instance_id(instance_id);
    if claims.is_empty() {
        tracing::debug!(controller, messageKind = %kind, instance = instance_id, "no nodeclaim for the instance");
        return Ok(());
    }
    let now = Timestamp::now();
    for claim in claims {
        let node_name = claim.status.as_ref().and_then(|s| s.node_name.clone());
        let node: Option<&Arc<Node>> =
            nodes.iter().find(|n| Some(n.name_any()) == node_name).or_else(|| nodes.first());
        if let Some((reason, message, warning)) = kind.event() {
            tell(ctx, &claim, node.map(Arc::as_ref), reason, message, warning).await;
        }
        let mut decision = decide(kind, &claim, now, ctx.settings.rebalance_replacement);
        // Deleted by another message of this batch: the cache does not show it yet.
        let uid = claim.uid().unwrap_or_default();
        if decision.delete && !deleted.lock().unwrap_or_else(PoisonError::into_inner).insert(uid) {
            decision.delete = false;
        }
        if decision.replace_first {
            mark_rebalance_recommended(ctx, &claim, now).await?;
            tracing::info!(controller, messageKind = %kind, NodeClaim = %claim.name_any(), "replacing the node before its spot interruption");
        }
        if let Some(key) = decision.unavailable {
            tracing::info!(controller, messageKind = %kind, NodeClaim = %claim.name_any(), instance_type = %key.instance_type, zone = %key.zone, capacity_type = %key.capacity_type, "marking offering unavailable after an interruption");
            aws.unavailable_offerings().mark(key, Scope::Everywhere);
        }
        if let Some(id) = &decision.reclaimed {
            tracing::info!(controller, messageKind = %kind, NodeClaim = %claim.name_any(), capacity_reservation_id = %id, "marking capacity reservation unavailable");
            aws.reservations().exhausted(id);
        }
        if decision.delete && nodeclaim::delete(&ctx.client, &claim).await? {
            tracing::info!(
                controller,
                messageKind = %kind,
                NodeClaim = %claim.name_any(),
                Node = node.map(|n| n.name_any()).unwrap_or_default(),
                action = action_name(kind.action()),
                "initiating delete from interruption message"
            );
            tell(ctx, &claim, node.map(Arc::as_ref), reasons::TERMINATING_ON_INTERRUPTION, "", true).await;
            count_disrupted(&ctx.metrics, &claim, kind.metric_label());
        }
        if decision.deadline {
            nodeclaim::set_termination_deadline(&ctx.client, controller, &claim, now).await?;
        }
    }
    Ok(())
}

/// Sets the claim's `RebalanceRecommended` condition (the disruption controller replaces such
/// claims as drifted ones). A claim gone or changed meanwhile is left alone: a conflict is an
/// error, so the message is handled again.
async fn mark_rebalance_recommended(
    ctx: &Context,
    claim: &NodeClaim,
    now: Timestamp,
) -> Result<(), ActError> {
    let mut conditions = claim.conditions().to_vec();
    let message = "EC2 recommends moving off this spot instance: it is replaced before its interruption";
    let update =
        ConditionUpdate { message: message.into(), ..ConditionUpdate::true_("RebalanceRecommendation") };
    if !set_condition(&mut conditions, REBALANCE_RECOMMENDED, update, claim.metadata.generation, now) {
        return Ok(());
    }
    match write_conditions(&ctx.client, claim, &conditions).await? {
        Written::Done | Written::Gone => Ok(()),
        Written::Changed => Err(ActError::Changed(claim.name_any())),
    }
}

/// Tells `reason` on the claim and its node, once per object (as upstream deduplicates by uid).
/// An empty `message` is the `TerminatingOnInterruption` text naming the object's kind.
async fn tell(
    ctx: &Context,
    claim: &NodeClaim,
    node: Option<&Node>,
    reason: &str,
    message: &str,
    warning: bool,
) {
    use crate::controllers::events::EventType;
    let type_ = if warning { EventType::Warning } else { EventType::Normal };
    let window = k8s_openapi::jiff::SignedDuration::from_mins(5);
    let text = |object: &str| {
        if message.is_empty() {
            format!("Interruption triggered termination for the {object}")
        } else {
            message.to_string()
        }
    };
    ctx.events.deduped(claim, type_, reason, "", window, text("NodeClaim")).await;
    if let Some(node) = node {
        ctx.events.deduped(node, type_, reason, "", window, text("Node")).await;
    }
}

/// Why a message could not be acted on (it is handled again).
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    /// The API server refused a write or did not answer.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The NodeClaim changed between reading it and writing its condition.
    #[error("nodeclaim {0} changed since it was read")]
    Changed(String),
}

/// Why a pass of the queue controller failed (retried with [`RECEIVE_BACKOFF`]).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The queue's URL could not be found (the queue does not exist yet, or no permission).
    #[error("failed to create valid sqs provider for queue {queue}")]
    Find {
        /// The queue's name.
        queue: String,
        /// What SQS answered.
        #[source]
        source: CloudProviderError,
    },
    /// ReceiveMessage failed.
    #[error("getting messages from queue {queue}")]
    Receive {
        /// The queue's name.
        queue: String,
        /// What SQS answered.
        #[source]
        source: CloudProviderError,
    },
}

/// Runs the queue controller until `stop` turns true: one pass finds the queue (until it
/// exists), receives up to 10 messages (waiting up to 20 s for them) and handles them; the next
/// pass follows at once, a failed one after a backoff.
pub async fn run_queue(
    ctx: Context,
    state: ClusterState,
    aws: Arc<AwsCloudProvider>,
    queue_name: String,
    stop: watch::Receiver<bool>,
) {
    let client = aws.clients().sqs.clone();
    let queue: Arc<tokio::sync::OnceCell<Queue>> = Arc::new(tokio::sync::OnceCell::new());
    let options = Options::new(CONTROLLER).backoff(RECEIVE_BACKOFF);
    run_singleton(options, Some(ctx.metrics.clone()), Timer, stop, || {
        let (ctx, state, aws, client, queue, name) =
            (ctx.clone(), state.clone(), aws.clone(), client.clone(), queue.clone(), queue_name.clone());
        async move {
            let queue = queue
                .get_or_try_init(|| async {
                    let found = bounded(Queue::find(client, &name), "GetQueueUrl")
                        .await
                        .map_err(|source| QueueError::Find { queue: name.clone(), source })?;
                    tracing::info!(controller = CONTROLLER, queue = %found.name(), url = %found.url(), "watching interruption queue");
                    Ok::<_, QueueError>(found)
                })
                .await?;
            let messages = bounded(queue.receive(), "ReceiveMessage")
                .await
                .map_err(|source| QueueError::Receive { queue: name.clone(), source })?;
            // Two messages of one batch about the same instance (a spot warning and a state
            // change, say) delete its NodeClaim once.
            let deleted = Mutex::new(HashSet::new());
            join_all(messages.iter().map(|m| handle(&ctx, &state, &aws, queue, m, &deleted))).await;
            Ok::<_, QueueError>(Next::After(Duration::ZERO))
        }
    })
    .await;
}

/// `call`, failing after [`CALL_TIMEOUT`].
async fn bounded<T>(
    call: impl std::future::Future<Output = Result<T, CloudProviderError>>,
    operation: &'static str,
) -> Result<T, CloudProviderError> {
    tokio::time::timeout(CALL_TIMEOUT, call).await.unwrap_or_else(|_| {
        Err(CloudProviderError::Api {
            operation,
            code: "Timeout".to_string(),
            message: format!("no answer within {CALL_TIMEOUT:?}"),
            source: "timed out".into(),
        })
    })
}

/// Handles one message: parsed, acted on, deleted (or kept when acting failed).
async fn handle(
    ctx: &Context,
    state: &ClusterState,
    aws: &AwsCloudProvider,
    queue: &Queue,
    received: &Received,
    deleted: &Mutex<HashSet<String>>,
) {
    let message = match interruption::parse(&received.body) {
        Ok(message) => message,
        Err(error) => {
            tracing::error!(controller = CONTROLLER, queue = %queue.name(), message_id = %received.message_id, error = %error_chain(&error), "failed parsing interruption message");
            count_received(ctx, MALFORMED);
            delete(ctx, queue, received).await;
            return;
        }
    };
    count_received(ctx, message.kind.metric_label());
    let mut kept = false;
    for instance_id in &message.instance_ids {
        if let Err(error) = act(ctx, state, aws, CONTROLLER, &message.kind, instance_id, deleted).await {
            kept = true;
            tracing::error!(controller = CONTROLLER, queue = %queue.name(), messageKind = %message.kind, instance = %instance_id, error = %error_chain(&error), "handling message");
        }
    }
    if kept {
        // Delivered again after the visibility timeout.
        return;
    }
    delete(ctx, queue, received).await;
    if let Some(time) = message.time {
        let waited = Duration::try_from(Timestamp::now().duration_since(time)).unwrap_or_default();
        ctx.metrics.interruption_message_queue_duration.get_or_create(&vec![]).observe(waited.as_secs_f64());
    }
}

fn count_received(ctx: &Context, message_type: &str) {
    ctx.metrics
        .interruption_received_messages
        .get_or_create(&vec![("message_type", message_type.to_string())])
        .inc();
}

async fn delete(ctx: &Context, queue: &Queue, received: &Received) {
    match bounded(queue.delete(received), "DeleteMessage").await {
        Ok(()) => {
            ctx.metrics.interruption_deleted_messages.get_or_create(&vec![]).inc();
        }
        Err(error) => {
            tracing::error!(controller = CONTROLLER, queue = %queue.name(), message_id = %received.message_id, error = %error_chain(&error), "deleting sqs message");
        }
    }
}

/// Runs the instance status controller until `stop` turns true.
pub async fn run_instance_status(
    ctx: Context,
    state: ClusterState,
    aws: Arc<AwsCloudProvider>,
    stop: watch::Receiver<bool>,
) {
    let first_seen = Arc::new(Mutex::new(FirstSeen::new()));
    let wake = Timer;
    let options = Options {
        backoff: Backoff::new(Duration::from_secs(10), STATUS_PERIOD),
        ..Options::new(STATUS_CONTROLLER)
    };
    run_singleton(options, Some(ctx.metrics.clone()), wake, stop, || {
        let (ctx, state, aws, first_seen) = (ctx.clone(), state.clone(), aws.clone(), first_seen.clone());
        async move { status_pass(&ctx, &state, &aws, &first_seen).await }
    })
    .await;
}

async fn status_pass(
    ctx: &Context,
    state: &ClusterState,
    aws: &AwsCloudProvider,
    first_seen: &Mutex<FirstSeen>,
) -> Result<Next, crate::cloudprovider::CloudProviderError> {
    let statuses = match bounded(instancestatus::describe(&aws.clients().ec2), "DescribeInstanceStatus").await
    {
        Ok(statuses) => statuses,
        Err(error)
            if matches!(
                error.api_code(),
                Some("UnauthorizedOperation" | "AccessDenied" | "AccessDeniedException")
            ) =>
        {
            tracing::error!(controller = STATUS_CONTROLLER, error = %error_chain(&error), "ec2:DescribeInstanceStatus permission is not allowed, update the IAM policy and restart the Karpenter deployment to enable instance status health checks");
            return Ok(Next::Wait);
        }
        Err(error) => return Err(error),
    };
    let statuses: Vec<_> =
        statuses.into_iter().filter(|s| !state.with_instance_id(&s.instance_id).0.is_empty()).collect();
    let (due, new) = {
        let mut seen = first_seen.lock().unwrap_or_else(PoisonError::into_inner);
        instancestatus::assess(&statuses, &mut seen, Timestamp::now())
    };
    for problem in &new {
        tracing::info!(controller = STATUS_CONTROLLER, instanceID = %problem.instance_id, category = %category(&problem.kind), "detected unhealthy instance owned by cluster");
        ctx.metrics
            .interruption_instance_status_unhealthy
            .get_or_create(&vec![("category", category(&problem.kind).to_string())])
            .inc();
    }
    let mut next = Next::After(STATUS_PERIOD);
    // assess gives at most one problem per instance; one set per pass, as per queue batch.
    let deleted = Mutex::new(HashSet::new());
    for problem in &due {
        if let Err(error) =
            act(ctx, state, aws, STATUS_CONTROLLER, &problem.kind, &problem.instance_id, &deleted).await
        {
            tracing::error!(controller = STATUS_CONTROLLER, instanceID = %problem.instance_id, error = %error_chain(&error), "handling instance status check message");
            next = Next::After(Duration::from_secs(10));
        }
    }
    Ok(next)
}

/// The `category` label of an instance status problem, as upstream names it.
fn category(kind: &Kind) -> &'static str {
    match kind {
        Kind::InstanceStatus => "InstanceStatus",
        Kind::SystemStatus => "SystemStatus",
        _ => "EventStatus",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels::{
        LABEL_CAPACITY_TYPE as CT, LABEL_INSTANCE_TYPE as IT, LABEL_TOPOLOGY_ZONE as ZONE,
    };

    /// A decision that marks nothing unavailable.
    fn plain(delete: bool, deadline: bool, replace_first: bool) -> Decision {
        Decision { delete, deadline, unavailable: None, reclaimed: None, replace_first }
    }

    fn claim(deleting: bool, deadline: Option<&str>) -> NodeClaim {
        let mut claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
            "metadata": {"name": "c", "uid": "u", "labels": {IT: "m5.large", ZONE: "us-west-2a", CT: "spot"}},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"}, "requirements": []}
        }))
        .unwrap();
        if deleting {
            claim.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-11-24T11:00:00Z".parse().unwrap(),
            ));
        }
        if let Some(d) = deadline {
            claim.annotations_mut().insert(ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP.into(), d.into());
        }
        claim
    }

    #[test]
    fn each_kind_decides_as_upstream() {
        let now: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
        let spot = decide(&Kind::SpotInterruption, &claim(false, None), now, false);
        assert!(spot.delete && !spot.deadline);
        assert_eq!(
            spot.unavailable,
            Some(OfferingKey {
                instance_type: "m5.large".into(),
                zone: "us-west-2a".into(),
                capacity_type: "spot".into()
            })
        );
        for kind in [
            Kind::Stopping,
            Kind::Terminating,
            Kind::ScheduledChange,
            Kind::EventStatus,
            Kind::CapacityReservationInterruption,
        ] {
            assert_eq!(decide(&kind, &claim(false, None), now, false), plain(true, false, false), "{kind}");
        }
        for kind in [Kind::RebalanceRecommendation, Kind::NoOp] {
            assert_eq!(decide(&kind, &claim(false, None), now, false), plain(false, false, false), "{kind}");
        }
        let forceful = decide(&Kind::SystemStatus, &claim(false, None), now, false);
        assert!(forceful.delete && forceful.deadline);
        // A reserved node's reservation being reclaimed: nothing is left in it.
        let mut reserved = claim(false, None);
        reserved.labels_mut().insert(LABEL_CAPACITY_RESERVATION_ID.into(), "cr-1".into());
        let d = decide(&Kind::CapacityReservationInterruption, &reserved, now, false);
        assert_eq!((d.delete, d.reclaimed.as_deref()), (true, Some("cr-1")));
        assert_eq!(decide(&Kind::SpotInterruption, &reserved, now, false).reclaimed, None);
    }

    #[test]
    fn a_rebalance_replaces_first_only_when_asked() {
        let now: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
        assert!(!decide(&Kind::RebalanceRecommendation, &claim(false, None), now, false).replace_first);
        let d = decide(&Kind::RebalanceRecommendation, &claim(false, None), now, true);
        assert_eq!(d, plain(false, false, true));
        assert!(
            !decide(&Kind::RebalanceRecommendation, &claim(true, None), now, true).replace_first,
            "already going"
        );
        assert!(!decide(&Kind::SpotInterruption, &claim(false, None), now, true).replace_first);
        let mut marked = claim(false, None);
        marked.status = Some(serde_json::from_value(serde_json::json!({"conditions": [{
            "type": REBALANCE_RECOMMENDED, "status": "True", "reason": "RebalanceRecommendation", "message": "",
            "lastTransitionTime": "2026-11-24T11:00:00Z"}]})).unwrap());
        assert!(!decide(&Kind::RebalanceRecommendation, &marked, now, true).replace_first, "marked once");
    }

    #[test]
    fn a_deleting_claim_is_not_deleted_again_and_a_due_deadline_is_kept() {
        let now: Timestamp = "2026-11-24T12:00:00Z".parse().unwrap();
        let d = decide(&Kind::SpotInterruption, &claim(true, None), now, false);
        assert!(!d.delete, "already deleting");
        assert!(d.unavailable.is_some(), "the offering is still marked");
        let d = decide(&Kind::InstanceStatus, &claim(true, Some("2026-11-24T11:30:00Z")), now, false);
        assert_eq!(d, plain(false, false, false));
        let d = decide(&Kind::InstanceStatus, &claim(true, Some("2026-11-24T13:00:00Z")), now, false);
        assert!(d.deadline, "a later deadline is brought forward");
        // A crash between the deletion and the deadline: the next look sets the deadline.
        let d = decide(&Kind::SystemStatus, &claim(true, None), now, false);
        assert_eq!(d, plain(false, true, false));
    }
}
