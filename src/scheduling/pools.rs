//! Per-NodePool indexes of a scheduling run: the instance types a NodePool can launch, cheapest
//! first, with their offerings as bit masks of zones and capacity types ([`OfferingIndex`]); their
//! prices and what each counts toward the NodePool's limits ([`PoolCosts`]); and what is left of
//! those limits.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::apis::labels::{LABEL_CAPACITY_TYPE, LABEL_TOPOLOGY_ZONE};

use super::input::{NodePoolInput, SchedulingInput};
use super::instancetypes::{InstanceType, RESERVATION_LABELS, compare_price, unit_price};
use super::requirements::Requirements;
use super::resources::{NODES, Resources};

/// Whether `key` is a label of offerings rather than of instance types: the zone, the capacity
/// type and the reservation labels.
pub(super) fn is_offering_label(key: &str) -> bool {
    key == LABEL_TOPOLOGY_ZONE || key == LABEL_CAPACITY_TYPE || RESERVATION_LABELS.contains(&key)
}

/// Bit masks of zones and capacity types, to test offerings without string lookups.
#[derive(Default)]
pub(super) struct OfferingIndex {
    zones: BTreeMap<String, u32>,
    capacity_types: BTreeMap<String, u32>,
}

impl OfferingIndex {
    /// Numbers every zone and every capacity type that the NodePools' instance types offer, in
    /// the order they first appear.
    pub(super) fn new(nodepools: &[NodePoolInput]) -> Self {
        let mut offer_idx = OfferingIndex::default();
        for np in nodepools {
            for it in &np.instance_types {
                for o in &it.offerings {
                    let n = u32::try_from(offer_idx.zones.len()).unwrap_or(u32::MAX);
                    offer_idx.zones.entry(o.zone.clone()).or_insert(n);
                    let n = u32::try_from(offer_idx.capacity_types.len()).unwrap_or(u32::MAX);
                    offer_idx.capacity_types.entry(o.capacity_type.clone()).or_insert(n);
                }
            }
        }
        offer_idx
    }

    pub(super) fn usable(&self) -> bool {
        self.zones.len() <= 64 && self.capacity_types.len() <= 64
    }

    fn bit(map: &BTreeMap<String, u32>, v: &str) -> u64 {
        map.get(v).and_then(|i| 1u64.checked_shl(*i)).unwrap_or(0)
    }

    /// The bit of zone `zone` (none for a zone nothing offers).
    pub(super) fn zone_bit(&self, zone: &str) -> u64 {
        Self::bit(&self.zones, zone)
    }

    pub(super) fn full_zone_mask(&self) -> u64 {
        self.zones.values().fold(0u64, |m, i| m | 1u64.checked_shl(*i).unwrap_or(0))
    }

    /// The zone and capacity type masks of `reqs`, when they tell which offerings `reqs` allow:
    /// not when the index is too large, nor when `reqs` constrain the reservation labels (which
    /// the masks do not cover).
    pub(super) fn masks_for(&self, reqs: &Requirements) -> Option<(u64, u64)> {
        (self.usable() && !RESERVATION_LABELS.iter().any(|k| reqs.has(k))).then(|| self.masks(reqs))
    }

    pub(super) fn masks(&self, reqs: &Requirements) -> (u64, u64) {
        let mask = |map: &BTreeMap<String, u32>, key: &str| {
            map.iter().filter(|(v, _)| reqs.allows(key, v)).fold(0u64, |m, (v, _)| m | Self::bit(map, v))
        };
        (mask(&self.zones, LABEL_TOPOLOGY_ZONE), mask(&self.capacity_types, LABEL_CAPACITY_TYPE))
    }
}

/// A NodePool as a scheduling run uses it.
pub(super) struct Pool<'a> {
    pub(super) input: &'a NodePoolInput,
    /// Indices into `input.instance_types` compatible with the template, cheapest first.
    pub(super) its: Vec<u32>,
    /// Per instance type: (zone bit, capacity type bit, price) of each available offering.
    pub(super) offers: Vec<Vec<(u64, u64, f64)>>,
    pub(super) ds_overhead: Resources,
    pub(super) remaining: Option<BTreeMap<String, i64>>,
    pub(super) has_min_values: bool,
}

impl<'a> Pool<'a> {
    pub(super) fn new(np: &'a NodePoolInput, input: &SchedulingInput, offer_idx: &OfferingIndex) -> Self {
        let mut its: Vec<(Option<f64>, u32)> = np
            .instance_types
            .iter()
            .enumerate()
            .filter(|(_, it)| it.is_compatible(&np.requirements))
            .map(|(i, it)| (it.cheapest_price(&np.requirements), u32::try_from(i).unwrap_or(u32::MAX)))
            .collect();
        its.sort_by(|a, b| compare_price(a.0, b.0).then(a.1.cmp(&b.1)));
        let offers = np
            .instance_types
            .iter()
            .map(|it| {
                it.offerings
                    .iter()
                    .filter(|o| o.available)
                    .map(|o| {
                        (
                            OfferingIndex::bit(&offer_idx.zones, &o.zone),
                            OfferingIndex::bit(&offer_idx.capacity_types, &o.capacity_type),
                            o.price,
                        )
                    })
                    .collect()
            })
            .collect();
        let ds_overhead = super::daemonsets::overhead(&input.daemonsets, &np.requirements, &np.taints);
        Pool {
            input: np,
            its: its.into_iter().map(|(_, i)| i).collect(),
            offers,
            ds_overhead,
            remaining: np.remaining_limits.clone(),
            has_min_values: np.requirements.iter().any(|(_, r)| r.min_values().is_some()),
        }
    }

    /// Moves a claim's reservation against the NodePool's limits: what it `held` goes back to
    /// what is left of them, what it `holds` now is taken.
    pub(super) fn move_reservation(&mut self, held: &BTreeMap<String, i64>, holds: &BTreeMap<String, i64>) {
        if let Some(rem) = self.remaining.as_mut() {
            for (k, v) in rem.iter_mut() {
                *v += held.get(k).copied().unwrap_or(0) - holds.get(k).copied().unwrap_or(0);
            }
        }
    }
}

/// Per instance type of a pool (by index into its `instance_types`): the price of its cheapest
/// offering the NodePool allows (infinite without one), and whether it is exotic.
pub(super) struct PoolCosts {
    prices: Vec<f64>,
    exotic: Vec<bool>,
    /// 1 / the CPU and memory each type leaves its pods: allocatable less the pool's DaemonSets
    /// (infinite where nothing is left).
    inverse: Vec<[f64; 2]>,
    /// What the pool's DaemonSets request on every node.
    daemonsets: Resources,
    /// Per limited resource of the NodePool (in key order): what each type counts toward it.
    pub(super) limits: Vec<LimitedAmounts>,
}

/// What each instance type of a pool counts toward one NodePool limit.
pub(super) struct LimitedAmounts(Vec<i64>);

impl LimitedAmounts {
    pub(super) fn amount(&self, i: u32) -> i64 {
        self.0.get(i as usize).copied().unwrap_or(i64::MAX)
    }
}

impl PoolCosts {
    pub(super) fn new(np: &NodePoolInput, daemonsets: &Resources) -> Self {
        let its = &np.instance_types;
        PoolCosts {
            prices: its
                .iter()
                .map(|it| it.cheapest_price(&np.requirements).unwrap_or(f64::INFINITY))
                .collect(),
            exotic: its.iter().map(|it| it.is_exotic()).collect(),
            inverse: its
                .iter()
                .map(|it| {
                    let a = it.allocatable();
                    [a.cpu - daemonsets.cpu, a.memory - daemonsets.memory]
                        .map(|v| if v > 0 { 1.0 / v as f64 } else { f64::INFINITY })
                })
                .collect(),
            daemonsets: daemonsets.clone(),
            limits: np
                .remaining_limits
                .iter()
                .flat_map(|l| l.keys())
                .map(|k| LimitedAmounts(its.iter().map(|it| limited_amount(it, k)).collect()))
                .collect(),
        }
    }

    /// The price on type `i` of what a claim's pods request (`pods`, the claim's requests less
    /// the pool's DaemonSets'): [`unit_price`] over what the type leaves them besides the
    /// DaemonSets, so that every node's share taken by DaemonSets is paid for and a larger node,
    /// whose share is smaller, is cheaper per unit at the same price per allocatable unit.
    /// Without divisions when they ask for CPU, memory and pod slots only.
    pub(super) fn unit_price(&self, i: u32, pods: &Resources, types: &[Arc<InstanceType>]) -> f64 {
        let price = self.price(i);
        match self.inverse.get(i as usize) {
            Some(inv) if pods.extended.is_empty() && pods.ephemeral_storage <= 0 => {
                let share = |v: i64, inv: f64| if v > 0 { v as f64 * inv } else { 0.0 };
                price * share(pods.cpu, inv[0]).max(share(pods.memory, inv[1]))
            }
            _ => types
                .get(i as usize)
                .map_or(f64::INFINITY, |it| unit_price(price, pods, &it.allocatable().sub(&self.daemonsets))),
        }
    }

    pub(super) fn price(&self, i: u32) -> f64 {
        self.prices.get(i as usize).copied().unwrap_or(f64::INFINITY)
    }

    pub(super) fn is_exotic(&self, i: u32) -> bool {
        self.exotic.get(i as usize).copied().unwrap_or(false)
    }
}

/// What a node of type `it` counts toward a NodePool limit on `key`.
pub(super) fn limited_amount(it: &InstanceType, key: &str) -> i64 {
    if key == NODES { 1 } else { it.capacity.get(key) }
}

/// Per CPU, memory and pods: the most any of the types `its` allocates.
pub(super) fn max_alloc(its: &[u32], types: &[Arc<InstanceType>]) -> [i64; 3] {
    let mut m = [i64::MIN; 3];
    for &i in its {
        if let Some(it) = types.get(i as usize) {
            let a = it.allocatable();
            m = [m[0].max(a.cpu), m[1].max(a.memory), m[2].max(a.pods)];
        }
    }
    m
}
