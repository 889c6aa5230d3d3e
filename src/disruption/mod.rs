//! Voluntary disruption: the pure decisions consolidation and drift replacement stand on.
//!
//! Disruption budgets ([`budgets`]) and the cron schedules they use ([`cron`]); the checks that
//! make a node a candidate or say why it is not ([`candidates`]); which nodes emptiness removes
//! ([`emptiness`]); whether nodes can be consolidated and how ([`consolidation`]); and one pass
//! over the cluster that picks the first command ([`decide`]); and the per-node record of why
//! ([`record`]). The disruption controller
//! (`controllers::disruption`) acts on them. Drift replacement is not implemented yet.

pub mod budgets;
pub mod candidates;
pub mod consolidation;
pub mod cron;
pub mod decide;
pub mod emptiness;
pub mod record;

#[cfg(test)]
mod tests;
