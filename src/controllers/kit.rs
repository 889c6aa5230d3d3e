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
//! controller's name, the key, the error with its causes), and both treat a reconcile that panics
//! as a failure (logged, counted, retried: the worker survives), as controller-runtime does with
//! `RecoverPanic`. A key's bookkeeping (its failure count, its timer, its timestamps) is dropped
//! with [`Queue::forget`] or when the key leaves the queue, so nothing accumulates for objects that
//! no longer exist.
//!
//! Both feed controller-runtime's families, with its names and labels:
//!
//! * `controller_runtime_reconcile_total{controller,result}` (`result` is `success` after
//!   [`Next::Wait`], `requeue_after` after [`Next::After`], `error` after a failure or a panic;
//!   the `requeue` series exists at 0, as no reconcile asks for a plain requeue),
//!   `controller_runtime_reconcile_errors_total`, `controller_runtime_reconcile_panics_total`,
//!   `controller_runtime_reconcile_time_seconds`, `controller_runtime_active_workers` and
//!   `controller_runtime_max_concurrent_reconciles`, all created when the controller starts;
//! * `controller_runtime_terminal_reconcile_errors_total` and
//!   `controller_runtime_reconcile_timeouts_total`, created at 0 and never counted: every failure
//!   is retried and no reconcile is cut short by a timeout;
//! * the `workqueue_*` families (`name` and `controller` both the controller's name; `depth` also
//!   `priority="0"`): a keyed controller's [`Queue`] feeds all of them (see [`Queue::instrument`]);
//!   a singleton, which has no queue, feeds `adds_total` (one per pass), `work_duration_seconds`
//!   (each pass), `unfinished_work_seconds` and `longest_running_processor_seconds` (the age of
//!   the pass under way, every 500 ms, 0 between passes) and a `depth` of 0; its
//!   `queue_duration_seconds` and `retries_total` are not exported.

use std::any::Any;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::apis::NodeClaim;
use crate::metrics::{Labels, Metrics};
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

/// How often the `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds` gauges are updated, as controller-runtime does.
const UNFINISHED_WORK_EVERY: Duration = Duration::from_millis(500);

/// The `workqueue_*` series of one queue.
#[derive(Debug)]
struct QueueMetrics {
    metrics: Arc<Metrics>,
    /// `name` and `controller`.
    labels: Labels,
    /// `name`, `controller` and `priority` (always `0`), of `workqueue_depth`.
    depth_labels: Labels,
}

impl QueueMetrics {
    /// The series of the queue `name`, created (counters and histograms empty, gauges at 0) as
    /// client-go creates them with a queue.
    fn new(name: &str, metrics: Arc<Metrics>) -> Self {
        let labels = workqueue_labels(name);
        let mut depth_labels = labels.clone();
        depth_labels.push(("priority", "0".to_string()));
        let wq = &metrics.workqueue;
        let _ = wq.adds.get_or_create(&labels);
        let _ = wq.retries.get_or_create(&labels);
        let _ = wq.queue_duration.get_or_create(&labels);
        let _ = wq.work_duration.get_or_create(&labels);
        wq.depth.get_or_create(&depth_labels).set(0.0);
        wq.unfinished_work_seconds.get_or_create(&labels).set(0.0);
        wq.longest_running_processor_seconds.get_or_create(&labels).set(0.0);
        QueueMetrics { metrics, labels, depth_labels }
    }

    /// A key became ready.
    fn added(&self) {
        self.metrics.workqueue.adds.get_or_create(&self.labels).inc();
    }

    /// A key was added back after a delay.
    fn retried(&self) {
        self.metrics.workqueue.retries.get_or_create(&self.labels).inc();
    }

    /// `ready` keys wait for a worker.
    fn depth(&self, ready: usize) {
        self.metrics.workqueue.depth.get_or_create(&self.depth_labels).set(ready as f64);
    }

    /// A key waited `waited`, ready, before a worker took it.
    fn waited(&self, waited: Duration) {
        self.metrics.workqueue.queue_duration.get_or_create(&self.labels).observe(waited.as_secs_f64());
    }

    /// A worker held a key for `held`.
    fn worked(&self, held: Duration) {
        self.metrics.workqueue.work_duration.get_or_create(&self.labels).observe(held.as_secs_f64());
    }

    /// The keys held now have been held `total` seconds together, the longest `longest`.
    fn unfinished(&self, total: f64, longest: f64) {
        self.metrics.workqueue.unfinished_work_seconds.get_or_create(&self.labels).set(total);
        self.metrics.workqueue.longest_running_processor_seconds.get_or_create(&self.labels).set(longest);
    }
}

/// The `name` and `controller` labels of the `workqueue_*` series of controller `name`.
fn workqueue_labels(name: &str) -> Labels {
    vec![("name", name.to_string()), ("controller", name.to_string())]
}

/// A coalescing work queue of keys, with per-key timers and failure counts.
///
/// * A key added while it waits is not added twice; a key added while a worker holds it is
///   handed out again once that worker is done.
/// * [`Queue::add_after`] keeps the earliest of several timers of a key; an immediate
///   [`Queue::add`] replaces the timer.
/// * Failure counts live here, so the backoff of a key survives between reconciles and
///   [`Queue::forget`] drops everything about a key at once.
/// * Once [instrumented](Queue::instrument), it feeds the `workqueue_*` families.
pub struct Queue<K> {
    inner: Mutex<Inner<K>>,
    notify: Notify,
}

struct Inner<K> {
    ready: VecDeque<K>,
    queued: HashSet<K>,
    /// When each key of `ready` became ready.
    ready_since: HashMap<K, Instant>,
    active: HashSet<K>,
    /// When each key of `active` was handed out.
    active_since: HashMap<K, Instant>,
    again: HashSet<K>,
    timers: BTreeSet<(Instant, u64)>,
    timer_keys: HashMap<u64, K>,
    timer_of: HashMap<K, (Instant, u64)>,
    next_timer: u64,
    failures: HashMap<K, u32>,
    closed: bool,
    metrics: Option<QueueMetrics>,
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
                ready_since: HashMap::new(),
                active: HashSet::new(),
                active_since: HashMap::new(),
                again: HashSet::new(),
                timers: BTreeSet::new(),
                timer_keys: HashMap::new(),
                timer_of: HashMap::new(),
                next_timer: 0,
                failures: HashMap::new(),
                closed: false,
                metrics: None,
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

    /// Puts `key` on the ready list, unless it is there already.
    fn make_ready(&mut self, key: K, now: Instant) {
        if self.queued.insert(key.clone()) {
            self.ready_since.insert(key.clone(), now);
            self.ready.push_back(key);
            if let Some(m) = &self.metrics {
                m.added();
                m.depth(self.ready.len());
            }
        }
    }

    fn push(&mut self, key: K, now: Instant) {
        self.cancel_timer(&key);
        if self.active.contains(&key) {
            self.again.insert(key);
        } else {
            self.make_ready(key, now);
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
                } else {
                    self.make_ready(key, now);
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

    /// Feeds the `workqueue_*` families of `metrics` from now on, labelled `name` and
    /// `controller` (both `name`; `workqueue_depth` also `priority="0"`), as controller-runtime's
    /// queue of controller `name` does, and creates their series:
    ///
    /// * `workqueue_adds_total`: each time a key becomes ready (added, or its timer due), not when
    ///   it was ready already;
    /// * `workqueue_depth`: the keys ready and waiting for a worker;
    /// * `workqueue_queue_duration_seconds`: from a key becoming ready to a worker taking it;
    /// * `workqueue_work_duration_seconds`: from a worker taking a key to [`Queue::done`];
    /// * `workqueue_retries_total`: each add with a delay ([`Queue::add_after`] with a delay,
    ///   and [`Queue::done`] scheduling a requeue or a retry);
    /// * `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds`:
    ///   updated by [`run_keyed`] every 500 ms from the keys held.
    ///
    /// [`run_keyed`] calls it when given metrics; a queue of [`Queue::new`] feeds nothing.
    pub fn instrument(&self, name: &str, metrics: Arc<Metrics>) {
        let queue_metrics = QueueMetrics::new(name, metrics);
        let mut inner = self.lock();
        // Keys added before the controller started (its first list) count as adds too.
        for _ in 0..inner.ready.len() {
            queue_metrics.added();
        }
        queue_metrics.depth(inner.ready.len());
        inner.metrics = Some(queue_metrics);
    }

    /// Sets `workqueue_unfinished_work_seconds` (the seconds the keys held now have been held,
    /// summed) and `workqueue_longest_running_processor_seconds` (the longest of them), 0 when no
    /// key is held; nothing if the queue is not instrumented.
    fn update_unfinished_work(&self) {
        let inner = self.lock();
        let Some(m) = &inner.metrics else { return };
        let now = Instant::now();
        let (mut total, mut longest) = (0.0_f64, 0.0_f64);
        for since in inner.active_since.values() {
            let held = now.saturating_duration_since(*since).as_secs_f64();
            total += held;
            longest = longest.max(held);
        }
        m.unfinished(total, longest);
    }

    /// Asks for `key` to be reconciled now.
    pub fn add(&self, key: K) {
        let mut inner = self.lock();
        if inner.closed {
            return;
        }
        inner.push(key, Instant::now());
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
        if let Some(m) = &inner.metrics {
            m.retried();
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
                let now = Instant::now();
                let deadline = inner.fire_due(now);
                if let Some(key) = inner.ready.pop_front() {
                    inner.queued.remove(&key);
                    let since = inner.ready_since.remove(&key);
                    inner.active.insert(key.clone());
                    inner.active_since.insert(key.clone(), now);
                    if let Some(m) = &inner.metrics {
                        if let Some(since) = since {
                            m.waited(now.saturating_duration_since(since));
                        }
                        m.depth(inner.ready.len());
                    }
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
        let now = Instant::now();
        inner.active.remove(key);
        let held = inner.active_since.remove(key);
        if let (Some(m), Some(since)) = (&inner.metrics, held) {
            m.worked(now.saturating_duration_since(since));
        }
        let (failures, delay) = match outcome {
            Ok(next) => {
                inner.failures.remove(key);
                match next {
                    Next::After(delay) => (0, Some(delay)),
                    Next::Wait => (0, None),
                }
            }
            Err(()) => {
                let n = inner.failures.entry(key.clone()).or_insert(0);
                *n = n.saturating_add(1);
                let n = *n;
                (n, Some(backoff.delay(n)))
            }
        };
        if let Some(delay) = delay {
            if !delay.is_zero()
                && !inner.closed
                && let Some(m) = &inner.metrics
            {
                m.retried();
            }
            inner.schedule(key.clone(), now + delay);
        }
        if inner.again.remove(key) && !inner.closed {
            inner.push(key.clone(), now);
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
        keys.extend(inner.ready_since.keys());
        keys.extend(inner.active.iter());
        keys.extend(inner.active_since.keys());
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

/// The `controller` label of controller `name`.
fn controller_labels(name: &str) -> Labels {
    vec![("controller", name.to_string())]
}

/// Creates the controller-runtime series of controller `name`, which runs `workers` reconciles at
/// once, as controller-runtime does when a controller starts:
/// `controller_runtime_max_concurrent_reconciles` set to `workers`,
/// `controller_runtime_active_workers` to 0, and the four `controller_runtime_reconcile_total`
/// series (`error`, `requeue_after`, `requeue`, `success`),
/// `controller_runtime_reconcile_errors_total`, `controller_runtime_reconcile_panics_total`,
/// `controller_runtime_terminal_reconcile_errors_total` and
/// `controller_runtime_reconcile_timeouts_total` at 0. The last two stay at 0: every failure is
/// retried (none is terminal) and no reconcile is cut short by a timeout.
fn start_metrics(metrics: &Metrics, name: &str, workers: usize) {
    let controller = controller_labels(name);
    metrics.controller_max_concurrent_reconciles.get_or_create(&controller).set(workers as f64);
    metrics.controller_active_workers.get_or_create(&controller).set(0.0);
    for result in ["error", "requeue_after", "requeue", "success"] {
        let _ = metrics
            .controller_reconcile
            .get_or_create(&vec![("controller", name.to_string()), ("result", result.to_string())]);
    }
    for family in [
        &metrics.controller_reconcile_errors,
        &metrics.controller_terminal_reconcile_errors,
        &metrics.controller_reconcile_panics,
        &metrics.controller_reconcile_timeouts,
    ] {
        let _ = family.get_or_create(&controller);
    }
}

/// One reconcile under way, counted in `controller_runtime_active_workers` until dropped.
struct ActiveWorker<'a> {
    metrics: &'a Metrics,
    labels: Labels,
}

impl<'a> ActiveWorker<'a> {
    /// Counts a reconcile of controller `name` starting.
    fn start(metrics: &'a Metrics, name: &str) -> Self {
        let labels = controller_labels(name);
        metrics.controller_active_workers.get_or_create(&labels).inc();
        ActiveWorker { metrics, labels }
    }
}

impl Drop for ActiveWorker<'_> {
    fn drop(&mut self) {
        self.metrics.controller_active_workers.get_or_create(&self.labels).dec();
    }
}

/// A reconcile that panicked, as controller-runtime reports it once recovered.
#[derive(Debug, thiserror::Error)]
#[error("panic: {0} [recovered]")]
struct Panicked(String);

/// The message of a panic's payload.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(message) = payload.downcast_ref::<&'static str>() {
        (*message).to_string()
    } else if let Some(message) = payload.downcast_ref::<String>() {
        message.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Reports that a reconcile of `key` by controller `name` panicked with `payload`: logs it and
/// counts it in `controller_runtime_reconcile_panics_total`. Returns the error the reconcile is
/// then treated as failing with.
fn panicked(
    name: &'static str,
    key: &dyn Display,
    payload: &(dyn Any + Send),
    metrics: Option<&Metrics>,
) -> Panicked {
    let message = panic_message(payload);
    tracing::error!(controller = name, key = %key, panic = %message, "Observed a panic in reconciler");
    if let Some(m) = metrics {
        m.controller_reconcile_panics.get_or_create(&controller_labels(name)).inc();
    }
    Panicked(message)
}

/// Reports the end of one reconcile, which took `took`, in the log and the metrics: a success
/// with what it asked for next, or a failure with its error and when it is retried.
fn report(
    name: &'static str,
    key: &dyn Display,
    took: Duration,
    result: Result<Next, (&(dyn std::error::Error + 'static), Duration)>,
    metrics: Option<&Metrics>,
) {
    let outcome = match result {
        Ok(Next::Wait) => "success",
        Ok(Next::After(_)) => "requeue_after",
        Err((error, retry_in)) => {
            if is_conflict(error) {
                tracing::debug!(controller = name, key = %key, error = %error_chain(error), retry_in = ?retry_in, "conflict, retrying");
            } else {
                tracing::error!(controller = name, key = %key, error = %error_chain(error), retry_in = ?retry_in, "Reconciler error");
            }
            if let Some(m) = metrics {
                m.controller_reconcile_errors.get_or_create(&controller_labels(name)).inc();
            }
            "error"
        }
    };
    if let Some(m) = metrics {
        m.controller_reconcile
            .get_or_create(&vec![("controller", name.to_string()), ("result", outcome.to_string())])
            .inc();
        m.controller_reconcile_time.get_or_create(&controller_labels(name)).observe(took.as_secs_f64());
    }
}

/// Runs a keyed controller: `options.workers` tasks take keys from `queue` and reconcile them
/// until `stop` turns true, when the queue is closed and the reconciles under way finish.
///
/// A reconcile that panics is logged (`Observed a panic in reconciler`), counted in
/// `controller_runtime_reconcile_panics_total` and treated as a failure: its key is retried after
/// the backoff and the worker goes on. With `metrics`, the controller's controller-runtime series
/// are created at start (see the module's documentation), `queue` is
/// [instrumented](Queue::instrument), and its unfinished-work gauges are updated every 500 ms.
pub async fn run_keyed<R: Reconcile>(
    reconciler: Arc<R>,
    queue: Arc<Queue<R::Key>>,
    options: Options,
    metrics: Option<Arc<Metrics>>,
    mut stop: watch::Receiver<bool>,
) {
    tracing::info!(controller = options.name, "starting controller");
    if let Some(m) = &metrics {
        start_metrics(m, options.name, options.workers);
        queue.instrument(options.name, m.clone());
    }
    let workers = (0..options.workers).map(|_| {
        let (reconciler, queue, options, metrics) =
            (reconciler.clone(), queue.clone(), options.clone(), metrics.clone());
        async move {
            while let Some(key) = queue.next().await {
                let started = tokio::time::Instant::now();
                let active = metrics.as_deref().map(|m| ActiveWorker::start(m, options.name));
                // Boxed: a reconcile's future can be large, and a worker is polled deep in others.
                // The reconcile is created inside the guarded future, so that a panic while
                // creating it is caught too.
                let result =
                    Box::pin(AssertUnwindSafe(async { reconciler.reconcile(&key).await }).catch_unwind())
                        .await;
                drop(active);
                let took = started.elapsed();
                match result {
                    Ok(Ok(next)) => {
                        queue.done(&key, Ok(next), &options.backoff);
                        report(options.name, &key, took, Ok(next), metrics.as_deref());
                    }
                    Ok(Err(error)) => {
                        let failures = queue.done(&key, Err(()), &options.backoff);
                        let retry_in = options.backoff.delay(failures);
                        report(options.name, &key, took, Err((&error, retry_in)), metrics.as_deref());
                    }
                    Err(payload) => {
                        let error = panicked(options.name, &key, &*payload, metrics.as_deref());
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
    // controller-runtime's queue updates its unfinished-work gauges every 500 ms.
    let unfinished_work = async {
        if metrics.is_some() {
            let mut every = tokio::time::interval(UNFINISHED_WORK_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                every.tick().await;
                queue.update_unfinished_work();
            }
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = &mut workers => {}
        _ = unfinished_work => {}
        _ = stopped(&mut stop) => {
            queue.close();
            workers.await;
        }
    }
    // Nothing is held any more: the gauges go back to 0.
    queue.update_unfinished_work();
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

/// Wakes at a change its own watches signal on `watched`, or at a change of the cluster-state
/// feed it follows (`fed`), once the burst has settled for `settle`.
pub struct WatchedOrFed {
    /// Notified by the controller's own watches.
    pub watched: std::sync::Arc<tokio::sync::Notify>,
    /// The cluster-state changes followed.
    pub fed: crate::state::Subscription,
    /// How long a burst is let settle.
    pub settle: Duration,
}

impl Wake for WatchedOrFed {
    async fn changed(&mut self) {
        tokio::select! {
            _ = self.watched.notified() => {}
            _ = self.fed.next() => {}
        }
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
///
/// A pass that panics is logged (`Observed a panic in reconciler`), counted in
/// `controller_runtime_reconcile_panics_total` and treated as a failure (retried after the
/// backoff). With `metrics`, the controller's controller-runtime series are created at start
/// (one worker), and the `workqueue_*` series this singleton feeds are those the module's
/// documentation lists: `adds_total` +1 at each pass start, `work_duration_seconds` of each
/// finished pass, `unfinished_work_seconds` and `longest_running_processor_seconds` the age of the
/// pass under way (updated every 500 ms, 0 between passes) and `depth` 0.
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
    let queue_labels = workqueue_labels(options.name);
    if let Some(m) = &metrics {
        start_metrics(m, options.name, 1);
        let wq = &m.workqueue;
        let _ = wq.adds.get_or_create(&queue_labels);
        let _ = wq.work_duration.get_or_create(&queue_labels);
        let mut depth_labels = queue_labels.clone();
        depth_labels.push(("priority", "0".to_string()));
        wq.depth.get_or_create(&depth_labels).set(0.0);
        set_unfinished_work(m, &queue_labels, Duration::ZERO);
    }
    let mut failures: u32 = 0;
    loop {
        if *stop.borrow() {
            break;
        }
        let started = tokio::time::Instant::now();
        if let Some(m) = &metrics {
            m.workqueue.adds.get_or_create(&queue_labels).inc();
        }
        let active = metrics.as_deref().map(|m| ActiveWorker::start(m, options.name));
        // The pass is created inside the guarded future, so that a panic while creating it is
        // caught too.
        let run = AssertUnwindSafe(async { pass().await }).catch_unwind();
        tokio::pin!(run);
        let mut every = tokio::time::interval(UNFINISHED_WORK_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let result = loop {
            tokio::select! {
                r = &mut run => break Some(r),
                _ = every.tick(), if metrics.is_some() => {
                    if let Some(m) = &metrics {
                        set_unfinished_work(m, &queue_labels, started.elapsed());
                    }
                }
                _ = stopped(&mut stop) => break None,
            }
        };
        drop(active);
        let took = started.elapsed();
        if let Some(m) = &metrics {
            set_unfinished_work(m, &queue_labels, Duration::ZERO);
            if result.is_some() {
                m.workqueue.work_duration.get_or_create(&queue_labels).observe(took.as_secs_f64());
            }
        }
        let Some(result) = result else { break };
        let (delay, woken_by_changes) = match result {
            Ok(Ok(next)) => {
                failures = 0;
                report(options.name, &"", took, Ok(next), metrics.as_deref());
                match next {
                    Next::Wait => (None, true),
                    Next::After(d) => (Some(d), true),
                }
            }
            Ok(Err(error)) => {
                failures = failures.saturating_add(1);
                let retry_in = options.backoff.delay(failures);
                report(options.name, &"", took, Err((&error, retry_in)), metrics.as_deref());
                (Some(retry_in), false)
            }
            Err(payload) => {
                let error = panicked(options.name, &"", &*payload, metrics.as_deref());
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

/// Sets a singleton's `workqueue_unfinished_work_seconds` and
/// `workqueue_longest_running_processor_seconds` (labelled `labels`) to the age of its pass under
/// way, `age` (zero between passes).
fn set_unfinished_work(metrics: &Metrics, labels: &Labels, age: Duration) {
    let seconds = age.as_secs_f64();
    metrics.workqueue.unfinished_work_seconds.get_or_create(labels).set(seconds);
    metrics.workqueue.longest_running_processor_seconds.get_or_create(labels).set(seconds);
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

    fn labels(pairs: &[(&'static str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    fn reconciles(m: &Metrics, controller: &str, result: &str) -> u64 {
        m.controller_reconcile.get_or_create(&labels(&[("controller", controller), ("result", result)])).get()
    }

    fn counter(family: &crate::metrics::CounterFamily, l: &Labels) -> u64 {
        family.get_or_create(l).get()
    }

    fn gauge(family: &crate::metrics::GaugeFamily, l: &Labels) -> f64 {
        family.get_or_create(l).get()
    }

    /// The value of `series` (name and labels, as encoded) in `registry`'s text encoding.
    fn sample(registry: &prometheus_client::registry::Registry, series: &str) -> Option<f64> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
    }

    /// Succeeds, requeues or fails by key; `bomb` panics at its first reconcile.
    struct ByKey {
        bombs: AtomicU32,
        calls: Mutex<Vec<String>>,
    }

    impl ByKey {
        fn new() -> Self {
            ByKey { bombs: AtomicU32::new(0), calls: Mutex::new(Vec::new()) }
        }

        fn calls(&self, key: &str) -> usize {
            self.calls.lock().unwrap().iter().filter(|k| k.as_str() == key).count()
        }
    }

    impl Reconcile for ByKey {
        type Key = String;
        type Error = Boom;

        async fn reconcile(&self, key: &String) -> Result<Next, Boom> {
            self.calls.lock().unwrap().push(key.clone());
            match key.as_str() {
                "after" => Ok(Next::After(Duration::from_secs(3600))),
                "fail" => Err(Boom),
                "bomb" if self.bombs.fetch_add(1, Ordering::SeqCst) == 0 => panic!("bomb went off"),
                _ => Ok(Next::Wait),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_keyed_controller_counts_reconciles_by_result() {
        let metrics = Arc::new(Metrics::unregistered());
        let r = Arc::new(ByKey::new());
        let q = Arc::new(Queue::new());
        let (stop_tx, stop) = watch::channel(false);
        for key in ["wait", "after", "fail"] {
            q.add(key.to_string());
        }
        let options = Options::new("test").workers(2);
        let task = tokio::spawn(run_keyed(r.clone(), q.clone(), options, Some(metrics.clone()), stop));
        // Before the failure's 1 s retry.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let m = &*metrics;
        assert_eq!(reconciles(m, "test", "success"), 1);
        assert_eq!(reconciles(m, "test", "requeue_after"), 1);
        assert_eq!(reconciles(m, "test", "error"), 1);
        let controller = labels(&[("controller", "test")]);
        assert_eq!(counter(&m.controller_reconcile_errors, &controller), 1);
        // Created at start, never counted.
        assert!(
            m.controller_reconcile.get(&labels(&[("controller", "test"), ("result", "requeue")])).is_some()
        );
        assert_eq!(reconciles(m, "test", "requeue"), 0);
        for family in [
            &m.controller_reconcile_panics,
            &m.controller_reconcile_timeouts,
            &m.controller_terminal_reconcile_errors,
        ] {
            assert!(family.get(&controller).is_some());
            assert_eq!(counter(family, &controller), 0);
        }
        assert_eq!(gauge(&m.controller_max_concurrent_reconciles, &controller), 2.0);
        assert_eq!(gauge(&m.controller_active_workers, &controller), 0.0);
        let queue = labels(&[("name", "test"), ("controller", "test")]);
        assert_eq!(counter(&m.workqueue.adds, &queue), 3);
        assert_eq!(counter(&m.workqueue.retries, &queue), 2, "the requeue and the retry");
        assert_eq!(
            gauge(
                &m.workqueue.depth,
                &labels(&[("name", "test"), ("controller", "test"), ("priority", "0")])
            ),
            0.0
        );
        stop_tx.send_replace(true);
        task.await.unwrap();
        assert_eq!(gauge(&m.workqueue.unfinished_work_seconds, &queue), 0.0);
        assert_eq!(gauge(&m.workqueue.longest_running_processor_seconds, &queue), 0.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_reconcile_is_counted_and_retried_and_the_worker_goes_on() {
        let metrics = Arc::new(Metrics::unregistered());
        let r = Arc::new(ByKey::new());
        let q = Arc::new(Queue::new());
        let (stop_tx, stop) = watch::channel(false);
        q.add("bomb".to_string());
        q.add("wait".to_string());
        let task =
            tokio::spawn(run_keyed(r.clone(), q.clone(), Options::new("test"), Some(metrics.clone()), stop));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(r.calls("bomb"), 2, "retried after the panic");
        assert_eq!(r.calls("wait"), 1, "the one worker survived the panic");
        assert_eq!(q.failures(&"bomb".to_string()), 0);
        let m = &*metrics;
        let controller = labels(&[("controller", "test")]);
        assert_eq!(counter(&m.controller_reconcile_panics, &controller), 1);
        assert_eq!(counter(&m.controller_reconcile_errors, &controller), 1);
        assert_eq!(reconciles(m, "test", "error"), 1);
        assert_eq!(reconciles(m, "test", "success"), 2);
        assert_eq!(gauge(&m.controller_active_workers, &controller), 0.0);
        assert_eq!(gauge(&m.controller_max_concurrent_reconciles, &controller), 1.0);
        assert!(!task.is_finished());
        stop_tx.send_replace(true);
        task.await.unwrap();
        assert_eq!(q.tracked(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn an_instrumented_queue_counts_adds_retries_depth_and_durations() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry));
        let m = &*metrics;
        let q: Queue<&str> = Queue::new();
        q.instrument("q", metrics.clone());
        let queue = labels(&[("name", "q"), ("controller", "q")]);
        let depth_labels = labels(&[("name", "q"), ("controller", "q"), ("priority", "0")]);
        let adds = || counter(&m.workqueue.adds, &queue);
        let retries = || counter(&m.workqueue.retries, &queue);
        let depth = || gauge(&m.workqueue.depth, &depth_labels);
        assert_eq!((adds(), retries(), depth()), (0, 0, 0.0), "created empty");

        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!((adds(), depth()), (2, 2.0), "a ready key is not added again");
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(depth(), 1.0);
        q.add("a");
        assert_eq!(adds(), 2, "held: ready again only once released");
        q.done(&"a", Ok(Next::Wait), &Backoff::DEFAULT);
        assert_eq!((adds(), depth()), (3, 2.0));
        assert_eq!(q.next().await, Some("b"));
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(depth(), 0.0);

        q.done(&"b", Ok(Next::After(Duration::from_secs(10))), &Backoff::DEFAULT);
        q.done(&"a", Err(()), &Backoff::DEFAULT);
        q.add_after("c", Duration::ZERO);
        q.add_after("d", Duration::from_secs(5));
        assert_eq!(retries(), 3, "the requeue, the retry and the delayed add");
        assert_eq!(adds(), 4, "the immediate add");
        for expected in ["c", "a", "d", "b"] {
            assert_eq!(q.next().await, Some(expected));
            q.done(&expected, Ok(Next::Wait), &Backoff::DEFAULT);
        }
        assert_eq!((adds(), retries(), depth()), (7, 3, 0.0), "each due timer is an add");
        assert_eq!(q.tracked(), 0, "no timestamps left behind");
        let handed_out =
            sample(&registry, "workqueue_queue_duration_seconds_count{name=\"q\",controller=\"q\"}");
        assert_eq!(handed_out, Some(7.0));
        let worked = sample(&registry, "workqueue_work_duration_seconds_count{name=\"q\",controller=\"q\"}");
        assert_eq!(worked, Some(7.0));
    }

    #[tokio::test(start_paused = true)]
    async fn the_unfinished_work_is_the_age_of_the_keys_held() {
        let metrics = Arc::new(Metrics::unregistered());
        let q: Queue<&str> = Queue::new();
        q.instrument("q", metrics.clone());
        let queue = labels(&[("name", "q"), ("controller", "q")]);
        let read = || {
            (
                gauge(&metrics.workqueue.unfinished_work_seconds, &queue),
                gauge(&metrics.workqueue.longest_running_processor_seconds, &queue),
            )
        };
        q.add("a");
        q.add("b");
        assert_eq!(q.next().await, Some("a"));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(q.next().await, Some("b"));
        tokio::time::advance(Duration::from_secs(1)).await;
        q.update_unfinished_work();
        assert_eq!(read(), (6.0, 5.0));
        q.done(&"a", Ok(Next::Wait), &Backoff::DEFAULT);
        q.done(&"b", Ok(Next::Wait), &Backoff::DEFAULT);
        q.update_unfinished_work();
        assert_eq!(read(), (0.0, 0.0));
    }

    #[tokio::test]
    async fn an_uninstrumented_queue_keeps_no_timestamps_behind() {
        let q: Queue<&str> = Queue::new();
        q.add("a");
        q.add("b");
        assert_eq!(q.next().await, Some("a"));
        q.update_unfinished_work();
        q.done(&"a", Ok(Next::Wait), &Backoff::DEFAULT);
        assert_eq!(q.tracked(), 1, "b waits");
        q.forget(&"b");
        assert_eq!(q.next().await, Some("b"), "a waiting reconcile still runs");
        q.done(&"b", Ok(Next::Wait), &Backoff::DEFAULT);
        assert_eq!(q.tracked(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_singleton_counts_passes_survives_a_panic_and_feeds_its_queue_series() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry));
        let calls = Arc::new(AtomicU32::new(0));
        let (_tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop_tx, stop) = watch::channel(false);
        let c = calls.clone();
        let task = tokio::spawn(run_singleton(
            Options::new("single"),
            Some(metrics.clone()),
            Manual(rx),
            stop,
            move || {
                let c = c.clone();
                async move {
                    if c.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("first pass blew up");
                    }
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Ok::<_, Boom>(Next::After(Duration::from_secs(60)))
                }
            },
        ));
        // The panic at start, then the retry 1 s later, under way for 1 s of its 2.
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let m = &*metrics;
        let controller = labels(&[("controller", "single")]);
        let queue = labels(&[("name", "single"), ("controller", "single")]);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(gauge(&m.controller_active_workers, &controller), 1.0, "the retry is under way");
        let unfinished = gauge(&m.workqueue.unfinished_work_seconds, &queue);
        assert!((0.5..=1.1).contains(&unfinished), "{unfinished}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(counter(&m.controller_reconcile_panics, &controller), 1);
        assert_eq!(reconciles(m, "single", "error"), 1);
        assert_eq!(reconciles(m, "single", "requeue_after"), 1);
        assert_eq!(reconciles(m, "single", "success"), 0);
        assert_eq!(gauge(&m.controller_max_concurrent_reconciles, &controller), 1.0);
        assert_eq!(gauge(&m.controller_active_workers, &controller), 0.0);
        assert_eq!(counter(&m.workqueue.adds, &queue), 2, "one per pass");
        assert_eq!(gauge(&m.workqueue.unfinished_work_seconds, &queue), 0.0);
        assert_eq!(gauge(&m.workqueue.longest_running_processor_seconds, &queue), 0.0);
        assert_eq!(
            gauge(
                &m.workqueue.depth,
                &labels(&[("name", "single"), ("controller", "single"), ("priority", "0")])
            ),
            0.0
        );
        let passes =
            sample(&registry, "workqueue_work_duration_seconds_count{name=\"single\",controller=\"single\"}");
        assert_eq!(passes, Some(2.0));
        stop_tx.send_replace(true);
        task.await.unwrap();
    }
}
