//! Offerings out of capacity for a while, everywhere or only in a placement group (and
//! partition), as upstream scopes its insufficient-capacity cache: running out inside a group
//! says nothing about launches outside it.

use std::sync::Arc;
use std::time::Duration;

use super::cache::{Clock, TtlCache};
use crate::cloudprovider::OfferingKey;

/// Where an offering ran out.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Launches anywhere.
    Everywhere,
    /// Launches into the placement group (its id).
    Group(String),
    /// Launches into one partition of a partition placement group.
    Partition(String, i32),
}

impl Scope {
    /// The scope of a launch into the placement group `group` (and `partition`), if any.
    pub fn of_launch(group: Option<&str>, partition: Option<i32>) -> Scope {
        match (group, partition) {
            (None, _) => Scope::Everywhere,
            (Some(g), None) => Scope::Group(g.to_string()),
            (Some(g), Some(p)) => Scope::Partition(g.to_string(), p),
        }
    }
}

/// The offerings recently out of capacity.
#[derive(Debug)]
pub struct UnavailableOfferings {
    cache: TtlCache<(OfferingKey, Scope), ()>,
}

impl UnavailableOfferings {
    /// An empty set whose entries last `ttl`, as measured by `clock`.
    pub fn new(ttl: Duration, clock: Arc<dyn Clock>) -> Self {
        UnavailableOfferings { cache: TtlCache::new(ttl, clock) }
    }

    /// Marks `offering` out of capacity in `scope` (again: its time starts over).
    pub fn mark(&self, offering: OfferingKey, scope: Scope) {
        self.cache.insert((offering, scope), ());
    }

    /// Whether `offering` is out of capacity for launches of a class whose placement group is
    /// `group`: marked everywhere, or in that group. As upstream's, an entry of one partition
    /// does not take the offering away (the claim's next launch may target another one).
    pub fn contains(&self, offering: &OfferingKey, group: Option<&str>) -> bool {
        let key = (offering.clone(), Scope::Everywhere);
        if self.cache.contains(&key) {
            return true;
        }
        group.is_some_and(|g| self.cache.contains(&(key.0, Scope::Group(g.to_string()))))
    }

    /// Whether `offering` is marked in exactly `scope`.
    pub fn marked(&self, offering: &OfferingKey, scope: Scope) -> bool {
        self.cache.contains(&(offering.clone(), scope))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudprovider::aws::cache::ManualClock;

    #[test]
    fn entries_are_scoped_to_their_placement_group() {
        let clock = ManualClock::default();
        let set = UnavailableOfferings::new(Duration::from_secs(180), Arc::new(clock.clone()));
        let key = |it: &str| OfferingKey {
            instance_type: it.into(),
            zone: "a".into(),
            capacity_type: "on-demand".into(),
        };
        set.mark(key("m5.large"), Scope::Group("pg-1".into()));
        assert!(set.contains(&key("m5.large"), Some("pg-1")));
        assert!(!set.contains(&key("m5.large"), None), "launches outside the group are not affected");
        assert!(!set.contains(&key("m5.large"), Some("pg-2")));
        set.mark(key("c5.large"), Scope::Partition("pg-1".into(), 2));
        assert!(set.marked(&key("c5.large"), Scope::of_launch(Some("pg-1"), Some(2))));
        assert!(
            !set.contains(&key("c5.large"), Some("pg-1")),
            "one partition does not take the group's offering"
        );
        set.mark(key("r5.large"), Scope::Everywhere);
        assert!(set.contains(&key("r5.large"), None) && set.contains(&key("r5.large"), Some("pg-1")));
        clock.advance(Duration::from_secs(181));
        assert!(!set.contains(&key("m5.large"), Some("pg-1")) && !set.contains(&key("r5.large"), None));
    }
}
