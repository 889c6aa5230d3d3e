//! EC2 instance types as the scheduler sees them: capacity, overhead, labels and offerings,
//! computed from the EC2 description of a type and the node class's kubelet settings.
//!
//! Everything here is pure; [`super::catalog`] fetches the descriptions.

use std::collections::BTreeSet;

use aws_sdk_ec2::types as ec2;
use serde::Deserialize;

use super::nodeclass::PlacementGroup;
use crate::apis::ec2nodeclass::{
    AmiFamily, EC2NodeClassSpec, InstanceStorePolicy, InterfaceType, KubeletConfiguration, NetworkInterface,
};
use crate::apis::labels::*;
use crate::scheduling::instancetypes::{InstanceType, Offering, Overhead};
use crate::scheduling::requirements::{Requirement, Requirements};
use crate::scheduling::resources::{
    CPU, EPHEMERAL_STORAGE, MEMORY, PODS, QuantityError, Resources, parse_quantity, parse_quantity_for,
};

/// Share of an instance's memory the hypervisor keeps (upstream's `VM_MEMORY_OVERHEAD_PERCENT`).
pub const DEFAULT_VM_MEMORY_OVERHEAD_PERCENT: f64 = 0.075;
/// Pods per node when the ENI limit is unknown.
pub const DEFAULT_MAX_PODS: i64 = 110;
/// Memory Graviton (arm64) instances set aside for the contiguous memory allocator, which the
/// node never gets.
pub const ARM64_CMA_RESERVED_MIB: i64 = 64;

const MI: i64 = 1 << 20;
const GI: i64 = 1 << 30;

/// A GPU model of an instance type.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Gpu {
    /// Model (`T4`).
    pub name: String,
    /// Manufacturer (`NVIDIA`, `AMD`, `Habana`).
    pub manufacturer: String,
    /// How many.
    pub count: i64,
    /// Memory per GPU in MiB.
    pub memory_mib: i64,
}

/// An ML accelerator (Inferentia, Trainium) of an instance type.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Accelerator {
    /// Model (`Inferentia`).
    pub name: String,
    /// Manufacturer (`AWS`).
    pub manufacturer: String,
    /// How many devices.
    pub count: i64,
    /// Neuron cores per device (0 for accelerators other than Neuron devices).
    #[serde(default)]
    pub cores: i64,
}

/// What Karpenter needs to know about an EC2 instance type, independent of the SDK.
///
/// It deserializes from an object with the field names below, missing fields taking their
/// default (the embedded catalog's format, see [`super::embedded`]).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct TypeInfo {
    /// Name (`m5.large`).
    pub name: String,
    /// EC2 architectures (`x86_64`, `arm64`).
    pub architectures: Vec<String>,
    /// Default number of vCPUs.
    pub vcpus: i64,
    /// Memory in MiB.
    pub memory_mib: i64,
    /// `nitro` or `xen`; empty for bare metal.
    pub hypervisor: String,
    /// CPU manufacturer as EC2 spells it (`Intel`, `AMD`, `AWS`).
    pub cpu_manufacturer: Option<String>,
    /// Sustained clock speed in GHz.
    pub sustained_clock_ghz: Option<f64>,
    /// Maximum network interfaces of the whole instance, over all network cards.
    pub max_enis: i64,
    /// Maximum network interfaces of the default network card, the only card the VPC CNI uses.
    /// `None` when EC2 does not say; the embedded catalog also leaves it out when it equals
    /// `max_enis`. Either way `max_enis` stands in (see [`TypeInfo::pod_enis`]).
    pub default_card_max_enis: Option<i64>,
    /// IPv4 addresses per interface.
    pub ipv4_per_eni: i64,
    /// Whether traffic between instances is encrypted.
    pub encryption_in_transit: bool,
    /// GPUs.
    pub gpus: Vec<Gpu>,
    /// Inferentia / Trainium devices.
    pub accelerators: Vec<Accelerator>,
    /// Maximum EFA interfaces.
    pub efa_interfaces: i64,
    /// Maximum network interfaces of each network card, by card index, when the type has more
    /// than one card (the embedded catalog leaves single-card types out; see
    /// [`TypeInfo::card_interfaces`]).
    pub network_cards: Vec<i64>,
    /// Whether the type has no ENA support (it takes no configured network interfaces).
    pub ena_unsupported: bool,
    /// Whether the type supports nested virtualization.
    pub nested_virtualization: bool,
    /// The placement group strategies the type supports, when not all three (`cluster`,
    /// `partition`, `spread`).
    pub placement_strategies: Vec<String>,
    /// Local NVMe instance storage in GB.
    pub local_nvme_gb: Option<i64>,
    /// Baseline network bandwidth in Mbps.
    pub network_bandwidth_mbps: Option<i64>,
    /// Maximum EBS bandwidth in Mbps.
    pub ebs_bandwidth_mbps: Option<i64>,
    /// Whether spot capacity can be bought.
    pub spot_supported: bool,
}

impl TypeInfo {
    /// Converts the EC2 description; `None` when it lacks a name, vCPUs or memory.
    pub fn from_sdk(info: &ec2::InstanceTypeInfo) -> Option<TypeInfo> {
        let name = info.instance_type()?.as_str().to_string();
        let vcpus = i64::from(info.v_cpu_info()?.default_v_cpus()?);
        let memory_mib = info.memory_info()?.size_in_mib()?;
        let processor = info.processor_info();
        let network = info.network_info();
        let gpus = info
            .gpu_info()
            .map(|g| g.gpus())
            .unwrap_or_default()
            .iter()
            .map(|g| Gpu {
                name: g.name().unwrap_or_default().to_string(),
                manufacturer: g.manufacturer().unwrap_or_default().to_string(),
                count: i64::from(g.count().unwrap_or(0)),
                memory_mib: i64::from(g.memory_info().and_then(|m| m.size_in_mib()).unwrap_or(0)),
            })
            .collect();
        let mut accelerators: Vec<Accelerator> = info
            .neuron_info()
            .map(|n| n.neuron_devices())
            .unwrap_or_default()
            .iter()
            .map(|d| Accelerator {
                name: d.name().unwrap_or_default().to_string(),
                manufacturer: "AWS".to_string(),
                count: i64::from(d.count().unwrap_or(0)),
                cores: i64::from(d.core_info().and_then(|c| c.count()).unwrap_or(0)),
            })
            .collect();
        if accelerators.is_empty() {
            accelerators = info
                .inference_accelerator_info()
                .map(|a| a.accelerators())
                .unwrap_or_default()
                .iter()
                .map(|d| Accelerator {
                    name: d.name().unwrap_or_default().to_string(),
                    manufacturer: d.manufacturer().unwrap_or_default().to_string(),
                    count: i64::from(d.count().unwrap_or(0)),
                    cores: 0,
                })
                .collect();
        }
        let nvme = info.instance_storage_info().and_then(|s| {
            let supported = !matches!(s.nvme_support(), Some(ec2::EphemeralNvmeSupport::Unsupported) | None);
            supported.then(|| s.total_size_in_gb()).flatten()
        });
        Some(TypeInfo {
            name,
            architectures: processor
                .map(|p| p.supported_architectures().iter().map(|a| a.as_str().to_string()).collect())
                .unwrap_or_default(),
            vcpus,
            memory_mib,
            hypervisor: info.hypervisor().map(|h| h.as_str().to_string()).unwrap_or_default(),
            cpu_manufacturer: processor.and_then(|p| p.manufacturer()).map(str::to_string),
            sustained_clock_ghz: processor.and_then(|p| p.sustained_clock_speed_in_ghz()),
            max_enis: i64::from(network.and_then(|n| n.maximum_network_interfaces()).unwrap_or(0)),
            default_card_max_enis: network
                .and_then(default_network_card)
                .and_then(|c| c.maximum_network_interfaces())
                .map(i64::from),
            ipv4_per_eni: i64::from(network.and_then(|n| n.ipv4_addresses_per_interface()).unwrap_or(0)),
            encryption_in_transit: network.and_then(|n| n.encryption_in_transit_supported()).unwrap_or(false),
            gpus,
            accelerators,
            efa_interfaces: i64::from(
                network.and_then(|n| n.efa_info()).and_then(|e| e.maximum_efa_interfaces()).unwrap_or(0),
            ),
            network_cards: network
                .map(|n| {
                    let mut cards: Vec<(i32, i64)> = n
                        .network_cards()
                        .iter()
                        .map(|c| {
                            (
                                c.network_card_index().unwrap_or(0),
                                i64::from(c.maximum_network_interfaces().unwrap_or(0)),
                            )
                        })
                        .collect();
                    cards.sort();
                    cards.into_iter().map(|(_, enis)| enis).collect::<Vec<i64>>()
                })
                .filter(|cards| cards.len() > 1)
                .unwrap_or_default(),
            ena_unsupported: network.and_then(|n| n.ena_support()) == Some(&ec2::EnaSupport::Unsupported),
            placement_strategies: info
                .placement_group_info()
                .map(|p| p.supported_strategies().iter().map(|s| s.as_str().to_string()).collect::<Vec<_>>())
                .filter(|all| !ALL_PLACEMENT_STRATEGIES.iter().all(|s| all.iter().any(|a| a == s)))
                .unwrap_or_default(),
            nested_virtualization: processor.is_some_and(|p| {
                p.supported_features().iter().any(|f| f.as_str() == "nested-virtualization")
            }),
            local_nvme_gb: nvme,
            network_bandwidth_mbps: network
                .and_then(|n| n.network_cards().first())
                .and_then(|c| c.baseline_bandwidth_in_gbps())
                .map(|g| (g * 1000.0).round() as i64),
            ebs_bandwidth_mbps: info
                .ebs_info()
                .and_then(|e| e.ebs_optimized_info())
                .and_then(|o| o.maximum_bandwidth_in_mbps())
                .map(i64::from),
            spot_supported: info.supported_usage_classes().contains(&ec2::UsageClassType::Spot),
        })
    }

    /// Whether instances of the type can be in a placement group of `strategy`.
    pub fn supports_placement(&self, strategy: &str) -> bool {
        self.placement_strategies.is_empty() || self.placement_strategies.iter().any(|s| s == strategy)
    }

    /// Maximum network interfaces of the network card `index`: `None` when the type has no
    /// such card.
    pub fn card_interfaces(&self, index: i32) -> Option<i64> {
        let index = usize::try_from(index).ok()?;
        if self.network_cards.is_empty() {
            return (index == 0).then(|| self.pod_enis());
        }
        self.network_cards.get(index).copied()
    }

    /// Network interfaces pods can get addresses from: those of the default network card, else
    /// (card unknown) those of the instance.
    pub fn pod_enis(&self) -> i64 {
        self.default_card_max_enis.unwrap_or(self.max_enis)
    }

    /// The Kubernetes architecture (`amd64`, `arm64`), if the type has a supported one.
    pub fn arch(&self) -> Option<&'static str> {
        if self.architectures.iter().any(|a| a == "x86_64") {
            Some(ARCH_AMD64)
        } else if self.architectures.iter().any(|a| a == "arm64") {
            Some(ARCH_ARM64)
        } else {
            None
        }
    }

    /// Family (`m5`) and size (`large`).
    pub fn family_and_size(&self) -> (&str, &str) {
        self.name.split_once('.').unwrap_or((&self.name, ""))
    }
}

/// The default network card of a type: the card with the default index, else (cards not
/// numbered) the card at that position.
fn default_network_card(network: &ec2::NetworkInfo) -> Option<&ec2::NetworkCardInfo> {
    let index = network.default_network_card_index().unwrap_or(0);
    let cards = network.network_cards();
    cards
        .iter()
        .find(|c| c.network_card_index() == Some(index))
        .or_else(|| usize::try_from(index).ok().and_then(|i| cards.get(i)))
}

/// Category (`m`, `inf`) and generation (`5`) of a family name (`m5`, `inf2`, `u-6tb1`).
pub fn category_and_generation(family: &str) -> (String, Option<String>) {
    let category: String = family.chars().take_while(|c| c.is_ascii_lowercase()).collect();
    let mut rest = &family[category.len()..];
    if let Some(after_dash) = rest.strip_prefix('-') {
        // `-<n>tb` memory marker of the high-memory families.
        let digits = after_dash.chars().take_while(char::is_ascii_digit).count();
        if after_dash[digits..].starts_with("tb") {
            rest = &after_dash[digits + 2..];
        }
    }
    let generation: String = rest.chars().take_while(char::is_ascii_digit).collect();
    (category, (!generation.is_empty()).then_some(generation))
}

/// Node-class and operator settings that shape every instance type.
#[derive(Clone, Debug)]
pub struct Settings<'a> {
    /// The region (label `topology.kubernetes.io/region`).
    pub region: &'a str,
    /// Kubelet settings of the node class.
    pub kubelet: Option<&'a KubeletConfiguration>,
    /// AMI family of the node class.
    pub ami_family: AmiFamily,
    /// Size of the volume backing the kubelet's ephemeral storage.
    pub ephemeral_storage: i64,
    /// Whether instance-store volumes become the ephemeral storage.
    pub instance_store_raid0: bool,
    /// Network interfaces kept out of the pod-density computation.
    pub reserved_enis: i64,
    /// Share of memory the hypervisor keeps.
    pub vm_memory_overhead_percent: f64,
    /// The node class's network interfaces (none: the primary interface only).
    pub network_interfaces: &'a [NetworkInterface],
    /// The placement group the node class launches into.
    pub placement_group: Option<&'a PlacementGroup>,
}

impl<'a> Settings<'a> {
    /// The settings of a node class, with default operator settings.
    pub fn for_node_class(region: &'a str, spec: &'a EC2NodeClassSpec) -> Self {
        let ami_family = super::amifamily::family_of(spec);
        Settings {
            region,
            kubelet: spec.kubelet.as_ref(),
            ami_family,
            ephemeral_storage: super::amifamily::ephemeral_storage(spec, ami_family),
            instance_store_raid0: spec.instance_store_policy == Some(InstanceStorePolicy::RAID0),
            reserved_enis: 0,
            vm_memory_overhead_percent: DEFAULT_VM_MEMORY_OVERHEAD_PERCENT,
            network_interfaces: &spec.network_interfaces,
            placement_group: None,
        }
    }
}

/// Memory the node sees: the type's memory, less the CMA reservation on arm64 (when arm64 is
/// the first architecture EC2 lists), less the hypervisor's share of what remains (rounded up
/// to MiB).
pub fn memory(info: &TypeInfo, overhead_percent: f64) -> i64 {
    let mut mib = info.memory_mib;
    if info.architectures.first().is_some_and(|a| a == "arm64") {
        mib -= ARM64_CMA_RESERVED_MIB;
    }
    let overhead_mib = (mib as f64 * overhead_percent).ceil() as i64;
    (mib - overhead_mib) * MI
}

/// Pods per node limited by the ENIs of the default network card and their IPv4 addresses (VPC
/// CNI without prefix delegation): `ENIs × (IPs per ENI − 1) + 2`, where ENIs excludes the
/// reserved ones. No ENI left means no pod. `None` when the type's network limits are unknown.
pub fn eni_limited_pods(info: &TypeInfo, reserved_enis: i64) -> Option<i64> {
    let enis = info.pod_enis();
    if enis <= 0 || info.ipv4_per_eni <= 0 {
        return None;
    }
    let usable = (enis - reserved_enis).max(0);
    if usable == 0 {
        return Some(0);
    }
    Some(usable * (info.ipv4_per_eni - 1) + 2)
}

/// Pods per node: kubelet's `maxPods`, else the ENI limit, capped by `podsPerCore × vCPUs`
/// (which Bottlerocket ignores).
pub fn pods(info: &TypeInfo, settings: &Settings<'_>) -> i64 {
    let kubelet = settings.kubelet;
    let windows = super::amifamily::windows(settings.ami_family).is_some();
    let mut count = match kubelet.and_then(|k| k.max_pods) {
        Some(max) => i64::from(max),
        // Windows nodes are not limited by their interfaces' addresses (upstream's figure).
        None if windows => DEFAULT_MAX_PODS,
        // An EFA-only interface on the default card takes an ENI and gives no address.
        None => {
            let efa_only = settings
                .network_interfaces
                .iter()
                .filter(|n| n.network_card_index == 0 && n.interface_type == InterfaceType::EfaOnly)
                .count() as i64;
            eni_limited_pods(info, settings.reserved_enis + efa_only).unwrap_or(DEFAULT_MAX_PODS)
        }
    };
    if let Some(per_core) = kubelet.and_then(|k| k.pods_per_core).filter(|p| *p > 0)
        && settings.ami_family != AmiFamily::Bottlerocket
    {
        count = count.min(i64::from(per_core) * info.vcpus);
    }
    count
}

/// Ephemeral storage of a node of this type.
pub fn ephemeral_storage(info: &TypeInfo, settings: &Settings<'_>) -> i64 {
    match info.local_nvme_gb {
        Some(gb) if settings.instance_store_raid0 && gb > 0 => gb * 1_000_000_000,
        _ => settings.ephemeral_storage,
    }
}

/// Total capacity of a node of this type.
pub fn capacity(info: &TypeInfo, settings: &Settings<'_>) -> Resources {
    let mut r = Resources::from_pairs([
        (CPU, info.vcpus * 1000),
        (MEMORY, memory(info, settings.vm_memory_overhead_percent)),
        (EPHEMERAL_STORAGE, ephemeral_storage(info, settings)),
        (PODS, pods(info, settings)),
    ]);
    for gpu in &info.gpus {
        let resource = match gpu.manufacturer.to_ascii_lowercase().as_str() {
            "nvidia" => RESOURCE_NVIDIA_GPU,
            "amd" => RESOURCE_AMD_GPU,
            "habana" => RESOURCE_HABANA_GAUDI,
            _ => continue,
        };
        r.set(resource, r.get(resource) + gpu.count);
    }
    let neuron: i64 = info.accelerators.iter().map(|a| a.count).sum();
    r.set(RESOURCE_AWS_NEURON, neuron);
    // Neuron cores of the first device model, the only one any type has.
    let cores = info.accelerators.first().map_or(0, |a| a.count * a.cores);
    r.set(RESOURCE_AWS_NEURON_CORE, cores);
    // The node class's EFA-only interfaces, when it configures interfaces; else every EFA
    // interface the type can have.
    let efa = if settings.network_interfaces.is_empty() {
        info.efa_interfaces
    } else {
        settings.network_interfaces.iter().filter(|n| n.interface_type == InterfaceType::EfaOnly).count()
            as i64
    };
    r.set(RESOURCE_EFA, efa);
    // A Windows node's pods take the secondary addresses of its primary interface, which the
    // VPC resource controller advertises as this resource.
    if super::amifamily::windows(settings.ami_family).is_some() {
        r.set(RESOURCE_PRIVATE_IPV4_ADDRESS, (info.ipv4_per_eni - 1).max(0));
    }
    r
}

/// The placement group strategies EC2 has.
const ALL_PLACEMENT_STRATEGIES: [&str; 3] = ["cluster", "partition", "spread"];

/// Whether instances of `info` can be launched as `spec` asks, as upstream's compatibility
/// checks: AL2023 does not boot on `a1`; configured network interfaces need ENA, the cards and
/// device indexes they name and the EFA-only interfaces they count; nested virtualization, when
/// enabled, a type that supports it; a placement group, a type that supports its strategy.
pub fn compatible(info: &TypeInfo, spec: &EC2NodeClassSpec, group: Option<&PlacementGroup>) -> bool {
    if group.is_some_and(|g| !info.supports_placement(&g.strategy)) {
        return false;
    }
    if super::amifamily::family_of(spec) == AmiFamily::AL2023 && info.name.starts_with("a1.") {
        return false;
    }
    let nics = &spec.network_interfaces;
    if !nics.is_empty() {
        if info.ena_unsupported {
            return false;
        }
        let fits = nics.iter().all(|n| {
            info.card_interfaces(n.network_card_index).is_some_and(|max| i64::from(n.device_index) < max)
        });
        let efa_only = nics.iter().filter(|n| n.interface_type == InterfaceType::EfaOnly).count() as i64;
        if !fits || efa_only > info.efa_interfaces {
            return false;
        }
    }
    let nested = spec.cpu_options.as_ref().and_then(|c| c.nested_virtualization.as_deref());
    nested != Some("enabled") || info.nested_virtualization
}

/// CPU kubelet and the container runtime need: 6% of the first core, 1% of the second, 0.5% of
/// the third and fourth and 0.25% of every further core (in millicores, each range truncated).
pub fn kube_reserved_cpu(cpu_millis: i64) -> i64 {
    const RANGES: [(i64, i64, f64); 4] =
        [(0, 1000, 0.06), (1000, 2000, 0.01), (2000, 4000, 0.005), (4000, i64::MAX, 0.0025)];
    RANGES
        .iter()
        .map(|(start, end, share)| {
            let in_range = (cpu_millis.min(*end) - start).max(0);
            (in_range as f64 * share) as i64
        })
        .sum()
}

/// Resources reserved for Kubernetes daemons: the defaults, overridden per key by the kubelet's
/// `kubeReserved`. The memory is sized for `memory_pods` pods (see [`memory_overhead_pods`]).
pub fn kube_reserved(
    capacity: &Resources,
    memory_pods: i64,
    kubelet: Option<&KubeletConfiguration>,
) -> Result<Resources, QuantityError> {
    let mut r = Resources::from_pairs([
        (CPU, kube_reserved_cpu(capacity.cpu)),
        (MEMORY, (11 * memory_pods + 255) * MI),
        (EPHEMERAL_STORAGE, GI),
    ]);
    apply_overrides(&mut r, kubelet.and_then(|k| k.kube_reserved.as_ref()))?;
    Ok(r)
}

/// Resources reserved for the operating system: only what the kubelet's `systemReserved` says.
pub fn system_reserved(kubelet: Option<&KubeletConfiguration>) -> Result<Resources, QuantityError> {
    let mut r = Resources::default();
    apply_overrides(&mut r, kubelet.and_then(|k| k.system_reserved.as_ref()))?;
    Ok(r)
}

fn apply_overrides(
    r: &mut Resources,
    overrides: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<(), QuantityError> {
    for (name, value) in overrides.into_iter().flatten() {
        if name == "pid" {
            continue;
        }
        let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(value.clone());
        r.set(name, parse_quantity_for(name, &q)?);
    }
    Ok(())
}

/// Memory and storage kept free for kubelet's eviction: 100Mi and 10% of the ephemeral storage,
/// unless `evictionHard` sets a threshold. Soft thresholds (`evictionSoft`) only start graceful
/// evictions and take nothing from allocatable, so they never count, whatever the AMI family.
pub fn eviction_threshold(
    capacity: &Resources,
    kubelet: Option<&KubeletConfiguration>,
) -> Result<Resources, QuantityError> {
    let mut memory: Option<i64> = None;
    let mut storage: Option<i64> = None;
    if let Some(hard) = kubelet.and_then(|k| k.eviction_hard.as_ref()) {
        if let Some(v) = hard.get("memory.available") {
            memory = Some(threshold(v, capacity.memory, MEMORY)?);
        }
        if let Some(v) = hard.get("nodefs.available") {
            storage = Some(threshold(v, capacity.ephemeral_storage, EPHEMERAL_STORAGE)?);
        }
    }
    Ok(Resources::from_pairs([
        (MEMORY, memory.unwrap_or(100 * MI)),
        (
            EPHEMERAL_STORAGE,
            storage.unwrap_or_else(|| (capacity.ephemeral_storage as f64 * 0.1).ceil() as i64),
        ),
    ]))
}

/// A threshold written as a percentage of `total` or as a quantity. `100%` disables a threshold
/// in kubelet, so it reserves nothing.
fn threshold(value: &str, total: i64, resource: &str) -> Result<i64, QuantityError> {
    let err = || QuantityError { resource: resource.to_string(), quantity: value.to_string() };
    match value.strip_suffix('%') {
        Some(pct) => {
            let mut pct: f64 = pct.parse().map_err(|_| err())?;
            if pct == 100.0 {
                pct = 0.0;
            }
            Ok((total as f64 * pct / 100.0).ceil() as i64)
        }
        None => parse_quantity(value, 1).ok_or_else(err),
    }
}

/// The pod count kube-reserved memory is sized for. The Amazon Linux and custom images reserve
/// memory for the ENI-limited pod count (without reserved ENIs) whatever `maxPods` says, as their
/// bootstrap does; Bottlerocket reserves it for the node's pod capacity.
pub fn memory_overhead_pods(info: &TypeInfo, settings: &Settings<'_>, pods: i64) -> i64 {
    match settings.ami_family {
        AmiFamily::AL2 | AmiFamily::AL2023 | AmiFamily::Custom => eni_limited_pods(info, 0).unwrap_or(pods),
        AmiFamily::Bottlerocket
        | AmiFamily::Windows2019
        | AmiFamily::Windows2022
        | AmiFamily::Windows2025 => pods,
    }
}

/// The full overhead of a node of this type.
pub fn overhead(
    capacity: &Resources,
    memory_pods: i64,
    kubelet: Option<&KubeletConfiguration>,
) -> Result<Overhead, QuantityError> {
    Ok(Overhead {
        kube_reserved: kube_reserved(capacity, memory_pods, kubelet)?,
        system_reserved: system_reserved(kubelet)?,
        eviction_threshold: eviction_threshold(capacity, kubelet)?,
        above_baseline: Resources::default(),
    })
}

fn single(reqs: &mut Requirements, key: &str, value: impl Into<String>) {
    reqs.add(key, Requirement::in_values([value.into()]));
}

/// The labels of a node of this type (without zone, capacity type and instance type, which
/// [`InstanceType::new`] adds). Labels a type lacks (GPUs, accelerators, NVMe) are
/// `DoesNotExist`, so that selectors requiring them exclude the type.
pub fn requirements(info: &TypeInfo, region: &str) -> Requirements {
    let mut r = Requirements::new();
    if let Some(arch) = info.arch() {
        single(&mut r, LABEL_ARCH, arch);
    }
    single(&mut r, LABEL_OS, "linux");
    r.add(LABEL_WINDOWS_BUILD, Requirement::does_not_exist());
    single(&mut r, LABEL_TOPOLOGY_REGION, region);
    let (family, size) = info.family_and_size();
    let (category, generation) = category_and_generation(family);
    single(&mut r, LABEL_INSTANCE_CATEGORY, category);
    single(&mut r, LABEL_INSTANCE_FAMILY, family);
    match generation {
        Some(g) => single(&mut r, LABEL_INSTANCE_GENERATION, g),
        None => r.add(LABEL_INSTANCE_GENERATION, Requirement::does_not_exist()),
    }
    single(&mut r, LABEL_INSTANCE_SIZE, size);
    single(&mut r, LABEL_INSTANCE_CPU, info.vcpus.to_string());
    match &info.cpu_manufacturer {
        Some(m) => single(&mut r, LABEL_INSTANCE_CPU_MANUFACTURER, m.to_ascii_lowercase()),
        None => r.add(LABEL_INSTANCE_CPU_MANUFACTURER, Requirement::does_not_exist()),
    }
    match info.sustained_clock_ghz {
        Some(ghz) => single(
            &mut r,
            LABEL_INSTANCE_CPU_SUSTAINED_CLOCK_SPEED_MHZ,
            ((ghz * 1000.0).round() as i64).to_string(),
        ),
        None => r.add(LABEL_INSTANCE_CPU_SUSTAINED_CLOCK_SPEED_MHZ, Requirement::does_not_exist()),
    }
    single(&mut r, LABEL_INSTANCE_MEMORY, info.memory_mib.to_string());
    single(&mut r, LABEL_INSTANCE_HYPERVISOR, info.hypervisor.clone());
    single(&mut r, LABEL_INSTANCE_CAPABILITY_FLEX, family.contains("-flex").to_string());
    // Every type launches with default or dedicated tenancy, as the NodeClaim asks.
    r.add(LABEL_INSTANCE_TENANCY, Requirement::in_values([TENANCY_DEFAULT, TENANCY_DEDICATED]));
    single(&mut r, LABEL_INSTANCE_ENCRYPTION_IN_TRANSIT_SUPPORTED, info.encryption_in_transit.to_string());
    optional(&mut r, LABEL_INSTANCE_NETWORK_BANDWIDTH, info.network_bandwidth_mbps);
    optional(&mut r, LABEL_INSTANCE_EBS_BANDWIDTH, info.ebs_bandwidth_mbps);
    optional(&mut r, LABEL_INSTANCE_LOCAL_NVME, info.local_nvme_gb);

    // GPU labels describe the type's single GPU model.
    match info.gpus.as_slice() {
        [gpu] => {
            single(&mut r, LABEL_INSTANCE_GPU_NAME, gpu.name.to_ascii_lowercase());
            single(&mut r, LABEL_INSTANCE_GPU_MANUFACTURER, gpu.manufacturer.to_ascii_lowercase());
            single(&mut r, LABEL_INSTANCE_GPU_COUNT, gpu.count.to_string());
            single(&mut r, LABEL_INSTANCE_GPU_MEMORY, gpu.memory_mib.to_string());
        }
        _ => {
            for key in [
                LABEL_INSTANCE_GPU_NAME,
                LABEL_INSTANCE_GPU_MANUFACTURER,
                LABEL_INSTANCE_GPU_COUNT,
                LABEL_INSTANCE_GPU_MEMORY,
            ] {
                r.add(key, Requirement::does_not_exist());
            }
        }
    }
    match info.accelerators.as_slice() {
        [acc] => {
            single(&mut r, LABEL_INSTANCE_ACCELERATOR_NAME, acc.name.to_ascii_lowercase());
            single(&mut r, LABEL_INSTANCE_ACCELERATOR_MANUFACTURER, acc.manufacturer.to_ascii_lowercase());
            single(&mut r, LABEL_INSTANCE_ACCELERATOR_COUNT, acc.count.to_string());
        }
        _ => {
            for key in [
                LABEL_INSTANCE_ACCELERATOR_NAME,
                LABEL_INSTANCE_ACCELERATOR_MANUFACTURER,
                LABEL_INSTANCE_ACCELERATOR_COUNT,
            ] {
                r.add(key, Requirement::does_not_exist());
            }
        }
    }
    r
}

fn optional(r: &mut Requirements, key: &str, value: Option<i64>) {
    match value {
        Some(v) => single(r, key, v.to_string()),
        None => r.add(key, Requirement::does_not_exist()),
    }
}

/// Where and how a type can be bought, as the catalog knows it.
pub struct OfferingInputs<'a> {
    /// Zones the type is offered in.
    pub offered_zones: &'a BTreeSet<String>,
    /// Zones that have one of the node class's subnets.
    pub subnet_zones: &'a BTreeSet<String>,
    /// Price of `(zone, capacity type)`.
    pub price: &'a dyn Fn(&str, &str) -> Option<f64>,
    /// Whether `(zone, capacity type)` recently ran out of capacity.
    pub unavailable: &'a dyn Fn(&str, &str) -> bool,
}

/// The offerings of a type: one per zone it is offered in and capacity type with a known price.
/// An offering is available when its zone has a subnet of the class and it has not recently
/// run out of capacity.
pub fn offerings(info: &TypeInfo, inputs: &OfferingInputs<'_>) -> Vec<Offering> {
    let mut capacity_types = vec![CAPACITY_TYPE_ON_DEMAND];
    if info.spot_supported {
        capacity_types.push(CAPACITY_TYPE_SPOT);
    }
    let mut out = Vec::new();
    for zone in inputs.offered_zones {
        for ct in &capacity_types {
            let Some(price) = (inputs.price)(zone, ct) else { continue };
            let available = inputs.subnet_zones.contains(zone) && !(inputs.unavailable)(zone, ct);
            out.push(Offering::new(zone.clone(), *ct, price, available));
        }
    }
    out
}

/// The labels of a node in `group`: its id, and for a partition group the partitions it may
/// be in (the scheduler picks one, as it picks a zone, when pods spread over them).
pub fn placement_requirements(r: &mut Requirements, group: &PlacementGroup) {
    single(r, LABEL_PLACEMENT_GROUP_ID, group.id.clone());
    if group.is_partitioned() {
        r.add(
            LABEL_PLACEMENT_GROUP_PARTITION,
            Requirement::in_values((1..=group.partition_count).map(|p| p.to_string())),
        );
    }
}

/// The labels of a type that depend on the AMI family, as upstream sets them: a Windows node is
/// `kubernetes.io/os: windows` with its family's `node.kubernetes.io/windows-build`, and only an
/// amd64 type runs Windows (an arm64 one gets no OS, which no Windows image matches).
pub fn family_requirements(r: &mut Requirements, info: &TypeInfo, family: AmiFamily) {
    let Some((_, build)) = super::amifamily::windows(family) else { return };
    r.remove(LABEL_OS);
    let os = match info.arch() {
        Some(ARCH_AMD64) => Requirement::in_values(["windows"]),
        _ => Requirement::does_not_exist(),
    };
    r.add(LABEL_OS, os);
    r.remove(LABEL_WINDOWS_BUILD);
    single(r, LABEL_WINDOWS_BUILD, build);
}

/// Builds the scheduler's instance type.
pub fn instance_type(
    info: &TypeInfo,
    settings: &Settings<'_>,
    offerings: Vec<Offering>,
) -> Result<InstanceType, QuantityError> {
    let capacity = capacity(info, settings);
    let memory_pods = memory_overhead_pods(info, settings, capacity.pods);
    let overhead = overhead(&capacity, memory_pods, settings.kubelet)?;
    let mut requirements = requirements(info, settings.region);
    family_requirements(&mut requirements, info, settings.ami_family);
    if let Some(group) = settings.placement_group {
        placement_requirements(&mut requirements, group);
    }
    Ok(InstanceType::new(info.name.clone(), requirements, capacity, overhead, offerings))
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::scheduling::resources::format_quantity;

    pub(crate) fn m5_large() -> TypeInfo {
        TypeInfo {
            name: "m5.large".into(),
            architectures: vec!["x86_64".into()],
            vcpus: 2,
            memory_mib: 8192,
            hypervisor: "nitro".into(),
            cpu_manufacturer: Some("Intel".into()),
            sustained_clock_ghz: Some(3.1),
            max_enis: 3,
            ipv4_per_eni: 10,
            encryption_in_transit: false,
            network_bandwidth_mbps: Some(750),
            ebs_bandwidth_mbps: Some(4750),
            spot_supported: true,
            ..Default::default()
        }
    }

    pub(crate) fn c6g_xlarge() -> TypeInfo {
        TypeInfo {
            name: "c6g.xlarge".into(),
            architectures: vec!["arm64".into()],
            vcpus: 4,
            memory_mib: 8192,
            hypervisor: "nitro".into(),
            cpu_manufacturer: Some("AWS".into()),
            sustained_clock_ghz: Some(2.5),
            max_enis: 4,
            ipv4_per_eni: 15,
            encryption_in_transit: false,
            network_bandwidth_mbps: Some(1250),
            ebs_bandwidth_mbps: Some(4750),
            spot_supported: true,
            ..Default::default()
        }
    }

    pub(crate) fn g4dn_xlarge() -> TypeInfo {
        TypeInfo {
            name: "g4dn.xlarge".into(),
            architectures: vec!["x86_64".into()],
            vcpus: 4,
            memory_mib: 16384,
            hypervisor: "nitro".into(),
            cpu_manufacturer: Some("Intel".into()),
            sustained_clock_ghz: Some(2.5),
            max_enis: 3,
            ipv4_per_eni: 10,
            encryption_in_transit: true,
            gpus: vec![Gpu { name: "T4".into(), manufacturer: "NVIDIA".into(), count: 1, memory_mib: 16384 }],
            local_nvme_gb: Some(125),
            network_bandwidth_mbps: Some(5000),
            ebs_bandwidth_mbps: Some(3500),
            spot_supported: true,
            ..Default::default()
        }
    }

    pub(crate) fn t3_medium() -> TypeInfo {
        TypeInfo {
            name: "t3.medium".into(),
            architectures: vec!["x86_64".into()],
            vcpus: 2,
            memory_mib: 4096,
            hypervisor: "nitro".into(),
            cpu_manufacturer: Some("Intel".into()),
            sustained_clock_ghz: Some(2.5),
            max_enis: 3,
            ipv4_per_eni: 6,
            encryption_in_transit: false,
            network_bandwidth_mbps: Some(256),
            ebs_bandwidth_mbps: Some(2085),
            spot_supported: true,
            ..Default::default()
        }
    }

    fn default_settings() -> Settings<'static> {
        Settings { region: "us-west-2", ..crate::cloudprovider::aws::embedded::default_settings() }
    }

    fn fmt(r: &Resources) -> BTreeMap<String, String> {
        r.iter().map(|(k, v)| (k.to_string(), format_quantity(k, v))).collect()
    }

    /// (type, capacity, kube-reserved cpu, kube-reserved memory, allocatable memory)
    #[rstest::rstest]
    #[case(m5_large(), "2", "7577Mi", 29, "70m", "574Mi", "6903Mi")]
    // arm64: 8192Mi less the 64Mi CMA reservation, less 7.5% of the remaining 8128Mi (610Mi).
    #[case(c6g_xlarge(), "4", "7518Mi", 58, "80m", "893Mi", "6525Mi")]
    #[case(g4dn_xlarge(), "4", "15155Mi", 29, "80m", "574Mi", "14481Mi")]
    #[case(t3_medium(), "2", "3788Mi", 17, "70m", "442Mi", "3246Mi")]
    fn capacity_and_overhead(
        #[case] info: TypeInfo,
        #[case] cpu: &str,
        #[case] mem: &str,
        #[case] pods: i64,
        #[case] reserved_cpu: &str,
        #[case] reserved_mem: &str,
        #[case] alloc_mem: &str,
    ) {
        let it = instance_type(&info, &default_settings(), vec![]).unwrap();
        let cap = fmt(&it.capacity);
        assert_eq!(cap["cpu"], cpu);
        assert_eq!(cap["memory"], mem);
        assert_eq!(cap["ephemeral-storage"], "20Gi");
        assert_eq!(it.capacity.pods, pods);
        assert_eq!(format_quantity(CPU, it.overhead.kube_reserved.cpu), reserved_cpu);
        assert_eq!(format_quantity(MEMORY, it.overhead.kube_reserved.memory), reserved_mem);
        assert_eq!(format_quantity(EPHEMERAL_STORAGE, it.overhead.kube_reserved.ephemeral_storage), "1Gi");
        assert_eq!(format_quantity(MEMORY, it.overhead.eviction_threshold.memory), "100Mi");
        // 10% of 20Gi, rounded up to a byte.
        assert_eq!(it.overhead.eviction_threshold.ephemeral_storage, 2147483648);
        assert_eq!(format_quantity(MEMORY, it.allocatable().memory), alloc_mem);
    }

    #[test]
    fn gpu_resources_and_labels() {
        let it = instance_type(&g4dn_xlarge(), &default_settings(), vec![]).unwrap();
        assert_eq!(it.capacity.get(RESOURCE_NVIDIA_GPU), 1);
        let labels = it.requirements.single_valued_labels();
        assert_eq!(labels[LABEL_INSTANCE_GPU_NAME], "t4");
        assert_eq!(labels[LABEL_INSTANCE_GPU_MANUFACTURER], "nvidia");
        assert_eq!(labels[LABEL_INSTANCE_GPU_COUNT], "1");
        assert_eq!(labels[LABEL_INSTANCE_GPU_MEMORY], "16384");
        assert_eq!(labels[LABEL_INSTANCE_LOCAL_NVME], "125");
        assert_eq!(labels[LABEL_INSTANCE_ENCRYPTION_IN_TRANSIT_SUPPORTED], "true");
        assert_eq!(labels[LABEL_INSTANCE_CATEGORY], "g");
        assert_eq!(labels[LABEL_INSTANCE_GENERATION], "4");
        assert_eq!(labels[LABEL_INSTANCE_FAMILY], "g4dn");
    }

    #[test]
    fn labels_of_m5_large_and_c6g() {
        let m5 = requirements(&m5_large(), "us-west-2").single_valued_labels();
        let want = [
            (LABEL_ARCH, "amd64"),
            (LABEL_OS, "linux"),
            (LABEL_TOPOLOGY_REGION, "us-west-2"),
            (LABEL_INSTANCE_CATEGORY, "m"),
            (LABEL_INSTANCE_FAMILY, "m5"),
            (LABEL_INSTANCE_GENERATION, "5"),
            (LABEL_INSTANCE_SIZE, "large"),
            (LABEL_INSTANCE_CPU, "2"),
            (LABEL_INSTANCE_CPU_MANUFACTURER, "intel"),
            (LABEL_INSTANCE_CPU_SUSTAINED_CLOCK_SPEED_MHZ, "3100"),
            (LABEL_INSTANCE_MEMORY, "8192"),
            (LABEL_INSTANCE_HYPERVISOR, "nitro"),
            (LABEL_INSTANCE_ENCRYPTION_IN_TRANSIT_SUPPORTED, "false"),
            (LABEL_INSTANCE_NETWORK_BANDWIDTH, "750"),
            (LABEL_INSTANCE_EBS_BANDWIDTH, "4750"),
        ];
        for (k, v) in want {
            assert_eq!(m5.get(k).map(String::as_str), Some(v), "{k}");
        }
        let reqs = requirements(&m5_large(), "us-west-2");
        assert!(!reqs.allows(LABEL_INSTANCE_GPU_COUNT, "1"));
        assert_eq!(m5[LABEL_INSTANCE_CAPABILITY_FLEX], "false");
        // Either tenancy: the NodeClaim's requirements choose, so no single label.
        assert!(
            reqs.allows(LABEL_INSTANCE_TENANCY, "default")
                && reqs.allows(LABEL_INSTANCE_TENANCY, "dedicated")
        );
        assert!(!reqs.allows(LABEL_INSTANCE_TENANCY, "host"));
        assert!(!m5.contains_key(LABEL_INSTANCE_TENANCY));
        let flex = TypeInfo { name: "c7i-flex.large".into(), ..m5_large() };
        assert_eq!(
            requirements(&flex, "us-west-2").single_valued_labels()[LABEL_INSTANCE_CAPABILITY_FLEX],
            "true"
        );
        assert!(!m5.contains_key(LABEL_INSTANCE_LOCAL_NVME));
        let c6g = requirements(&c6g_xlarge(), "us-west-2").single_valued_labels();
        assert_eq!(c6g[LABEL_ARCH], "arm64");
        assert_eq!(c6g[LABEL_INSTANCE_CPU_MANUFACTURER], "aws");
        assert_eq!(c6g[LABEL_INSTANCE_CATEGORY], "c");
        assert_eq!(c6g[LABEL_INSTANCE_GENERATION], "6");
    }

    #[rstest::rstest]
    #[case("m5", "m", Some("5"))]
    #[case("g4dn", "g", Some("4"))]
    #[case("inf2", "inf", Some("2"))]
    #[case("u-6tb1", "u", Some("1"))]
    #[case("mac2-m2pro", "mac", Some("2"))]
    #[case("weird", "weird", None)]
    fn categories(#[case] family: &str, #[case] cat: &str, #[case] generation: Option<&str>) {
        assert_eq!(category_and_generation(family), (cat.to_string(), generation.map(str::to_string)));
    }

    #[test]
    fn kube_reserved_cpu_ranges() {
        assert_eq!(kube_reserved_cpu(1000), 60);
        assert_eq!(kube_reserved_cpu(2000), 70);
        assert_eq!(kube_reserved_cpu(4000), 80);
        assert_eq!(kube_reserved_cpu(5000), 82);
        assert_eq!(kube_reserved_cpu(96000), 310);
    }

    #[test]
    fn kubelet_overrides() {
        let kubelet = KubeletConfiguration {
            max_pods: Some(110),
            pods_per_core: Some(10),
            kube_reserved: Some(BTreeMap::from([("cpu".into(), "200m".into())])),
            system_reserved: Some(BTreeMap::from([("memory".into(), "1Gi".into())])),
            eviction_hard: Some(BTreeMap::from([
                ("memory.available".into(), "5%".into()),
                ("nodefs.available".into(), "1Gi".into()),
            ])),
            eviction_soft: Some(BTreeMap::from([("memory.available".into(), "500Mi".into())])),
            ..Default::default()
        };
        let settings = Settings { kubelet: Some(&kubelet), ..default_settings() };
        let it = instance_type(&m5_large(), &settings, vec![]).unwrap();
        assert_eq!(it.capacity.pods, 20, "podsPerCore caps maxPods");
        assert_eq!(it.overhead.kube_reserved.cpu, 200);
        // Amazon Linux sizes kube-reserved memory for the ENI-limited 29 pods, not the 20 allowed.
        assert_eq!(it.overhead.kube_reserved.memory, (11 * 29 + 255) * MI);
        assert_eq!(it.overhead.system_reserved.memory, GI);
        // 5% of 7577Mi; the larger evictionSoft threshold does not count.
        assert_eq!(it.overhead.eviction_threshold.memory, (7577.0 * MI as f64 * 0.05).ceil() as i64);
        assert_eq!(it.overhead.eviction_threshold.ephemeral_storage, GI);

        let bottlerocket = Settings { ami_family: AmiFamily::Bottlerocket, ..settings };
        assert_eq!(pods(&m5_large(), &bottlerocket), 110);
        let it = instance_type(&m5_large(), &bottlerocket, vec![]).unwrap();
        assert_eq!(it.overhead.kube_reserved.memory, (11 * 110 + 255) * MI, "Bottlerocket: the pod capacity");
        let reserved = Settings { reserved_enis: 1, ..default_settings() };
        assert_eq!(pods(&m5_large(), &reserved), 20);
        let raid = Settings { instance_store_raid0: true, ..default_settings() };
        assert_eq!(ephemeral_storage(&g4dn_xlarge(), &raid), 125_000_000_000);
    }

    #[test]
    fn arm64_memory_excludes_the_cma_reservation() {
        let pct = DEFAULT_VM_MEMORY_OVERHEAD_PERCENT;
        assert_eq!(memory(&c6g_xlarge(), pct), (8128 - 610) * MI);
        // Only when arm64 is the architecture EC2 lists first, as upstream checks it.
        let x86_first = TypeInfo { architectures: vec!["x86_64".into(), "arm64".into()], ..c6g_xlarge() };
        assert_eq!(memory(&x86_first, pct), (8192 - 615) * MI);
        let labels = requirements(&c6g_xlarge(), "us-west-2").single_valued_labels();
        assert_eq!(labels[LABEL_INSTANCE_MEMORY], "8192", "the label keeps EC2's figure");
    }

    #[rstest::rstest]
    #[case(AmiFamily::AL2023)]
    #[case(AmiFamily::AL2)]
    #[case(AmiFamily::Bottlerocket)]
    fn only_hard_eviction_thresholds_count(#[case] family: AmiFamily) {
        let soft_only = KubeletConfiguration {
            eviction_soft: Some(BTreeMap::from([
                ("memory.available".into(), "1Gi".into()),
                ("nodefs.available".into(), "50%".into()),
            ])),
            eviction_soft_grace_period: Some(BTreeMap::from([
                ("memory.available".into(), "1m".into()),
                ("nodefs.available".into(), "1m".into()),
            ])),
            ..Default::default()
        };
        let settings = Settings { kubelet: Some(&soft_only), ami_family: family, ..default_settings() };
        let it = instance_type(&m5_large(), &settings, vec![]).unwrap();
        assert_eq!(it.overhead.eviction_threshold.memory, 100 * MI, "the default, not evictionSoft");
        assert_eq!(it.overhead.eviction_threshold.ephemeral_storage, 2 * GI);

        let hard_below_soft = KubeletConfiguration {
            eviction_hard: Some(BTreeMap::from([("memory.available".into(), "500Mi".into())])),
            ..soft_only.clone()
        };
        let settings = Settings { kubelet: Some(&hard_below_soft), ..settings };
        let it = instance_type(&m5_large(), &settings, vec![]).unwrap();
        assert_eq!(it.overhead.eviction_threshold.memory, 500 * MI);
    }

    #[test]
    fn a_hard_threshold_of_100_percent_reserves_nothing() {
        let kubelet = KubeletConfiguration {
            eviction_hard: Some(BTreeMap::from([("memory.available".into(), "100%".into())])),
            ..Default::default()
        };
        let it =
            instance_type(&m5_large(), &Settings { kubelet: Some(&kubelet), ..default_settings() }, vec![])
                .unwrap();
        assert_eq!(it.overhead.eviction_threshold.memory, 0);
    }

    /// p4d.24xlarge: 4 network cards of 15 interfaces, 60 in all, 50 IPv4 addresses each.
    fn p4d_24xlarge() -> TypeInfo {
        TypeInfo {
            name: "p4d.24xlarge".into(),
            architectures: vec!["x86_64".into()],
            vcpus: 96,
            memory_mib: 1_179_648,
            max_enis: 60,
            default_card_max_enis: Some(15),
            ipv4_per_eni: 50,
            ..Default::default()
        }
    }

    /// (type, reserved ENIs, pods)
    #[rstest::rstest]
    #[case::single_card_falls_back_to_the_total(m5_large(), 0, Some(29))]
    #[case::single_card_with_a_reserved_eni(m5_large(), 1, Some(20))]
    #[case::multi_card_uses_the_default_card(p4d_24xlarge(), 0, Some(15 * 49 + 2))]
    #[case::multi_card_with_reserved_enis(p4d_24xlarge(), 2, Some(13 * 49 + 2))]
    #[case::every_eni_reserved(p4d_24xlarge(), 15, Some(0))]
    #[case::more_reserved_than_there_are(m5_large(), 5, Some(0))]
    #[case::unknown_limits(TypeInfo { max_enis: 0, ..m5_large() }, 0, None)]
    fn eni_limited_pod_density(#[case] info: TypeInfo, #[case] reserved: i64, #[case] want: Option<i64>) {
        assert_eq!(eni_limited_pods(&info, reserved), want);
    }

    #[test]
    fn no_usable_eni_means_no_pods_on_the_node() {
        let settings = Settings { reserved_enis: 3, ..default_settings() };
        assert_eq!(pods(&m5_large(), &settings), 0);
        let it = instance_type(&p4d_24xlarge(), &default_settings(), vec![]).unwrap();
        assert_eq!(it.capacity.pods, 737);
    }

    #[test]
    fn from_sdk_reads_the_default_card_and_neuron_cores() {
        let card = |index: i32, enis: i32| {
            ec2::NetworkCardInfo::builder().network_card_index(index).maximum_network_interfaces(enis).build()
        };
        let described = |default_index: i32, cards: Vec<ec2::NetworkCardInfo>| {
            ec2::InstanceTypeInfo::builder()
                .instance_type(ec2::InstanceType::Inf124xlarge)
                .v_cpu_info(ec2::VCpuInfo::builder().default_v_cpus(96).build())
                .memory_info(ec2::MemoryInfo::builder().size_in_mib(196_608).build())
                .network_info(
                    ec2::NetworkInfo::builder()
                        .maximum_network_interfaces(20)
                        .ipv4_addresses_per_interface(50)
                        .default_network_card_index(default_index)
                        .set_network_cards(Some(cards))
                        .build(),
                )
                .neuron_info(
                    ec2::NeuronInfo::builder()
                        .neuron_devices(
                            ec2::NeuronDeviceInfo::builder()
                                .name("Inferentia")
                                .count(16)
                                .core_info(ec2::NeuronDeviceCoreInfo::builder().count(4).build())
                                .build(),
                        )
                        .build(),
                )
                .build()
        };
        let info = TypeInfo::from_sdk(&described(0, vec![card(0, 8), card(1, 12)])).unwrap();
        assert_eq!((info.max_enis, info.default_card_max_enis), (20, Some(8)));
        assert_eq!(info.accelerators[0].cores, 4);
        // Found by its index even when EC2 lists the cards out of order.
        let info = TypeInfo::from_sdk(&described(1, vec![card(1, 12), card(0, 8)])).unwrap();
        assert_eq!(info.default_card_max_enis, Some(12));
        let info = TypeInfo::from_sdk(&described(0, vec![])).unwrap();
        assert_eq!(info.default_card_max_enis, None);
        assert_eq!(eni_limited_pods(&info, 0), Some(20 * 49 + 2), "the total stands in");
    }

    #[test]
    fn neuron_devices_and_cores() {
        let inf = |count: i64, cores: i64| TypeInfo {
            accelerators: vec![Accelerator {
                name: "Inferentia2".into(),
                manufacturer: "AWS".into(),
                count,
                cores,
            }],
            ..m5_large()
        };
        let cap = capacity(&inf(12, 2), &default_settings());
        assert_eq!(cap.get(RESOURCE_AWS_NEURON), 12);
        assert_eq!(cap.get(RESOURCE_AWS_NEURON_CORE), 24);
        let cap = capacity(&inf(1, 0), &default_settings());
        assert_eq!((cap.get(RESOURCE_AWS_NEURON), cap.get(RESOURCE_AWS_NEURON_CORE)), (1, 0));
        let cap = capacity(&m5_large(), &default_settings());
        assert_eq!(cap.get(RESOURCE_AWS_NEURON_CORE), 0);
    }

    #[test]
    fn offerings_follow_subnets_prices_and_capacity() {
        let offered: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let subnets: BTreeSet<String> = ["a", "b"].map(String::from).into();
        let price = |zone: &str, ct: &str| match (zone, ct) {
            ("c", "spot") => None,
            (_, "spot") => Some(0.03),
            _ => Some(0.096),
        };
        let unavailable = |zone: &str, ct: &str| zone == "b" && ct == "spot";
        let inputs = OfferingInputs {
            offered_zones: &offered,
            subnet_zones: &subnets,
            price: &price,
            unavailable: &unavailable,
        };
        let got: Vec<(String, String, bool)> = offerings(&m5_large(), &inputs)
            .into_iter()
            .map(|o| (o.zone, o.capacity_type, o.available))
            .collect();
        let s = |z: &str, c: &str, a: bool| (z.to_string(), c.to_string(), a);
        assert_eq!(
            got,
            vec![
                s("a", "on-demand", true),
                s("a", "spot", true),
                s("b", "on-demand", true),
                s("b", "spot", false),
                s("c", "on-demand", false),
            ]
        );
        let no_spot = TypeInfo { spot_supported: false, ..m5_large() };
        assert!(offerings(&no_spot, &inputs).iter().all(|o| o.capacity_type == "on-demand"));
    }

    fn spec(extra: serde_json::Value) -> EC2NodeClassSpec {
        let mut base = serde_json::json!({"role": "r", "subnetSelectorTerms": [{"id": "subnet-1"}],
            "securityGroupSelectorTerms": [{"id": "sg-1"}], "amiSelectorTerms": [{"alias": "al2023@latest"}]});
        base.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn types_are_compatible_with_a_class_as_upstreams_checks_say() {
        let p4d = TypeInfo { network_cards: vec![15, 15, 15, 15], efa_interfaces: 4, ..p4d_24xlarge() };
        let ok = |info: &TypeInfo, spec: &EC2NodeClassSpec| compatible(info, spec, None);
        let plain = spec(serde_json::json!({}));
        assert!(ok(&m5_large(), &plain) && ok(&p4d, &plain));
        assert!(!ok(&TypeInfo { name: "a1.large".into(), ..m5_large() }, &plain), "AL2023 skips a1");
        let nics = |extra: serde_json::Value| {
            let mut list = vec![
                serde_json::json!({"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"}),
            ];
            list.extend(extra.as_array().unwrap().iter().cloned());
            spec(serde_json::json!({"networkInterfaces": list}))
        };
        let efa_on_card_3 =
            nics(serde_json::json!([{"networkCardIndex": 3, "deviceIndex": 0, "interfaceType": "efa-only"}]));
        assert!(ok(&p4d, &efa_on_card_3));
        assert!(!ok(&m5_large(), &efa_on_card_3), "one card, no EFA");
        let device_3 = nics(
            serde_json::json!([{"networkCardIndex": 0, "deviceIndex": 3, "interfaceType": "interface"}]),
        );
        assert!(!ok(&m5_large(), &device_3), "m5.large has three interfaces: 0 to 2");
        assert!(ok(&p4d, &device_3));
        assert!(!ok(&TypeInfo { ena_unsupported: true, ..p4d.clone() }, &nics(serde_json::json!([]))));
        let nested = spec(serde_json::json!({"cpuOptions": {"nestedVirtualization": "enabled"}}));
        assert!(!ok(&m5_large(), &nested));
        assert!(ok(&TypeInfo { nested_virtualization: true, ..m5_large() }, &nested));
        assert!(ok(
            &m5_large(),
            &spec(serde_json::json!({"cpuOptions": {"nestedVirtualization": "disabled"}}))
        ));
        // A placement group takes the types that support its strategy.
        let cluster = PlacementGroup {
            id: "pg-1".into(),
            name: "training".into(),
            strategy: "cluster".into(),
            partition_count: 0,
        };
        let no_cluster =
            TypeInfo { placement_strategies: vec!["partition".into(), "spread".into()], ..m5_large() };
        assert!(compatible(&m5_large(), &plain, Some(&cluster)));
        assert!(!compatible(&no_cluster, &plain, Some(&cluster)));
        assert!(compatible(
            &no_cluster,
            &plain,
            Some(&PlacementGroup { strategy: "spread".into(), ..cluster })
        ));
    }

    #[test]
    fn configured_efa_only_interfaces_set_the_efa_resource_and_take_a_pod_eni() {
        let p4d = TypeInfo { network_cards: vec![15, 15, 15, 15], efa_interfaces: 4, ..p4d_24xlarge() };
        let plain = spec(serde_json::json!({}));
        let settings = Settings { region: "us-west-2", ..Settings::for_node_class("us-west-2", &plain) };
        let c = capacity(&p4d, &settings);
        assert_eq!((c.get(RESOURCE_EFA), c.get(PODS)), (4, 15 * 49 + 2), "every EFA interface of the type");
        let configured = spec(serde_json::json!({"networkInterfaces": [
            {"networkCardIndex": 0, "deviceIndex": 0, "interfaceType": "interface"},
            {"networkCardIndex": 0, "deviceIndex": 1, "interfaceType": "efa-only"},
            {"networkCardIndex": 1, "deviceIndex": 0, "interfaceType": "efa-only"}]}));
        let c = capacity(&p4d, &Settings::for_node_class("us-west-2", &configured));
        assert_eq!(c.get(RESOURCE_EFA), 2, "the class's EFA-only interfaces");
        assert_eq!(c.get(PODS), 14 * 49 + 2, "the EFA-only interface on the default card gives no address");
    }
}
