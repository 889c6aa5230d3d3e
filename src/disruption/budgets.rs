//! NodePool disruption budgets: how many of a pool's nodes voluntary disruption may take now, for
//! each reason, as upstream counts them.
//!
//! A budget with no schedule is always active; one with a schedule is active for `duration` after
//! each time the schedule fires (UTC). An active budget allows its `nodes` (a count, or a
//! percentage of the pool's nodes rounded up); an inactive one does not limit. A reason is allowed
//! the least of the active budgets that name it (or name no reason). The pool's nodes are its
//! managed, initialized nodes whose instance is not terminating; those not Ready or going away
//! already use the budget. A budget that does not parse allows nothing, for every reason.
//!
//! Budgets gate consolidation and drift only: expiry, interruption, repair and deleting a
//! NodeClaim or Node by hand do not wait for them (but count against them while they run).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use thiserror::Error;

use crate::apis::common::TaintEffect;
use crate::apis::labels::TAINT_DISRUPTED;
use crate::apis::nodepool::{Budget, DisruptionReason, NodePool};
use crate::state::StateNode;
use crate::util::parse_duration;

use super::cron::{Schedule, ScheduleError};

/// Every reason, in upstream's order.
pub const REASONS: [DisruptionReason; 3] =
    [DisruptionReason::Underutilized, DisruptionReason::Empty, DisruptionReason::Drifted];

/// A budget that cannot be evaluated.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BudgetError {
    /// Its schedule does not parse.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// Its duration does not parse.
    #[error("invalid duration {duration:?}: {reason}")]
    Duration {
        /// The duration as written.
        duration: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Its node count does not parse.
    #[error("invalid nodes {0:?}: expected a count or a percentage")]
    Nodes(String),
}

/// Whether `budget` is active at `now`.
pub fn is_active(budget: &Budget, now: Timestamp) -> Result<bool, BudgetError> {
    let (Some(schedule), Some(duration)) = (&budget.schedule, &budget.duration) else {
        return Ok(true);
    };
    let schedule = Schedule::parse(schedule)?;
    let duration: Duration = parse_duration(duration)
        .map_err(|reason| BudgetError::Duration { duration: duration.clone(), reason })?;
    Ok(schedule.active(now, duration))
}

/// The nodes `budget` allows out of `total`, if it is active (`None`: it does not limit now).
pub fn budget_allows(budget: &Budget, total: usize, now: Timestamp) -> Result<Option<usize>, BudgetError> {
    let nodes = budget.nodes.trim();
    let allowed = match nodes.strip_suffix('%') {
        Some(percent) => {
            let percent: usize = percent.parse().map_err(|_| BudgetError::Nodes(nodes.to_string()))?;
            if percent > 100 {
                return Err(BudgetError::Nodes(nodes.to_string()));
            }
            (percent * total).div_ceil(100)
        }
        None => nodes.parse().map_err(|_| BudgetError::Nodes(nodes.to_string()))?,
    };
    Ok(is_active(budget, now)?.then_some(allowed))
}

/// The nodes of a pool of `total` that `budgets` allow disrupting for `reason` at `now`, before
/// counting those already disrupting; `usize::MAX` when no active budget limits it.
pub fn allowed(
    budgets: &[Budget],
    reason: DisruptionReason,
    total: usize,
    now: Timestamp,
) -> Result<usize, BudgetError> {
    let mut allowed = usize::MAX;
    for budget in budgets {
        let applies = budget.reasons.as_ref().is_none_or(|r| r.is_empty() || r.contains(&reason));
        if applies && let Some(n) = budget_allows(budget, total, now)? {
            allowed = allowed.min(n);
        }
    }
    Ok(allowed)
}

/// A NodePool's nodes as budgets count them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolNodes {
    /// Managed, initialized nodes whose instance is not terminating.
    pub total: usize,
    /// Of those, the ones not Ready or going away.
    pub disrupting: usize,
}

/// Counts each NodePool's nodes.
pub fn pool_nodes(nodes: &[StateNode]) -> BTreeMap<String, PoolNodes> {
    let mut pools: BTreeMap<String, PoolNodes> = BTreeMap::new();
    for node in nodes {
        let Some(pool) = node.nodepool() else { continue };
        if !node.managed || !node.initialized || node.instance_terminating() {
            continue;
        }
        let counts = pools.entry(pool.to_string()).or_default();
        counts.total += 1;
        // Tainted `karpenter.sh/disrupted`: a command is replacing it (its replacements may not be
        // in the cache yet, so it is not marked for deletion yet) or it is draining.
        let tainted =
            node.taints.iter().any(|t| t.key == TAINT_DISRUPTED && t.effect == TaintEffect::NoSchedule);
        if !node.is_ready() || node.marked_for_deletion || tainted {
            counts.disrupting += 1;
        }
    }
    pools
}

/// A NodePool's budget for one reason, now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolBudget {
    /// What the budgets allow before counting the nodes disrupting (`usize::MAX`: unlimited);
    /// the `karpenter_nodepools_allowed_disruptions` metric.
    pub allowed: usize,
    /// Nodes already disrupting; the `karpenter_nodepools_nodes_consuming_budgets` metric.
    pub disrupting: usize,
    /// How many more nodes may be disrupted now.
    pub remaining: usize,
    /// Why the pool's budgets could not be evaluated (then nothing is allowed).
    pub error: Option<BudgetError>,
}

/// Each NodePool's budget for `reason` at `now`.
pub fn budgets<'a>(
    pools: impl IntoIterator<Item = &'a std::sync::Arc<NodePool>>,
    nodes: &BTreeMap<String, PoolNodes>,
    reason: DisruptionReason,
    now: Timestamp,
) -> BTreeMap<String, PoolBudget> {
    pools
        .into_iter()
        .filter_map(|pool| {
            let name = pool.metadata.name.clone()?;
            let counts = nodes.get(&name).copied().unwrap_or_default();
            let (allowed, error) = match allowed(&pool.spec.disruption.budgets, reason, counts.total, now) {
                Ok(allowed) => (allowed, None),
                Err(error) => (0, Some(error)),
            };
            let remaining = allowed.saturating_sub(counts.disrupting);
            Some((name, PoolBudget { allowed, disrupting: counts.disrupting, remaining, error }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(nodes: &str, reasons: Option<Vec<DisruptionReason>>, schedule: Option<(&str, &str)>) -> Budget {
        Budget {
            nodes: nodes.to_string(),
            reasons,
            schedule: schedule.map(|s| s.0.to_string()),
            duration: schedule.map(|s| s.1.to_string()),
        }
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn percentages_round_up_and_counts_are_counts() {
        let now = at("2026-11-24T12:00:00Z");
        assert_eq!(allowed(&[budget("10%", None, None)], DisruptionReason::Empty, 11, now), Ok(2));
        assert_eq!(allowed(&[budget("10%", None, None)], DisruptionReason::Empty, 10, now), Ok(1));
        assert_eq!(allowed(&[budget("10%", None, None)], DisruptionReason::Empty, 0, now), Ok(0));
        assert_eq!(allowed(&[budget("0%", None, None)], DisruptionReason::Empty, 50, now), Ok(0));
        assert_eq!(allowed(&[budget("3", None, None)], DisruptionReason::Empty, 2, now), Ok(3));
        assert_eq!(allowed(&[], DisruptionReason::Empty, 2, now), Ok(usize::MAX), "no budget, no limit");
    }

    #[test]
    fn the_least_of_the_active_budgets_for_the_reason() {
        let budgets = [
            budget("20%", None, None),
            budget("0", Some(vec![DisruptionReason::Underutilized]), None),
            // Drift is frozen on weekday working hours.
            budget("0", Some(vec![DisruptionReason::Drifted]), Some(("0 9 * * mon-fri", "8h"))),
        ];
        let tuesday_noon = at("2026-11-24T12:00:00Z");
        let tuesday_night = at("2026-11-24T22:00:00Z");
        assert_eq!(allowed(&budgets, DisruptionReason::Empty, 10, tuesday_noon), Ok(2));
        assert_eq!(allowed(&budgets, DisruptionReason::Underutilized, 10, tuesday_noon), Ok(0));
        assert_eq!(allowed(&budgets, DisruptionReason::Drifted, 10, tuesday_noon), Ok(0));
        assert_eq!(allowed(&budgets, DisruptionReason::Drifted, 10, tuesday_night), Ok(2));
    }

    #[test]
    fn a_budget_that_does_not_parse_allows_nothing() {
        let now = at("2026-11-24T12:00:00Z");
        let bad = budget("10%", None, Some(("0 25 * * *", "1h")));
        assert!(matches!(
            allowed(std::slice::from_ref(&bad), DisruptionReason::Empty, 10, now),
            Err(BudgetError::Schedule(_))
        ));
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []}},
                "disruption": {"budgets": [{"nodes": "10%", "schedule": "0 25 * * *", "duration": "1h"}]}}
        }))
        .unwrap();
        let nodes = BTreeMap::from([("p".to_string(), PoolNodes { total: 10, disrupting: 0 })]);
        let got = budgets(&[std::sync::Arc::new(pool)], &nodes, DisruptionReason::Empty, now);
        assert_eq!(got["p"].remaining, 0);
        assert!(got["p"].error.as_ref().is_some_and(|e| e.to_string().contains("outside 0-23")));
    }

    #[test]
    fn nodes_already_disrupting_use_the_budget() {
        let now = at("2026-11-24T12:00:00Z");
        let pool: NodePool = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"template": {"spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "c"}, "requirements": []}},
                "disruption": {"budgets": [{"nodes": "3"}]}}
        }))
        .unwrap();
        let nodes = BTreeMap::from([("p".to_string(), PoolNodes { total: 10, disrupting: 2 })]);
        let got = budgets(&[std::sync::Arc::new(pool.clone())], &nodes, DisruptionReason::Drifted, now);
        assert_eq!(got["p"], PoolBudget { allowed: 3, disrupting: 2, remaining: 1, error: None });
        let nodes = BTreeMap::from([("p".to_string(), PoolNodes { total: 10, disrupting: 5 })]);
        let got = budgets(&[std::sync::Arc::new(pool)], &nodes, DisruptionReason::Drifted, now);
        assert_eq!(got["p"].remaining, 0, "never below zero");
    }
}
