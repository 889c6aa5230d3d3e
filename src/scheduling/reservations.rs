//! Capacity reservations during one scheduling run.
//!
//! A `reserved` offering launches into a capacity reservation that has a known number of
//! instances left. While pods are placed, each new NodeClaim holds one instance of every
//! reservation it could still launch into (pessimistically, as upstream: the launch picks one of
//! them), so that a run never plans more reserved nodes than the reservations hold. A NodeClaim
//! that holds reservations is launched as `reserved` into one of them; when its pods outgrow
//! every reserved type it gives them back.
//!
//! Two modes, as upstream's scheduler: the provisioner is strict (a pod that could use a
//! reservation whose instances are all held waits for the next run rather than taking on-demand
//! capacity; the next run sees the reservation exhausted and falls back), the disruption
//! simulations fall back at once.

use std::collections::HashMap;

use super::instancetypes::Offering;
use super::scheduler::NodePoolInput;

/// Why a strict run refuses a pod a NodeClaim (upstream's words).
pub const NONE_LEFT: &str =
    "one or more instance types with compatible reserved offerings are available, but could not be reserved";
/// Why a strict run refuses a pod that would take a NodeClaim off every reservation it holds.
pub const WOULD_LOSE: &str =
    "satisfying updated nodeclaim constraints would remove all compatible reserved offering options";

/// Instances left per reservation in this run.
#[derive(Debug, Default)]
pub(super) struct Book {
    left: HashMap<String, i64>,
    strict: bool,
}

impl Book {
    /// The reservations of the NodePools' available reserved offerings, with what each has left
    /// (the least any NodePool reports, when two disagree) minus one for each entry of
    /// `held_in_flight` (reservations NodeClaims not launched yet hold).
    pub(super) fn new(nodepools: &[NodePoolInput], held_in_flight: &[String], strict: bool) -> Self {
        let mut left: HashMap<String, i64> = HashMap::new();
        for it in nodepools.iter().flat_map(|np| &np.instance_types) {
            for r in it.offerings.iter().filter(|o| o.available).filter_map(|o| o.reservation.as_ref()) {
                left.entry(r.id.clone()).and_modify(|n| *n = (*n).min(r.capacity)).or_insert(r.capacity);
            }
        }
        for id in held_in_flight {
            if let Some(n) = left.get_mut(id) {
                *n = (*n - 1).max(0);
            }
        }
        Book { left, strict }
    }

    /// Whether no offering of the run is reserved.
    pub(super) fn is_empty(&self) -> bool {
        self.left.is_empty()
    }

    /// The reservations a NodeClaim holding `held` holds once it may launch only as `offerings`
    /// (those compatible with its requirements, of the types that still hold its pods), or why
    /// a strict run refuses the change.
    pub(super) fn to_hold<'o>(
        &self,
        held: &[String],
        offerings: impl Iterator<Item = &'o Offering>,
    ) -> Result<Vec<String>, &'static str> {
        let mut compatible = false;
        let mut out: Vec<String> = Vec::new();
        for o in offerings.filter(|o| o.available) {
            let Some(id) = o.reservation_id() else { continue };
            compatible = true;
            let can = held.iter().any(|h| h == id) || self.left.get(id).is_some_and(|n| *n > 0);
            if can && !out.iter().any(|h| h == id) {
                out.push(id.to_string());
            }
        }
        if self.strict && out.is_empty() {
            if compatible {
                return Err(NONE_LEFT);
            }
            if !held.is_empty() {
                return Err(WOULD_LOSE);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Moves a NodeClaim's holds from `old` to `new`.
    pub(super) fn hold(&mut self, old: &[String], new: &[String]) {
        for id in new.iter().filter(|id| !old.contains(id)) {
            if let Some(n) = self.left.get_mut(id) {
                *n -= 1;
            }
        }
        for id in old.iter().filter(|id| !new.contains(id)) {
            if let Some(n) = self.left.get_mut(id) {
                *n += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::scheduling::instancetypes::Reservation;

    fn reserved(id: &str, capacity: i64) -> Offering {
        Offering {
            reservation: Some(Arc::new(Reservation {
                id: id.into(),
                reservation_type: "default".into(),
                interruptible: false,
                capacity,
            })),
            ..Offering::new("z1", "reserved", 0.0, true)
        }
    }

    #[test]
    fn holds_until_the_reservation_is_used_up() {
        let offerings = [reserved("cr-1", 2), Offering::new("z1", "on-demand", 1.0, true)];
        let mut book = Book { left: HashMap::from([("cr-1".to_string(), 2)]), strict: true };
        let first = book.to_hold(&[], offerings.iter()).unwrap();
        assert_eq!(first, vec!["cr-1".to_string()]);
        book.hold(&[], &first);
        // Holding is idempotent: the same claim keeps its instance.
        assert_eq!(book.to_hold(&first, offerings.iter()).unwrap(), first);
        let second = book.to_hold(&[], offerings.iter()).unwrap();
        book.hold(&[], &second);
        assert_eq!(book.to_hold(&[], offerings.iter()), Err(NONE_LEFT));
        // Outgrowing the reserved type gives the instance back, or is refused when strict.
        assert_eq!(book.to_hold(&first, std::iter::empty()), Err(WOULD_LOSE));
        book.hold(&first, &[]);
        assert_eq!(book.to_hold(&[], offerings.iter()).unwrap(), first);
        // Without a reserved offering there is nothing to hold.
        assert_eq!(book.to_hold(&[], offerings[1..].iter()).unwrap(), Vec::<String>::new());
    }

    #[test]
    fn falling_back_never_refuses() {
        let offerings = [reserved("cr-1", 0)];
        let book = Book { left: HashMap::from([("cr-1".to_string(), 0)]), strict: false };
        assert_eq!(book.to_hold(&[], offerings.iter()).unwrap(), Vec::<String>::new());
        assert_eq!(book.to_hold(&["cr-2".to_string()], std::iter::empty()).unwrap(), Vec::<String>::new());
    }
}
