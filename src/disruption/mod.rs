//! Voluntary disruption: the pure decisions consolidation and drift replacement stand on.
//!
//! So far: disruption budgets ([`budgets`]) and the cron schedules they use ([`cron`]); the checks
//! that make a node a candidate or say why it is not ([`candidates`]); which nodes emptiness would
//! remove ([`emptiness`]). The disruption controller that acts on them (emptiness, consolidation,
//! drift replacement) is not implemented yet; see the README.

pub mod budgets;
pub mod candidates;
pub mod cron;
pub mod emptiness;
