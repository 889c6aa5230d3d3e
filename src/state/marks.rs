//! What this process knows about nodes that no object records yet: which nodes pods were just
//! nominated to, and which NodeClaims a disruption decided to delete.
//!
//! A node that pods were nominated to within the nomination window is about to receive them: it
//! must not be chosen for disruption (upstream's `StateNode.Nominated`). A NodeClaim marked for
//! deletion counts as going away for every decision that follows, before its deletion is written
//! (upstream's `MarkedForDeletion`). Marks are keyed by node name or NodeClaim name; a mark set on
//! a NodeClaim's name applies to its node as well, and the other way round (see
//! [`super::statenode`]).

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
    deleting: HashSet<String>,
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

    /// Marks NodeClaims as being deleted by a decision of this process.
    pub fn mark_for_deletion<'a>(&self, claims: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        inner.deleting.extend(claims.into_iter().map(str::to_string));
    }

    /// Takes the marks back (the decision was abandoned), or drops them (the claims are gone).
    pub fn unmark<'a>(&self, claims: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.lock();
        for c in claims {
            inner.deleting.remove(c);
        }
    }

    /// The NodeClaims marked for deletion.
    pub fn marked_for_deletion(&self) -> HashSet<String> {
        self.lock().deleting.clone()
    }

    /// Drops every mark about `name` (its object is gone).
    pub fn forget(&self, name: &str) {
        let mut inner = self.lock();
        inner.nominated.remove(name);
        inner.deleting.remove(name);
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
        marks.mark_for_deletion(["a", "b"]);
        marks.unmark(["a"]);
        assert_eq!(marks.marked_for_deletion(), HashSet::from(["b".to_string()]));
        marks.forget("b");
        assert!(marks.marked_for_deletion().is_empty());
    }
}
