//! Capacity reservations as offerings: what each reservation has left, and the `reserved`
//! offerings of an instance type, as upstream's reserved-capacity resolver makes them.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, PoisonError, RwLock};

use crate::apis::ec2nodeclass::CapacityReservationStatus;
use crate::apis::labels::CAPACITY_TYPE_RESERVED;
use crate::scheduling::instancetypes::{Offering, Reservation};

/// Upstream divides a type's on-demand price by this for its reserved offerings: reserved
/// capacity is paid for already, so it is all but free, and types keep their order.
pub const RESERVED_PRICE_DIVISOR: f64 = 10_000_000.0;

/// The state of a capacity block close to its end (see [`super::nodeclass::CAPACITY_BLOCK_EXPIRATION`]).
pub const STATE_EXPIRING: &str = "expiring";

/// Instances left per capacity reservation: what DescribeCapacityReservations last said, less
/// the launches and plus the terminations since, and none once a launch found it exhausted.
#[derive(Debug, Default)]
pub struct Availability(RwLock<HashMap<String, i64>>);

impl Availability {
    /// Takes in what EC2 says the reservations have available.
    pub fn sync<'a>(&self, counts: impl IntoIterator<Item = (&'a str, i64)>) {
        let mut map = self.0.write().unwrap_or_else(PoisonError::into_inner);
        for (id, n) in counts {
            map.insert(id.to_string(), n.max(0));
        }
    }

    /// Instances left in reservation `id` (none when it was never listed).
    pub fn left(&self, id: &str) -> i64 {
        self.0.read().unwrap_or_else(PoisonError::into_inner).get(id).copied().unwrap_or(0)
    }

    /// An instance was launched into `id`.
    pub fn launched(&self, id: &str) {
        self.adjust(id, |n| (n - 1).max(0));
    }

    /// An instance of `id` is terminating: its slot comes back.
    pub fn terminated(&self, id: &str) {
        self.adjust(id, |n| n + 1);
    }

    /// A launch found `id` exhausted.
    pub fn exhausted(&self, id: &str) {
        self.adjust(id, |_| 0);
    }

    fn adjust(&self, id: &str, f: impl FnOnce(i64) -> i64) {
        let mut map = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = map.get_mut(id) {
            *n = f(*n);
        }
    }
}

/// The reserved offerings of the instance type `instance_type` from the class's reservations:
/// one per reservation of that type, priced at its `on_demand` price divided by
/// [`RESERVED_PRICE_DIVISOR`] (zero when unknown), available while the reservation has instances
/// `left`, is not expiring and its zone has a subnet of the class.
pub fn offerings(
    instance_type: &str,
    reservations: &[CapacityReservationStatus],
    subnet_zones: &BTreeSet<String>,
    on_demand: Option<f64>,
    left: &dyn Fn(&str) -> i64,
) -> Vec<Offering> {
    reservations
        .iter()
        .filter(|r| r.instance_type == instance_type)
        .map(|r| {
            let capacity = left(&r.id);
            let expiring = r.state.as_deref() == Some(STATE_EXPIRING);
            Offering {
                reservation: Some(Arc::new(Reservation {
                    id: r.id.clone(),
                    reservation_type: r.reservation_type.clone().unwrap_or_else(|| "default".to_string()),
                    interruptible: r.interruptible.unwrap_or(false),
                    capacity,
                })),
                ..Offering::new(
                    r.availability_zone.clone(),
                    CAPACITY_TYPE_RESERVED,
                    on_demand.map(|p| p / RESERVED_PRICE_DIVISOR).unwrap_or(0.0),
                    capacity > 0 && !expiring && subnet_zones.contains(&r.availability_zone),
                )
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(id: &str, it: &str, zone: &str, kind: &str, state: &str) -> CapacityReservationStatus {
        CapacityReservationStatus {
            id: id.into(),
            availability_zone: zone.into(),
            instance_type: it.into(),
            owner_id: "123456789012".into(),
            instance_match_criteria: Some("targeted".into()),
            reservation_type: Some(kind.into()),
            state: Some(state.into()),
            end_time: None,
            interruptible: Some(false),
        }
    }

    #[test]
    fn reserved_offerings_as_upstream_makes_them() {
        let reservations = [
            status("cr-1", "m5.large", "us-west-2a", "default", "active"),
            status("cr-2", "m5.large", "us-west-2b", "capacity-block", "expiring"),
            status("cr-3", "c5.large", "us-west-2a", "default", "active"),
            status("cr-4", "m5.large", "us-west-2c", "default", "active"),
        ];
        let zones: BTreeSet<String> = ["us-west-2a".to_string(), "us-west-2b".to_string()].into();
        let left = |id: &str| if id == "cr-1" { 3 } else { 1 };
        let got = offerings("m5.large", &reservations, &zones, Some(0.096), &left);
        let summary: Vec<(&str, bool, i64)> = got
            .iter()
            .map(|o| {
                let r = o.reservation.as_ref().unwrap();
                (r.id.as_str(), o.available, r.capacity)
            })
            .collect();
        // cr-2 is expiring, cr-4 in a zone without a subnet of the class.
        assert_eq!(summary, vec![("cr-1", true, 3), ("cr-2", false, 1), ("cr-4", false, 1)]);
        assert!(got.iter().all(|o| o.capacity_type == "reserved"));
        assert!((got[0].price - 0.096 / RESERVED_PRICE_DIVISOR).abs() < 1e-15);
        assert_eq!(got[1].reservation.as_ref().unwrap().reservation_type, "capacity-block");
        // A reservation that is used up is not available.
        assert!(!offerings("c5.large", &reservations, &zones, None, &|_| 0)[0].available);
    }

    #[test]
    fn availability_follows_launches_and_terminations() {
        let a = Availability::default();
        a.sync([("cr-1", 2)]);
        a.launched("cr-1");
        assert_eq!(a.left("cr-1"), 1);
        a.terminated("cr-1");
        assert_eq!(a.left("cr-1"), 2);
        a.exhausted("cr-1");
        assert_eq!(a.left("cr-1"), 0);
        a.launched("cr-1");
        assert_eq!(a.left("cr-1"), 0);
        // Reservations never listed have nothing left, and are not tracked.
        a.terminated("cr-9");
        assert_eq!(a.left("cr-9"), 0);
    }
}
