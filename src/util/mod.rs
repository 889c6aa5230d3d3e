//! What every layer shares and that depends on nothing else in the crate: errors as text, what an
//! API server's refusal means, Go-style durations, a token bucket, the API client's request limit, lists of pods
//! in one line.

pub mod api;
pub mod bucket;
pub mod duration;
pub mod error;

pub use duration::parse_duration;
pub use error::error_chain;

/// Requests the API client sends at once; controllers that call it in parallel size their
/// workers to it.
pub const MAX_IN_FLIGHT: usize = 32;

/// Most pod names [`summarise_pods`] lists before counting the rest.
const LISTED_PODS: usize = 5;

/// `95 pods: default/a, default/b, default/c, default/d, default/e … (+90)`.
pub fn summarise_pods(pods: &[String]) -> String {
    let noun = if pods.len() == 1 { "pod" } else { "pods" };
    let listed = pods.iter().take(LISTED_PODS).cloned().collect::<Vec<_>>().join(", ");
    let rest = pods.len().saturating_sub(LISTED_PODS);
    if rest == 0 {
        format!("{} {noun}: {listed}", pods.len())
    } else {
        format!("{} {noun}: {listed} … (+{rest})", pods.len())
    }
}
