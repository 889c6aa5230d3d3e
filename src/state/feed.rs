//! The change feed: what changed in the cluster state, for the controllers that react to changes
//! as a whole (the provisioner, disruption, the NodePool status).
//!
//! The feed keeps one counter per kind of change, bumped by the watches. A consumer remembers the
//! counters it last acted on and compares: any number of consumers can follow the feed, each at
//! its own pace, and the feed itself never holds more than the counters. A burst of a thousand
//! events wakes a slow consumer once; a replica that is not leading, whose controllers are not
//! running, accumulates nothing.

use tokio::sync::watch;

/// Counters of changes, one per kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// A pod the provisioner should find capacity for was added or changed.
    pub provisionable_pods: u64,
    /// Any pod was added, changed or deleted (bound, finished, evicted, ...).
    pub pods: u64,
    /// A Node was added or changed.
    pub nodes: u64,
    /// A Node was deleted.
    pub node_deletions: u64,
    /// A NodeClaim was added or changed.
    pub nodeclaims: u64,
    /// A NodeClaim was deleted.
    pub nodeclaim_deletions: u64,
    /// A NodePool was added, changed or deleted.
    pub nodepools: u64,
    /// An EC2NodeClass was added, changed or deleted.
    pub nodeclasses: u64,
    /// A DaemonSet, PodDisruptionBudget, Namespace or storage object changed.
    pub others: u64,
    /// What the NodeOverlays change was evaluated anew, with another result.
    pub overlays: u64,
    /// The placeholder pods of CapacityBuffers changed.
    pub buffers: u64,
}

/// Which kinds of change a consumer follows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Interest {
    /// [`Changes::provisionable_pods`].
    pub provisionable_pods: bool,
    /// [`Changes::pods`].
    pub pods: bool,
    /// [`Changes::nodes`].
    pub nodes: bool,
    /// [`Changes::node_deletions`].
    pub node_deletions: bool,
    /// [`Changes::nodeclaims`].
    pub nodeclaims: bool,
    /// [`Changes::nodeclaim_deletions`].
    pub nodeclaim_deletions: bool,
    /// [`Changes::nodepools`].
    pub nodepools: bool,
    /// [`Changes::nodeclasses`].
    pub nodeclasses: bool,
    /// [`Changes::others`].
    pub others: bool,
    /// [`Changes::overlays`].
    pub overlays: bool,
    /// [`Changes::buffers`].
    pub buffers: bool,
}

impl Interest {
    /// Every kind of change.
    pub const ALL: Interest = Interest {
        provisionable_pods: true,
        pods: true,
        nodes: true,
        node_deletions: true,
        nodeclaims: true,
        nodeclaim_deletions: true,
        nodepools: true,
        nodeclasses: true,
        others: true,
        overlays: true,
        buffers: true,
    };

    /// Whether `after` differs from `before` in a kind this interest follows.
    pub fn differs(&self, before: &Changes, after: &Changes) -> bool {
        (self.provisionable_pods && before.provisionable_pods != after.provisionable_pods)
            || (self.pods && before.pods != after.pods)
            || (self.nodes && before.nodes != after.nodes)
            || (self.node_deletions && before.node_deletions != after.node_deletions)
            || (self.nodeclaims && before.nodeclaims != after.nodeclaims)
            || (self.nodeclaim_deletions && before.nodeclaim_deletions != after.nodeclaim_deletions)
            || (self.nodepools && before.nodepools != after.nodepools)
            || (self.nodeclasses && before.nodeclasses != after.nodeclasses)
            || (self.others && before.others != after.others)
            || (self.overlays && before.overlays != after.overlays)
            || (self.buffers && before.buffers != after.buffers)
    }
}

/// The producing side, owned by the cluster state.
#[derive(Debug)]
pub struct Feed {
    tx: watch::Sender<Changes>,
}

impl Default for Feed {
    fn default() -> Self {
        Feed { tx: watch::Sender::new(Changes::default()) }
    }
}

impl Feed {
    /// Bumps the counters `f` chooses and wakes the consumers.
    pub fn bump(&self, f: impl FnOnce(&mut Changes)) {
        self.tx.send_modify(f);
    }

    /// The counters now.
    pub fn current(&self) -> Changes {
        *self.tx.borrow()
    }

    /// A consumer of the kinds in `interest`, starting from the counters now.
    pub fn subscribe(&self, interest: Interest) -> Subscription {
        let mut rx = self.tx.subscribe();
        let seen = *rx.borrow_and_update();
        Subscription { rx, seen, interest }
    }
}

/// One consumer of the feed.
#[derive(Debug)]
pub struct Subscription {
    rx: watch::Receiver<Changes>,
    seen: Changes,
    interest: Interest,
}

impl Subscription {
    /// The counters last returned by [`Subscription::next`] (or at subscription).
    pub fn seen(&self) -> Changes {
        self.seen
    }

    /// Waits until a kind this consumer follows changed since it last looked, and returns the
    /// counters then. Pending forever once the feed is gone.
    pub async fn next(&mut self) -> Changes {
        loop {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            let now = *self.rx.borrow_and_update();
            if self.interest.differs(&self.seen, &now) {
                self.seen = now;
                return now;
            }
        }
    }

    /// Whether a followed kind changed since the last [`Subscription::next`], without waiting.
    pub fn has_changed(&self) -> bool {
        self.interest.differs(&self.seen, &self.rx.borrow())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn consumers_see_only_what_they_follow_and_bursts_coalesce() {
        let feed = Feed::default();
        let mut pods = feed.subscribe(Interest { provisionable_pods: true, ..Default::default() });
        let mut everything = feed.subscribe(Interest::ALL);
        for _ in 0..1000 {
            feed.bump(|c| c.nodeclaims += 1);
        }
        let c = everything.next().await;
        assert_eq!(c.nodeclaims, 1000, "a thousand events, one wake-up");
        assert!(tokio::time::timeout(Duration::from_millis(20), pods.next()).await.is_err());
        feed.bump(|c| c.provisionable_pods += 1);
        assert_eq!(pods.next().await.provisionable_pods, 1);
        assert!(!pods.has_changed());
    }

    #[tokio::test]
    async fn a_feed_without_consumers_holds_only_its_counters() {
        let feed = Feed::default();
        for _ in 0..100_000 {
            feed.bump(|c| c.pods += 1);
        }
        assert_eq!(feed.current().pods, 100_000);
        let mut late = feed.subscribe(Interest::ALL);
        assert!(!late.has_changed(), "a new consumer starts from now");
        feed.bump(|c| c.nodes += 1);
        assert_eq!(late.next().await.nodes, 1);
    }
}
