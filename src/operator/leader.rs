//! Leader election on a `coordination.k8s.io/v1` Lease, with the timing of Kubernetes'
//! controllers (lease 15 s, renew deadline 10 s, retry 2 s): only the holder of the Lease acts.
//!
//! Expiry is judged the way client-go judges it: by how long this process has watched the
//! Lease's record stay unchanged, on its own monotonic clock, so clock skew between replicas
//! cannot hand the Lease to two holders.
//!
//! The elector talks to the API server on a client of its own, outside the request throttle and
//! the in-flight limit of the controllers' client, so that a burst of evictions or events never
//! delays a renewal; every call is bounded by [`Timing::call_timeout`]. A leader that has not
//! renewed for the renew deadline steps down at that very moment, even while a call hangs, which
//! is before the Lease can expire for the other replicas (renew deadline < lease duration).
//!
//! With metrics ([`LeaderElector::with_metrics`]), `leader_election_master_status{name}` shows
//! whether this replica holds the Lease: 0 from the start of the election, 1 while leading.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::util::api::is_conflict;
use crate::util::error_chain;

/// Default name of the Lease (`LEADER_ELECTION_NAME`), as upstream Karpenter names it.
pub const LEASE_NAME: &str = "karpenter-leader-election";

/// Timing of the election.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// How long a Lease stays valid after its last renewal.
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// Pause between attempts.
    pub retry_period: Duration,
}

impl Timing {
    /// The longest one call to the API server may take: half of what is left of the renew
    /// deadline after a retry period, so that at least two attempts fit in it.
    pub fn call_timeout(&self) -> Duration {
        (self.renew_deadline.saturating_sub(self.retry_period) / 2).max(Duration::from_millis(100))
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// Errors talking to the API server about the Lease.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// A read or write of the Lease failed for a reason other than a lost race.
    #[error("lease {namespace}/{name}: {action} failed")]
    Api {
        /// Namespace of the Lease.
        namespace: String,
        /// Name of the Lease.
        name: String,
        /// What was attempted.
        action: &'static str,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

/// Campaigns for, holds and releases one Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timing: Timing,
    observed: Option<(Option<String>, Option<MicroTime>)>,
    observed_at: Instant,
    /// `leader_election_master_status{name}` of this Lease, when metrics are kept.
    status: Option<Gauge<f64, AtomicU64>>,
}

impl LeaderElector {
    /// An elector for `namespace/name` under `identity` (unique per process, e.g. the pod name),
    /// with a client of its own for the API server of `config`.
    pub fn new(
        config: &kube::Config,
        namespace: &str,
        name: &str,
        identity: &str,
        timing: Timing,
    ) -> Result<Self, kube::Error> {
        let mut config = config.clone();
        let call = timing.call_timeout();
        config.connect_timeout = Some(call);
        config.read_timeout = Some(call);
        config.write_timeout = Some(call);
        let client = Client::try_from(config)?;
        Ok(LeaderElector {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
            identity: identity.to_string(),
            timing,
            observed: None,
            observed_at: Instant::now(),
            status: None,
        })
    }

    /// This elector, reporting in `metrics` whether it leads: `leader_election_master_status`
    /// with the Lease's name, 0 from the start of [`LeaderElector::run`], 1 while it holds the
    /// Lease.
    pub fn with_metrics(mut self, metrics: &Metrics) -> Self {
        let labels = vec![("name", self.name.clone())];
        self.status = Some(metrics.leader_election_master_status.get_or_create_owned(&labels));
        self
    }

    /// Publishes whether this replica leads, on `leading` and in the status gauge.
    fn publish(&self, leading: &watch::Sender<bool>, is_leading: bool) {
        leading.send_replace(is_leading);
        if let Some(status) = &self.status {
            status.set(if is_leading { 1.0 } else { 0.0 });
        }
    }

    /// This elector's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Runs the election until `stop` turns true: publishes leadership on `leading`, renews
    /// while leading, steps down when renewal fails past the deadline, and releases the Lease on
    /// stop so that a standby takes over at once.
    pub async fn run(mut self, leading: watch::Sender<bool>, mut stop: watch::Receiver<bool>) {
        if let Some(status) = &self.status {
            status.set(0.0);
        }
        let mut last_renewal = Instant::now();
        loop {
            if *stop.borrow() {
                break;
            }
            let is_leading = *leading.borrow();
            let deadline = last_renewal + self.timing.renew_deadline;
            let timeout = self.timing.call_timeout().saturating_mul(2);
            let attempt = tokio::select! {
                // Both calls of an attempt are bounded, and so is the attempt.
                a = tokio::time::timeout(timeout, self.try_acquire_or_renew()) => Some(a),
                // A leader must not outlive its renew deadline, whatever the attempt does.
                _ = tokio::time::sleep_until(deadline), if is_leading => None,
            };
            let now = Instant::now();
            match attempt {
                None => {
                    tracing::error!(lease = %self.name, identity = %self.identity, "failed to renew lease within the deadline, stepping down");
                    self.publish(&leading, false);
                    break;
                }
                Some(Ok(Ok(true))) => {
                    last_renewal = now;
                    if !is_leading {
                        tracing::info!(lease = %self.name, identity = %self.identity, "successfully acquired lease");
                        self.publish(&leading, true);
                    }
                }
                Some(Ok(Ok(false))) => {
                    if is_leading {
                        tracing::error!(lease = %self.name, identity = %self.identity, "leader election lost");
                        self.publish(&leading, false);
                        break;
                    }
                }
                Some(Ok(Err(error))) => {
                    tracing::warn!(error = %error_chain(&error), "error retrieving or updating the lease");
                }
                Some(Err(_)) => {
                    tracing::warn!(lease = %self.name, timeout = ?timeout, "retrieving or updating the lease timed out");
                }
            }
            if *leading.borrow() && now.duration_since(last_renewal) > self.timing.renew_deadline {
                tracing::error!(lease = %self.name, identity = %self.identity, "failed to renew lease within the deadline, stepping down");
                self.publish(&leading, false);
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.timing.retry_period) => {}
                _ = stop.changed() => {}
            }
        }
        if *leading.borrow() {
            self.publish(&leading, false);
            match tokio::time::timeout(self.timing.call_timeout().saturating_mul(2), self.release()).await {
                Ok(Ok(())) => tracing::info!(lease = %self.name, identity = %self.identity, "released lease"),
                Ok(Err(error)) => tracing::warn!(error = %error_chain(&error), "failed to release lease"),
                Err(_) => tracing::warn!(lease = %self.name, "releasing the lease timed out"),
            }
        }
    }

    /// One round: creates the Lease if missing, renews it if held, takes it over if expired.
    /// Returns whether this elector holds the Lease afterwards.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, LeaderError> {
        let now = MicroTime(Timestamp::now());
        let current = self.api.get_opt(&self.name).await.map_err(|source| self.error("get", source))?;
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..ObjectMeta::default() },
                spec: Some(self.held_spec(now.clone(), now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if is_conflict(&e) => Ok(false),
                Err(source) => Err(self.error("create", source)),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let record = (spec.holder_identity.clone(), spec.renew_time.clone());
        if self.observed.as_ref() != Some(&record) {
            self.observed = Some(record);
            self.observed_at = Instant::now();
        }
        let holder = spec.holder_identity.as_deref().filter(|h| !h.is_empty());
        let held_by_me = holder == Some(self.identity.as_str());
        let lease_duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.timing.lease_duration, Duration::from_secs);
        let expired = holder.is_none() || self.observed_at.elapsed() > lease_duration;
        if !held_by_me && !expired {
            return Ok(false);
        }
        let (acquire_time, transitions) = if held_by_me {
            (spec.acquire_time.unwrap_or_else(|| now.clone()), spec.lease_transitions.unwrap_or(0))
        } else {
            (now.clone(), spec.lease_transitions.unwrap_or(0) + 1)
        };
        lease.spec = Some(self.held_spec(acquire_time, now, transitions));
        // The resourceVersion in `lease` makes this a compare-and-swap: of two replicas racing
        // for an expired Lease, one gets a conflict.
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(updated) => {
                let spec = updated.spec.unwrap_or_default();
                self.observed = Some((spec.holder_identity, spec.renew_time));
                self.observed_at = Instant::now();
                Ok(true)
            }
            Err(e) if is_conflict(&e) => Ok(false),
            Err(source) => Err(self.error("update", source)),
        }
    }

    /// Gives the Lease up: no holder and a one-second duration, so a standby acquires it on its
    /// next attempt.
    pub async fn release(&mut self) -> Result<(), LeaderError> {
        let Some(mut lease) =
            self.api.get_opt(&self.name).await.map_err(|source| self.error("get", source))?
        else {
            return Ok(());
        };
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        lease.spec = Some(spec);
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) => Ok(()),
            Err(source) => Err(self.error("release", source)),
        }
    }

    fn held_spec(&self, acquire_time: MicroTime, renew_time: MicroTime, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: i32::try_from(self.timing.lease_duration.as_secs()).ok(),
            acquire_time: Some(acquire_time),
            renew_time: Some(renew_time),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn error(&self, action: &'static str, source: kube::Error) -> LeaderError {
        LeaderError::Api { namespace: self.namespace.clone(), name: self.name.clone(), action, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An elector whose API server nobody answers.
    fn elector() -> LeaderElector {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        LeaderElector::new(&config, "kube-system", LEASE_NAME, "me", Timing::default()).unwrap()
    }

    #[tokio::test]
    async fn the_master_status_follows_leadership() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Metrics::new(&mut registry);
        let labels = vec![("name", LEASE_NAME.to_string())];
        let status = || metrics.leader_election_master_status.get(&labels).map(|g| g.get());
        let (leading, _) = watch::channel(false);
        // Without metrics, no series.
        elector().publish(&leading, true);
        assert_eq!(status(), None);

        let elector = elector().with_metrics(&metrics);
        assert_eq!(status(), Some(0.0));
        elector.publish(&leading, true);
        assert!(*leading.borrow());
        assert_eq!(status(), Some(1.0));
        elector.publish(&leading, false);
        assert!(!*leading.borrow());
        assert_eq!(status(), Some(0.0));

        // A run starts from 0; stopped at once, it returns without touching the Lease.
        elector.publish(&leading, true);
        let (run_leading, _) = watch::channel(false);
        let (_stop_tx, stop) = watch::channel(true);
        tokio::time::timeout(Duration::from_secs(5), elector.run(run_leading, stop)).await.unwrap();
        assert_eq!(status(), Some(0.0));
    }
}
