//! A small time-to-live cache with an injectable clock, so that expiry can be tested without
//! sleeping.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The real, monotonic clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<Instant>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock { now: Arc::new(Mutex::new(Instant::now())) }
    }
}

impl ManualClock {
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A map whose entries expire `ttl` after they were inserted.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    ttl: Duration,
    clock: Arc<dyn Clock>,
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache whose entries live for `ttl` as measured by `clock`.
    pub fn new(ttl: Duration, clock: Arc<dyn Clock>) -> Self {
        TtlCache { ttl, clock, entries: Mutex::new(HashMap::new()) }
    }

    /// Inserts or refreshes `key`.
    pub fn insert(&self, key: K, value: V) {
        let expires = self.clock.now() + self.ttl;
        self.lock().insert(key, (value, expires));
    }

    /// The live value of `key`.
    pub fn get(&self, key: &K) -> Option<V> {
        let now = self.clock.now();
        let mut entries = self.lock();
        match entries.get(key) {
            Some((v, expires)) if *expires > now => Some(v.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Whether `key` has a live entry.
    pub fn contains(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    /// Removes `key`.
    pub fn remove(&self, key: &K) {
        self.lock().remove(key);
    }

    /// Gives `key` a full `ttl` again if its entry is live, and says whether it was. An expired
    /// entry is left alone (unlike [`TtlCache::get`], which drops it), so that
    /// [`TtlCache::expired_keys`] still finds it.
    pub fn refresh(&self, key: &K) -> bool {
        let now = self.clock.now();
        match self.lock().get_mut(key) {
            Some((_, expires)) if *expires > now => {
                *expires = now + self.ttl;
                true
            }
            _ => false,
        }
    }

    /// The keys whose entries have expired but are still held (none that [`TtlCache::get`],
    /// [`TtlCache::contains`] or [`TtlCache::keys`] already dropped). They stay until removed or
    /// inserted again.
    pub fn expired_keys(&self) -> Vec<K> {
        let now = self.clock.now();
        self.lock().iter().filter(|(_, (_, expires))| *expires <= now).map(|(k, _)| k.clone()).collect()
    }

    /// The live keys.
    pub fn keys(&self) -> Vec<K> {
        let now = self.clock.now();
        let mut entries = self.lock();
        entries.retain(|_, (_, expires)| *expires > now);
        entries.keys().cloned().collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, (V, Instant)>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_with_the_clock() {
        let clock = ManualClock::default();
        let cache = TtlCache::new(Duration::from_secs(180), Arc::new(clock.clone()));
        cache.insert("a", 1);
        assert_eq!(cache.get(&"a"), Some(1));
        clock.advance(Duration::from_secs(179));
        assert!(cache.contains(&"a"));
        assert_eq!(cache.keys(), vec!["a"]);
        clock.advance(Duration::from_secs(1));
        assert_eq!(cache.get(&"a"), None);
        assert!(cache.keys().is_empty());
        cache.insert("b", 2);
        cache.remove(&"b");
        assert!(!cache.contains(&"b"));
    }

    #[test]
    fn refreshed_entries_live_on_and_expired_ones_wait_to_be_collected() {
        let clock = ManualClock::default();
        let cache = TtlCache::new(Duration::from_secs(60), Arc::new(clock.clone()));
        cache.insert("used", ());
        cache.insert("unused", ());
        assert!(!cache.refresh(&"absent"));
        clock.advance(Duration::from_secs(50));
        assert!(cache.refresh(&"used"));
        assert!(cache.expired_keys().is_empty());
        clock.advance(Duration::from_secs(10));
        assert_eq!(cache.expired_keys(), vec!["unused"]);
        // An expired entry is not refreshed, and stays until removed.
        assert!(!cache.refresh(&"unused"));
        assert_eq!(cache.expired_keys(), vec!["unused"]);
        cache.remove(&"unused");
        assert!(cache.expired_keys().is_empty());
        clock.advance(Duration::from_secs(49));
        assert!(cache.contains(&"used"));
        clock.advance(Duration::from_secs(1));
        assert_eq!(cache.expired_keys(), vec!["used"]);
    }
}
