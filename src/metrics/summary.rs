//! Prometheus summaries, which `prometheus-client` does not have: upstream exports two of its
//! duration families as summaries (`karpenter_pods_startup_duration_seconds`,
//! `karpenter_nodes_termination_duration_seconds`), and its performance dashboard reads their
//! `quantile` series.
//!
//! Like client_golang's summaries with upstream's settings, each series reports the quantiles 0,
//! 0.5, 0.9, 0.99 and 1 of the observations of the last ten minutes, and a `_sum` and `_count` of
//! all observations. The quantiles here are exact over the window (client_golang's are estimates
//! within 1 %); a window keeps at most [`MAX_SAMPLES`] observations, the newest.
//!
//! Summaries are registered with the other metrics through the registrar of [`super::Metrics`]
//! and written after them by [`encode`].

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;

use super::Labels;

/// The quantiles of every summary, as upstream's `SummaryObjectives`.
pub const QUANTILES: [f64; 5] = [0.0, 0.5, 0.9, 0.99, 1.0];
/// How long an observation counts towards the quantiles (client_golang's default `MaxAge`).
pub const MAX_AGE: Duration = Duration::from_secs(600);
/// Observations kept per series at most; older ones leave the window early.
pub const MAX_SAMPLES: usize = 10_000;

#[derive(Debug, Default)]
struct Series {
    window: VecDeque<(Instant, f64)>,
    sum: f64,
    count: u64,
}

impl Series {
    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.window.front() {
            if now.saturating_duration_since(*at) > MAX_AGE || self.window.len() > MAX_SAMPLES {
                self.window.pop_front();
            } else {
                break;
            }
        }
    }

    fn quantiles(&self) -> Vec<(f64, f64)> {
        let mut values: Vec<f64> = self.window.iter().map(|(_, v)| *v).collect();
        values.sort_by(f64::total_cmp);
        QUANTILES.iter().map(|q| (*q, quantile(&values, *q))).collect()
    }
}

/// The `q` quantile of `sorted` (ascending): the smallest value with at least `q` of the values
/// at or below it; NaN without values, as client_golang reports an empty window.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

/// A summary family: one series per label set.
#[derive(Debug, Default)]
pub struct SummaryFamily {
    series: Mutex<BTreeMap<Labels, Series>>,
}

impl SummaryFamily {
    /// Records `value` in the series of `labels`.
    pub fn observe(&self, labels: &Labels, value: f64) {
        self.observe_at(labels, value, Instant::now());
    }

    fn observe_at(&self, labels: &Labels, value: f64, now: Instant) {
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let s = series.entry(labels.clone()).or_default();
        s.window.push_back((now, value));
        s.sum += value;
        s.count += 1;
        s.expire(now);
    }

    /// Writes the family in the OpenMetrics text format.
    fn encode<W: Write>(&self, name: &str, help: &str, out: &mut W, now: Instant) -> std::fmt::Result {
        writeln!(out, "# HELP {name} {help}")?;
        writeln!(out, "# TYPE {name} summary")?;
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        for (labels, s) in series.iter_mut() {
            s.expire(now);
            for (q, v) in s.quantiles() {
                let mut with_q = labels.clone();
                with_q.push(("quantile", format_float(q)));
                writeln!(out, "{name}{} {}", label_text(&with_q), format_float(v))?;
            }
            writeln!(out, "{name}_sum{} {}", label_text(labels), format_float(s.sum))?;
            writeln!(out, "{name}_count{} {}", label_text(labels), s.count)?;
        }
        Ok(())
    }
}

/// A float as Prometheus prints it: `0.5`, `1`, `NaN`, `+Inf`.
fn format_float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// `{a="x",b="y"}`, or nothing without labels; values escaped as the text format wants.
fn label_text(labels: &Labels) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect();
    format!("{{{}}}", pairs.join(","))
}

/// The registered summary families, in registration order.
#[derive(Debug, Default)]
pub struct Summaries {
    families: Vec<(String, String, Arc<SummaryFamily>)>,
}

impl Summaries {
    /// Registers a new family under `name` with `help` and returns it.
    pub fn add(&mut self, name: &str, help: &str) -> Arc<SummaryFamily> {
        let family = Arc::new(SummaryFamily::default());
        self.families.push((name.to_string(), help.to_string(), family.clone()));
        family
    }
}

/// `/metrics`: `registry` in the OpenMetrics text format, then `summaries`, then `# EOF`.
pub fn encode<W: Write>(registry: &Registry, summaries: &Summaries, out: &mut W) -> std::fmt::Result {
    prometheus_client::encoding::text::encode_registry(out, registry)?;
    let now = Instant::now();
    for (name, help, family) in &summaries.families {
        family.encode(name, help, out, now)?;
    }
    prometheus_client::encoding::text::encode_eof(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_a_window() {
        let sorted: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&sorted, 0.0), 1.0);
        assert_eq!(quantile(&sorted, 0.5), 50.0);
        assert_eq!(quantile(&sorted, 0.9), 90.0);
        assert_eq!(quantile(&sorted, 0.99), 99.0);
        assert_eq!(quantile(&sorted, 1.0), 100.0);
        assert_eq!(quantile(&[7.0], 0.5), 7.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn old_observations_leave_the_quantiles_but_not_the_sum() {
        let family = SummaryFamily::default();
        let labels: Labels = vec![("nodepool", "default".to_string())];
        let start = Instant::now();
        family.observe_at(&labels, 100.0, start);
        let later = start + MAX_AGE + Duration::from_secs(1);
        family.observe_at(&labels, 2.0, later);
        let mut out = String::new();
        family.encode("x_seconds", "X.", &mut out, later).unwrap();
        assert!(out.contains("# TYPE x_seconds summary\n"), "{out}");
        assert!(out.contains("x_seconds{nodepool=\"default\",quantile=\"1\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds{nodepool=\"default\",quantile=\"0.99\"} 2\n"), "{out}");
        assert!(out.contains("x_seconds_sum{nodepool=\"default\"} 102\n"), "{out}");
        assert!(out.contains("x_seconds_count{nodepool=\"default\"} 2\n"), "{out}");
    }

    #[test]
    fn summaries_come_before_the_end_marker() {
        let mut summaries = Summaries::default();
        let family = summaries.add("y_seconds", "Y.");
        family.observe(&vec![], 1.5);
        let mut registry = Registry::default();
        let counter = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("z", "Z.", counter);
        let mut out = String::new();
        encode(&registry, &summaries, &mut out).unwrap();
        assert!(out.ends_with("y_seconds_count 1\n# EOF\n"), "{out}");
        assert!(out.contains("z_total 0\n"), "{out}");
        assert_eq!(out.matches("# EOF").count(), 1, "{out}");
        assert!(out.contains("y_seconds{quantile=\"0.5\"} 1.5\n"), "{out}");
    }
}
