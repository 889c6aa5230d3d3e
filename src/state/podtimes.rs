//! When this process first saw each pending pod as provisionable, first decided about it, and
//! first found it a place: the starting points of upstream's `karpenter_pods_provisioning_*` and
//! `karpenter_pods_scheduling_decision_duration_seconds` metrics.
//!
//! As upstream's cluster state keeps them, the times live in memory only (a new leader starts
//! afresh), keyed by the pod's namespace and name, and are dropped when the pod is deleted, Ready
//! or finished.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// The times of one pod.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Times {
    /// When the provisioner first saw the pod as provisionable.
    pub acked: Option<Timestamp>,
    /// When the provisioner first decided about the pod (a place or an error).
    pub decided: Option<Timestamp>,
    /// When the provisioner first found the pod a place (a new NodeClaim or an existing node),
    /// since the last time it found none.
    pub placed: Option<Timestamp>,
}

/// The times of every pod the provisioner has seen (see the module's documentation).
#[derive(Debug, Default)]
pub struct PodTimes {
    inner: Mutex<HashMap<String, Times>>,
}

impl PodTimes {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Times>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that the pod `key` (`namespace/name`) was seen provisionable at `now`; only the
    /// first time counts.
    pub fn ack(&self, key: &str, now: Timestamp) {
        let mut inner = self.lock();
        if let Some(t) = inner.get_mut(key) {
            t.acked.get_or_insert(now);
        } else {
            inner.insert(key.to_string(), Times { acked: Some(now), ..Times::default() });
        }
    }

    /// Notes the provisioner's decision about the pod `key` at `now`: a place (`placed`) or
    /// none. A pod left without a place loses its placement time, so that a later place starts a
    /// new one. Returns the time from the first sight to this decision if it is the first one.
    pub fn decided(&self, key: &str, placed: bool, now: Timestamp) -> Option<SignedDuration> {
        let mut inner = self.lock();
        let t = inner.entry(key.to_string()).or_default();
        let first = t.decided.is_none();
        t.decided.get_or_insert(now);
        if placed {
            t.placed.get_or_insert(now);
        } else {
            t.placed = None;
        }
        if first { t.acked.map(|acked| now.duration_since(acked)) } else { None }
    }

    /// The times of the pod `key`.
    pub fn get(&self, key: &str) -> Times {
        self.lock().get(key).copied().unwrap_or_default()
    }

    /// Drops the times of the pod `key`.
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// How many pods have times.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no pod has times.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn the_first_sight_and_decision_count() {
        let times = PodTimes::default();
        times.ack("ns/a", at(0));
        times.ack("ns/a", at(5));
        assert_eq!(times.decided("ns/a", false, at(2)), Some(SignedDuration::from_secs(2)));
        assert_eq!(times.decided("ns/a", true, at(3)), None, "only the first decision is timed");
        let t = times.get("ns/a");
        assert_eq!((t.acked, t.decided, t.placed), (Some(at(0)), Some(at(2)), Some(at(3))));
        times.decided("ns/a", true, at(4));
        assert_eq!(times.get("ns/a").placed, Some(at(3)), "the first place counts");
        times.decided("ns/a", false, at(6));
        assert_eq!(times.get("ns/a").placed, None, "an error starts over");
        times.forget("ns/a");
        assert!(times.is_empty());
    }

    #[test]
    fn a_decision_without_a_sight_is_not_timed() {
        let times = PodTimes::default();
        assert_eq!(times.decided("ns/b", true, at(1)), None);
        assert_eq!(times.get("ns/b").placed, Some(at(1)));
        assert_eq!(times.len(), 1);
    }
}
