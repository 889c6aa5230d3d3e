//! What every layer shares and that depends on nothing else in the crate: errors as text, what an
//! API server's refusal means, Go-style durations, the API client's request limit.

pub mod api;
pub mod duration;
pub mod error;

pub use duration::parse_duration;
pub use error::error_chain;

/// Requests the API client sends at once; controllers that call it in parallel size their
/// workers to it.
pub const MAX_IN_FLIGHT: usize = 32;
