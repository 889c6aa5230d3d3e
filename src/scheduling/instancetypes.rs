//! Instance types and their offerings, as the scheduler sees them.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::apis::labels::{
    LABEL_CAPACITY_RESERVATION_ID, LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE, LABEL_CAPACITY_RESERVATION_TYPE,
    LABEL_CAPACITY_TYPE, LABEL_INSTANCE_ACCELERATOR_COUNT, LABEL_INSTANCE_GPU_COUNT, LABEL_INSTANCE_SIZE,
    LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_ZONE, RESOURCE_AMD_GPU, RESOURCE_AWS_NEURON,
    RESOURCE_AWS_NEURON_CORE, RESOURCE_HABANA_GAUDI, RESOURCE_NVIDIA_GPU,
};

use super::requirements::{Requirement, Requirements};
use super::resources::Resources;

/// One way to buy an instance type: a zone and capacity type at a price.
#[derive(Clone, Debug, PartialEq)]
pub struct Offering {
    /// Availability zone (`topology.kubernetes.io/zone`).
    pub zone: String,
    /// `spot`, `on-demand` or `reserved`.
    pub capacity_type: String,
    /// Hourly price: what decisions compare, the full cost of a node where the cloud provider
    /// adds what comes with every node to the list price.
    pub price: f64,
    /// The hourly list price, without what comes with the node (equal to `price` unless the
    /// cloud provider added some).
    pub list_price: f64,
    /// Whether it can be launched now (not known to be out of capacity).
    pub available: bool,
    /// For a `reserved` offering, the capacity reservation it launches into.
    pub reservation: Option<Arc<Reservation>>,
}

/// The capacity reservation of a `reserved` offering: one per reservation, in its zone, for its
/// instance type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Its id (`karpenter.k8s.aws/capacity-reservation-id`).
    pub id: String,
    /// `default` or `capacity-block` (`karpenter.k8s.aws/capacity-reservation-type`).
    pub reservation_type: String,
    /// Whether EC2 may take its instances back (`karpenter.k8s.aws/capacity-reservation-interruptible`).
    pub interruptible: bool,
    /// Instances that can still be launched into it, as last known.
    pub capacity: i64,
}

/// The labels of an offering's reservation.
pub const RESERVATION_LABELS: [&str; 3] = [
    LABEL_CAPACITY_RESERVATION_ID,
    LABEL_CAPACITY_RESERVATION_TYPE,
    LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE,
];

impl Reservation {
    /// The labels a node launched into it gets (besides `karpenter.sh/capacity-type: reserved`).
    pub fn labels(&self) -> [(&'static str, String); 3] {
        [
            (LABEL_CAPACITY_RESERVATION_ID, self.id.clone()),
            (LABEL_CAPACITY_RESERVATION_TYPE, self.reservation_type.clone()),
            (LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE, self.interruptible.to_string()),
        ]
    }
}

impl Offering {
    /// An offering that launches into no reservation.
    pub fn new(
        zone: impl Into<String>,
        capacity_type: impl Into<String>,
        price: f64,
        available: bool,
    ) -> Self {
        Offering {
            zone: zone.into(),
            capacity_type: capacity_type.into(),
            price,
            list_price: price,
            available,
            reservation: None,
        }
    }

    /// Adds `per_hour`, a cost that comes with every node of it, to its price (not to its list
    /// price).
    pub fn add_node_cost(&mut self, per_hour: f64) {
        self.price += per_hour;
    }

    /// Sets its list price to `change` of it (a NodeOverlay's), keeping what comes with the node
    /// on top.
    pub fn reprice(&mut self, change: impl FnOnce(f64) -> f64) {
        let extra = self.price - self.list_price;
        self.list_price = change(self.list_price);
        self.price = self.list_price + extra;
    }

    /// Whether `reqs` allow this offering's zone and capacity type, and its reservation's labels:
    /// those of its reservation, or (as upstream's offerings say `DoesNotExist`) their absence.
    pub fn is_compatible(&self, reqs: &Requirements) -> bool {
        reqs.allows(LABEL_TOPOLOGY_ZONE, &self.zone)
            && reqs.allows(LABEL_CAPACITY_TYPE, &self.capacity_type)
            && match &self.reservation {
                Some(r) => r.labels().iter().all(|(k, v)| reqs.allows(k, v)),
                None => RESERVATION_LABELS.iter().all(|k| reqs.get(k).is_none_or(Requirement::allows_absent)),
            }
    }

    /// The id of the reservation it launches into.
    pub fn reservation_id(&self) -> Option<&str> {
        self.reservation.as_ref().map(|r| r.id.as_str())
    }
}

/// Resources a node reserves for the system and keeps free for eviction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overhead {
    /// Reserved for Kubernetes daemons (kubelet, container runtime).
    pub kube_reserved: Resources,
    /// Reserved for the operating system.
    pub system_reserved: Resources,
    /// Kept free so that kubelet's hard eviction does not trigger.
    pub eviction_threshold: Resources,
    /// CPU of a burstable type above what it sustains, which plans leave unused (see
    /// `BURSTABLE_CPU`); the node itself has it.
    pub above_baseline: Resources,
}

impl Overhead {
    /// The total overhead.
    pub fn total(&self) -> Resources {
        self.kube_reserved.add(&self.system_reserved).add(&self.eviction_threshold).add(&self.above_baseline)
    }
}

/// An instance type a NodePool may launch.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceType {
    /// Name (`m5.large`).
    pub name: String,
    /// The labels a node of this type gets, as requirements; includes the instance type name and
    /// the zones and capacity types of its offerings.
    pub requirements: Requirements,
    /// Total capacity.
    pub capacity: Resources,
    /// Reserved resources.
    pub overhead: Overhead,
    /// How it can be bought.
    pub offerings: Vec<Offering>,
    /// The NodeOverlays that changed it, in the NodePool it was resolved for; `None` for the
    /// cloud provider's own figures.
    pub overlays: Option<Arc<OverlayMarks>>,
    allocatable: Resources,
}

/// Which NodeOverlays changed an instance type: those that set one of its offerings' price, and
/// those that added capacity (each list sorted, without repeats).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlayMarks {
    /// Overlays that set or adjusted the price of at least one offering.
    pub price: Vec<String>,
    /// Overlays that added extended resources.
    pub capacity: Vec<String>,
}

impl InstanceType {
    /// Builds an instance type; `requirements` are its labels (arch, os, `karpenter.k8s.aws/*`),
    /// to which the name and the offerings' zones and capacity types are added.
    pub fn new(
        name: impl Into<String>,
        mut requirements: Requirements,
        capacity: Resources,
        overhead: Overhead,
        mut offerings: Vec<Offering>,
    ) -> Self {
        let name = name.into();
        requirements.add(LABEL_INSTANCE_TYPE, Requirement::in_values([name.clone()]));
        requirements
            .add(LABEL_TOPOLOGY_ZONE, Requirement::in_values(offerings.iter().map(|o| o.zone.clone())));
        requirements.add(
            LABEL_CAPACITY_TYPE,
            Requirement::in_values(offerings.iter().map(|o| o.capacity_type.clone())),
        );
        requirements.shrink_to_fit();
        offerings.shrink_to_fit();
        let allocatable = capacity.sub(&overhead.total());
        InstanceType { name, requirements, capacity, overhead, offerings, overlays: None, allocatable }
    }

    /// This type as NodeOverlays change it: `offerings` in place of its own (same zones and
    /// capacity types, other prices), `extra` resources set on top of its capacity, and `marks`
    /// naming the overlays. The labels and overhead are its own.
    pub fn overlaid(
        &self,
        offerings: Vec<Offering>,
        extra: &BTreeMap<String, i64>,
        marks: OverlayMarks,
    ) -> Self {
        let mut capacity = self.capacity.clone();
        for (name, value) in extra {
            capacity.set(name, *value);
        }
        let allocatable = capacity.sub(&self.overhead.total());
        InstanceType {
            name: self.name.clone(),
            requirements: self.requirements.clone(),
            capacity,
            overhead: self.overhead.clone(),
            offerings,
            overlays: Some(Arc::new(marks)),
            allocatable,
        }
    }

    /// This type with `extra` added to its capacity (each resource set to the amount given; the
    /// NodeOverlays' marks kept).
    pub fn with_capacity(&self, extra: &BTreeMap<String, i64>) -> Self {
        let mut capacity = self.capacity.clone();
        for (name, value) in extra {
            capacity.set(name, *value);
        }
        let allocatable = capacity.sub(&self.overhead.total());
        InstanceType { capacity, allocatable, ..self.clone() }
    }

    /// This type with `overhead` instead of its own (the NodeOverlays' marks kept).
    pub fn with_overhead(&self, overhead: Overhead) -> Self {
        let allocatable = self.capacity.sub(&overhead.total());
        InstanceType { overhead, allocatable, ..self.clone() }
    }

    /// This type offered as `offerings` instead (other zones, capacity types or reservations):
    /// its zone and capacity-type labels follow them.
    pub fn with_offerings(&self, offerings: Vec<Offering>) -> Self {
        let mut requirements = self.requirements.clone();
        requirements.remove(LABEL_TOPOLOGY_ZONE);
        requirements.remove(LABEL_CAPACITY_TYPE);
        requirements.remove(LABEL_INSTANCE_TYPE);
        InstanceType::new(
            self.name.clone(),
            requirements,
            self.capacity.clone(),
            self.overhead.clone(),
            offerings,
        )
    }

    /// Whether a NodeOverlay set the price of one of its offerings.
    pub fn price_overlaid(&self) -> bool {
        self.overlays.as_ref().is_some_and(|m| !m.price.is_empty())
    }

    /// Whether a NodeOverlay added capacity to it.
    pub fn capacity_overlaid(&self) -> bool {
        self.overlays.as_ref().is_some_and(|m| !m.capacity.is_empty())
    }

    /// Capacity minus overhead: what pods can use.
    pub fn allocatable(&self) -> &Resources {
        &self.allocatable
    }

    /// The available offerings `reqs` allow.
    pub fn compatible_offerings<'a>(
        &'a self,
        reqs: &'a Requirements,
    ) -> impl Iterator<Item = &'a Offering> + 'a {
        self.offerings.iter().filter(move |o| o.available && o.is_compatible(reqs))
    }

    /// Price of the cheapest available offering `reqs` allow.
    pub fn cheapest_price(&self, reqs: &Requirements) -> Option<f64> {
        self.compatible_offerings(reqs).map(|o| o.price).min_by(f64::total_cmp)
    }

    /// Whether the type's labels intersect `reqs` and it has an available offering they allow.
    pub fn is_compatible(&self, reqs: &Requirements) -> bool {
        self.requirements.intersects(reqs).is_ok() && self.compatible_offerings(reqs).next().is_some()
    }

    /// Whether `requests` fit into the allocatable resources.
    pub fn fits(&self, requests: &Resources) -> bool {
        requests.fits(&self.allocatable)
    }

    /// Whether the type is "exotic": bare metal (its `instance-size` contains `metal`), or with
    /// GPUs or ML accelerators (GPU, Neuron or Gaudi capacity, or a GPU or accelerator count
    /// label). The scheduler gives such types to a NodeClaim only when no other type can hold its
    /// pods (see [`scheduler`](super::scheduler)). Upstream's AWS provider drops the same types
    /// from a launch (metal sizes; NVIDIA, AMD, Neuron, Neuron core and Gaudi capacity); the count
    /// labels add GPUs and accelerators of makers without a resource name here.
    pub fn is_exotic(&self) -> bool {
        let labelled = |key: &str| {
            self.requirements.get(key).is_some_and(|r| !r.is_complement() && !r.values().is_empty())
        };
        let metal = self
            .requirements
            .get(LABEL_INSTANCE_SIZE)
            .is_some_and(|r| !r.is_complement() && r.values().iter().any(|v| v.contains("metal")));
        metal
            || EXOTIC_RESOURCES.iter().any(|r| self.capacity.get(r) > 0)
            || labelled(LABEL_INSTANCE_GPU_COUNT)
            || labelled(LABEL_INSTANCE_ACCELERATOR_COUNT)
    }
}

/// Resources only exotic instance types have: a pod requesting one needs such a type.
pub const EXOTIC_RESOURCES: [&str; 5] = [
    RESOURCE_NVIDIA_GPU,
    RESOURCE_AMD_GPU,
    RESOURCE_AWS_NEURON,
    RESOURCE_AWS_NEURON_CORE,
    RESOURCE_HABANA_GAUDI,
];

/// The price of `requests` on a type of hourly `price` and `allocatable` resources when the type
/// is filled with copies of them up to its binding resource: `price` times the largest fraction of
/// any allocatable resource that `requests` take. Infinite when the type lacks a requested
/// resource; zero for empty requests.
///
/// Pod slots are a limit, not a priced resource: a type's maximum pod count follows from its
/// network interfaces, and buying slots with more nodes buys every per-node cost the list price
/// leaves out (root volume, DaemonSet pods, kubelet reservations). So pods that request nothing
/// else cost nothing per unit on any type, and a NodeClaim of them grows into the cheapest type
/// that holds them all, as upstream's scheduler does.
pub fn unit_price(price: f64, requests: &Resources, allocatable: &Resources) -> f64 {
    let fixed = [
        (requests.cpu, allocatable.cpu),
        (requests.memory, allocatable.memory),
        (requests.ephemeral_storage, allocatable.ephemeral_storage),
    ];
    let extended = requests.extended.iter().map(|(k, v)| (*v, allocatable.get(k)));
    let mut share = 0.0f64;
    for (v, a) in fixed.into_iter().chain(extended) {
        if v <= 0 {
            continue;
        }
        if a <= 0 {
            return f64::INFINITY;
        }
        share = share.max(v as f64 / a as f64);
    }
    price * share
}

/// The instance types compatible with `reqs` on which `requests` fit.
pub fn filter<'a>(
    types: &'a [InstanceType],
    reqs: &'a Requirements,
    requests: &'a Resources,
) -> impl Iterator<Item = &'a InstanceType> + 'a {
    types.iter().filter(move |it| it.fits(requests) && it.is_compatible(reqs))
}

/// Orders instance types cheapest first by their cheapest offering compatible with `reqs`
/// (types without one last), then by name.
pub fn sort_cheapest(types: &mut [&InstanceType], reqs: &Requirements) {
    types.sort_by(|a, b| {
        compare_price(a.cheapest_price(reqs), b.cheapest_price(reqs)).then(a.name.cmp(&b.name))
    });
}

/// Compares optional prices, missing prices last.
pub fn compare_price(a: Option<f64>, b: Option<f64>) -> Ordering {
    match (a, b) {
        (Some(a), Some(b)) => a.total_cmp(&b),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::resources::{CPU, MEMORY, PODS};

    fn it(name: &str, cpu: i64, offerings: &[(&str, &str, f64, bool)]) -> InstanceType {
        InstanceType::new(
            name,
            Requirements::new(),
            Resources::from_pairs([(CPU, cpu * 1000), (MEMORY, cpu << 30), (PODS, 10)]),
            Overhead { kube_reserved: Resources::from_pairs([(CPU, 100)]), ..Default::default() },
            offerings
                .iter()
                .map(|(z, c, p, a)| Offering::new(z.to_string(), c.to_string(), *p, *a))
                .collect(),
        )
    }

    #[test]
    fn filters_and_orders() {
        let types = vec![
            it("big", 8, &[("z1", "on-demand", 0.8, true), ("z2", "spot", 0.3, true)]),
            it("small", 2, &[("z1", "on-demand", 0.2, true)]),
            it("gone", 4, &[("z1", "on-demand", 0.1, false)]),
        ];
        assert_eq!(types[0].allocatable().cpu, 7900);
        let mut reqs = Requirements::new();
        let requests = Resources::from_pairs([(CPU, 1500)]);
        let mut got: Vec<&InstanceType> = filter(&types, &reqs, &requests).collect();
        sort_cheapest(&mut got, &reqs);
        assert_eq!(got.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(), vec!["small", "big"]);

        reqs.add(LABEL_CAPACITY_TYPE, Requirement::in_values(["spot"]));
        let got: Vec<&str> = filter(&types, &reqs, &requests).map(|i| i.name.as_str()).collect();
        assert_eq!(got, vec!["big"]);
        assert_eq!(types[0].cheapest_price(&reqs), Some(0.3));

        let too_big = Resources::from_pairs([(CPU, 7950)]);
        assert_eq!(filter(&types, &Requirements::new(), &too_big).count(), 0);
    }
}
