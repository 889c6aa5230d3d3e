//! What this process knows about nodes that no object records yet: which nodes pods were just
//! nominated to, and which NodeClaims a disruption decided to delete.
//!
//! A node that pods were nominated to within the nomination window is about to receive them: it
//! must not be chosen for disruption (upstream's `StateNode.Nominated`). A NodeClaim marked for
//! deletion counts as going away for every decision that follows, before its deletion is written
//! (upstream's `MarkedForDeletion`). Nominations are keyed by node or NodeClaim name (they run
//! out within seconds); deletion marks by NodeClaim UID, and a mark is dropped as soon as its
//! NodeClaim has left the cluster: NodeClaim names come from `generateName` and are reused, and a
//! new claim that happens to get an old one's name must not inherit its mark. A mark applies to
//! the claim's node as well (see [`super::statenode`]).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The shortest nomination window.
pub const MIN_NOMINATION_WINDOW: Duration = Duration::from_secs(10);

/// How long a nomination protects a node: twice the longest batch, at least ten seconds, as
/// upstream.
pub fn nomination_window(batch_max_duration: Duration) -> Duration {
    batch_max_duration.saturating_mul(2).max(MIN_NOMINATION_WINDOW)
}

#[derive(Debug, Default)]
struct Inner {
    nominated: HashMap<String, Instant>,
    /// NodeClaim UID -> name.
    deleting: HashMap<String, String>,
}

/// The marks.
#[derive(Debug, Default)]
pub struct Marks {
    inner: Mutex<Inner>,
}

impl Marks {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that pods were nominated to the node or NodeClaim `name`, for `window` from now.
    pub fn nominate(&self, name: &str, window: Duration) {
        let until = Instant::now() + window;
        let mut inner = self.lock();
        let now = Instant::now();
        inner.nominated.retain(|_, t| *t > now);
        let entry = inner.nominated.entry(name.to_string()).or_insert(until);
        *entry = (*entry).max(until);
    }

    /// The names with a nomination that has not run out.
    pub fn nominated(&self) -> HashSet<String> {
        let now = Instant::now();
        self.lock().nominated.iter().filter(|(_, t)| **t > now).map(|(n, _)| n.clone()).collect()
    }

    /// Marks NodeClaims, given as `(uid, name)`, as being deleted by a decision of this process.
    pub fn mark_for_deletion<'a>(&self, claims: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut inner = self.lock();
        inner.deleting.extend(claims.into_iter().map(|(uid, name)| (uid.to_string(), name.to_string())));
    }

    /// Takes the marks of the NodeClaims with these UIDs back (the decision was abandoned).
    pub fn unmark<'a>(&self, uids: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        for uid in uids {
            inner.deleting.remove(uid);
        }
    }

    /// The names of the NodeClaims marked for deletion, of those whose UID `live` still holds;
    /// the marks of the others are dropped for good (their claims are gone).
    pub fn marked_for_deletion(&self, live: &HashSet<&str>) -> HashSet<String> {
        let mut inner = self.lock();
        inner.deleting.retain(|uid, _| live.contains(uid.as_str()));
        inner.deleting.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_twice_the_batch_and_at_least_ten_seconds() {
        assert_eq!(nomination_window(Duration::from_secs(10)), Duration::from_secs(20));
        assert_eq!(nomination_window(Duration::from_secs(1)), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn nominations_run_out() {
        let marks = Marks::default();
        marks.nominate("n1", Duration::from_secs(20));
        tokio::time::sleep(Duration::from_secs(10)).await;
        marks.nominate("n2", Duration::from_secs(20));
        assert_eq!(marks.nominated().len(), 2);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(marks.nominated(), HashSet::from(["n2".to_string()]));
        // A later nomination extends, an earlier one never shortens.
        marks.nominate("n2", Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(marks.nominated().contains("n2"));
    }

    #[test]
    fn deletion_marks_come_and_go() {
        let marks = Marks::default();
        marks.mark_for_deletion([("uid-a", "a"), ("uid-b", "b")]);
        marks.unmark(["uid-a"]);
        let live = HashSet::from(["uid-a", "uid-b"]);
        assert_eq!(marks.marked_for_deletion(&live), HashSet::from(["b".to_string()]));
    }

    #[test]
    fn a_claim_that_reuses_a_gone_claims_name_is_not_marked() {
        let marks = Marks::default();
        marks.mark_for_deletion([("uid-1", "default-abcde")]);
        assert_eq!(marks.marked_for_deletion(&HashSet::from(["uid-1"])).len(), 1);
        // The claim is gone; a new one got the same name.
        assert!(marks.marked_for_deletion(&HashSet::from(["uid-2"])).is_empty());
        // And the mark is gone for good, not only hidden.
        assert!(marks.marked_for_deletion(&HashSet::from(["uid-1", "uid-2"])).is_empty());
    }
}
