//! Instance-type catalogs for the simulation.
//!
//! # `kwok`
//!
//! A generated set modelled on upstream's kwok provider: for each architecture (`amd64`,
//! `arm64`), each family `c` (2 GiB of memory per vCPU), `m` (4 GiB) and `r` (8 GiB), and each
//! size of 1, 2, 4, 8, 16, 32, 48 and 64 vCPUs, a type named `<family>-<cpu>x-<arch>`
//! (`c-4x-amd64`): 48 types. Each has the labels `node.kubernetes.io/instance-type`,
//! `kubernetes.io/arch`, `kubernetes.io/os=linux`, `karpenter.k8s.aws/instance-category` and
//! `instance-family` (the family), `instance-cpu`, `instance-memory` (MiB) and `instance-size`
//! (`4x`). It holds [`KWOK_MAX_PODS`] pods, fewer on types under 8 vCPUs (see [`kwok_pods`]), and
//! reserves [`KWOK_RESERVED_CPU_MILLIS`] of CPU and [`KWOK_RESERVED_MEMORY_MIB`] of memory for
//! kubelet. It is offered in [`KWOK_ZONES`] as on-demand at [`KWOK_PRICE_PER_VCPU_HOUR`] per vCPU
//! plus [`KWOK_PRICE_PER_GIB_HOUR`] per GiB an hour, and as spot at [`KWOK_SPOT_FRACTION`] of that.
//!
//! # `aws`
//!
//! The EC2 instance types of us-east-1 embedded in the binary, with the capacity, overhead and
//! labels the EC2 provider computes for a default EC2NodeClass (see
//! [`crate::cloudprovider::aws::embedded`]).
//!
//! # A catalog file
//!
//! A YAML list of instance types:
//!
//! ```yaml
//! - name: m5.large
//!   cpu: "2"              # a quantity
//!   memory: 8Gi           # a quantity
//!   pods: 29
//!   arch: amd64           # kubernetes.io/arch
//!   labels:               # optional, more node labels (os defaults to linux)
//!     karpenter.k8s.aws/instance-family: m5
//!   overhead:             # optional, reserved resources (quantities)
//!     cpu: 70m
//!     memory: 442Mi
//!   offerings:
//!     - zone: us-west-2a
//!       capacityType: on-demand   # on-demand, spot or reserved
//!       price: 0.096              # per hour
//!       available: true           # optional, default true
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use crate::apis::ResourceList;
use crate::apis::labels::{
    ARCH_AMD64, ARCH_ARM64, CAPACITY_TYPE_ON_DEMAND, CAPACITY_TYPE_SPOT, LABEL_ARCH, LABEL_INSTANCE_CATEGORY,
    LABEL_INSTANCE_CPU, LABEL_INSTANCE_FAMILY, LABEL_INSTANCE_MEMORY, LABEL_INSTANCE_SIZE, LABEL_OS,
};
use crate::cloudprovider::aws::embedded;
use crate::scheduling::resources::{CPU, MEMORY, PODS, parse_quantity_for};
use crate::scheduling::{InstanceType, Offering, Overhead, Requirements, Resources};

/// A catalog cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The catalog file cannot be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The catalog file is malformed.
    #[error("instance-type catalog {file}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The embedded EC2 catalog cannot be used.
    #[error("loading the aws instance-type catalog")]
    Aws(#[source] embedded::EmbeddedCatalogError),
}

/// Zones of the kwok catalog.
pub const KWOK_ZONES: [&str; 3] = ["test-zone-a", "test-zone-b", "test-zone-c"];
/// vCPU sizes of the kwok catalog.
pub const KWOK_SIZES: [i64; 8] = [1, 2, 4, 8, 16, 32, 48, 64];
/// Families of the kwok catalog with their GiB of memory per vCPU.
pub const KWOK_FAMILIES: [(&str, i64); 3] = [("c", 2), ("m", 4), ("r", 8)];
/// Pods a kwok node of 8 vCPUs or more holds (kubelet's default).
pub const KWOK_MAX_PODS: i64 = 110;
/// CPU a kwok node reserves for kubelet, in milli-cores.
pub const KWOK_RESERVED_CPU_MILLIS: i64 = 100;
/// Memory a kwok node reserves for kubelet, in MiB.
pub const KWOK_RESERVED_MEMORY_MIB: i64 = 200;
/// On-demand price of a vCPU an hour (that of a general-purpose vCPU in us-east-1).
pub const KWOK_PRICE_PER_VCPU_HOUR: f64 = 0.0416;
/// On-demand price of a GiB of memory an hour.
pub const KWOK_PRICE_PER_GIB_HOUR: f64 = 0.0052;
/// Spot price as a fraction of the on-demand price (a typical spot discount of 70%).
pub const KWOK_SPOT_FRACTION: f64 = 0.3;
/// The operating system of the generated types.
pub const OS_LINUX: &str = "linux";

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

/// Which catalog to use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Catalog {
    /// The generated kwok catalog.
    Kwok,
    /// The EC2 catalog embedded in the binary (us-east-1, see
    /// [`crate::cloudprovider::aws::embedded`]).
    Aws,
    /// A catalog file.
    File(String),
}

impl std::str::FromStr for Catalog {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "kwok" => Catalog::Kwok,
            "aws" => Catalog::Aws,
            path => Catalog::File(path.to_string()),
        })
    }
}

impl std::fmt::Display for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Catalog::Kwok => f.write_str("kwok"),
            Catalog::Aws => f.write_str("aws"),
            Catalog::File(path) => f.write_str(path),
        }
    }
}

impl Catalog {
    /// The catalog's instance types.
    pub fn load(&self) -> Result<Vec<Arc<InstanceType>>, CatalogError> {
        match self {
            Catalog::Kwok => Ok(kwok_instance_types()),
            Catalog::Aws => embedded::instance_types().map_err(CatalogError::Aws),
            Catalog::File(path) => load_file(Path::new(path)),
        }
    }
}

/// How many pods a kwok type of `cpu` vCPUs holds: 110, or 8 + 16 a vCPU under 8 vCPUs.
pub fn kwok_pods(cpu: i64) -> i64 {
    (8 + 16 * cpu).min(KWOK_MAX_PODS)
}

/// On-demand hourly price of a kwok type.
pub fn kwok_on_demand_price(cpu: i64, memory_gib: i64) -> f64 {
    cpu as f64 * KWOK_PRICE_PER_VCPU_HOUR + memory_gib as f64 * KWOK_PRICE_PER_GIB_HOUR
}

/// The generated kwok catalog (see the module documentation).
pub fn kwok_instance_types() -> Vec<Arc<InstanceType>> {
    let overhead = Overhead {
        kube_reserved: Resources::from_pairs([
            (CPU, KWOK_RESERVED_CPU_MILLIS),
            (MEMORY, KWOK_RESERVED_MEMORY_MIB * MIB),
        ]),
        ..Default::default()
    };
    let mut types = Vec::new();
    for arch in [ARCH_AMD64, ARCH_ARM64] {
        for (family, gib_per_cpu) in KWOK_FAMILIES {
            for cpu in KWOK_SIZES {
                let memory_gib = cpu * gib_per_cpu;
                let name = format!("{family}-{cpu}x-{arch}");
                let labels: BTreeMap<String, String> = [
                    (LABEL_ARCH, arch.to_string()),
                    (LABEL_OS, OS_LINUX.to_string()),
                    (LABEL_INSTANCE_CATEGORY, family.to_string()),
                    (LABEL_INSTANCE_FAMILY, family.to_string()),
                    (LABEL_INSTANCE_CPU, cpu.to_string()),
                    (LABEL_INSTANCE_MEMORY, (memory_gib * 1024).to_string()),
                    (LABEL_INSTANCE_SIZE, format!("{cpu}x")),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
                let on_demand = kwok_on_demand_price(cpu, memory_gib);
                let mut offerings = Vec::new();
                for zone in KWOK_ZONES {
                    for (capacity_type, price) in [
                        (CAPACITY_TYPE_ON_DEMAND, on_demand),
                        (CAPACITY_TYPE_SPOT, on_demand * KWOK_SPOT_FRACTION),
                    ] {
                        offerings.push(Offering::new(
                            zone.to_string(),
                            capacity_type.to_string(),
                            price,
                            true,
                        ));
                    }
                }
                types.push(Arc::new(InstanceType::new(
                    name,
                    Requirements::from_labels(&labels),
                    Resources::from_pairs([
                        (CPU, cpu * 1000),
                        (MEMORY, memory_gib * GIB),
                        (PODS, kwok_pods(cpu)),
                    ]),
                    overhead.clone(),
                    offerings,
                )));
            }
        }
    }
    types
}

/// One instance type of a catalog file.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogEntry {
    /// Instance type name.
    pub name: String,
    /// vCPUs (a quantity).
    pub cpu: k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    /// Memory (a quantity).
    pub memory: k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    /// How many pods it holds.
    pub pods: i64,
    /// Architecture.
    pub arch: String,
    /// More labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Reserved resources.
    #[serde(default)]
    pub overhead: ResourceList,
    /// Offerings.
    pub offerings: Vec<CatalogOffering>,
}

/// One offering of a catalog file entry.
#[derive(Deserialize, Debug, Clone)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CatalogOffering {
    /// Zone.
    pub zone: String,
    /// Capacity type.
    pub capacity_type: String,
    /// Hourly price.
    pub price: f64,
    /// Whether it can be launched.
    #[serde(default = "default_true")]
    pub available: bool,
}

fn default_true() -> bool {
    true
}

/// Reads a catalog file.
pub fn load_file(path: &Path) -> Result<Vec<Arc<InstanceType>>, CatalogError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| CatalogError::Read { path: path.display().to_string(), source })?;
    parse_catalog(&text, &path.display().to_string())
}

/// Parses a catalog file's text; `file` names it in messages.
pub fn parse_catalog(text: &str, file: &str) -> Result<Vec<Arc<InstanceType>>, CatalogError> {
    let err = |message: String| CatalogError::Invalid { file: file.to_string(), message };
    let entries: Vec<CatalogEntry> = serde_saphyr::from_str(text).map_err(|e| err(e.to_string()))?;
    let mut types = Vec::new();
    for (i, e) in entries.into_iter().enumerate() {
        let at = |m: String| err(format!("entry {} ({}): {m}", i + 1, e.name));
        let cpu = parse_quantity_for(CPU, &e.cpu).map_err(|x| at(x.to_string()))?;
        let memory = parse_quantity_for(MEMORY, &e.memory).map_err(|x| at(x.to_string()))?;
        let reserved = Resources::from_list(&e.overhead).map_err(|x| at(x.to_string()))?;
        if e.offerings.is_empty() {
            return Err(at("no offerings".to_string()));
        }
        let mut labels = e.labels.clone();
        labels.insert(LABEL_ARCH.to_string(), e.arch.clone());
        labels.entry(LABEL_OS.to_string()).or_insert_with(|| OS_LINUX.to_string());
        let offerings = e
            .offerings
            .iter()
            .map(|o| Offering::new(o.zone.clone(), o.capacity_type.clone(), o.price, o.available))
            .collect();
        types.push(Arc::new(InstanceType::new(
            e.name.clone(),
            Requirements::from_labels(&labels),
            Resources::from_pairs([(CPU, cpu), (MEMORY, memory), (PODS, e.pods)]),
            Overhead { kube_reserved: reserved, ..Default::default() },
            offerings,
        )));
    }
    Ok(types)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::labels::{LABEL_CAPACITY_TYPE, LABEL_INSTANCE_TYPE, LABEL_TOPOLOGY_ZONE};

    #[test]
    fn kwok_catalog_has_every_family_size_and_arch() {
        let types = kwok_instance_types();
        assert_eq!(types.len(), 2 * 3 * 8);
        let c4 = types.iter().find(|t| t.name == "c-4x-amd64").expect("c-4x-amd64 exists");
        let reqs = &c4.requirements;
        for (key, value) in [
            (LABEL_INSTANCE_TYPE, "c-4x-amd64"),
            (LABEL_ARCH, ARCH_AMD64),
            (LABEL_OS, OS_LINUX),
            (LABEL_INSTANCE_CATEGORY, "c"),
            (LABEL_INSTANCE_FAMILY, "c"),
            (LABEL_INSTANCE_CPU, "4"),
            (LABEL_INSTANCE_MEMORY, "8192"),
            (LABEL_INSTANCE_SIZE, "4x"),
            (LABEL_TOPOLOGY_ZONE, "test-zone-b"),
            (LABEL_CAPACITY_TYPE, CAPACITY_TYPE_SPOT),
        ] {
            assert!(reqs.allows(key, value), "{key}={value}");
        }
        assert_eq!(c4.capacity.cpu, 4000);
        assert_eq!(c4.capacity.memory, 8 * GIB);
        assert_eq!(c4.capacity.pods, 72);
        assert_eq!(c4.allocatable().cpu, 3900);
        assert_eq!(c4.offerings.len(), 6);
        let od = kwok_on_demand_price(4, 8);
        assert!((od - (4.0 * 0.0416 + 8.0 * 0.0052)).abs() < 1e-12);
        let spot = c4.offerings.iter().find(|o| o.capacity_type == CAPACITY_TYPE_SPOT).map(|o| o.price);
        assert_eq!(spot, Some(od * KWOK_SPOT_FRACTION));
        let big = types.iter().find(|t| t.name == "r-64x-arm64").expect("r-64x-arm64 exists");
        assert_eq!(big.capacity.pods, KWOK_MAX_PODS);
        assert_eq!(big.capacity.memory, 512 * GIB);
    }

    #[test]
    fn reads_a_catalog_file() {
        let text = "- name: m5.large\n  cpu: 2\n  memory: 8Gi\n  pods: 29\n  arch: amd64\n  labels: {karpenter.k8s.aws/instance-family: m5}\n  overhead: {cpu: 70m}\n  offerings:\n    - {zone: us-west-2a, capacityType: on-demand, price: 0.096}\n";
        let types = parse_catalog(text, "types.yaml").expect("parses");
        assert_eq!(types.len(), 1);
        assert_eq!(types[0].allocatable().cpu, 1930);
        assert!(types[0].requirements.allows(LABEL_OS, OS_LINUX));
        assert!(types[0].requirements.allows(LABEL_INSTANCE_FAMILY, "m5"));
        let err = parse_catalog(
            "- name: x\n  cpu: lots\n  memory: 1Gi\n  pods: 1\n  arch: amd64\n  offerings: []\n",
            "t.yaml",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("t.yaml") && err.contains("entry 1"), "{err}");
    }

    #[test]
    fn aws_catalog_is_the_embedded_one() {
        let types = "aws".parse::<Catalog>().unwrap().load().unwrap();
        assert_eq!(types, embedded::instance_types().unwrap());
        assert!(types.iter().any(|t| t.name == "m5.large"));
    }
}
