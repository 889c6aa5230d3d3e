//! Node updates that only renew a heartbeat.
//!
//! A kubelet writes its Node's status when something changes and, even when nothing does, at
//! least every `nodeStatusReportFrequency` (five minutes by default), renewing each condition's
//! `lastHeartbeatTime`. No decision reads a heartbeat (node health works from leases, condition
//! statuses and transition times), but each of those writes is a watch event: on a 2,000-node
//! cluster several a second, each one waking every controller that follows Node changes to build
//! its view of every node again. [`Renewals`] tells such updates apart, so that the watch keeps the
//! new version cached and wakes nobody.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hasher};
use std::io;

use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::runtime::watcher::Event;

/// What an update of an object of kind `K` is compared by: a fingerprint of everything in it but
/// what a renewal changes, or `None` when every update counts.
pub type Fingerprint<K> = fn(&K) -> Option<u64>;

/// The fingerprint of each object of one kind the watch has seen, by name.
pub struct Renewals<K> {
    fingerprint: Fingerprint<K>,
    last: HashMap<String, u64>,
}

impl<K: Resource> Renewals<K> {
    /// Follows updates by `fingerprint`.
    pub fn new(fingerprint: Fingerprint<K>) -> Self {
        Renewals { fingerprint, last: HashMap::new() }
    }

    /// Follows `event`; returns whether it is an update that changes nothing but what a renewal
    /// changes since the version seen last.
    pub fn only_renews(&mut self, event: &Event<K>) -> bool {
        let name = |o: &K| o.meta().name.clone().unwrap_or_default();
        match event {
            Event::Apply(o) | Event::InitApply(o) => match (self.fingerprint)(o) {
                Some(print) => {
                    let before = self.last.insert(name(o), print);
                    matches!(event, Event::Apply(_)) && before == Some(print)
                }
                None => false,
            },
            Event::Delete(o) => {
                self.last.remove(&name(o));
                false
            }
            // A new list: what it has is seen afresh.
            Event::Init => {
                self.last.clear();
                false
            }
            Event::InitDone => false,
        }
    }
}

/// Every update of a kind counts.
pub fn every_update<K>(_: &K) -> Option<u64> {
    None
}

/// A Node's fingerprint without its resource version, managed fields and conditions' heartbeat
/// times. `None` when it cannot be worked out (the update then counts).
pub fn node_fingerprint(node: &Node) -> Option<u64> {
    let mut node = node.clone();
    node.metadata.resource_version = None;
    node.metadata.managed_fields = None;
    if let Some(conditions) = node.status.as_mut().and_then(|s| s.conditions.as_mut()) {
        for condition in conditions {
            condition.last_heartbeat_time = None;
        }
    }
    let mut hasher = HashWriter(DefaultHasher::new());
    serde_json::to_writer(&mut hasher, &node).ok()?;
    Some(hasher.0.finish())
}

/// Hashes what is written to it.
struct HashWriter(DefaultHasher);

impl io::Write for HashWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    use super::*;

    fn node(
        version: &str,
        heartbeat: &str,
        ready: &str,
        labels: serde_json::Value,
    ) -> Result<Node, serde_json::Error> {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "resourceVersion": version, "labels": labels},
            "spec": {"providerID": "kwok://n1"},
            "status": {"conditions": [{
                "type": "Ready", "status": ready, "reason": "KubeletReady",
                "lastHeartbeatTime": heartbeat, "lastTransitionTime": "2026-11-29T10:00:00Z"
            }]}
        }))
    }

    #[test]
    fn only_a_renewed_heartbeat_is_a_renewal() -> Result<(), Box<dyn std::error::Error>> {
        let mut renewals = Renewals::new(node_fingerprint);
        let first = node("1", "2026-11-29T10:00:00Z", "True", json!({"a": "1"}))?;
        assert!(!renewals.only_renews(&Event::Apply(first)), "the first version is news");
        let renewed = node("2", "2026-11-29T10:05:00Z", "True", json!({"a": "1"}))?;
        assert!(renewals.only_renews(&Event::Apply(renewed)));
        let not_ready = node("3", "2026-11-29T10:10:00Z", "Unknown", json!({"a": "1"}))?;
        assert!(!renewals.only_renews(&Event::Apply(not_ready)), "a condition's status changed");
        let relabelled = node("4", "2026-11-29T10:10:00Z", "Unknown", json!({"a": "2"}))?;
        assert!(!renewals.only_renews(&Event::Apply(relabelled.clone())), "a label changed");
        assert!(renewals.only_renews(&Event::Apply(relabelled.clone())), "the same again");
        Ok(())
    }

    #[test]
    fn a_new_list_or_a_deletion_starts_afresh() -> Result<(), Box<dyn std::error::Error>> {
        let mut renewals = Renewals::new(node_fingerprint);
        let n = node("1", "2026-11-29T10:00:00Z", "True", json!({}))?;
        renewals.only_renews(&Event::Apply(n.clone()));
        renewals.only_renews(&Event::Delete(n.clone()));
        assert!(!renewals.only_renews(&Event::Apply(n.clone())), "created again after its deletion");
        renewals.only_renews(&Event::Init);
        assert!(!renewals.only_renews(&Event::InitApply(n.clone())), "a listed object always counts");
        renewals.only_renews(&Event::InitDone);
        assert!(renewals.only_renews(&Event::Apply(n)), "the listed version is the one compared");
        Ok(())
    }

    #[test]
    fn every_update_counts_without_a_fingerprint() -> Result<(), Box<dyn std::error::Error>> {
        let mut renewals = Renewals::<Node>::new(every_update);
        let n = node("1", "2026-11-29T10:00:00Z", "True", json!({}))?;
        assert!(!renewals.only_renews(&Event::Apply(n.clone())));
        assert!(!renewals.only_renews(&Event::Apply(n)));
        Ok(())
    }
}
