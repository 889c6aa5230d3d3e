//! What the controllers read of the operator's settings: the feature gates, the provisioner's
//! batch window and the scheduling policies.

use std::sync::Arc;
use std::time::Duration;

use crate::scheduling::defaultspread::DefaultSpread;
use crate::scheduling::{FEWER_NODES_MARGIN, MinValuesPolicy, PreferencePolicy, SchedulerOptions};

/// The controllers' settings (see [`crate::operator::Settings`] for where each comes from).
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// `FEATURE_GATES`.
    pub feature_gates: FeatureGates,
    /// `BATCH_IDLE_DURATION`: a batch of pending pods closes after this long without a new one.
    pub batch_idle_duration: Duration,
    /// `BATCH_MAX_DURATION`: the longest a batch stays open.
    pub batch_max_duration: Duration,
    /// `MIN_VALUES_POLICY`.
    pub min_values_policy: MinValuesPolicy,
    /// `PREFERENCE_POLICY`.
    pub preference_policy: PreferencePolicy,
    /// Whether a rebalance recommendation replaces the spot node before deleting it.
    pub rebalance_replacement: bool,
    /// `FEWER_NODES_MARGIN`, as a fraction.
    pub fewer_nodes_margin: f64,
    /// `DEFAULT_POD_TOPOLOGY_SPREAD` and `KUBE_SCHEDULER_CONFIG`: kube-scheduler's default spreads.
    pub default_spread: Arc<DefaultSpread>,
    /// `CONSOLIDATION_PREFERENCE_POLICY`.
    pub consolidation_preference_policy: ConsolidationPreferencePolicy,
}

/// How the disruption simulations treat pods' preferences (preferred node and pod affinity,
/// `ScheduleAnyway` spreads): `CONSOLIDATION_PREFERENCE_POLICY`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ConsolidationPreferencePolicy {
    /// As kube-scheduler treats them: a pod that fits on a remaining node only without its
    /// preferences goes there, and a node whose pods do is removed (karpenter-rs's default).
    #[default]
    Soft,
    /// As upstream: a preference that new capacity could honour is kept, so the node stays or is
    /// replaced.
    Respect,
}

impl std::str::FromStr for ConsolidationPreferencePolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "Soft" => Ok(ConsolidationPreferencePolicy::Soft),
            "Respect" => Ok(ConsolidationPreferencePolicy::Respect),
            other => {
                Err(format!("invalid consolidation preference policy {other:?}: expected Soft or Respect"))
            }
        }
    }
}

impl Settings {
    /// The options of the provisioner's and the disruption simulations' scheduling runs.
    pub fn scheduler_options(&self) -> SchedulerOptions {
        SchedulerOptions {
            min_values_policy: self.min_values_policy,
            preference_policy: self.preference_policy,
            fewer_nodes_margin: self.fewer_nodes_margin,
            default_spread: Arc::clone(&self.default_spread),
            ..SchedulerOptions::default()
        }
    }

    /// The options of the disruption simulations: the provisioner's, with preferences yielding to
    /// the remaining nodes under [`ConsolidationPreferencePolicy::Soft`].
    pub fn disruption_options(&self) -> SchedulerOptions {
        SchedulerOptions {
            preferences_yield_to_existing: self.consolidation_preference_policy
                == ConsolidationPreferencePolicy::Soft,
            ..self.scheduler_options()
        }
    }
}

impl Default for Settings {
    /// Upstream's defaults, and karpenter-rs's own for its own settings.
    fn default() -> Self {
        Settings {
            feature_gates: FeatureGates::default(),
            batch_idle_duration: Duration::from_secs(1),
            batch_max_duration: Duration::from_secs(10),
            min_values_policy: MinValuesPolicy::default(),
            preference_policy: PreferencePolicy::default(),
            rebalance_replacement: false,
            fewer_nodes_margin: FEWER_NODES_MARGIN,
            default_spread: Arc::new(DefaultSpread::builtin()),
            consolidation_preference_policy: ConsolidationPreferencePolicy::default(),
        }
    }
}

/// Feature gates, as upstream names them in `FEATURE_GATES` (`Name=true,Other=false`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    /// Consolidation may replace a spot node with a cheaper spot node.
    pub spot_to_spot_consolidation: bool,
    /// Unhealthy nodes are repaired (replaced) automatically.
    pub node_repair: bool,
    /// Capacity reservations are used as a capacity type.
    pub reserved_capacity: bool,
    /// NodeOverlay resources adjust instance types.
    pub node_overlay: bool,
    /// NodePools with a fixed number of replicas.
    pub static_capacity: bool,
    /// CapacityBuffer resources keep headroom.
    pub capacity_buffer: bool,
}

impl Default for FeatureGates {
    fn default() -> Self {
        FeatureGates {
            spot_to_spot_consolidation: false,
            node_repair: false,
            reserved_capacity: true,
            node_overlay: false,
            static_capacity: false,
            capacity_buffer: false,
        }
    }
}

/// Feature gates that older releases had and that are now always on; accepted and ignored so
/// that existing Helm values keep working.
const RETIRED_FEATURE_GATES: &[&str] = &["Drift"];

impl std::str::FromStr for FeatureGates {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut gates = FeatureGates::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| format!("feature gate {item:?} is not of the form Name=true|false"))?;
            let value: bool = value
                .trim()
                .parse()
                .map_err(|_| format!("feature gate {name}: {value:?} is neither true nor false"))?;
            match name.trim() {
                "SpotToSpotConsolidation" => gates.spot_to_spot_consolidation = value,
                "NodeRepair" => gates.node_repair = value,
                "ReservedCapacity" => gates.reserved_capacity = value,
                "NodeOverlay" => gates.node_overlay = value,
                "StaticCapacity" => gates.static_capacity = value,
                "CapacityBuffer" => gates.capacity_buffer = value,
                retired if RETIRED_FEATURE_GATES.contains(&retired) => {}
                unknown => return Err(format!("unrecognized feature gate {unknown:?}")),
            }
        }
        Ok(gates)
    }
}
