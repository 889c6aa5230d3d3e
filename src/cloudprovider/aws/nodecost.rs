//! What a node costs besides its instance's hourly list price, so that plans compare what a node
//! really costs: the EBS volumes of its EC2NodeClass, a public IPv4 address when its subnets (or
//! the class) give it one, and, for a burstable (T) type, the CPU above its baseline.
//!
//! Rates are AWS's published us-east-1 prices (EBS pricing page, VPC pricing page for public
//! IPv4 addresses, the EC2 user guide's burstable performance tables for T2/T3/T3a/T4g baselines
//! and their unlimited mode's surplus credits); other regions differ by a few per cent.
//!
//! A burstable type is planned one of three ways ([`BurstableCpu`], the `BURSTABLE_CPU`
//! setting): `baseline` (the default) plans only the CPU its baseline sustains, so that it wins
//! only when the pods fit there (a NodePool that names the family, category or type keeps its
//! full CPU: it asked for bursts); `unlimited` plans its full CPU and prices the CPU above the
//! baseline at the surplus-credit rate, as if the pods used what they request; `ignore` plans
//! its full CPU at its list price (upstream's behaviour). A t1 type states no baseline and has
//! no unlimited mode: in both `baseline` and `unlimited` it is planned with no CPU unless the
//! NodePool asks for it.

use std::str::FromStr;
use std::sync::Arc;

use crate::apis::ec2nodeclass::{BlockDeviceMapping, EC2NodeClassSpec, VolumeType};
use crate::apis::labels::{LABEL_INSTANCE_CATEGORY, LABEL_INSTANCE_FAMILY, LABEL_INSTANCE_TYPE};
use crate::scheduling::instancetypes::InstanceType;
use crate::scheduling::requirements::Requirements;
use crate::scheduling::resources::{CPU, Resources};

use super::amifamily;
use super::launchtemplate::volume_size_gib;

/// Hours in a month, as AWS bills monthly rates.
pub const HOURS_PER_MONTH: f64 = 730.0;
/// A public IPv4 address, per hour.
pub const PUBLIC_IPV4_PER_HOUR: f64 = 0.005;
/// Surplus CPU credits of a T2/T3/T3a/T4g instance in unlimited mode, per vCPU-hour (Linux).
pub const SURPLUS_PER_VCPU_HOUR: f64 = 0.05;

/// Monthly rates of an EBS volume type: per GB, and per IOPS and MiB/s provisioned above what
/// the type includes.
struct VolumeRates {
    per_gb: f64,
    per_iops: f64,
    included_iops: i64,
    per_mibps: f64,
    included_mibps: i64,
}

fn rates(t: VolumeType) -> VolumeRates {
    let plain =
        |per_gb| VolumeRates { per_gb, per_iops: 0.0, included_iops: 0, per_mibps: 0.0, included_mibps: 0 };
    match t {
        VolumeType::Gp3 => VolumeRates {
            per_gb: 0.08,
            per_iops: 0.005,
            included_iops: 3000,
            per_mibps: 0.04,
            included_mibps: 125,
        },
        VolumeType::Gp2 => plain(0.10),
        VolumeType::Io1 | VolumeType::Io2 => VolumeRates { per_iops: 0.065, ..plain(0.125) },
        VolumeType::St1 => plain(0.045),
        VolumeType::Sc1 => plain(0.015),
        VolumeType::Standard => plain(0.05),
    }
}

/// The hourly cost of the volume of a block device mapping; none without an EBS size (a volume
/// sized by its snapshot costs what the snapshot says, unknown here). An unset type is EC2's
/// default, gp2.
pub fn volume_per_hour(m: &BlockDeviceMapping) -> f64 {
    let Some(ebs) = &m.ebs else { return 0.0 };
    let Some(gib) = ebs.volume_size.as_deref().and_then(volume_size_gib) else { return 0.0 };
    let r = rates(ebs.volume_type.unwrap_or(VolumeType::Gp2));
    let above = |given: Option<i64>, included: i64| given.map_or(0, |g| (g - included).max(0)) as f64;
    let monthly = f64::from(gib) * r.per_gb
        + above(ebs.iops, r.included_iops) * r.per_iops
        + above(ebs.throughput, r.included_mibps) * r.per_mibps;
    monthly / HOURS_PER_MONTH
}

/// What every node of a class costs besides its instance, per hour.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NodeCost {
    /// Its EBS volumes.
    pub volumes: f64,
    /// Its public IPv4 address, when it gets one.
    pub public_ipv4: f64,
}

impl NodeCost {
    /// The cost of a node with the volumes of `mappings` and, when `public_ipv4`, a public IPv4
    /// address.
    pub fn of(mappings: &[BlockDeviceMapping], public_ipv4: bool) -> Self {
        NodeCost {
            volumes: mappings.iter().map(volume_per_hour).sum(),
            public_ipv4: if public_ipv4 { PUBLIC_IPV4_PER_HOUR } else { 0.0 },
        }
    }

    /// The cost of a node of the class `spec` (its block device mappings, or its AMI family's
    /// default ones); a public IPv4 address when the class asks for one, or does not say and
    /// `subnets_public` (its subnets give one).
    pub fn of_class(spec: &EC2NodeClassSpec, subnets_public: bool) -> Self {
        let family = amifamily::family_of(spec);
        NodeCost::of(
            &amifamily::block_device_mappings(spec, family),
            spec.associate_public_ip_address.unwrap_or(subnets_public),
        )
    }

    /// Per hour, in all.
    pub fn per_hour(&self) -> f64 {
        self.volumes + self.public_ipv4
    }
}

/// How plans treat burstable types' CPU (see the module's documentation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BurstableCpu {
    /// Usable CPU is the baseline, unless the NodePool asks for the type.
    #[default]
    Baseline,
    /// Full CPU, the part above the baseline priced at the surplus-credit rate.
    Unlimited,
    /// Full CPU at the list price.
    Ignore,
}

impl FromStr for BurstableCpu {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "baseline" => Ok(BurstableCpu::Baseline),
            "unlimited" => Ok(BurstableCpu::Unlimited),
            "ignore" => Ok(BurstableCpu::Ignore),
            _ => Err(format!("{s:?} is not one of baseline, unlimited, ignore")),
        }
    }
}

/// The CPU credits a burstable type earns per hour (one credit: one vCPU for one minute), from
/// the EC2 user guide's tables; `None` for other types.
pub fn credits_per_hour(instance_type: &str) -> Option<f64> {
    let (family, size) = instance_type.split_once('.')?;
    let t2 = matches!(family, "t2");
    if !t2 && !matches!(family, "t3" | "t3a" | "t4g") {
        return None;
    }
    let credits = match (size, t2) {
        ("nano", true) => 3.0,
        ("micro", true) => 6.0,
        ("small", true) => 12.0,
        ("medium", true) => 24.0,
        ("large", true) => 36.0,
        ("xlarge", true) => 54.0,
        ("2xlarge", true) => 81.0,
        ("nano", false) => 6.0,
        ("micro", false) => 12.0,
        ("small", false) | ("medium", false) => 24.0,
        ("large", false) => 36.0,
        ("xlarge", false) => 96.0,
        ("2xlarge", false) => 192.0,
        _ => return None,
    };
    Some(credits)
}

/// Whether `instance_type` is of a burstable family that publishes no baseline and has no
/// unlimited mode: t1, the previous generation's, which runs a small, unstated share of a vCPU
/// and bursts when the host has cycles to spare. Nothing of its CPU can be counted on.
fn bursts_without_baseline(instance_type: &str) -> bool {
    instance_type.split_once('.').is_some_and(|(family, _)| family == "t1")
}

/// The CPU a burstable type sustains, in millicores (its credits per hour over 60 minutes); none
/// for a t1 type, which states none.
pub fn baseline_millis(instance_type: &str) -> Option<i64> {
    if bursts_without_baseline(instance_type) {
        return Some(0);
    }
    credits_per_hour(instance_type).map(|c| (c / 60.0 * 1000.0).round() as i64)
}

/// What the surplus credits of `cpu` millicores, used all the time on an `instance_type` in
/// unlimited mode, cost per hour: the CPU above the type's baseline at the surplus rate; nothing
/// on a type that is not burstable, or (t1) cannot buy surplus.
pub fn surplus_per_hour(instance_type: &str, cpu: i64) -> f64 {
    match baseline_millis(instance_type) {
        Some(baseline) if !bursts_without_baseline(instance_type) => {
            (cpu - baseline).max(0) as f64 / 1000.0 * SURPLUS_PER_VCPU_HOUR
        }
        _ => 0.0,
    }
}

/// `it` priced at its full cost: each offering's price plus `cost` and, in unlimited mode, the
/// surplus credits of a burstable type whose allocatable CPU is all requested. The list price
/// stays on each offering.
pub fn priced(it: &InstanceType, cost: &NodeCost, mode: BurstableCpu) -> InstanceType {
    let surplus = match mode {
        BurstableCpu::Unlimited => surplus_per_hour(&it.name, it.allocatable().cpu),
        _ => 0.0,
    };
    let extra = cost.per_hour() + surplus;
    let mut out = it.clone();
    for o in &mut out.offerings {
        o.add_node_cost(extra);
    }
    out
}

/// Whether the NodePool requirements `pool` name `it`'s family, category or type (an `In` that
/// lists it): the pool asks for that burstable type and plans its full CPU.
fn asked_for(pool: &Requirements, it: &InstanceType) -> bool {
    [LABEL_INSTANCE_TYPE, LABEL_INSTANCE_FAMILY, LABEL_INSTANCE_CATEGORY].iter().any(|key| {
        let own = it.requirements.get(key).and_then(|r| r.single());
        match (pool.get(key), own) {
            (Some(r), Some(v)) => !r.is_complement() && r.has(v),
            _ => false,
        }
    })
}

/// The types a NodePool with requirements `pool` plans with: in baseline mode, a burstable type
/// it does not ask for keeps only its baseline CPU usable (the rest counts as overhead). A t1
/// type, with no baseline stated and no unlimited mode to buy more, keeps none in unlimited mode
/// too.
pub fn for_pool(
    types: &[Arc<InstanceType>],
    pool: &Requirements,
    mode: BurstableCpu,
) -> Vec<Arc<InstanceType>> {
    types
        .iter()
        .map(|it| match baseline_millis(&it.name) {
            Some(baseline)
                if (mode == BurstableCpu::Baseline
                    || (mode == BurstableCpu::Unlimited && bursts_without_baseline(&it.name)))
                    && !asked_for(pool, it) =>
            {
                let unusable = (it.capacity.cpu - baseline).max(0);
                let mut overhead = it.overhead.clone();
                overhead.above_baseline = Resources::from_pairs([(CPU, unusable)]);
                Arc::new(it.with_overhead(overhead))
            }
            _ => Arc::clone(it),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ec2nodeclass::BlockDevice;
    use crate::scheduling::instancetypes::{Offering, Overhead};
    use crate::scheduling::requirements::Requirement;

    fn volume(
        size: &str,
        t: Option<VolumeType>,
        iops: Option<i64>,
        throughput: Option<i64>,
    ) -> BlockDeviceMapping {
        BlockDeviceMapping {
            device_name: Some("/dev/xvda".into()),
            ebs: Some(BlockDevice {
                volume_size: Some(size.into()),
                volume_type: t,
                iops,
                throughput,
                ..Default::default()
            }),
            root_volume: Some(true),
        }
    }

    #[test]
    fn volumes_cost_their_size_and_what_is_provisioned_above_the_included() {
        let per_month =
            |m: &BlockDeviceMapping| (volume_per_hour(m) * HOURS_PER_MONTH * 1000.0).round() / 1000.0;
        // (mapping, dollars per month)
        let table = [
            (volume("20Gi", Some(VolumeType::Gp3), None, None), 1.6),
            (volume("20Gi", Some(VolumeType::Gp3), Some(3000), Some(125)), 1.6),
            (volume("100Gi", Some(VolumeType::Gp3), Some(6000), Some(250)), 8.0 + 15.0 + 5.0),
            (volume("20Gi", None, None, None), 2.0),
            (volume("100Gi", Some(VolumeType::Io2), Some(1000), None), 12.5 + 65.0),
            (volume("500Gi", Some(VolumeType::St1), None, None), 22.5),
            (volume("1Ti", Some(VolumeType::Sc1), None, None), 15.36),
        ];
        for (m, want) in table {
            assert_eq!(per_month(&m), want, "{m:?}");
        }
        let snapshot =
            BlockDeviceMapping { ebs: Some(BlockDevice::default()), ..volume("1Gi", None, None, None) };
        assert_eq!(volume_per_hour(&snapshot), 0.0, "size unknown");
        let cost = NodeCost::of(&[volume("20Gi", Some(VolumeType::Gp3), None, None)], true);
        assert!((cost.per_hour() - (1.6 / HOURS_PER_MONTH + 0.005)).abs() < 1e-12);
        assert_eq!(NodeCost::of(&[], false).per_hour(), 0.0);
    }

    #[test]
    fn burstable_baselines_are_the_user_guides() {
        // (type, millicores it sustains)
        for (name, want) in [
            ("t3.nano", Some(100)),
            ("t3a.small", Some(400)),
            ("t3.large", Some(600)),
            ("t4g.xlarge", Some(1600)),
            ("t3.2xlarge", Some(3200)),
            ("t2.micro", Some(100)),
            ("t2.2xlarge", Some(1350)),
            ("t1.micro", Some(0)),
            ("m5.large", None),
            ("t3.metal", None),
        ] {
            assert_eq!(baseline_millis(name), want, "{name}");
        }
        assert_eq!("Unlimited".parse(), Ok(BurstableCpu::Unlimited));
        assert!("bursty".parse::<BurstableCpu>().is_err());
    }

    fn it(name: &str, family: &str, cpu: i64, price: f64) -> Arc<InstanceType> {
        let mut reqs = Requirements::new();
        reqs.add(LABEL_INSTANCE_FAMILY, Requirement::in_values([family]));
        reqs.add(LABEL_INSTANCE_CATEGORY, Requirement::in_values([&family[..1]]));
        Arc::new(InstanceType::new(
            name,
            reqs,
            Resources::from_pairs([(CPU, cpu)]),
            Overhead { kube_reserved: Resources::from_pairs([(CPU, 70)]), ..Default::default() },
            vec![Offering::new("a", "on-demand", price, true)],
        ))
    }

    #[test]
    fn a_node_is_priced_with_what_comes_with_it() {
        let t3a = it("t3a.small", "t3a", 2000, 0.0188);
        let m5 = it("m5.large", "m5", 2000, 0.096);
        let t1 = it("t1.micro", "t1", 1000, 0.02);
        let cost = NodeCost { volumes: 0.002, public_ipv4: 0.005 };
        // (type, mode, full price)
        let table = [
            (&m5, BurstableCpu::Baseline, 0.096 + 0.007),
            (&m5, BurstableCpu::Unlimited, 0.096 + 0.007),
            (&t3a, BurstableCpu::Baseline, 0.0188 + 0.007),
            (&t3a, BurstableCpu::Ignore, 0.0188 + 0.007),
            // 1930m allocatable, 400m sustained: 1.53 vCPU of surplus credits.
            (&t3a, BurstableCpu::Unlimited, 0.0188 + 0.007 + 1.53 * 0.05),
            // No unlimited mode: no surplus to buy.
            (&t1, BurstableCpu::Unlimited, 0.02 + 0.007),
        ];
        for (it, mode, want) in table {
            let got = priced(it, &cost, mode);
            let o = &got.offerings[0];
            assert!((o.price - want).abs() < 1e-9, "{} {mode:?}: {} != {want}", it.name, o.price);
            assert_eq!(o.list_price, it.offerings[0].price, "the list price is kept");
        }
    }

    #[test]
    fn burstable_types_plan_their_baseline_unless_the_pool_asks_for_them() {
        let types = [it("t3a.small", "t3a", 2000, 0.0188), it("m5.large", "m5", 2000, 0.096)];
        let any = Requirements::new();
        let planned = for_pool(&types, &any, BurstableCpu::Baseline);
        assert_eq!(planned[0].allocatable().cpu, 400 - 70, "its baseline, less what the node reserves");
        assert_eq!(planned[1].allocatable().cpu, 1930);
        for mode in [BurstableCpu::Unlimited, BurstableCpu::Ignore] {
            assert_eq!(for_pool(&types, &any, mode)[0].allocatable().cpu, 1930, "{mode:?}");
        }
        // A pool that names the family, the category or the type asks for bursts.
        for (key, value) in [
            (LABEL_INSTANCE_FAMILY, "t3a"),
            (LABEL_INSTANCE_CATEGORY, "t"),
            (LABEL_INSTANCE_TYPE, "t3a.small"),
        ] {
            let mut pool = Requirements::new();
            pool.add(key, Requirement::in_values([value, "m5"]));
            assert_eq!(for_pool(&types, &pool, BurstableCpu::Baseline)[0].allocatable().cpu, 1930, "{key}");
        }
        // A t1 type sustains nothing stated, and cannot buy more.
        let t1 = [it("t1.micro", "t1", 1000, 0.02)];
        for (mode, want) in
            [(BurstableCpu::Baseline, 0), (BurstableCpu::Unlimited, 0), (BurstableCpu::Ignore, 930)]
        {
            assert_eq!(for_pool(&t1, &any, mode)[0].allocatable().cpu.max(0), want, "{mode:?}");
        }
        let mut t1_pool = Requirements::new();
        t1_pool.add(LABEL_INSTANCE_FAMILY, Requirement::in_values(["t1"]));
        assert_eq!(for_pool(&t1, &t1_pool, BurstableCpu::Unlimited)[0].allocatable().cpu, 930);
        let mut not_t = Requirements::new();
        not_t.add(LABEL_INSTANCE_CATEGORY, Requirement::not_in(["c"]));
        assert_eq!(for_pool(&types, &not_t, BurstableCpu::Baseline)[0].allocatable().cpu, 330);
    }
}
