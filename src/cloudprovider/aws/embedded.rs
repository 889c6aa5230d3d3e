//! An EC2 instance-type catalog built into the binary, for when there is no EC2 to ask: the
//! kwok cloud provider and `karpenter simulate --instance-types aws`.
//!
//! The data (`data/instance-types-us-east-1.json`) is a snapshot of DescribeInstanceTypes and
//! DescribeInstanceTypeOfferings for [`REGION`], limited to the zones [`ZONES`], with only the
//! fields [`TypeInfo`] holds. `hack/gen-instance-types.py` regenerates it from the snapshot the
//! AWS emulator (moto) bundles.
//!
//! Instance types are computed from it by the same code as the EC2 provider's
//! ([`instancetype::instance_type`]), by default with the settings of a default EC2NodeClass
//! (AL2023, no kubelet settings, a 20Gi root volume; see [`default_settings`]), so capacity,
//! overhead and labels are those a real node would get. Every type gets one offering per zone it
//! is offered in: on-demand at the price of the static on-demand table ([`Pricing`]), and, when
//! the type supports spot, spot at [`SPOT_PRICE_FRACTION`] of it. Types without a known
//! on-demand price are left out. All offerings are available. The result is deterministic:
//! types in name order, offerings in zone order.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, LazyLock};

use serde::Deserialize;
use thiserror::Error;

use super::amifamily::DEFAULT_EPHEMERAL_STORAGE;
use super::catalog::CatalogData;
use super::instancetype::{self, DEFAULT_VM_MEMORY_OVERHEAD_PERCENT, OfferingInputs, Settings, TypeInfo};
use super::pricing::Pricing;
use crate::apis::ec2nodeclass::AmiFamily;
use crate::apis::labels::{CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT};
use crate::scheduling::InstanceType;
use crate::scheduling::resources::QuantityError;

/// Region of the embedded catalog (that of the on-demand price table).
pub const REGION: &str = "us-east-1";
/// Zones of the embedded catalog.
pub const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
/// Spot price as a fraction of the on-demand price (a typical spot discount of 70%).
pub const SPOT_PRICE_FRACTION: f64 = 0.3;

const DATA: &str = include_str!("data/instance-types-us-east-1.json");

/// The embedded catalog cannot be used.
#[derive(Debug, Error)]
pub enum EmbeddedCatalogError {
    /// The data file does not parse (a build of a corrupted file).
    #[error("the embedded instance-type catalog is malformed")]
    Parse(#[source] Arc<serde_json::Error>),
    /// The settings' kubelet overrides do not parse.
    #[error("instance type {name}")]
    Quantity {
        /// The instance type being computed.
        name: String,
        /// The bad quantity.
        #[source]
        source: QuantityError,
    },
}

/// The data file; its `region`, `zones` and `source` fields document it and are not read.
#[derive(Deserialize)]
struct File {
    types: Vec<Entry>,
}

#[derive(Deserialize)]
struct Entry {
    #[serde(flatten)]
    info: TypeInfo,
    zones: BTreeSet<String>,
}

static PARSED: LazyLock<Result<Arc<CatalogData>, Arc<serde_json::Error>>> = LazyLock::new(|| parse(DATA));

fn parse(text: &str) -> Result<Arc<CatalogData>, Arc<serde_json::Error>> {
    let file: File = serde_json::from_str(text).map_err(Arc::new)?;
    let mut types = Vec::with_capacity(file.types.len());
    let mut zones = HashMap::with_capacity(file.types.len());
    for e in file.types {
        zones.insert(e.info.name.clone(), e.zones);
        types.push(e.info);
    }
    types.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Arc::new(CatalogData { types, zones }))
}

/// The EC2 descriptions of the embedded catalog and the zones each type is offered in (parsed
/// once).
pub fn catalog_data() -> Result<Arc<CatalogData>, EmbeddedCatalogError> {
    PARSED.as_ref().map(Arc::clone).map_err(|e| EmbeddedCatalogError::Parse(Arc::clone(e)))
}

/// The settings of a default EC2NodeClass (alias `al2023@latest`, no kubelet settings, the
/// family's default 20Gi root volume) in [`REGION`], with default operator settings.
pub fn default_settings() -> Settings<'static> {
    Settings {
        region: REGION,
        kubelet: None,
        ami_family: AmiFamily::AL2023,
        ephemeral_storage: DEFAULT_EPHEMERAL_STORAGE,
        instance_store_raid0: false,
        reserved_enis: 0,
        vm_memory_overhead_percent: DEFAULT_VM_MEMORY_OVERHEAD_PERCENT,
        network_interfaces: &[],
        placement_group: None,
    }
}

/// The embedded catalog's instance types with [`default_settings`].
pub fn instance_types() -> Result<Vec<Arc<InstanceType>>, EmbeddedCatalogError> {
    instance_types_with(&default_settings())
}

/// The embedded catalog's instance types, their capacity and overhead computed with `settings`
/// (whose region only sets the region label).
pub fn instance_types_with(settings: &Settings<'_>) -> Result<Vec<Arc<InstanceType>>, EmbeddedCatalogError> {
    let data = catalog_data()?;
    let pricing = Pricing::default();
    let all_zones: BTreeSet<String> = ZONES.iter().map(|z| z.to_string()).collect();
    let empty = BTreeSet::new();
    let no_capacity_errors = |_: &str, _: &str| false;
    let mut out = Vec::with_capacity(data.types.len());
    for info in &data.types {
        let Some(on_demand) = pricing.on_demand_price(&info.name) else { continue };
        let price = |_: &str, capacity_type: &str| match capacity_type {
            CAPACITY_TYPE_ON_DEMAND => Some(on_demand),
            CAPACITY_TYPE_SPOT => Some(on_demand * SPOT_PRICE_FRACTION),
            _ => None,
        };
        let inputs = OfferingInputs {
            offered_zones: data.zones.get(&info.name).unwrap_or(&empty),
            subnet_zones: &all_zones,
            price: &price,
            unavailable: &no_capacity_errors,
        };
        let offerings = instancetype::offerings(info, &inputs);
        if offerings.is_empty() {
            continue;
        }
        let it = instancetype::instance_type(info, settings, offerings)
            .map_err(|source| EmbeddedCatalogError::Quantity { name: info.name.clone(), source })?;
        out.push(Arc::new(it));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ec2nodeclass::EC2NodeClassSpec;
    use crate::apis::labels::*;
    use crate::scheduling::resources::{CPU, EPHEMERAL_STORAGE, MEMORY, format_quantity};

    #[test]
    fn data_parses_and_matches_the_live_description() {
        let data = catalog_data().unwrap();
        assert!(data.types.len() > 1000, "{}", data.types.len());
        let m5 = data.get("m5.large").unwrap();
        assert_eq!(m5, &instancetype::tests::m5_large());
        assert_eq!(data.get("c6g.xlarge").unwrap(), &instancetype::tests::c6g_xlarge());
        let c6in = data.get("c6in.32xlarge").unwrap();
        assert_eq!((c6in.max_enis, c6in.default_card_max_enis), (16, Some(8)));
        assert_eq!(data.get("inf2.48xlarge").unwrap().accelerators[0].cores, 2);
        let g4dn = data.get("g4dn.xlarge").unwrap();
        assert_eq!(g4dn.gpus, instancetype::tests::g4dn_xlarge().gpus);
        assert_eq!(g4dn.local_nvme_gb, Some(125));
        let zones: Vec<&str> = data.zones["m5.large"].iter().map(String::as_str).collect();
        assert_eq!(zones, ZONES);
        assert!(data.zones.values().flatten().all(|z| ZONES.contains(&z.as_str())));
        let header: serde_json::Value = serde_json::from_str(DATA).unwrap();
        assert_eq!(header["region"], REGION);
        assert_eq!(header["zones"], serde_json::json!(ZONES));
    }

    #[test]
    fn default_settings_are_those_of_a_default_node_class() {
        let spec: EC2NodeClassSpec = serde_json::from_value(serde_json::json!({
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "role": "KarpenterNodeRole",
            "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
            "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "demo"}}],
        }))
        .unwrap();
        let live = Settings::for_node_class(REGION, &spec);
        let ours = default_settings();
        assert_eq!(live.ami_family, ours.ami_family);
        assert_eq!(live.ephemeral_storage, ours.ephemeral_storage);
        assert_eq!(live.kubelet.is_none(), ours.kubelet.is_none());
        assert_eq!(live.instance_store_raid0, ours.instance_store_raid0);
        assert_eq!(live.reserved_enis, ours.reserved_enis);
        assert_eq!(live.vm_memory_overhead_percent, ours.vm_memory_overhead_percent);
    }

    #[test]
    fn instance_types_have_upstream_capacity_labels_and_prices() {
        let types = instance_types().unwrap();
        assert!(types.len() > 1000, "{}", types.len());
        assert!(types.windows(2).all(|w| w[0].name < w[1].name), "sorted by name");
        let m5 = types.iter().find(|t| t.name == "m5.large").unwrap();
        assert_eq!(m5.capacity.cpu, 2000);
        assert_eq!(format_quantity(MEMORY, m5.capacity.memory), "7577Mi");
        assert_eq!(format_quantity(EPHEMERAL_STORAGE, m5.capacity.ephemeral_storage), "20Gi");
        assert_eq!(m5.capacity.pods, 29);
        assert_eq!(format_quantity(CPU, m5.allocatable().cpu), "1930m");
        assert_eq!(format_quantity(MEMORY, m5.allocatable().memory), "6903Mi");
        let labels = m5.requirements.single_valued_labels();
        for (k, v) in [
            (LABEL_INSTANCE_TYPE, "m5.large"),
            (LABEL_ARCH, ARCH_AMD64),
            (LABEL_OS, "linux"),
            (LABEL_TOPOLOGY_REGION, REGION),
            (LABEL_INSTANCE_CATEGORY, "m"),
            (LABEL_INSTANCE_GENERATION, "5"),
            (LABEL_INSTANCE_FAMILY, "m5"),
            (LABEL_INSTANCE_SIZE, "large"),
        ] {
            assert_eq!(labels.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert_eq!(m5.offerings.len(), 6);
        for o in &m5.offerings {
            assert!(o.available);
            let want =
                if o.capacity_type == CAPACITY_TYPE_SPOT { 0.096 * SPOT_PRICE_FRACTION } else { 0.096 };
            assert!((o.price - want).abs() < 1e-12, "{o:?}");
        }
        let arm: Vec<&str> = types
            .iter()
            .filter(|t| t.requirements.allows(LABEL_ARCH, ARCH_ARM64))
            .map(|t| t.name.as_str())
            .collect();
        assert!(arm.contains(&"c6g.xlarge") && arm.contains(&"m7g.large"), "{arm:?}");
        let g4dn = types.iter().find(|t| t.name == "g4dn.xlarge").unwrap();
        assert_eq!(g4dn.capacity.get(RESOURCE_NVIDIA_GPU), 1);
        let find = |name: &str| types.iter().find(|t| t.name == name).unwrap();
        // arm64: 8192Mi less the 64Mi CMA reservation, less 7.5% of the rest.
        assert_eq!(format_quantity(MEMORY, find("c6g.xlarge").capacity.memory), "7518Mi");
        // Multi-card types: the default card's interfaces (8 of 16, 15 of 60), 50 addresses each.
        assert_eq!(find("c6in.32xlarge").capacity.pods, 8 * 49 + 2);
        assert_eq!(find("p4d.24xlarge").capacity.pods, 15 * 49 + 2);
        let inf2 = find("inf2.48xlarge");
        assert_eq!(inf2.capacity.get(RESOURCE_AWS_NEURON), 12);
        assert_eq!(inf2.capacity.get(RESOURCE_AWS_NEURON_CORE), 24);
        let pricing = Pricing::default();
        assert!(types.iter().all(|t| pricing.on_demand_price(&t.name).is_some()));
        assert_eq!(instance_types().unwrap(), types, "deterministic");
    }

    #[test]
    fn malformed_data_is_an_error() {
        assert!(parse("{\"region\": \"us-east-1\", \"types\": [{\"zones\": 3}]}").is_err());
    }
}
