//! kube-scheduler's default topology spreading, as the scheduling simulation applies it.
//!
//! kube-scheduler gives a pod that sets no `topologySpreadConstraints` its PodTopologySpread
//! plugin's default constraints: built in (`defaultingType: System`), one on the hostname
//! (`maxSkew: 3`) and one on the zone (`maxSkew: 5`), both `ScheduleAnyway`; or the list a
//! KubeSchedulerConfiguration gives (`defaultingType: List`). Their selector is built from the
//! workload that owns the pod, so they apply only to pods of a workload.
//!
//! The simulation plans the capacity those pods will land on:
//!
//! - a `ScheduleAnyway` default is only a score to kube-scheduler, and that score puts each pod in
//!   the domain with the fewest of its workload while one has room. So a zone (or other
//!   non-hostname) default is planned as a balance within one (`maxSkew: 1`, `ScheduleAnyway`, so
//!   that it gives way when it cannot be met): new capacity in every zone the pods may use. A
//!   `ScheduleAnyway` hostname default is left out: scoring spreads pods over the nodes there are,
//!   and never needs a node more;
//! - a `DoNotSchedule` default is a filter to kube-scheduler, and planned as it is.
//!
//! The selector is the pod's own labels, less those a StatefulSet sets per pod, for a pod whose
//! controller is a ReplicaSet, ReplicationController or StatefulSet: its siblings carry the same
//! ones. kube-scheduler builds it from those owners' selectors and from the selectors of the
//! Services that select the pod; a pod that only a Service selects is not spread here.

use crate::apis::pod::Pod;
use k8s_openapi::api::core::v1::TopologySpreadConstraint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;

use crate::apis::labels::{LABEL_HOSTNAME, LABEL_TOPOLOGY_ZONE};

/// Owner kinds whose pods kube-scheduler's default constraints select.
const WORKLOAD_KINDS: [&str; 3] = ["ReplicaSet", "ReplicationController", "StatefulSet"];
/// Labels a StatefulSet gives each of its pods its own value of.
const PER_POD_LABELS: [&str; 2] = ["statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index"];
const SCHEDULE_ANYWAY: &str = "ScheduleAnyway";
/// The profile kube-scheduler serves pods with no `schedulerName`.
const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Why a KubeSchedulerConfiguration cannot give the default constraints.
#[derive(Debug, thiserror::Error)]
pub enum DefaultSpreadError {
    /// Not YAML of the expected shape.
    #[error("not a KubeSchedulerConfiguration: {0}")]
    Parse(String),
    /// Another kind or API version.
    #[error("{api_version}/{kind} is not a kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration")]
    Kind {
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
    /// Arguments kube-scheduler itself refuses.
    #[error("profile {profile:?}, PodTopologySpread args: {reason}")]
    Invalid {
        /// The profile's scheduler name.
        profile: String,
        /// What is wrong.
        reason: String,
    },
}

/// The default constraints of kube-scheduler's default profile.
#[derive(Clone, Debug, PartialEq)]
pub struct DefaultSpread {
    constraints: Vec<TopologySpreadConstraint>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Config {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    profiles: Vec<Profile>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Profile {
    scheduler_name: Option<String>,
    #[serde(default)]
    plugin_config: Vec<PluginConfig>,
}

#[derive(Deserialize)]
struct PluginConfig {
    name: String,
    #[serde(default)]
    args: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpreadArgs {
    #[serde(default)]
    default_constraints: Vec<TopologySpreadConstraint>,
    defaulting_type: Option<String>,
}

fn constraint(key: &str, max_skew: i32) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew,
        topology_key: key.to_string(),
        when_unsatisfiable: SCHEDULE_ANYWAY.to_string(),
        ..Default::default()
    }
}

impl DefaultSpread {
    /// kube-scheduler's built-in defaults (`defaultingType: System`).
    pub fn builtin() -> Self {
        DefaultSpread { constraints: vec![constraint(LABEL_HOSTNAME, 3), constraint(LABEL_TOPOLOGY_ZONE, 5)] }
    }

    /// No default constraints.
    pub fn none() -> Self {
        DefaultSpread { constraints: Vec::new() }
    }

    /// The defaults of the default profile (`default-scheduler`) of the KubeSchedulerConfiguration
    /// `text`: its PodTopologySpread args, or the built-in defaults when it has none.
    pub fn from_kube_scheduler_config(text: &str) -> Result<Self, DefaultSpreadError> {
        let config: Config =
            serde_saphyr::from_str(text).map_err(|e| DefaultSpreadError::Parse(e.to_string()))?;
        if config.kind != "KubeSchedulerConfiguration"
            || config.api_version != "kubescheduler.config.k8s.io/v1"
        {
            return Err(DefaultSpreadError::Kind { api_version: config.api_version, kind: config.kind });
        }
        let profile = config
            .profiles
            .iter()
            .find(|p| p.scheduler_name.as_deref().unwrap_or(DEFAULT_SCHEDULER) == DEFAULT_SCHEDULER);
        let Some(profile) = profile else { return Ok(Self::builtin()) };
        let Some(args) = profile.plugin_config.iter().find(|c| c.name == "PodTopologySpread") else {
            return Ok(Self::builtin());
        };
        let invalid =
            |reason: String| DefaultSpreadError::Invalid { profile: DEFAULT_SCHEDULER.into(), reason };
        let args: SpreadArgs = match &args.args {
            Some(v) => serde_json::from_value(v.clone()).map_err(|e| invalid(e.to_string()))?,
            None => SpreadArgs { default_constraints: Vec::new(), defaulting_type: None },
        };
        // kube-scheduler's own rules for these args.
        match args.defaulting_type.as_deref().unwrap_or("System") {
            "System" if args.default_constraints.is_empty() => return Ok(Self::builtin()),
            "System" => {
                return Err(invalid("defaultConstraints must be empty with defaultingType System".into()));
            }
            "List" => {}
            other => return Err(invalid(format!("defaultingType {other:?} is not System or List"))),
        }
        for c in &args.default_constraints {
            if c.label_selector.is_some() {
                return Err(invalid(format!(
                    "the default constraint on {} sets a labelSelector",
                    c.topology_key
                )));
            }
            if c.max_skew < 1 || c.topology_key.is_empty() {
                return Err(invalid(format!(
                    "the default constraint on {:?} needs a topologyKey and maxSkew of at least 1",
                    c.topology_key
                )));
            }
            if !matches!(c.when_unsatisfiable.as_str(), SCHEDULE_ANYWAY | "DoNotSchedule") {
                return Err(invalid(format!(
                    "whenUnsatisfiable {:?} is not DoNotSchedule or ScheduleAnyway",
                    c.when_unsatisfiable
                )));
            }
        }
        Ok(DefaultSpread { constraints: args.default_constraints })
    }

    /// The constraints the simulation plans `pod` with (see the module), none when it sets its
    /// own or belongs to no workload.
    pub fn for_pod(&self, pod: &Pod) -> Vec<TopologySpreadConstraint> {
        let own = pod.spec.as_ref().and_then(|s| s.topology_spread_constraints.as_ref());
        if self.constraints.is_empty() || own.is_some_and(|c| !c.is_empty()) {
            return Vec::new();
        }
        let of_workload = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && WORKLOAD_KINDS.contains(&o.kind.as_str()));
        let labels: std::collections::BTreeMap<String, String> = pod
            .metadata
            .labels
            .iter()
            .flatten()
            .filter(|(k, _)| !PER_POD_LABELS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !of_workload || labels.is_empty() {
            return Vec::new();
        }
        let selector = LabelSelector { match_labels: Some(labels), match_expressions: None };
        self.constraints
            .iter()
            .filter_map(|c| {
                let soft = c.when_unsatisfiable == SCHEDULE_ANYWAY;
                if soft && c.topology_key == LABEL_HOSTNAME {
                    return None;
                }
                Some(TopologySpreadConstraint {
                    max_skew: if soft { 1 } else { c.max_skew },
                    label_selector: Some(selector.clone()),
                    ..c.clone()
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::pod::PodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

    fn pod(owner: Option<&str>, labels: &[(&str, &str)], own: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                owner_references: owner.map(|kind| {
                    vec![OwnerReference {
                        kind: kind.into(),
                        name: "web".into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            },
            spec: Some(PodSpec {
                topology_spread_constraints: own.then(|| vec![constraint(LABEL_TOPOLOGY_ZONE, 1)]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn keys_and_skews(cs: &[TopologySpreadConstraint]) -> Vec<(&str, i32, &str)> {
        cs.iter().map(|c| (c.topology_key.as_str(), c.max_skew, c.when_unsatisfiable.as_str())).collect()
    }

    #[test]
    fn a_workloads_pods_are_spread_over_zones_by_their_labels() {
        let d = DefaultSpread::builtin();
        let labels = [("app", "web"), ("pod-template-hash", "5d4f"), ("apps.kubernetes.io/pod-index", "0")];
        let got = d.for_pod(&pod(Some("ReplicaSet"), &labels, false));
        // The hostname default is a score only; the zone default is planned as a balance.
        assert_eq!(keys_and_skews(&got), [(LABEL_TOPOLOGY_ZONE, 1, SCHEDULE_ANYWAY)]);
        let selected =
            got[0].label_selector.as_ref().and_then(|s| s.match_labels.clone()).unwrap_or_default();
        assert_eq!(selected.keys().map(String::as_str).collect::<Vec<_>>(), ["app", "pod-template-hash"]);
        for kind in ["StatefulSet", "ReplicationController"] {
            assert_eq!(d.for_pod(&pod(Some(kind), &labels, false)).len(), 1, "{kind}");
        }
        // (owner, labels, own constraints): none applies.
        for (owner, labels, own) in [
            (None, &labels[..], false),
            (Some("Job"), &labels[..], false),
            (Some("DaemonSet"), &labels[..], false),
            (Some("ReplicaSet"), &labels[..], true),
            (Some("ReplicaSet"), &[("apps.kubernetes.io/pod-index", "0")][..], false),
        ] {
            assert!(d.for_pod(&pod(owner, labels, own)).is_empty(), "{owner:?} {labels:?} {own}");
        }
        assert!(DefaultSpread::none().for_pod(&pod(Some("ReplicaSet"), &labels, false)).is_empty());
    }

    const HEAD: &str = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n";

    #[test]
    fn the_default_profiles_args_give_the_constraints() {
        let list = format!(
            "{HEAD}profiles:\n- schedulerName: other\n- pluginConfig:\n  - name: PodTopologySpread\n    args:\n      defaultingType: List\n      defaultConstraints:\n      - maxSkew: 2\n        topologyKey: topology.kubernetes.io/zone\n        whenUnsatisfiable: DoNotSchedule\n      - maxSkew: 1\n        topologyKey: kubernetes.io/hostname\n        whenUnsatisfiable: DoNotSchedule\n"
        );
        let d = DefaultSpread::from_kube_scheduler_config(&list).unwrap();
        let got = d.for_pod(&pod(Some("ReplicaSet"), &[("app", "web")], false));
        // Filters are planned as they are, hostname too.
        assert_eq!(
            keys_and_skews(&got),
            [(LABEL_TOPOLOGY_ZONE, 2, "DoNotSchedule"), (LABEL_HOSTNAME, 1, "DoNotSchedule")]
        );
        // (configuration, the built-in defaults)
        for text in [
            HEAD.to_string(),
            format!("{HEAD}profiles:\n- schedulerName: default-scheduler\n"),
            format!(
                "{HEAD}profiles:\n- pluginConfig:\n  - name: PodTopologySpread\n    args:\n      defaultingType: System\n"
            ),
        ] {
            assert_eq!(
                DefaultSpread::from_kube_scheduler_config(&text).unwrap(),
                DefaultSpread::builtin(),
                "{text}"
            );
        }
        let off = format!(
            "{HEAD}profiles:\n- pluginConfig:\n  - name: PodTopologySpread\n    args:\n      defaultingType: List\n"
        );
        assert_eq!(DefaultSpread::from_kube_scheduler_config(&off).unwrap(), DefaultSpread::none());
    }

    #[test]
    fn configurations_kube_scheduler_refuses_are_refused() {
        let args = |body: &str| {
            format!("{HEAD}profiles:\n- pluginConfig:\n  - name: PodTopologySpread\n    args:\n{body}")
        };
        // (configuration, part of the message)
        let table = [
            ("kind: Pod\n".to_string(), "is not a kubescheduler.config.k8s.io/v1"),
            (
                "apiVersion: kubescheduler.config.k8s.io/v1beta3\nkind: KubeSchedulerConfiguration\n".into(),
                "v1beta3",
            ),
            ("profiles: [".into(), "not a KubeSchedulerConfiguration"),
            (args("      defaultingType: Sometimes\n"), "defaultingType \"Sometimes\""),
            (
                args(
                    "      defaultConstraints:\n      - maxSkew: 1\n        topologyKey: zone\n        whenUnsatisfiable: DoNotSchedule\n",
                ),
                "must be empty with defaultingType System",
            ),
            (
                args(
                    "      defaultingType: List\n      defaultConstraints:\n      - maxSkew: 1\n        topologyKey: zone\n        whenUnsatisfiable: DoNotSchedule\n        labelSelector: {matchLabels: {a: b}}\n",
                ),
                "sets a labelSelector",
            ),
            (
                args(
                    "      defaultingType: List\n      defaultConstraints:\n      - maxSkew: 0\n        topologyKey: zone\n        whenUnsatisfiable: DoNotSchedule\n",
                ),
                "maxSkew of at least 1",
            ),
            (
                args(
                    "      defaultingType: List\n      defaultConstraints:\n      - maxSkew: 1\n        topologyKey: zone\n        whenUnsatisfiable: Maybe\n",
                ),
                "whenUnsatisfiable \"Maybe\"",
            ),
        ];
        for (text, want) in table {
            let err = DefaultSpread::from_kube_scheduler_config(&text).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }
}
