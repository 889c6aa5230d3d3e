//! Launch decisions, kept pure: which capacity type, which (instance type, zone, subnet)
//! overrides in which order, which AMI each type boots, and what a CreateFleet answer means.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::unavailable::Scope;
use crate::apis::ec2nodeclass::AmiStatus;
use crate::apis::labels::{
    CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_RESERVED, CAPACITY_TYPE_SPOT, LABEL_CAPACITY_TYPE,
};
use crate::cloudprovider::OfferingKey;
use crate::scheduling::instancetypes::{InstanceType, Reservation, compare_price};
use crate::scheduling::requirements::Requirements;

/// The `capacity-reservation-type` of a capacity block, also the EC2 market type, instance
/// lifecycle and fleet target type of its launches.
pub const CAPACITY_BLOCK: &str = "capacity-block";
/// The EC2 market type (and instance lifecycle) of a launch into an interruptible capacity
/// reservation.
pub const INTERRUPTIBLE_RESERVATION: &str = "interruptible-capacity-reservation";
/// The fleet target type of a launch into interruptible capacity reservations.
pub const RESERVED_CAPACITY: &str = "reserved-capacity";

/// The EC2 market type of a launch into the reservation `r`: a capacity block's or an
/// interruptible reservation's own; `None` for a plain one (an on-demand launch).
pub fn reserved_market_type(r: &Reservation) -> Option<&'static str> {
    if r.reservation_type == CAPACITY_BLOCK {
        Some(CAPACITY_BLOCK)
    } else if r.interruptible {
        Some(INTERRUPTIBLE_RESERVATION)
    } else {
        None
    }
}

/// The reservation `id` an instance of EC2 lifecycle `lifecycle` runs in, as far as the instance
/// shows it (its kind; the instances it has left are not known from the instance).
pub fn instance_reservation(id: &str, lifecycle: Option<&str>) -> Reservation {
    Reservation {
        id: id.to_string(),
        reservation_type: if lifecycle == Some(CAPACITY_BLOCK) { CAPACITY_BLOCK } else { "default" }
            .to_string(),
        interruptible: lifecycle == Some(INTERRUPTIBLE_RESERVATION),
        capacity: 0,
    }
}

/// The CreateFleet target capacity type of a launch of `capacity_type` whose reservations (a
/// reserved launch's, all of one kind) launch with the market type `market`, as upstream's: a
/// reserved launch is an on-demand one, a capacity block's and an interruptible reservation's
/// have their own target types.
pub fn fleet_target_type<'a>(capacity_type: &'a str, market: Option<&str>) -> &'a str {
    match (capacity_type, market) {
        (CAPACITY_TYPE_RESERVED, Some(CAPACITY_BLOCK)) => CAPACITY_BLOCK,
        (CAPACITY_TYPE_RESERVED, Some(INTERRUPTIBLE_RESERVATION)) => RESERVED_CAPACITY,
        (CAPACITY_TYPE_RESERVED, _) => CAPACITY_TYPE_ON_DEMAND,
        (other, _) => other,
    }
}

/// At most this many instance types go into one CreateFleet request.
pub const MAX_INSTANCE_TYPES: usize = 60;

/// Error codes of CreateFleet that mean an offering has no capacity right now.
pub const INSUFFICIENT_CAPACITY_CODES: &[&str] = &[
    "InsufficientInstanceCapacity",
    "MaxSpotInstanceCountExceeded",
    "VcpuLimitExceeded",
    "UnfulfillableCapacity",
    "Unsupported",
    "InsufficientFreeAddressesInSubnet",
    "ReservationCapacityExceeded",
];

/// Whether a CreateFleet error code means "no capacity for this offering".
pub fn is_insufficient_capacity(code: &str) -> bool {
    INSUFFICIENT_CAPACITY_CODES.contains(&code)
}

/// Whether an EC2 error code says a launch template (or the version asked for) does not exist:
/// `InvalidLaunchTemplateName.NotFoundException`, `InvalidLaunchTemplateId.NotFound`,
/// `InvalidLaunchTemplateId.VersionNotFound`, ...
pub fn is_launch_template_not_found(code: &str) -> bool {
    code.starts_with("InvalidLaunchTemplate") && code.contains("NotFound")
}

/// One (instance type, zone, subnet) the fleet may launch, at a price.
#[derive(Clone, Debug, PartialEq)]
pub struct Override {
    /// Instance type.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Subnet in that zone.
    pub subnet_id: String,
    /// Hourly price of the offering.
    pub price: f64,
    /// The capacity reservation it launches into (a `reserved` launch).
    pub reservation: Option<Arc<Reservation>>,
}

/// Reserved, then spot, then on-demand: the first the requirements allow and some type has an
/// available offering of; else `None`.
pub fn capacity_type(types: &[&InstanceType], reqs: &Requirements) -> Option<&'static str> {
    let offered = |ct: &str| {
        reqs.allows(LABEL_CAPACITY_TYPE, ct)
            && types.iter().any(|it| it.compatible_offerings(reqs).any(|o| o.capacity_type == ct))
    };
    [CAPACITY_TYPE_RESERVED, CAPACITY_TYPE_SPOT, CAPACITY_TYPE_ON_DEMAND].into_iter().find(|ct| offered(ct))
}

/// The overrides of a launch: for `capacity_type`, every available offering the requirements
/// allow whose zone has a subnet, of the cheapest [`MAX_INSTANCE_TYPES`] types, cheapest first.
pub fn overrides(
    types: &[&InstanceType],
    reqs: &Requirements,
    capacity_type: &str,
    subnets_by_zone: &BTreeMap<String, String>,
) -> Vec<Override> {
    let mut reqs = reqs.clone();
    reqs.add(LABEL_CAPACITY_TYPE, crate::scheduling::requirements::Requirement::in_values([capacity_type]));
    if capacity_type == CAPACITY_TYPE_RESERVED {
        return reserved_overrides(types, &reqs, subnets_by_zone);
    }
    let usable = |it: &InstanceType| {
        it.compatible_offerings(&reqs)
            .filter(|o| subnets_by_zone.contains_key(&o.zone))
            .map(|o| o.price)
            .min_by(f64::total_cmp)
    };
    let mut ranked: Vec<(&InstanceType, f64)> =
        types.iter().filter_map(|it| Some((*it, usable(it)?))).collect();
    ranked.sort_by(|a, b| compare_price(Some(a.1), Some(b.1)).then(a.0.name.cmp(&b.0.name)));
    ranked.truncate(MAX_INSTANCE_TYPES);
    let mut out: Vec<Override> = ranked
        .iter()
        .flat_map(|(it, _)| {
            let reqs = &reqs;
            it.compatible_offerings(reqs).filter_map(move |o| {
                Some(Override {
                    instance_type: it.name.clone(),
                    zone: o.zone.clone(),
                    subnet_id: subnets_by_zone.get(&o.zone)?.clone(),
                    price: o.price,
                    reservation: None,
                })
            })
        })
        .collect();
    out.sort_by(|a, b| {
        a.price.total_cmp(&b.price).then(a.instance_type.cmp(&b.instance_type)).then(a.zone.cmp(&b.zone))
    });
    out
}

/// The subnet used in each zone: the one with the most free addresses (subnets come sorted so).
/// The overrides of a reserved launch, as upstream filters them: the reservations of one kind
/// (the kind with the cheapest offering; on a tie, plain reservations before capacity blocks
/// before interruptible ones), one reservation per instance type and zone (the one with the
/// most instances left), and of a capacity block only its cheapest offering.
fn reserved_overrides(
    types: &[&InstanceType],
    reqs: &Requirements,
    subnets_by_zone: &BTreeMap<String, String>,
) -> Vec<Override> {
    let kind = |r: &Reservation| match (r.reservation_type.as_str(), r.interruptible) {
        (CAPACITY_BLOCK, _) => 1,
        (_, false) => 0,
        (_, true) => 2,
    };
    let mut offers: Vec<Override> = types
        .iter()
        .flat_map(|it| {
            it.compatible_offerings(reqs).filter_map(|o| {
                Some(Override {
                    instance_type: it.name.clone(),
                    zone: o.zone.clone(),
                    subnet_id: subnets_by_zone.get(&o.zone)?.clone(),
                    price: o.price,
                    reservation: Some(Arc::clone(o.reservation.as_ref()?)),
                })
            })
        })
        .collect();
    let kind_of = |o: &Override| o.reservation.as_deref().map(kind).unwrap_or(3);
    let Some(chosen) = offers
        .iter()
        .min_by(|a, b| a.price.total_cmp(&b.price).then(kind_of(a).cmp(&kind_of(b))))
        .map(kind_of)
    else {
        return Vec::new();
    };
    offers.retain(|o| kind_of(o) == chosen);
    let capacity = |o: &Override| o.reservation.as_ref().map(|r| r.capacity).unwrap_or(0);
    let id = |o: &Override| o.reservation.as_ref().map(|r| r.id.clone()).unwrap_or_default();
    offers.sort_by(|a, b| {
        a.price
            .total_cmp(&b.price)
            .then(a.instance_type.cmp(&b.instance_type))
            .then(a.zone.cmp(&b.zone))
            .then(capacity(b).cmp(&capacity(a)))
            .then(id(a).cmp(&id(b)))
    });
    offers.dedup_by(|later, first| later.instance_type == first.instance_type && later.zone == first.zone);
    if chosen == 1 {
        offers.truncate(1);
    }
    offers.truncate(MAX_INSTANCE_TYPES);
    offers
}

pub fn subnets_by_zone<'a>(
    subnets: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (zone, id) in subnets {
        out.entry(zone.to_string()).or_insert_with(|| id.to_string());
    }
    out
}

/// The first (newest) AMI whose requirements the instance type meets.
pub fn select_ami<'a>(amis: &'a [AmiStatus], it: &InstanceType) -> Option<&'a AmiStatus> {
    ami_for(amis, &it.requirements)
}

/// The first (newest) AMI whose requirements an instance type of `requirements` meets.
pub fn ami_for<'a>(amis: &'a [AmiStatus], requirements: &Requirements) -> Option<&'a AmiStatus> {
    amis.iter().find(|ami| {
        Requirements::from_node_selector(&ami.requirements)
            .is_ok_and(|reqs| requirements.intersects(&reqs).is_ok())
    })
}

/// An error CreateFleet reported for one override.
#[derive(Clone, Debug, PartialEq)]
pub struct FleetError {
    /// Error code.
    pub code: String,
    /// Message.
    pub message: String,
    /// The override's instance type, when given.
    pub instance_type: Option<String>,
    /// The override's zone (or the zone of its subnet), when known.
    pub zone: Option<String>,
}

/// Part of EC2's message when a spread placement group has its most instances in a zone.
const SPREAD_GROUP_LIMIT: &str = "limit of instances in this spread placement group";

/// The offerings a fleet's errors show to be out of capacity, with where, as upstream scopes
/// them: a launch into a placement group (`scope`) only there; a spread group that reached its
/// limit in a zone makes every type the launch tried (`types`) unavailable in that zone, for
/// that group.
pub fn unavailable_offerings(
    errors: &[FleetError],
    capacity_type: &str,
    scope: &Scope,
    types: &[&str],
) -> Vec<(OfferingKey, Scope)> {
    let key = |instance_type: &str, zone: &str| OfferingKey {
        instance_type: instance_type.to_string(),
        zone: zone.to_string(),
        capacity_type: capacity_type.to_string(),
    };
    let group = match scope {
        Scope::Group(g) | Scope::Partition(g, _) => Some(g),
        Scope::Everywhere => None,
    };
    let mut out: Vec<(OfferingKey, Scope)> = errors
        .iter()
        .filter(|e| is_insufficient_capacity(&e.code))
        .flat_map(|e| {
            let zone = e.zone.as_deref().unwrap_or_default();
            match group {
                Some(g) if e.message.contains(SPREAD_GROUP_LIMIT) && !zone.is_empty() => {
                    types.iter().map(|t| (key(t, zone), Scope::Group(g.clone()))).collect()
                }
                _ => match (&e.instance_type, &e.zone) {
                    (Some(t), Some(z)) => vec![(key(t, z), scope.clone())],
                    _ => Vec::new(),
                },
            }
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The capacity reservations a reserved launch's errors show to be exhausted: those of the
/// `overrides` whose instance type and zone an insufficient-capacity error names.
pub fn exhausted_reservations(errors: &[FleetError], overrides: &[&Override]) -> Vec<String> {
    let mut out: Vec<String> = errors
        .iter()
        .filter(|e| is_insufficient_capacity(&e.code))
        .flat_map(|e| {
            overrides.iter().filter(move |o| {
                e.instance_type.as_deref() == Some(o.instance_type.as_str())
                    && e.zone.as_deref() == Some(o.zone.as_str())
            })
        })
        .filter_map(|o| o.reservation.as_ref().map(|r| r.id.clone()))
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels::{LABEL_ARCH, LABEL_INSTANCE_GPU_COUNT};
    use crate::scheduling::instancetypes::{Offering, Overhead};
    use crate::scheduling::requirements::Requirement;
    use crate::scheduling::resources::Resources;

    fn it(name: &str, offerings: &[(&str, &str, f64, bool)]) -> InstanceType {
        let mut reqs = Requirements::new();
        reqs.add(LABEL_ARCH, Requirement::in_values(["amd64"]));
        if name.starts_with('g') {
            reqs.add(LABEL_INSTANCE_GPU_COUNT, Requirement::in_values(["1"]));
        } else {
            reqs.add(LABEL_INSTANCE_GPU_COUNT, Requirement::does_not_exist());
        }
        InstanceType::new(
            name,
            reqs,
            Resources::default(),
            Overhead::default(),
            offerings
                .iter()
                .map(|(z, c, p, a)| Offering::new(z.to_string(), c.to_string(), *p, *a))
                .collect(),
        )
    }

    fn subnets() -> BTreeMap<String, String> {
        subnets_by_zone([("a", "subnet-a1"), ("a", "subnet-a2"), ("b", "subnet-b")])
    }

    #[test]
    fn prefers_spot_when_allowed() {
        let m5 = it("m5.large", &[("a", "on-demand", 0.096, true), ("a", "spot", 0.03, true)]);
        let c5 = it("c5.large", &[("b", "on-demand", 0.085, true)]);
        let types = [&m5, &c5];
        assert_eq!(capacity_type(&types, &Requirements::new()), Some("spot"));
        let mut od = Requirements::new();
        od.add(LABEL_CAPACITY_TYPE, Requirement::in_values(["on-demand"]));
        assert_eq!(capacity_type(&types, &od), Some("on-demand"));
        let gone = it("x.large", &[("a", "spot", 0.01, false)]);
        let mut spot = Requirements::new();
        spot.add(LABEL_CAPACITY_TYPE, Requirement::in_values(["spot"]));
        assert_eq!(capacity_type(&[&gone], &spot), None);
    }

    #[test]
    fn overrides_cheapest_first_with_subnets() {
        let m5 = it(
            "m5.large",
            &[
                ("a", "on-demand", 0.096, true),
                ("b", "on-demand", 0.096, true),
                ("c", "on-demand", 0.01, true),
            ],
        );
        let c5 = it("c5.large", &[("a", "on-demand", 0.085, true), ("b", "on-demand", 0.085, false)]);
        let t3 = it("t3.large", &[("a", "spot", 0.02, true)]);
        let got = overrides(&[&m5, &c5, &t3], &Requirements::new(), "on-demand", &subnets());
        let names: Vec<(&str, &str, &str)> =
            got.iter().map(|o| (o.instance_type.as_str(), o.zone.as_str(), o.subnet_id.as_str())).collect();
        assert_eq!(
            names,
            vec![
                ("c5.large", "a", "subnet-a1"),
                ("m5.large", "a", "subnet-a1"),
                ("m5.large", "b", "subnet-b")
            ]
        );
    }

    fn with_reservations(base: InstanceType, reservations: &[(&str, &str, &str, i64)]) -> InstanceType {
        let mut offerings = base.offerings.clone();
        for (id, zone, kind, left) in reservations {
            offerings.push(Offering {
                reservation: Some(Arc::new(Reservation {
                    id: id.to_string(),
                    reservation_type: kind.to_string(),
                    interruptible: false,
                    capacity: *left,
                })),
                ..Offering::new(*zone, CAPACITY_TYPE_RESERVED, 0.0000001, *left > 0)
            });
        }
        InstanceType::new(
            base.name.clone(),
            base.requirements.clone(),
            Resources::default(),
            Overhead::default(),
            offerings,
        )
    }

    #[test]
    fn reserved_launches_go_into_one_reservation_per_type_and_zone() {
        let m5 = with_reservations(
            it("m5.large", &[("a", "on-demand", 0.096, true)]),
            &[("cr-small", "a", "default", 1), ("cr-big", "a", "default", 5), ("cr-b", "b", "default", 2)],
        );
        let c5 = with_reservations(
            it("c5.large", &[("a", "on-demand", 0.085, true)]),
            &[("cr-gone", "a", "default", 0)],
        );
        let types = [&m5, &c5];
        assert_eq!(capacity_type(&types, &Requirements::new()), Some("reserved"));
        let got = overrides(&types, &Requirements::new(), "reserved", &subnets());
        let ids: Vec<(&str, &str)> =
            got.iter().map(|o| (o.zone.as_str(), o.reservation.as_ref().unwrap().id.as_str())).collect();
        assert_eq!(ids, vec![("a", "cr-big"), ("b", "cr-b")]);
        // A claim asking for one reservation gets only that one.
        let mut one = Requirements::new();
        one.add(crate::apis::labels::LABEL_CAPACITY_RESERVATION_ID, Requirement::in_values(["cr-small"]));
        let got = overrides(&types, &one, "reserved", &subnets());
        assert_eq!(
            got.iter().map(|o| o.reservation.as_ref().unwrap().id.as_str()).collect::<Vec<_>>(),
            ["cr-small"]
        );
        // Capacity blocks: one offering; plain reservations win a tie.
        let p5 = with_reservations(
            it("p5.48xlarge", &[("a", "on-demand", 98.0, true)]),
            &[("cb-1", "a", "capacity-block", 1), ("cb-2", "b", "capacity-block", 1)],
        );
        let got = overrides(&[&p5], &Requirements::new(), "reserved", &subnets());
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].reservation.as_ref().unwrap().id, "cb-1");
        let got = overrides(&[&p5, &m5], &Requirements::new(), "reserved", &subnets());
        assert!(got.iter().all(|o| o.reservation.as_ref().unwrap().reservation_type == "default"));
        // Without an available reserved offering: spot, then on-demand.
        let mut od = Requirements::new();
        od.add(LABEL_CAPACITY_TYPE, Requirement::in_values(["on-demand", "spot"]));
        assert_eq!(capacity_type(&types, &od), Some("on-demand"));
        assert_eq!(capacity_type(&[&c5], &Requirements::new()), Some("on-demand"));
    }

    #[test]
    fn each_kind_of_reservation_launches_with_its_market_and_fleet_target_type() {
        let odcr = instance_reservation("cr-1", None);
        let block = instance_reservation("cr-2", Some("capacity-block"));
        let interruptible = instance_reservation("cr-3", Some("interruptible-capacity-reservation"));
        assert_eq!((odcr.reservation_type.as_str(), odcr.interruptible), ("default", false));
        assert_eq!((block.reservation_type.as_str(), block.interruptible), ("capacity-block", false));
        assert_eq!((interruptible.reservation_type.as_str(), interruptible.interruptible), ("default", true));
        let markets: Vec<Option<&str>> =
            [&odcr, &block, &interruptible].into_iter().map(reserved_market_type).collect();
        assert_eq!(markets, [None, Some("capacity-block"), Some("interruptible-capacity-reservation")]);
        let targets: Vec<&str> = markets.iter().map(|m| fleet_target_type("reserved", *m)).collect();
        assert_eq!(targets, ["on-demand", "capacity-block", "reserved-capacity"]);
        assert_eq!(fleet_target_type("spot", None), "spot");
        assert_eq!(fleet_target_type("on-demand", None), "on-demand");
    }

    #[test]
    fn exhausted_reservations_are_named_by_their_override() {
        let m5 = with_reservations(
            it("m5.large", &[]),
            &[("cr-a", "a", "default", 1), ("cr-b", "b", "default", 1)],
        );
        let got = overrides(&[&m5], &Requirements::new(), "reserved", &subnets());
        let refs: Vec<&Override> = got.iter().collect();
        let error = |code: &str, zone: &str| FleetError {
            code: code.into(),
            message: String::new(),
            instance_type: Some("m5.large".into()),
            zone: Some(zone.into()),
        };
        let errors = [error("ReservationCapacityExceeded", "b"), error("InvalidParameterValue", "a")];
        assert_eq!(exhausted_reservations(&errors, &refs), vec!["cr-b".to_string()]);
    }

    #[test]
    fn at_most_sixty_types() {
        let types: Vec<InstanceType> = (0..70)
            .map(|i| it(&format!("t{i:02}.large"), &[("a", "on-demand", 1.0 + f64::from(i), true)]))
            .collect();
        let refs: Vec<&InstanceType> = types.iter().collect();
        let got = overrides(&refs, &Requirements::new(), "on-demand", &subnets());
        assert_eq!(got.len(), MAX_INSTANCE_TYPES);
        assert_eq!(got[0].instance_type, "t00.large");
        assert_eq!(got[59].instance_type, "t59.large");
    }

    #[test]
    fn amis_match_instance_types() {
        let standard = AmiStatus {
            id: "ami-std".into(),
            requirements: crate::cloudprovider::aws::amifamily::alias_queries(
                crate::apis::ec2nodeclass::AmiFamily::AL2023,
                "latest",
                "1.34",
            )[0]
            .requirements
            .clone(),
            ..Default::default()
        };
        let nvidia = AmiStatus {
            id: "ami-gpu".into(),
            requirements: crate::cloudprovider::aws::amifamily::alias_queries(
                crate::apis::ec2nodeclass::AmiFamily::AL2023,
                "latest",
                "1.34",
            )[2]
            .requirements
            .clone(),
            ..Default::default()
        };
        let amis = [standard, nvidia];
        assert_eq!(select_ami(&amis, &it("m5.large", &[])).map(|a| a.id.as_str()), Some("ami-std"));
        assert_eq!(select_ami(&amis, &it("g4dn.xlarge", &[])).map(|a| a.id.as_str()), Some("ami-gpu"));
    }

    #[test]
    fn missing_launch_templates() {
        for code in [
            "InvalidLaunchTemplateName.NotFoundException",
            "InvalidLaunchTemplateId.NotFound",
            "InvalidLaunchTemplateId.VersionNotFound",
        ] {
            assert!(is_launch_template_not_found(code), "{code}");
        }
        for code in
            ["InvalidLaunchTemplateId.Malformed", "InvalidSubnetID.NotFound", "InvalidAMIID.NotFound", ""]
        {
            assert!(!is_launch_template_not_found(code), "{code}");
        }
    }

    #[test]
    fn fleet_errors() {
        let e = |code: &str, it: &str| FleetError {
            code: code.into(),
            message: String::new(),
            instance_type: Some(it.into()),
            zone: Some("a".into()),
        };
        let errors = [
            e("InsufficientInstanceCapacity", "m5.large"),
            e("InvalidParameter", "c5.large"),
            e("InsufficientInstanceCapacity", "m5.large"),
        ];
        let key = |it: &str| OfferingKey {
            instance_type: it.into(),
            zone: "a".into(),
            capacity_type: "spot".into(),
        };
        let got = unavailable_offerings(&errors, "spot", &Scope::Everywhere, &["m5.large", "c5.large"]);
        assert_eq!(got, vec![(key("m5.large"), Scope::Everywhere)]);
        // In a placement group: only there (and in the partition the launch targeted).
        let partition = Scope::of_launch(Some("pg-1"), Some(2));
        let got = unavailable_offerings(&errors, "spot", &partition, &["m5.large", "c5.large"]);
        assert_eq!(got, vec![(key("m5.large"), partition.clone())]);
        // A spread group full in the zone: every type tried, for the group.
        let spread = FleetError {
            message: "You have reached the limit of instances in this spread placement group.".into(),
            ..e("InsufficientInstanceCapacity", "m5.large")
        };
        let group = Scope::of_launch(Some("pg-1"), None);
        let got =
            unavailable_offerings(std::slice::from_ref(&spread), "spot", &group, &["m5.large", "c5.large"]);
        assert_eq!(got, vec![(key("c5.large"), group.clone()), (key("m5.large"), group.clone())]);
        let got = unavailable_offerings(&[spread], "spot", &Scope::Everywhere, &["m5.large", "c5.large"]);
        assert_eq!(got, vec![(key("m5.large"), Scope::Everywhere)], "without a group: the one offering");
    }
}
