//! The instance-type metrics of the AWS provider (upstream's `cloudprovider.metrics` controller,
//! and the gauges upstream's instance-type provider sets while it builds types):
//!
//! - `karpenter_cloudprovider_instance_type_cpu_cores{instance_type}` and
//!   `karpenter_cloudprovider_instance_type_memory_bytes{instance_type}`: the vCPUs and the memory
//!   EC2 reports (before any overhead) of each instance type a NodePool can launch;
//! - `karpenter_cloudprovider_instance_type_offering_available{instance_type, capacity_type,
//!   zone}`: 1 when one of the NodePools has that offering available, else 0 (out of capacity);
//!   with the `ReservedCapacity` gate, a zone of a type without reserved offering has a
//!   `reserved` series at 0, as upstream;
//! - `karpenter_cloudprovider_instance_type_offering_price_estimate{...}` (same labels): the
//!   offering's hourly price (0 for those `reserved` series).
//!
//! Every minute, as upstream, from the instance types of every NodePool (through the cloud
//! provider, so that capacity errors and new prices show) and the region's catalog as last
//! fetched. A NodePool whose types cannot be resolved (its node class is not ready) is left out
//! of the pass; upstream gives up the whole pass then. Series of types and offerings no NodePool
//! has any more are removed.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::ResourceExt;
use tokio::sync::watch;

use crate::apis::labels::CAPACITY_TYPE_RESERVED;
use crate::cloudprovider::aws::AwsCloudProvider;
use crate::cloudprovider::aws::instancetype::TypeInfo;
use crate::controllers::Context;
use crate::controllers::kit::{Next, Options, Timer, run_singleton};
use crate::controllers::node::metrics::Pass;
use crate::metrics::{Labels, Metrics};
use crate::scheduling::InstanceType;
use crate::state::ClusterState;
use crate::util::error_chain;

/// Name of the controller, in logs and metrics (upstream's).
pub const CONTROLLER: &str = "cloudprovider.metrics";
/// How often the metrics are recomputed (upstream's period).
const PERIOD: Duration = Duration::from_secs(60);

/// An offering: instance type, capacity type, zone.
pub type Dimensions = (String, String, String);

/// The figures of one pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Readings {
    /// vCPUs by instance type.
    pub cpu_cores: BTreeMap<String, f64>,
    /// Memory in bytes by instance type.
    pub memory_bytes: BTreeMap<String, f64>,
    /// Whether any NodePool has the offering available.
    pub available: BTreeMap<Dimensions, bool>,
    /// The offering's hourly price.
    pub price: BTreeMap<Dimensions, f64>,
}

/// The readings of the instance types of every NodePool, `pool_types`, with the sizes of
/// `catalog`; `reserved_capacity` is the `ReservedCapacity` feature gate (pure).
pub fn readings(
    pool_types: &[Vec<Arc<InstanceType>>],
    catalog: &[TypeInfo],
    reserved_capacity: bool,
) -> Readings {
    let sizes: HashMap<&str, &TypeInfo> = catalog.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut out = Readings::default();
    for it in pool_types.iter().flatten() {
        if let Some(info) = sizes.get(it.name.as_str()) {
            out.cpu_cores.insert(it.name.clone(), info.vcpus as f64);
            out.memory_bytes.insert(it.name.clone(), info.memory_mib as f64 * 1024.0 * 1024.0);
        }
        let mut zones = BTreeSet::new();
        for o in &it.offerings {
            let key: Dimensions = (it.name.clone(), o.capacity_type.clone(), o.zone.clone());
            *out.available.entry(key.clone()).or_insert(false) |= o.available;
            out.price.insert(key, o.list_price);
            zones.insert(o.zone.as_str());
        }
        if reserved_capacity {
            for zone in zones {
                let key: Dimensions = (it.name.clone(), CAPACITY_TYPE_RESERVED.to_string(), zone.to_string());
                if let Entry::Vacant(absent) = out.available.entry(key.clone()) {
                    absent.insert(false);
                    out.price.insert(key, 0.0);
                }
            }
        }
    }
    out
}

fn offering_labels((instance_type, capacity_type, zone): &Dimensions) -> Labels {
    vec![
        ("instance_type", instance_type.clone()),
        ("capacity_type", capacity_type.clone()),
        ("zone", zone.clone()),
    ]
}

/// Sets the metrics to `readings`, then removes the series of the last pass not set again
/// (`published` holds them).
pub fn record(m: &Metrics, readings: &Readings, published: &mut Vec<HashSet<Labels>>) {
    let mut pass = Pass::new(vec![
        &m.cloudprovider_instance_type_cpu_cores,
        &m.cloudprovider_instance_type_memory_bytes,
        &m.cloudprovider_instance_type_offering_available,
        &m.cloudprovider_instance_type_offering_price_estimate,
    ]);
    for (name, cores) in &readings.cpu_cores {
        pass.set(0, vec![("instance_type", name.clone())], *cores);
    }
    for (name, bytes) in &readings.memory_bytes {
        pass.set(1, vec![("instance_type", name.clone())], *bytes);
    }
    for (key, available) in &readings.available {
        pass.set(2, offering_labels(key), if *available { 1.0 } else { 0.0 });
    }
    for (key, price) in &readings.price {
        pass.set(3, offering_labels(key), *price);
    }
    pass.retire(published);
}

/// Runs until `stop` turns true: a pass every [`PERIOD`].
pub async fn run(ctx: Context, state: ClusterState, aws: Arc<AwsCloudProvider>, stop: watch::Receiver<bool>) {
    let published: Mutex<Vec<HashSet<Labels>>> = Mutex::new(Vec::new());
    let reserved_capacity = ctx.settings.feature_gates.reserved_capacity;
    run_singleton(Options::new(CONTROLLER), Some(ctx.metrics.clone()), Timer, stop, || async {
        let mut pool_types = Vec::new();
        for pool in state.nodepools.state() {
            match ctx.cloud.instance_types(&pool).await {
                Ok(types) => pool_types.push(types),
                Err(error) => tracing::debug!(
                    controller = CONTROLLER,
                    NodePool = %pool.name_any(),
                    error = %error_chain(&error),
                    "leaving the nodepool's instance types out of the metrics"
                ),
            }
        }
        let catalog = aws.known_instance_types().await;
        let types = catalog.as_deref().map(|c| c.types.as_slice()).unwrap_or_default();
        let readings = readings(&pool_types, types, reserved_capacity);
        let mut published = published.lock().unwrap_or_else(PoisonError::into_inner);
        record(&ctx.metrics, &readings, &mut published);
        Ok::<_, std::convert::Infallible>(Next::After(PERIOD))
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduling::{Offering, Overhead, Requirements, Resources};

    /// A type offered on-demand at `price` and spot at half of it in each of `zones`.
    fn instance_type(name: &str, zones: &[&str], price: f64, available: bool) -> Arc<InstanceType> {
        let mut offerings = Vec::new();
        for zone in zones {
            for (capacity_type, price) in [("on-demand", price), ("spot", price / 2.0)] {
                offerings.push(Offering::new(zone.to_string(), capacity_type.to_string(), price, available));
            }
        }
        Arc::new(InstanceType::new(
            name,
            Requirements::new(),
            Resources::default(),
            Overhead::default(),
            offerings,
        ))
    }

    fn info(name: &str, vcpus: i64, memory_mib: i64) -> TypeInfo {
        TypeInfo { name: name.into(), vcpus, memory_mib, ..TypeInfo::default() }
    }

    fn key(it: &str, ct: &str, zone: &str) -> Dimensions {
        (it.into(), ct.into(), zone.into())
    }

    #[test]
    fn offerings_of_every_nodepool_are_merged() {
        let a = instance_type("m.2x", &["z1", "z2"], 0.2, true);
        let b = instance_type("m.2x", &["z1"], 0.2, false);
        let only_b = instance_type("m.4x", &["z1"], 0.4, false);
        let pools = vec![vec![a], vec![b, only_b]];
        let catalog = [info("m.2x", 2, 4096), info("m.4x", 4, 8192), info("unused", 8, 1)];
        let r = readings(&pools, &catalog, false);
        assert_eq!(r.cpu_cores, BTreeMap::from([("m.2x".to_string(), 2.0), ("m.4x".to_string(), 4.0)]));
        assert_eq!(r.memory_bytes["m.4x"], 8192.0 * 1024.0 * 1024.0);
        assert!(r.available[&key("m.2x", "spot", "z1")], "available in one pool is enough");
        assert!(!r.available[&key("m.4x", "on-demand", "z1")]);
        assert_eq!(r.price[&key("m.2x", "spot", "z2")], 0.1);
        assert_eq!(r.available.len(), 6);
        assert!(!r.available.keys().any(|(_, ct, _)| ct == CAPACITY_TYPE_RESERVED));

        let r = readings(&pools, &catalog, true);
        assert!(!r.available[&key("m.2x", "reserved", "z2")], "a zero per zone without reservation");
        assert_eq!(r.price[&key("m.2x", "reserved", "z2")], 0.0);
        assert_eq!(r.available.len(), 6 + 3);
    }

    #[test]
    fn series_of_offerings_gone_are_removed() {
        let m = Metrics::unregistered();
        let mut published = Vec::new();
        let types = vec![vec![instance_type("m.2x", &["z1", "z2"], 0.2, true)]];
        let catalog = [info("m.2x", 2, 4096)];
        record(&m, &readings(&types, &catalog, false), &mut published);
        let spot_z2 = offering_labels(&key("m.2x", "spot", "z2"));
        assert_eq!(
            m.cloudprovider_instance_type_offering_available.get(&spot_z2).map(|g| g.get()),
            Some(1.0)
        );
        assert_eq!(
            m.cloudprovider_instance_type_offering_price_estimate.get(&spot_z2).map(|g| g.get()),
            Some(0.1)
        );
        let cores = vec![("instance_type", "m.2x".to_string())];
        assert_eq!(m.cloudprovider_instance_type_cpu_cores.get(&cores).map(|g| g.get()), Some(2.0));

        // z2 is gone, then every type.
        let types = vec![vec![instance_type("m.2x", &["z1"], 0.2, true)]];
        record(&m, &readings(&types, &catalog, false), &mut published);
        assert!(m.cloudprovider_instance_type_offering_available.get(&spot_z2).is_none());
        assert!(m.cloudprovider_instance_type_offering_price_estimate.get(&spot_z2).is_none());
        let spot_z1 = offering_labels(&key("m.2x", "spot", "z1"));
        assert!(m.cloudprovider_instance_type_offering_available.get(&spot_z1).is_some());
        record(&m, &Readings::default(), &mut published);
        assert!(m.cloudprovider_instance_type_offering_available.get(&spot_z1).is_none());
        assert!(m.cloudprovider_instance_type_cpu_cores.get(&cores).is_none());
        assert!(m.cloudprovider_instance_type_memory_bytes.get(&cores).is_none());
    }
}
