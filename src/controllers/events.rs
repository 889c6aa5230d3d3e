//! Kubernetes events with upstream Karpenter's reasons.
//!
//! Publishing never fails the caller: an event that cannot be written is logged and dropped.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

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
    /// Draining a node could not evict some pods yet.
    pub const FAILED_DRAINING: &str = "FailedDraining";
    /// A pod was evicted from a node being drained.
    pub const EVICTED: &str = "Evicted";
    /// A pod is deleted because its node's termination grace period is running out.
    pub const TERMINATION_GRACE_PERIOD_EXPIRING: &str = "TerminationGracePeriodExpiring";
    /// Disruption of a node or NodeClaim is blocked.
    pub const DISRUPTION_BLOCKED: &str = "DisruptionBlocked";
    /// A node or NodeClaim is being disrupted.
    pub const DISRUPTION_TERMINATING: &str = "DisruptionTerminating";
    /// A NodeClaim failed to launch.
    pub const LAUNCH_FAILED: &str = "LaunchFailed";
    /// A NodeClaim did not register in time.
    pub const REGISTRATION_TIMEOUT: &str = "RegistrationTimeout";
}

/// Publishes events as the `karpenter` controller.
#[derive(Clone)]
pub struct Events {
    recorder: Option<Recorder>,
}

impl Events {
    /// Events written through `client`, reported by `karpenter` from `instance` (the pod name).
    pub fn new(client: Client, instance: Option<String>) -> Self {
        let reporter = Reporter { controller: "karpenter".into(), instance };
        Events { recorder: Some(Recorder::new(client, reporter)) }
    }

    /// Events that are only logged, for tests without an API server.
    pub fn disabled() -> Self {
        Events { recorder: None }
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

    /// Publishes an event about the object `reference` points at.
    pub async fn publish(&self, reference: ObjectReference, type_: EventType, reason: &str, message: String) {
        let Some(recorder) = &self.recorder else {
            tracing::debug!(reason, message, "event");
            return;
        };
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(truncate(message, 1024)),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &reference).await {
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
    #[test]
    fn long_notes_are_cut() {
        assert_eq!(super::truncate("abc".into(), 10), "abc");
        let long = "é".repeat(600);
        let cut = super::truncate(long, 1024);
        assert!(cut.len() <= 1024 && cut.ends_with("..."));
    }
}
