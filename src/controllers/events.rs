//! Kubernetes events with upstream Karpenter's reasons.
//!
//! Events are written as core `v1` Events, as upstream's recorder writes them (so upstream's RBAC,
//! which grants only those, is enough), from the `karpenter` component. The same event about the
//! same object again within [`SERIES_WINDOW`] updates the first Event's count and last timestamp
//! instead of creating another object, as client-go's recorder does. Only what that needs (a hash of the event, the Event's name and the
//! count) is remembered, a few dozen bytes per event, so announcing a thousand pods costs next to
//! no memory. Publishing never fails the caller: an event that cannot be written is logged and
//! dropped.

use crate::util::api::is_not_found;
use crate::util::bucket::TokenBucket;
use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event as K8sEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::json;

/// How long a repeated event extends the series of the first instead of starting a new Event.
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// The longest deduplication window in use; entries older than this are pruned.
const MAX_DEDUPE_WINDOW: SignedDuration = SignedDuration::from_mins(15);
/// Entries (deduplication or series) kept before old ones are pruned; after a prune, twice what
/// was kept, so that a cluster with more live entries does not scan them at every event.
const PRUNE_AT: usize = 4096;

/// Entries keyed by an event's hash, pruned when they reach `prune_at`.
#[derive(Debug)]
struct Remembered<V> {
    entries: HashMap<u64, V>,
    prune_at: usize,
}

impl<V> Default for Remembered<V> {
    fn default() -> Self {
        Remembered { entries: HashMap::new(), prune_at: PRUNE_AT }
    }
}

impl<V> Remembered<V> {
    /// Inserts `value`, first dropping the entries `keep` refuses when there are many.
    fn insert(&mut self, key: u64, value: V, keep: impl FnMut(&V) -> bool) {
        if self.entries.len() >= self.prune_at {
            let mut keep = keep;
            self.entries.retain(|_, v| keep(v));
            self.prune_at = (self.entries.len() * 2).max(PRUNE_AT);
        }
        self.entries.insert(key, value);
    }
}

/// The name events are reported under.
const CONTROLLER: &str = "karpenter";

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something needs attention.
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// What is remembered of a published event.
#[derive(Debug, Clone)]
struct Series {
    /// Name of the Event object.
    name: String,
    /// Occurrences so far.
    count: i32,
    /// When it was last published.
    last: Timestamp,
}

/// Event reasons, as upstream writes them.
pub mod reasons {
    /// A pod is expected to land on a NodeClaim or node Karpenter provisioned.
    pub const NOMINATED: &str = "Nominated";
    /// A pod fits no NodePool.
    pub const FAILED_SCHEDULING: &str = "FailedScheduling";
    /// The cloud had no capacity for any offering of a NodeClaim.
    pub const INSUFFICIENT_CAPACITY_ERROR: &str = "InsufficientCapacityError";
    /// The NodeClaim's node class is not ready.
    pub const NODE_CLASS_NOT_READY: &str = "NodeClassNotReady";
    /// The node class of a NodeClaim does not exist: the NodeClaim is deleted.
    pub const NODE_CLASS_NOT_FOUND: &str = "NodeClassNotFound";
    /// Draining a node could not evict some pods yet.
    pub const FAILED_DRAINING: &str = "FailedDraining";
    /// A pod was evicted from a node being drained.
    pub const EVICTED: &str = "Evicted";
    /// A pod is deleted because its node's termination grace period is running out.
    pub const TERMINATION_GRACE_PERIOD_EXPIRING: &str = "TerminationGracePeriodExpiring";
    /// A NodeClaim whose provider ID the cloud provider cannot act on: its instance is treated as
    /// gone.
    pub const INVALID_PROVIDER_ID: &str = "InvalidProviderID";
    /// A pod deleted at its node's termination deadline, bypassing its PodDisruptionBudget and
    /// `karpenter.sh/do-not-disrupt`.
    pub const DISRUPTED: &str = "Disrupted";
    /// Disruption of a node or NodeClaim is blocked.
    pub const DISRUPTION_BLOCKED: &str = "DisruptionBlocked";
    /// A node or NodeClaim is being disrupted.
    pub const DISRUPTION_TERMINATING: &str = "DisruptionTerminating";
    /// A replacement NodeClaim of a disruption is launching.
    pub const DISRUPTION_LAUNCHING: &str = "DisruptionLaunching";
    /// A disruption waits for its replacement NodeClaim to initialize.
    pub const DISRUPTION_WAITING_READINESS: &str = "DisruptionWaitingReadiness";
    /// A candidate that consolidation looked at cannot be consolidated.
    pub const UNCONSOLIDATABLE: &str = "Unconsolidatable";
    /// A node is to be replaced by consolidation.
    pub const CONSOLIDATION_CANDIDATE: &str = "ConsolidationCandidate";
    /// A consolidation failed its validation.
    pub const CONSOLIDATION_REJECTED: &str = "ConsolidationRejected";
    /// A Balanced NodePool approved a consolidation move.
    pub const CONSOLIDATION_APPROVED: &str = "ConsolidationApproved";
    /// A pod's `karpenter.sh/do-not-disrupt` value is not understood and is ignored.
    pub const INVALID_DO_NOT_DISRUPT_ANNOTATION: &str = "InvalidDoNotDisruptAnnotation";
    /// Node repair of an unhealthy node is refused: too many nodes of its NodePool (or of the
    /// cluster) are unhealthy.
    pub const NODE_REPAIR_BLOCKED: &str = "NodeRepairBlocked";
    /// An interruption (queue message or failed status check) deleted the NodeClaim.
    pub const TERMINATING_ON_INTERRUPTION: &str = "TerminatingOnInterruption";
    /// A NodeClaim failed to launch.
    pub const LAUNCH_FAILED: &str = "LaunchFailed";
    /// A NodeClaim did not register in time.
    pub const REGISTRATION_TIMEOUT: &str = "RegistrationTimeout";
    /// A pod that was given several new NodeClaims and keeps coming back pending gets no new one
    /// for a while (karpenter-rs only: upstream has no such guard).
    pub const PROVISIONING_BACKOFF: &str = "ProvisioningBackoff";
}

/// Publishes events as the `karpenter` controller.
#[derive(Clone)]
pub struct Events {
    client: Option<Client>,
    instance: String,
    series: Arc<Mutex<Remembered<Series>>>,
    /// When each deduplicated event (hash of object uid, reason and key) was last published.
    recent: Arc<Mutex<Remembered<Timestamp>>>,
}

impl Events {
    /// Events written through `client`, reported by `karpenter` from `instance` (the pod name).
    pub fn new(client: Client, instance: Option<String>) -> Self {
        Events {
            client: Some(client),
            instance: instance.unwrap_or_else(|| CONTROLLER.to_string()),
            series: Arc::default(),
            recent: Arc::default(),
        }
    }

    /// Events that are only logged, for tests without an API server.
    pub fn disabled() -> Self {
        Events {
            client: None,
            instance: CONTROLLER.to_string(),
            series: Arc::default(),
            recent: Arc::default(),
        }
    }

    /// Publishes a `Normal` event about `object`.
    pub async fn normal<K>(&self, object: &K, reason: &str, message: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(object.object_ref(&()), EventType::Normal, reason, message).await;
    }

    /// Publishes a `Warning` event about `object`.
    pub async fn warning<K>(&self, object: &K, reason: &str, message: String)
    where
        K: Resource<DynamicType = ()>,
    {
        self.publish(object.object_ref(&()), EventType::Warning, reason, message).await;
    }

    /// Publishes an event about `object` unless one with the same reason (and `key`) was
    /// published about it within `window`, as upstream's recorder deduplicates: the message is not
    /// part of the identity, so a blocked node is told once per window, not every pass.
    pub async fn deduped<K>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        key: &str,
        window: SignedDuration,
        message: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        let reference = object.object_ref(&());
        if self.first_in_window(&reference, reason, key, window) {
            self.publish(reference, type_, reason, message).await;
        }
    }

    /// As [`Events::deduped`] (without a key), and only when `limit` has a token: an event it
    /// refuses is dropped and still counts as told for the window, as upstream's recorder limits
    /// `Nominated` (its deduplication comes first).
    pub async fn limited<K>(
        &self,
        (object, type_, reason): (&K, EventType, &str),
        window: SignedDuration,
        limit: &TokenBucket,
        message: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        let reference = object.object_ref(&());
        if !self.first_in_window(&reference, reason, "", window) {
            return;
        }
        if !limit.try_take() {
            let name = reference.name.as_deref().unwrap_or_default();
            tracing::debug!(reason, name, "event dropped by its rate limit");
            return;
        }
        self.publish(reference, type_, reason, message).await;
    }

    /// Whether no event with `reason` (and `key`) about `reference` was told within `window`;
    /// if none was, this one counts as told from now.
    fn first_in_window(
        &self,
        reference: &ObjectReference,
        reason: &str,
        key: &str,
        window: SignedDuration,
    ) -> bool {
        let mut hasher = DefaultHasher::new();
        (reference.uid.as_deref(), reference.name.as_deref(), reason, key).hash(&mut hasher);
        let id = hasher.finish();
        let now = Timestamp::now();
        let mut recent = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.entries.get(&id).is_some_and(|last| now.duration_since(*last) < window) {
            return false;
        }
        recent.insert(id, now, |last| now.duration_since(*last) < MAX_DEDUPE_WINDOW);
        true
    }

    /// Publishes an event about the object `reference` points at.
    pub async fn publish(&self, reference: ObjectReference, type_: EventType, reason: &str, message: String) {
        let Some(client) = &self.client else {
            tracing::debug!(reason, message, "event");
            return;
        };
        let note = truncate(message, 1024);
        let now = Timestamp::now();
        let key = series_key(&reference, type_, reason, &note);
        let previous = self.remember(key, now);
        let namespace = reference.namespace.clone().unwrap_or_else(|| "default".to_string());
        let api: Api<K8sEvent> = Api::namespaced(client.clone(), &namespace);
        let fresh = || self.new_event(reference.clone(), type_, reason, note, now);
        let result = match previous {
            Some(series) => {
                let patch = json!({"count": series.count, "lastTimestamp": Time(now)});
                match api.patch(&series.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    // The Event expired on the API server (after an hour by default): start anew.
                    Err(e) if is_not_found(&e) => self.create(&api, key, fresh()).await,
                    other => other.map(|_| ()),
                }
            }
            None => self.create(&api, key, fresh()).await,
        };
        if let Err(error) = result {
            tracing::warn!(
                reason,
                kind = reference.kind.as_deref().unwrap_or_default(),
                name = reference.name.as_deref().unwrap_or_default(),
                namespace = reference.namespace.as_deref().unwrap_or_default(),
                error = %error,
                "failed to publish event"
            );
        }
    }

    /// Counts one more occurrence of the event `key` at `now`; returns its series when it
    /// continues one. Series older than [`SERIES_WINDOW`] are forgotten.
    fn remember(&self, key: u64, now: Timestamp) -> Option<Series> {
        let mut all = self.series.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let series = all.entries.get_mut(&key).filter(|s| s.last + SERIES_WINDOW > now)?;
        series.count += 1;
        series.last = now;
        Some(series.clone())
    }

    /// Creates `event` and starts its series.
    async fn create(&self, api: &Api<K8sEvent>, key: u64, event: K8sEvent) -> Result<(), kube::Error> {
        api.create(&PostParams::default(), &event).await?;
        let (Some(name), Some(Time(last))) = (event.metadata.name, event.last_timestamp) else {
            return Ok(());
        };
        let now = Timestamp::now();
        let mut all = self.series.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        all.insert(key, Series { name, count: 1, last }, |s| s.last + SERIES_WINDOW > now);
        Ok(())
    }

    /// A new Event, named after the object and the time as client-go names them.
    fn new_event(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
        now: Timestamp,
    ) -> K8sEvent {
        let name = format!("{}.{:x}", reference.name.as_deref().unwrap_or(CONTROLLER), now.as_nanosecond());
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: reference.namespace.clone(),
                ..Default::default()
            },
            reason: Some(reason.to_string()),
            message: Some(note),
            type_: Some(type_.as_str().to_string()),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            involved_object: reference,
            source: Some(EventSource { component: Some(CONTROLLER.to_string()), host: None }),
            reporting_component: Some(CONTROLLER.to_string()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        }
    }
}

/// Identifies "the same event": its type, reason and note about the same object.
fn series_key(reference: &ObjectReference, type_: EventType, reason: &str, note: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (&reference.api_version, &reference.kind, &reference.namespace, &reference.name, &reference.uid)
        .hash(&mut h);
    (type_, reason, note).hash(&mut h);
    h.finish()
}

/// Events notes are limited to 1 kB by the API server.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    #[test]
    fn the_same_event_again_continues_its_series_until_the_window_ends() {
        let events = Events::disabled();
        let t0 = Timestamp::UNIX_EPOCH;
        let key = series_key(&reference("a"), EventType::Normal, "Nominated", "Pod should schedule on: x");
        events
            .series
            .lock()
            .unwrap()
            .insert(key, Series { name: "a.1".into(), count: 1, last: t0 }, |_| true);
        let again = events.remember(key, t0 + SignedDuration::from_mins(1)).unwrap();
        assert_eq!((again.name.as_str(), again.count), ("a.1", 2));
        // Six minutes after the last occurrence the series is over.
        assert!(events.remember(key, t0 + SignedDuration::from_mins(7)).is_none());
    }

    #[test]
    fn old_entries_go_when_many_are_remembered() {
        let mut remembered = Remembered::default();
        for key in 0..PRUNE_AT as u64 {
            remembered.insert(key, key % 2 == 0, |_| unreachable!("no prune below the threshold"));
        }
        // The next insert prunes (the odd keys go), and the next prune waits for twice the rest.
        remembered.insert(u64::MAX, true, |keep| *keep);
        let kept = PRUNE_AT / 2;
        assert_eq!(remembered.entries.len(), kept + 1);
        assert_eq!(remembered.prune_at, 2 * kept);
        // Live entries: each prune keeps them all, and the threshold doubles.
        for key in PRUNE_AT as u64..(3 * PRUNE_AT as u64) {
            remembered.insert(key, true, |keep| *keep);
        }
        assert_eq!(remembered.entries.len(), kept + 1 + 2 * PRUNE_AT);
        assert_eq!(remembered.prune_at, 4 * PRUNE_AT);
    }

    #[tokio::test]
    async fn a_limited_event_is_deduplicated_first_and_dropped_without_a_token() {
        let events = Events::disabled();
        let limit = TokenBucket::new(1, 2);
        let pod = |name: &str| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(
                json!({"metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")}}),
            )
            .unwrap()
        };
        let window = SignedDuration::from_mins(2);
        let tell = |name: &str, message: &str| {
            let (events, limit, pod, message) = (events.clone(), &limit, pod(name), message.to_string());
            async move {
                events.limited((&pod, EventType::Normal, "Nominated"), window, limit, message).await;
            }
        };
        tell("a", "Pod should schedule on: nodeclaim/x").await;
        // Told within the window, whatever the message: no token taken.
        tell("a", "Pod should schedule on: nodeclaim/y").await;
        assert!(limit.try_take(), "one of the two tokens is left");
        // No token for b: dropped, and still told for the window.
        tell("b", "Pod should schedule on: nodeclaim/z").await;
        assert_eq!(events.recent.lock().unwrap().entries.len(), 2);
    }

    #[test]
    fn events_differ_by_object_type_reason_and_note() {
        let base = series_key(&reference("a"), EventType::Normal, "Nominated", "n");
        assert_eq!(base, series_key(&reference("a"), EventType::Normal, "Nominated", "n"));
        for other in [
            series_key(&reference("b"), EventType::Normal, "Nominated", "n"),
            series_key(&reference("a"), EventType::Warning, "Nominated", "n"),
            series_key(&reference("a"), EventType::Normal, "FailedScheduling", "n"),
            series_key(&reference("a"), EventType::Normal, "Nominated", "m"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn long_notes_are_cut() {
        assert_eq!(super::truncate("abc".into(), 10), "abc");
        let long = "é".repeat(600);
        let cut = super::truncate(long, 1024);
        assert!(cut.len() <= 1024 && cut.ends_with("..."));
    }
}
