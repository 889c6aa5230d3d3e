//! NodeClaims this process created that its cache has not delivered yet. A pass counts them as
//! capacity, so that a burst of pods never gets a second claim for the same room; once the watch
//! reports a claim (applied, deleted or found gone), the cache speaks for it and the entry goes.
//!
//! An entry must go at the watch's first word, not at the next pass: a claim created, delivered and
//! deleted between two passes would otherwise come back as capacity that no longer exists, holding
//! pods pending and NodePool limits used up until its grace ran out.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::apis::NodeClaim;
use crate::state::{ClusterState, Notice, Registration};

/// How long a created NodeClaim counts as capacity before it shows up in the cache; far longer
/// than a watch takes to deliver it.
pub const GRACE: Duration = Duration::from_secs(60);

/// Claims created and not yet reported by the watch, by name.
#[derive(Default)]
pub struct Created {
    claims: HashMap<String, (Instant, Arc<NodeClaim>)>,
}

impl Created {
    /// Records a claim the API server accepted at `now`.
    pub fn add(&mut self, claim: Arc<NodeClaim>, now: Instant) {
        let Some(name) = claim.metadata.name.clone() else { return };
        self.claims.insert(name, (now, claim));
    }

    /// The watch reported `name`: the cache has it, or had it and saw it go.
    pub fn reported(&mut self, name: &str) {
        self.claims.remove(name);
    }

    /// The claims still awaited at `now` (those past their grace are dropped).
    pub fn awaited(&mut self, now: Instant) -> Vec<Arc<NodeClaim>> {
        self.claims.retain(|_, (at, _)| now.saturating_duration_since(*at) < GRACE);
        self.claims.values().map(|(_, c)| Arc::clone(c)).collect()
    }

    /// Whether nothing is awaited.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }
}

/// The created claims, and the watch registration that clears them as the cache reports them.
pub fn follow(state: &ClusterState) -> (Arc<Mutex<Created>>, Registration) {
    let created = Arc::new(Mutex::new(Created::default()));
    let registration = {
        let created = Arc::clone(&created);
        state.on_nodeclaim(move |notice| {
            let name = match notice {
                Notice::Applied(c) | Notice::Deleted(c) => c.metadata.name.as_deref(),
                Notice::Gone { name, .. } => Some(name),
            };
            let Some(name) = name else { return };
            let mut created = created.lock().unwrap_or_else(PoisonError::into_inner);
            if !created.is_empty() {
                created.reported(name);
            }
        })
    };
    (created, registration)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str) -> Arc<NodeClaim> {
        let mut claim: NodeClaim = serde_json::from_value(serde_json::json!({
            "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "metadata": {"name": "x"},
            "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                "requirements": []}
        }))
        .unwrap();
        claim.metadata.name = (!name.is_empty()).then(|| name.to_string());
        Arc::new(claim)
    }

    fn names(mut claims: Vec<Arc<NodeClaim>>) -> Vec<String> {
        let mut names: Vec<String> = claims.drain(..).filter_map(|c| c.metadata.name.clone()).collect();
        names.sort();
        names
    }

    #[test]
    fn a_claim_counts_until_the_watch_reports_it_or_its_grace_ends() {
        let t0 = Instant::now();
        let mut created = Created::default();
        created.add(claim("a"), t0);
        created.add(claim("b"), t0);
        created.add(claim("c"), t0 + Duration::from_secs(30));
        assert_eq!(names(created.awaited(t0 + Duration::from_secs(1))), ["a", "b", "c"]);
        // Reported (and perhaps deleted since): the cache speaks for it from now on.
        created.reported("a");
        assert_eq!(names(created.awaited(t0 + Duration::from_secs(2))), ["b", "c"]);
        // Never reported: it stops counting once its grace is over.
        assert_eq!(names(created.awaited(t0 + GRACE)), ["c"]);
        assert_eq!(names(created.awaited(t0 + GRACE + Duration::from_secs(30))), Vec::<String>::new());
        assert!(created.is_empty());
    }

    #[test]
    fn a_claim_without_a_name_is_not_kept() {
        let mut created = Created::default();
        created.add(claim(""), Instant::now());
        assert!(created.is_empty());
    }
}
