//! The one shape every controller has.
//!
//! A controller is started by the operator once this replica leads, and runs until its `stop`
//! signal turns true (shutdown, or leadership lost). There are two kinds:
//!
//! * **keyed** controllers reconcile one object at a time ([`run_keyed`]): watch events put the
//!   object's key on a [`Queue`], which coalesces repeated keys, never hands the same key to two
//!   workers at once, and holds the per-key retry timers and failure counts;
//! * **singleton** controllers reconcile the whole cluster in one pass ([`run_singleton`]), woken
//!   by the cluster-state change feed or a timer.
//!
//! Both retry a failed reconcile after [`Backoff::delay`], both log failures the same way (the
//! controller's name, the key, the error with its causes), and both count reconciles, errors and
//! their durations under controller-runtime's names (`controller_runtime_reconcile_total`,
//! `controller_runtime_reconcile_errors_total`, `controller_runtime_reconcile_time_seconds`). A key's
//! bookkeeping (its failure count, its timer) is dropped with [`Queue::forget`] when its object
//! goes, so nothing accumulates for objects that no longer exist.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::apis::NodeClaim;
use crate::metrics::Metrics;
use crate::util::error_chain;

/// What a successful reconcile asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing until something changes.
    Wait,
    /// Look again after this long (sooner if something changes).
    After(Duration),
}

impl Next {
    /// The earlier of two requests.
    pub fn min(self, other: Next) -> Next {
        match (self, other) {
            (Next::Wait, n) | (n, Next::Wait) => n,
            (Next::After(a), Next::After(b)) => Next::After(a.min(b)),
        }
    }
}

/// The retry delay after consecutive failures: `base`, doubling with each further failure, at
/// most `cap`. The one backoff of the project.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Longest delay.
    pub cap: Duration,
}

impl Backoff {
    /// The backoff of the per-object controllers: 1 s doubling up to 5 min (controller-runtime's
    /// item backoff starts lower; a second is plenty for an API server round trip).
    pub const DEFAULT: Backoff = Backoff { base: Duration::from_secs(1), cap: Duration::from_secs(300) };

    /// A backoff from `base` up to `cap`.
    pub const fn new(base: Duration, cap: Duration) -> Self {
        Backoff { base, cap }
    }

    /// The delay after `failures` consecutive failures (counted from 1; 0 is treated as 1).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(20));
        self.base.saturating_mul(factor).min(self.cap)
    }
}

/// A coalescing work queue of keys, with per-key timers and failure counts.
///
/// * A key added while it waits is not added twice; a key added while a worker holds it is
///   handed out again once that worker is done.
/// * [`Queue::add_after`] keeps the earliest of several timers of a key; an immediate
///   [`Queue::add`] replaces the timer.
/// * Failure counts live here, so the backoff of a key survives between reconciles and
///   [`Queue::forget`] drops everything about a key at once.
pub struct Queue<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
}

struct Inner<K> {
    ready: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    again: HashSet<K>,
    timers: BTreeSet<(Instant, u64)>,
    timer_keys: HashMap<u64, K>,
    timer_of: HashMap<K, (Instant, u64)>,
    next_timer: u64,
    failures: HashMap<K, u32>,
    closed: bool,
}

impl<K> std::fmt::Debug for Queue<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

impl<K: Clone + Eq + Hash> Default for Queue<K> {
    fn default() -> Self {
        Queue {
            inner: Mutex::new(Inner {
                ready: VecDeque::new(),
                queued: HashSet::new(),
                active: HashSet::new(),
                again: HashSet::new(),
                timers: BTreeSet::new(),
                timer_keys: HashMap::new(),
                timer_of: HashMap::new(),
                next_timer: 0,
                failures: HashMap::new(),
                closed: false,
            }),
            notify: Notify::new(),
        }
    }
}

impl<K: Clone + Eq + Hash> Inner<K> {
    fn cancel_timer(&mut self, key: &K) {
        if let Some(entry) = self.timer_of.remove(key) {
            self.timers.remove(&entry);
            self.timer_keys.remove(&entry.1);
        }
    }

    fn push(&mut self, key: K) {
        self.cancel_timer(&key);
        if self.active.contains(&key) {
            self.again.insert(key);
        } else if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
        }
    }

    fn schedule(&mut self, key: K, at: Instant) {
        if self.queued.contains(&key) {
            return;
        }
        if let Some((existing, _)) = self.timer_of.get(&key)
            && *existing <= at
        {
            return;
        }
        self.cancel_timer(&key);
        let id = self.next_timer;
        self.next_timer = self.next_timer.wrapping_add(1);
        self.timers.insert((at, id));
        self.timer_keys.insert(id, key.clone());
        self.timer_of.insert(key, (at, id));
    }

    /// Moves the keys whose timers are due to the ready list; returns the next deadline.
    fn fire_due(&mut self, now: Instant) -> Option<Instant> {
        while let Some(&(at, id)) = self.timers.first() {
            if at > now {
                return Some(at);
            }
            self.timers.remove(&(at, id));
            if let Some(key) = self.timer_keys.remove(&id) {
                self.timer_of.remove(&key);
                if self.active.contains(&key) {
                    self.again.insert(key);
                } else if self.queued.insert(key.clone()) {
                    self.ready.push_back(key);
                }
            }
        }
        None
    }
}

impl<K: Clone + Eq + Hash> Queue<K> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Asks for `key` to be reconciled now.
    pub fn add(&self, key: K) {
        let mut inner = self.lock();
        if inner.closed {
            return;
        }
        inner.push(key);
        drop(inner);
        self.notify.notify_waiters();
    }

    /// Asks for `key` to be reconciled after `delay`, unless it is due earlier anyway.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            return self.add(key);
        }
        let mut inner = self.lock();
        if inner.closed {
            return;
        }
        inner.schedule(key, Instant::now() + delay);
        drop(inner);
        self.notify.notify_waiters();
    }

    /// The next key to reconcile, once one is due; `None` once the queue is closed. The key is
    /// held until [`Queue::done`].
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let deadline = {
                let mut inner = self.lock();
                if inner.closed {
                    return None;
                }
                let deadline = inner.fire_due(Instant::now());
                if let Some(key) = inner.ready.pop_front() {
                    inner.queued.remove(&key);
                    inner.active.insert(key.clone());
                    return Some(key);
                }
                deadline
            };
            match deadline {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Releases `key` after a reconcile: a success resets its failure count and schedules what it
    /// asked for; a failure counts and schedules the retry after `backoff`. Returns the failure
    /// count (0 after a success).
    pub fn done(&self, key: &K, outcome: Result<Next, ()>, backoff: &Backoff) -> u32 {
        let mut inner = self.lock();
        inner.active.remove(key);
        let failures = match outcome {
            Ok(next) => {
                inner.failures.remove(key);
                if let Next::After(delay) = next {
                    inner.schedule(key.clone(), Instant::now() + delay);
                }
                0
            }
            Err(()) => {
                let n = inner.failures.entry(key.clone()).or_insert(0);
                *n = n.saturating_add(1);
                let n = *n;
                inner.schedule(key.clone(), Instant::now() + backoff.delay(n));
                n
            }
        };
        if inner.again.remove(key) && !inner.closed {
            inner.push(key.clone());
        }
        drop(inner);
        self.notify.notify_waiters();
        failures
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Drops everything the queue keeps about `key` (its object is gone): timer and failures. A
    /// reconcile already waiting still runs, and finds the object gone.
    pub fn forget(&self, key: &K) {
        let mut inner = self.lock();
        inner.cancel_timer(key);
        inner.failures.remove(key);
    }

    /// How many keys the queue keeps anything about (waiting, held, timed or failing).
    pub fn tracked(&self) -> usize {
        let inner = self.lock();
        let mut keys: HashSet<&K> = inner.queued.iter().collect();
        keys.extend(inner.active.iter());
        keys.extend(inner.timer_of.keys());
        keys.extend(inner.failures.keys());
        keys.len()
    }

    /// Stops handing out keys: waiting [`Queue::next`] calls return `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }
}

/// A per-object reconciler.
pub trait Reconcile: Send + Sync + 'static {
    /// The key of an object (its name, or namespace and name).
    type Key: Clone + Eq + Hash + Display + Send + Sync + 'static;
    /// Why a reconcile failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Brings the object of `key` closer to what it should be.
    fn reconcile(&self, key: &Self::Key) -> impl Future<Output = Result<Next, Self::Error>> + Send;
}

/// How a controller runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The controller's name, in logs and metrics (upstream's, e.g. `nodeclaim.lifecycle`).
    pub name: &'static str,
    /// Keys reconciled at once.
    pub workers: usize,
    /// Retry delays after failures.
    pub backoff: Backoff,
}

impl Options {
    /// One worker and the default backoff.
    pub fn new(name: &'static str) -> Self {
        Options { name, workers: 1, backoff: Backoff::DEFAULT }
    }

    /// With `workers` keys reconciled at once.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// With another backoff.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
}

/// Whether an error (or one of its causes) is an optimistic-concurrency conflict with another
/// writer: retried like any failure, but not worth an error in the log.
pub fn is_conflict(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = current {
        if e.downcast_ref::<kube::Error>().is_some_and(crate::util::api::is_conflict) {
            return true;
        }
        current = e.source();
    }
    false
}

/// Completes once `stop` is true (or its sender is gone).
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    // An error means the sender is gone: that is a stop too.
    let _ = stop.wait_for(|s| *s).await;
}

/// Reports the end of one reconcile, which took `took`, in the log and the metrics; returns
/// nothing.
fn report(
    name: &'static str,
    key: &dyn Display,
    took: Duration,
    result: Result<(), (&(dyn std::error::Error + 'static), Duration)>,
    metrics: Option<&Metrics>,
) {
    let outcome = match result {
        Ok(()) => "success",
        Err((error, retry_in)) => {
            if is_conflict(error) {
                tracing::debug!(controller = name, key = %key, error = %error_chain(error), retry_in = ?retry_in, "conflict, retrying");
            } else {
                tracing::error!(controller = name, key = %key, error = %error_chain(error), retry_in = ?retry_in, "Reconciler error");
            }
            if let Some(m) = metrics {
                m.controller_reconcile_errors.get_or_create(&vec![("controller", name.to_string())]).inc();
            }
            "error"
        }
    };
    if let Some(m) = metrics {
        m.controller_reconcile
            .get_or_create(&vec![("controller", name.to_string()), ("result", outcome.to_string())])
            .inc();
        m.controller_reconcile_time
            .get_or_create(&vec![("controller", name.to_string())])
            .observe(took.as_secs_f64());
    }
}

/// Runs a keyed controller: `options.workers` tasks take keys from `queue` and reconcile them
/// until `stop` turns true, when the queue is closed and the reconciles under way finish.
pub async fn run_keyed<R: Reconcile>(
    reconciler: Arc<R>,
    queue: Arc<Queue<R::Key>>,
    options: Options,
    metrics: Option<Arc<Metrics>>,
    mut stop: watch::Receiver<bool>,
) {
    tracing::info!(controller = options.name, "starting controller");
    let workers = (0..options.workers).map(|_| {
        let (reconciler, queue, options, metrics) =
            (reconciler.clone(), queue.clone(), options.clone(), metrics.clone());
        async move {
            while let Some(key) = queue.next().await {
                // Boxed: a reconcile's future can be large, and a worker is polled deep in others.
                let started = tokio::time::Instant::now();
                let result = Box::pin(reconciler.reconcile(&key)).await;
                let took = started.elapsed();
                match result {
                    Ok(next) => {
                        queue.done(&key, Ok(next), &options.backoff);
                        report(options.name, &key, took, Ok(()), metrics.as_deref());
                    }
                    Err(error) => {
                        let failures = queue.done(&key, Err(()), &options.backoff);
                        let retry_in = options.backoff.delay(failures);
                        report(options.name, &key, took, Err((&error, retry_in)), metrics.as_deref());
                    }
                }
            }
        }
    });
    let workers = futures::future::join_all(workers);
    tokio::pin!(workers);
    tokio::select! {
        _ = &mut workers => {}
        _ = stopped(&mut stop) => {
            queue.close();
            workers.await;
        }
    }
    tracing::info!(controller = options.name, "stopped controller");
}

/// What wakes a singleton controller besides its own timer: a future that completes when
/// something it cares about changed (see [`crate::state::feed`]).
pub trait Wake: Send {
    /// Completes at the next relevant change; pending forever if none can come.
    fn changed(&mut self) -> impl Future<Output = ()> + Send;
}

/// Wakes at a change of the cluster-state feed, once the burst it belongs to has settled for
/// `settle`.
pub struct Coalesced {
    /// The changes followed.
    pub changes: crate::state::Subscription,
    /// How long a burst is let settle.
    pub settle: Duration,
}

/// A subscription to the cluster state wakes at each change it follows.
impl Wake for crate::state::Subscription {
    async fn changed(&mut self) {
        self.next().await;
    }
}

impl Wake for Coalesced {
    async fn changed(&mut self) {
        self.changes.next().await;
        tokio::time::sleep(self.settle).await;
    }
}

/// Never wakes: a controller that runs on its timer only.
#[derive(Debug, Default)]
pub struct Timer;

impl Wake for Timer {
    async fn changed(&mut self) {
        std::future::pending::<()>().await
    }
}

/// Runs a singleton controller until `stop` turns true: `pass` runs once at start, then whenever
/// `wake` reports a change, when the delay it asked for is up, or, after a failure, when the
/// backoff is up.
pub async fn run_singleton<F, Fut, E, W>(
    options: Options,
    metrics: Option<Arc<Metrics>>,
    mut wake: W,
    mut stop: watch::Receiver<bool>,
    mut pass: F,
) where
    F: FnMut() -> Fut + Send,
    Fut: Future<Output = Result<Next, E>> + Send,
    E: std::error::Error + 'static,
    W: Wake,
{
    tracing::info!(controller = options.name, "starting controller");
    let mut failures: u32 = 0;
    loop {
        if *stop.borrow() {
            break;
        }
        let started = tokio::time::Instant::now();
        let result = tokio::select! {
            r = pass() => r,
            _ = stopped(&mut stop) => break,
        };
        let took = started.elapsed();
        let (delay, woken_by_changes) = match result {
            Ok(next) => {
                failures = 0;
                report(options.name, &"", took, Ok(()), metrics.as_deref());
                match next {
                    Next::Wait => (None, true),
                    Next::After(d) => (Some(d), true),
                }
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                let retry_in = options.backoff.delay(failures);
                report(options.name, &"", took, Err((&error, retry_in)), metrics.as_deref());
                (Some(retry_in), false)
            }
        };
        let sleep = async {
            match delay {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        let changed =
            async { if woken_by_changes { wake.changed().await } else { std::future::pending().await } };
        tokio::select! {
            _ = sleep => {}
            _ = changed => {}
            _ = stopped(&mut stop) => break,
        }
    }
    tracing::info!(controller = options.name, "stopped controller");
}

/// Counts `claim` in `karpenter_nodeclaims_disrupted_total{reason,nodepool,capacity_type}`.
pub fn count_disrupted(metrics: &Metrics, claim: &NodeClaim, reason: &str) {
    let label =
        |key: &str| claim.metadata.labels.as_ref().and_then(|l| l.get(key)).cloned().unwrap_or_default();
    let labels = vec![
        ("reason", reason.to_string()),
        ("nodepool", label(crate::apis::labels::LABEL_NODEPOOL)),
        ("capacity_type", label(crate::apis::labels::LABEL_CAPACITY_TYPE)),
    ];
    metrics.nodeclaims_disrupted.get_or_create(&labels).inc();
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let delays: Vec<u64> = (0..7).map(|n| b.delay(n).as_secs()).collect();
        assert_eq!(delays, [1, 1, 2, 4, 8, 10, 10]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn next_keeps_the_earlier_request() {
        let s = Duration::from_secs;
        assert_eq!(Next::Wait.min(Next::After(s(3))), Next::After(s(3)));
        assert_eq!(Next::After(s(5)).min(Next::After(s(3))), Next::After(s(3)));
        assert_eq!(Next::Wait.min(Next::Wait), Next::Wait);
    }

    #[tokio::test]
    async fn keys_are_coalesced_and_handed_out_in_order() {
        let q: Queue<&str> = Queue::new();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        let b = Backoff::DEFAULT;
        q.done(&"a", Ok(Next::Wait), &b);
        q.done(&"b", Ok(Next::Wait), &b);
        assert_eq!(q.tracked(), 0);
    }

    #[tokio::test]
    async fn a_key_added_while_held_comes_back_once_released() {
        let q: Queue<&str> = Queue::new();
        q.add("a");
        assert_eq!(q.next().await, Some("a"));
        q.add("a");
        q.add("a");
        // Not handed to a second worker while held.
        assert!(tokio::time::timeout(Duration::from_millis(20), q.next()).await.is_err());
        q.done(&"a", Ok(Next::Wait), &Backoff::DEFAULT);
        assert_eq!(q.next().await, Some("a"));
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_and_reset_on_success() {
        let q: Queue<&str> = Queue::new();
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
        q.add("a");
        assert_eq!(q.next().await, Some("a"));
        for expected in [1u64, 2, 4, 8] {
            let before = Instant::now();
            q.done(&"a", Err(()), &b);
            assert_eq!(q.next().await, Some("a"));
            assert_eq!(Instant::now() - before, Duration::from_secs(expected));
        }
        assert_eq!(q.failures(&"a"), 4);
        q.done(&"a", Ok(Next::Wait), &b);
        assert_eq!(q.failures(&"a"), 0);
        assert_eq!(q.tracked(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn timers_keep_the_earliest_and_an_immediate_add_wins() {
        let q: Queue<&str> = Queue::new();
        q.add_after("a", Duration::from_secs(30));
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(20));
        let start = Instant::now();
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
        q.done(&"a", Ok(Next::After(Duration::from_secs(100))), &Backoff::DEFAULT);
        q.add("a");
        let t = Instant::now();
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(Instant::now(), t, "the add replaced the 100 s timer");
        q.done(&"a", Ok(Next::Wait), &Backoff::DEFAULT);
        assert_eq!(q.tracked(), 0, "the replaced timer is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn forgetting_a_key_drops_its_timer_and_failures() {
        let q: Queue<String> = Queue::new();
        for i in 0..100 {
            let key = format!("claim-{i}");
            q.add(key.clone());
            let got = q.next().await.unwrap();
            q.done(&got, Err(()), &Backoff::DEFAULT);
        }
        assert_eq!(q.tracked(), 100);
        for i in 0..100 {
            q.forget(&format!("claim-{i}"));
        }
        assert_eq!(q.tracked(), 0);
        assert!(tokio::time::timeout(Duration::from_secs(3600), q.next()).await.is_err());
    }

    #[tokio::test]
    async fn closing_releases_waiting_workers() {
        let q: Arc<Queue<&str>> = Arc::new(Queue::new());
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.next().await }
        });
        tokio::task::yield_now().await;
        q.close();
        assert_eq!(waiter.await.unwrap(), None);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("boom")]
    struct Boom;

    struct Counting {
        calls: AtomicU32,
        fail_first: u32,
    }

    impl Reconcile for Counting {
        type Key = String;
        type Error = Boom;

        async fn reconcile(&self, _key: &String) -> Result<Next, Boom> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if n < self.fail_first { Err(Boom) } else { Ok(Next::Wait) }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_keyed_controller_retries_failures_and_stops_on_signal() {
        let r = Arc::new(Counting { calls: AtomicU32::new(0), fail_first: 3 });
        let q = Arc::new(Queue::new());
        let (stop_tx, stop) = watch::channel(false);
        q.add("x".to_string());
        let task = tokio::spawn(run_keyed(r.clone(), q.clone(), Options::new("test").workers(2), None, stop));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(r.calls.load(Ordering::SeqCst), 4, "three failures, then success");
        assert_eq!(q.failures(&"x".to_string()), 0);
        stop_tx.send_replace(true);
        task.await.unwrap();
    }

    struct Manual(tokio::sync::mpsc::UnboundedReceiver<()>);

    impl Wake for Manual {
        async fn changed(&mut self) {
            if self.0.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_singleton_runs_at_start_on_changes_and_on_its_timer() {
        let calls = Arc::new(AtomicU32::new(0));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop) = watch::channel(false);
        let c = calls.clone();
        let task = tokio::spawn(run_singleton(Options::new("test"), None, Manual(rx), stop, move || {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Boom>(Next::After(Duration::from_secs(60)))
            }
        }));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "once at start");
        tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2, "once per change");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3, "and on its timer");
        stop_tx.send_replace(true);
        task.await.unwrap();
    }
}
