//! Upstream's pod metrics (its `metrics.pod` controller): how long pods wait to be bound and to
//! start, from their creation and from the first place the provisioner found them.
//!
//! Every change of a pod, and every [`PERIOD`] for the pods still waiting:
//! - a pending pod has `karpenter_pods_unstarted_time_seconds` and, while not bound,
//!   `karpenter_pods_unbound_time_seconds` (seconds since its creation), and, once the
//!   provisioner found it a place, the `karpenter_pods_provisioning_unstarted_time_seconds` /
//!   `_unbound_time_seconds` variants (seconds since that place); while the provisioner has seen
//!   it but decided nothing, `karpenter_pods_provisioning_scheduling_undecided_time_seconds`;
//! - a pod seen pending that leaves Pending is observed once: `karpenter_pods_bound_duration_seconds`
//!   (creation to its PodScheduled condition) and `karpenter_pods_startup_duration_seconds`
//!   (creation to its Ready condition, a summary), with the `_provisioning_` histograms measured
//!   from the first place; its gauges go.
//!
//! As upstream's, only pods this process saw pending are observed (a new leader starts afresh),
//! and a pod that finishes without being Ready is not.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::apis::pod::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use tokio::sync::watch;

use crate::controllers::Context;
use crate::controllers::kit::{Next, Options, Timer, run_singleton};
use crate::metrics::{GaugeFamily, Labels, Metrics};
use crate::state::podtimes::{PodTimes, Times};
use crate::state::{ClusterState, Notice, pods};

/// Name of the controller, in logs and metrics.
pub const CONTROLLER: &str = "metrics.pod";
/// How often the waiting pods' gauges are brought up to date (upstream requeues each pod
/// every 30 s).
const PERIOD: Duration = Duration::from_secs(30);

/// The pods seen pending and not observed yet.
#[derive(Debug, Default)]
pub struct Tracker {
    /// Not started yet (upstream's `pendingPods`).
    unstarted: HashSet<String>,
    /// Not bound yet (upstream's `unscheduledPods`).
    unbound: HashSet<String>,
}

fn condition(pod: &Pod, type_: &str) -> Option<(bool, Option<Timestamp>)> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == type_)?;
    Some((c.status == "True", c.last_transition_time.as_ref().map(|t| t.0)))
}

fn seconds(d: SignedDuration) -> f64 {
    d.as_secs_f64().max(0.0)
}

/// Sets the series `labels` of `family` to the seconds from `since` to `now`, or removes it
/// without `since`.
fn set_since(family: &GaugeFamily, labels: &Labels, since: Option<Timestamp>, now: Timestamp) {
    match since {
        Some(since) => {
            family.get_or_create(labels).set(seconds(now.duration_since(since)));
        }
        None => {
            family.remove(labels);
        }
    }
}

impl Tracker {
    /// Whether no pod waits to be observed.
    pub fn is_empty(&self) -> bool {
        self.unstarted.is_empty() && self.unbound.is_empty()
    }

    /// Whether `pod` needs looking at on a periodic pass: pending, or seen pending.
    fn follows(&self, key: &str, pod: &Pod) -> bool {
        is_pending(pod) || self.unstarted.contains(key) || self.unbound.contains(key)
    }

    /// Brings `pod`'s metrics up to date at `now`, with the provisioner's `times`.
    pub fn update(&mut self, metrics: &Metrics, times: &PodTimes, pod: &Pod, now: Timestamp) {
        let key = pods::key(pod);
        let labels = series(pod);
        let t = times.get(&key);
        let scheduled = condition(pod, "PodScheduled");
        let scheduled_true = scheduled.is_some_and(|(s, _)| s);
        // Undecided: seen by the provisioner, no decision yet.
        let undecided = &metrics.pods_provisioning_scheduling_undecided_time;
        if t.decided.is_some() || scheduled_true {
            undecided.remove(&labels);
        } else if t.acked.is_some() {
            set_since(undecided, &labels, t.acked, now);
        }
        let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
        self.update_startup(metrics, times, pod, &key, &labels, t, created, now);
        self.update_bound(metrics, pod, &key, &labels, t, created, scheduled, now);
    }

    #[allow(clippy::too_many_arguments)]
    fn update_startup(
        &mut self,
        metrics: &Metrics,
        times: &PodTimes,
        pod: &Pod,
        key: &str,
        labels: &Labels,
        t: Times,
        created: Option<Timestamp>,
        now: Timestamp,
    ) {
        let waiting = |metrics: &Metrics| {
            set_since(&metrics.pods_unstarted_time, labels, created, now);
            set_since(&metrics.pods_provisioning_unstarted_time, labels, t.placed, now);
        };
        if is_pending(pod) {
            waiting(metrics);
            self.unstarted.insert(key.to_string());
            return;
        }
        if !self.unstarted.contains(key) {
            return;
        }
        let ready = condition(pod, "Ready");
        if let Some((true, Some(ready_at))) = ready {
            if let Some(created) = created {
                metrics.pods_startup_duration.observe(&vec![], seconds(ready_at.duration_since(created)));
            }
            if let Some(placed) = t.placed {
                metrics
                    .pods_provisioning_startup_duration
                    .get_or_create(&vec![])
                    .observe(seconds(ready_at.duration_since(placed)));
            }
        } else if !pods::is_terminal(pod) {
            waiting(metrics);
            return;
        }
        metrics.pods_unstarted_time.remove(labels);
        metrics.pods_provisioning_unstarted_time.remove(labels);
        self.unstarted.remove(key);
        times.forget(key);
    }

    #[allow(clippy::too_many_arguments)]
    fn update_bound(
        &mut self,
        metrics: &Metrics,
        pod: &Pod,
        key: &str,
        labels: &Labels,
        t: Times,
        created: Option<Timestamp>,
        scheduled: Option<(bool, Option<Timestamp>)>,
        now: Timestamp,
    ) {
        let scheduled_at = match scheduled {
            Some((true, at)) => Some(at),
            _ => None,
        };
        if is_pending(pod) {
            if scheduled_at.is_none() {
                set_since(&metrics.pods_unbound_time, labels, created, now);
                set_since(&metrics.pods_provisioning_unbound_time, labels, t.placed, now);
            }
            self.unbound.insert(key.to_string());
            return;
        }
        let Some(at) = scheduled_at else { return };
        if !self.unbound.remove(key) {
            return;
        }
        if let (Some(bound), Some(created)) = (at, created) {
            metrics
                .pods_bound_duration
                .get_or_create(&vec![])
                .observe(seconds(bound.duration_since(created)));
        }
        if let (Some(bound), Some(placed)) = (at, t.placed) {
            metrics
                .pods_provisioning_bound_duration
                .get_or_create(&vec![])
                .observe(seconds(bound.duration_since(placed)));
        }
        metrics.pods_unbound_time.remove(labels);
        metrics.pods_provisioning_unbound_time.remove(labels);
    }

    /// Forgets the pod `namespace/name` (deleted): its gauges and times go.
    pub fn forget(&mut self, metrics: &Metrics, times: &PodTimes, namespace: &str, name: &str) {
        let key = format!("{namespace}/{name}");
        let labels: Labels = vec![("name", name.to_string()), ("namespace", namespace.to_string())];
        for family in [
            &metrics.pods_unstarted_time,
            &metrics.pods_provisioning_unstarted_time,
            &metrics.pods_unbound_time,
            &metrics.pods_provisioning_unbound_time,
            &metrics.pods_provisioning_scheduling_undecided_time,
        ] {
            family.remove(&labels);
        }
        self.unstarted.remove(&key);
        self.unbound.remove(&key);
        times.forget(&key);
    }
}

fn is_pending(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
}

/// The labels of a pod's gauges.
fn series(pod: &Pod) -> Labels {
    vec![
        ("name", pod.metadata.name.clone().unwrap_or_default()),
        ("namespace", pod.metadata.namespace.clone().unwrap_or_default()),
    ]
}

/// Runs until `stop` turns true: every pod change updates its metrics at once, and every
/// [`PERIOD`] the pods still waiting are brought up to date.
pub async fn run(ctx: Context, state: ClusterState, stop: watch::Receiver<bool>) {
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let _watch = {
        let (tracker, metrics, times) = (tracker.clone(), ctx.metrics.clone(), state.pod_times.clone());
        state.on_pod(move |notice| {
            let mut tracker = tracker.lock().unwrap_or_else(PoisonError::into_inner);
            match notice {
                Notice::Applied(pod) => tracker.update(&metrics, &times, pod, Timestamp::now()),
                Notice::Deleted(pod) => tracker.forget(
                    &metrics,
                    &times,
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default(),
                ),
                Notice::Gone { namespace, name } => {
                    tracker.forget(&metrics, &times, namespace.unwrap_or_default(), name)
                }
            }
        })
    };
    let pass = || {
        let (tracker, metrics, state) = (tracker.clone(), ctx.metrics.clone(), state.clone());
        async move {
            let now = Timestamp::now();
            let all = state.pods.state();
            let mut tracker = tracker.lock().unwrap_or_else(PoisonError::into_inner);
            for pod in &all {
                if tracker.follows(&pods::key(pod), pod) {
                    tracker.update(&metrics, &state.pod_times, pod, now);
                }
            }
            Ok::<_, std::convert::Infallible>(Next::After(PERIOD))
        }
    };
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), Timer, stop, pass).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::pod::PodStatus;
    use k8s_openapi::api::core::v1::PodCondition;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn pod(phase: &str, conditions: &[(&str, &str, i64)]) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("web".into());
        p.metadata.namespace = Some("shop".into());
        p.metadata.creation_timestamp = Some(Time(at(0)));
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            conditions: Some(
                conditions
                    .iter()
                    .map(|(t, s, when)| PodCondition {
                        type_: t.to_string(),
                        status: s.to_string(),
                        last_transition_time: Some(Time(at(*when))),
                        ..PodCondition::default()
                    })
                    .collect(),
            ),
            ..PodStatus::default()
        });
        p
    }

    fn gauge(family: &crate::metrics::GaugeFamily) -> Option<f64> {
        let labels: Labels = vec![("name", "web".into()), ("namespace", "shop".into())];
        family.get(&labels).map(|g| g.get())
    }

    fn histogram_count(family: &crate::metrics::HistogramFamily) -> (f64, u64) {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("h", "", family.clone());
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let value = |suffix: &str| {
            text.lines()
                .find(|l| l.starts_with(&format!("h_{suffix}")))
                .and_then(|l| l.rsplit(' ').next())
                .map(|v| v.parse::<f64>().unwrap())
        };
        (value("sum").unwrap_or(0.0), value("count").unwrap_or(0.0) as u64)
    }

    #[test]
    fn a_pod_provisioned_then_started_is_observed_once() {
        let metrics = Metrics::unregistered();
        let times = PodTimes::default();
        let mut tracker = Tracker::default();
        times.ack("shop/web", at(1));
        let pending = pod("Pending", &[("PodScheduled", "False", 1)]);
        tracker.update(&metrics, &times, &pending, at(3));
        assert_eq!(gauge(&metrics.pods_provisioning_scheduling_undecided_time), Some(2.0));
        assert_eq!(gauge(&metrics.pods_unbound_time), Some(3.0));
        assert_eq!(gauge(&metrics.pods_provisioning_unbound_time), None, "no place found yet");
        times.decided("shop/web", true, at(4));
        tracker.update(&metrics, &times, &pending, at(10));
        assert_eq!(gauge(&metrics.pods_provisioning_scheduling_undecided_time), None);
        assert_eq!(gauge(&metrics.pods_provisioning_unbound_time), Some(6.0));
        assert_eq!(gauge(&metrics.pods_unstarted_time), Some(10.0));
        // Bound at 40 s, Running at 50, Ready at 55.
        let bound = pod("Pending", &[("PodScheduled", "True", 40)]);
        tracker.update(&metrics, &times, &bound, at(45));
        assert_eq!(histogram_count(&metrics.pods_bound_duration).1, 0, "observed when it leaves Pending");
        let running = pod("Running", &[("PodScheduled", "True", 40), ("Ready", "False", 50)]);
        tracker.update(&metrics, &times, &running, at(50));
        assert_eq!(histogram_count(&metrics.pods_bound_duration), (40.0, 1));
        assert_eq!(histogram_count(&metrics.pods_provisioning_bound_duration), (36.0, 1));
        assert_eq!(gauge(&metrics.pods_unbound_time), None);
        assert_eq!(gauge(&metrics.pods_unstarted_time), Some(50.0), "running, not Ready");
        let ready = pod("Running", &[("PodScheduled", "True", 40), ("Ready", "True", 55)]);
        tracker.update(&metrics, &times, &ready, at(56));
        tracker.update(&metrics, &times, &ready, at(60));
        assert_eq!(histogram_count(&metrics.pods_provisioning_startup_duration), (51.0, 1));
        assert_eq!(histogram_count(&metrics.pods_bound_duration).1, 1, "once");
        assert_eq!(gauge(&metrics.pods_unstarted_time), None);
        assert!(tracker.is_empty());
        assert!(times.is_empty(), "the times go once the pod is Ready");
        let mut text = String::new();
        crate::metrics::summary::encode(
            &prometheus_client::registry::Registry::default(),
            &metrics.summaries,
            &mut text,
        )
        .unwrap();
        assert!(text.contains("karpenter_pods_startup_duration_seconds{quantile=\"0.5\"} 55\n"), "{text}");
        assert!(text.contains("karpenter_pods_startup_duration_seconds_count 1\n"), "{text}");
    }

    #[test]
    fn pods_never_seen_pending_are_not_observed_and_deleted_pods_go() {
        let metrics = Metrics::unregistered();
        let times = PodTimes::default();
        let mut tracker = Tracker::default();
        let ready = pod("Running", &[("PodScheduled", "True", 1), ("Ready", "True", 2)]);
        tracker.update(&metrics, &times, &ready, at(5));
        assert_eq!(histogram_count(&metrics.pods_bound_duration).1, 0);
        let pending = pod("Pending", &[("PodScheduled", "False", 1)]);
        times.ack("shop/web", at(1));
        tracker.update(&metrics, &times, &pending, at(5));
        assert_eq!(gauge(&metrics.pods_unbound_time), Some(5.0));
        tracker.forget(&metrics, &times, "shop", "web");
        assert_eq!(gauge(&metrics.pods_unbound_time), None);
        assert_eq!(gauge(&metrics.pods_provisioning_scheduling_undecided_time), None);
        assert!(tracker.is_empty() && times.is_empty());
        // A pod that fails without being Ready loses its gauges, unobserved.
        tracker.update(&metrics, &times, &pending, at(5));
        let failed = pod("Failed", &[("PodScheduled", "True", 3)]);
        tracker.update(&metrics, &times, &failed, at(9));
        assert_eq!(gauge(&metrics.pods_unstarted_time), None);
        assert_eq!(histogram_count(&metrics.pods_bound_duration).1, 1, "it was bound");
    }
}
