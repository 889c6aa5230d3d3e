//! Voluntary disruption: the pure decisions consolidation and drift replacement stand on.
//!
//! Disruption budgets ([`budgets`]) and the cron schedules they use ([`cron`]); the checks that
//! make a node a candidate or say why it is not ([`candidates`]); which nodes emptiness removes
//! ([`emptiness`]); whether nodes can be consolidated and how ([`consolidation`]); and one pass
//! over the cluster that picks the first command ([`decide`]); and the per-node record of why
//! ([`record`]); how static NodePools keep their replicas ([`static_capacity`]). The disruption controller
//! (`controllers::disruption`) acts on them. Node repair ([`repair`]) is forceful and outside the
//! loop: `controllers::node::health` acts on it.

pub mod budgets;
pub mod candidates;
pub mod consolidation;
pub mod cron;
pub mod decide;
pub mod emptiness;
pub mod record;
pub mod repair;
pub mod static_capacity;
pub mod surge;

#[cfg(test)]
pub(crate) mod tests;
