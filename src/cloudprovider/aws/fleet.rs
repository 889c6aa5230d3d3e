//! Launch decisions, kept pure: which capacity type, which (instance type, zone, subnet)
//! overrides in which order, which AMI each type boots, and what a CreateFleet answer means.

use std::collections::BTreeMap;

use crate::apis::ec2nodeclass::AmiStatus;
use crate::apis::labels::{CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT, LABEL_CAPACITY_TYPE};
use crate::cloudprovider::OfferingKey;
use crate::scheduling::instancetypes::{InstanceType, compare_price};
use crate::scheduling::requirements::Requirements;

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
}

/// Spot when the requirements allow it and some type has an available spot offering they
/// allow; else on-demand when allowed and offered; else `None`.
pub fn capacity_type(types: &[&InstanceType], reqs: &Requirements) -> Option<&'static str> {
    let offered = |ct: &str| {
        reqs.allows(LABEL_CAPACITY_TYPE, ct)
            && types.iter().any(|it| it.compatible_offerings(reqs).any(|o| o.capacity_type == ct))
    };
    [CAPACITY_TYPE_SPOT, CAPACITY_TYPE_ON_DEMAND].into_iter().find(|ct| offered(ct))
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

/// The offerings a fleet's errors show to be out of capacity.
pub fn unavailable_offerings(errors: &[FleetError], capacity_type: &str) -> Vec<OfferingKey> {
    let mut out: Vec<OfferingKey> = errors
        .iter()
        .filter(|e| is_insufficient_capacity(&e.code))
        .filter_map(|e| {
            Some(OfferingKey {
                instance_type: e.instance_type.clone()?,
                zone: e.zone.clone()?,
                capacity_type: capacity_type.to_string(),
            })
        })
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
                .map(|(z, c, p, a)| Offering {
                    zone: z.to_string(),
                    capacity_type: c.to_string(),
                    price: *p,
                    available: *a,
                })
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
        let got = unavailable_offerings(
            &[
                e("InsufficientInstanceCapacity", "m5.large"),
                e("InvalidParameter", "c5.large"),
                e("InsufficientInstanceCapacity", "m5.large"),
            ],
            "spot",
        );
        assert_eq!(
            got,
            vec![OfferingKey {
                instance_type: "m5.large".into(),
                zone: "a".into(),
                capacity_type: "spot".into()
            }]
        );
    }
}
