//! Well-known label, annotation, taint, finalizer and resource names.
//!
//! Every string that Karpenter users, kubectl, dashboards or other controllers may rely on lives
//! here, once. The values are those of upstream Karpenter v1, so manifests and queries written for
//! upstream keep working.

/// API group of the core Karpenter kinds (`NodePool`, `NodeClaim`).
pub const GROUP: &str = "karpenter.sh";
/// API group of the AWS kinds (`EC2NodeClass`).
pub const AWS_GROUP: &str = "karpenter.k8s.aws";
/// The only served version of both groups.
pub const VERSION: &str = "v1";

// --- Kubernetes well-known labels -----------------------------------------------------------

/// Zone of a node (`topology.kubernetes.io/zone`).
pub const LABEL_TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Region of a node (`topology.kubernetes.io/region`).
pub const LABEL_TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
/// Instance type of a node (`node.kubernetes.io/instance-type`).
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// CPU architecture of a node (`kubernetes.io/arch`).
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// Operating system of a node (`kubernetes.io/os`).
pub const LABEL_OS: &str = "kubernetes.io/os";

/// Deprecated label keys that selectors may still use, and the keys they stand for. Requirements
/// on them are read as requirements on the current key, as upstream does.
pub const NORMALIZED_LABELS: [(&str, &str); 7] = [
    ("failure-domain.beta.kubernetes.io/zone", LABEL_TOPOLOGY_ZONE),
    ("failure-domain.beta.kubernetes.io/region", LABEL_TOPOLOGY_REGION),
    ("beta.kubernetes.io/arch", LABEL_ARCH),
    ("beta.kubernetes.io/os", LABEL_OS),
    ("beta.kubernetes.io/instance-type", LABEL_INSTANCE_TYPE),
    ("kubernetes.io/instance-type", LABEL_INSTANCE_TYPE),
    // The zone key of the EBS CSI driver's volume topology.
    ("topology.ebs.csi.aws.com/zone", LABEL_TOPOLOGY_ZONE),
];

/// The current key for `key` (see [`NORMALIZED_LABELS`]), or `key` itself.
pub fn normalized_label(key: &str) -> &str {
    NORMALIZED_LABELS.iter().find(|(old, _)| *old == key).map_or(key, |(_, new)| new)
}
/// Host name of a node (`kubernetes.io/hostname`).
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// Windows build of a node (`node.kubernetes.io/windows-build`).
pub const LABEL_WINDOWS_BUILD: &str = "node.kubernetes.io/windows-build";

/// Annotation the kubelet puts on the mirror pod of a static pod.
pub const ANNOTATION_MIRROR_POD: &str = "kubernetes.io/config.mirror";
/// Priority class of pods the whole cluster depends on.
pub const PRIORITY_CLASS_SYSTEM_CLUSTER_CRITICAL: &str = "system-cluster-critical";
/// Priority class of pods their node depends on.
pub const PRIORITY_CLASS_SYSTEM_NODE_CRITICAL: &str = "system-node-critical";

// --- karpenter.sh labels ---------------------------------------------------------------------

/// The NodePool a node or NodeClaim belongs to.
pub const LABEL_NODEPOOL: &str = "karpenter.sh/nodepool";
/// Capacity type of a node: `spot`, `on-demand` or `reserved`.
pub const LABEL_CAPACITY_TYPE: &str = "karpenter.sh/capacity-type";
/// Set to `true` once the node has registered with the cluster.
pub const LABEL_REGISTERED: &str = "karpenter.sh/registered";
/// Set to `true` once the node is initialized (ready, startup taints gone, resources present).
pub const LABEL_INITIALIZED: &str = "karpenter.sh/initialized";
/// On a Node (from the kubelet's own labels), `true` keeps registration from copying the
/// NodeClaim's taints and startup taints onto it: something else manages the node's taints.
pub const LABEL_DO_NOT_SYNC_TAINTS: &str = "karpenter.sh/do-not-sync-taints";

/// Capacity type value for spot instances.
pub const CAPACITY_TYPE_SPOT: &str = "spot";
/// Capacity type value for on-demand instances.
pub const CAPACITY_TYPE_ON_DEMAND: &str = "on-demand";
/// Capacity type value for capacity reservations.
pub const CAPACITY_TYPE_RESERVED: &str = "reserved";
/// `kubernetes.io/arch` value for x86-64.
pub const ARCH_AMD64: &str = "amd64";
/// `kubernetes.io/arch` value for 64-bit ARM.
pub const ARCH_ARM64: &str = "arm64";

// --- karpenter.sh annotations ----------------------------------------------------------------

/// Set to `true` on a pod or node to block voluntary disruption.
pub const ANNOTATION_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// Hash of the NodePool template a NodeClaim was created from (drift detection).
pub const ANNOTATION_NODEPOOL_HASH: &str = "karpenter.sh/nodepool-hash";
/// Version of the NodePool hashing scheme.
pub const ANNOTATION_NODEPOOL_HASH_VERSION: &str = "karpenter.sh/nodepool-hash-version";
/// Time by which a terminating NodeClaim's node is forcibly drained.
pub const ANNOTATION_NODECLAIM_TERMINATION_TIMESTAMP: &str = "karpenter.sh/nodeclaim-termination-timestamp";
/// Set on a NodeClaim whose `minValues` were relaxed under the BestEffort policy.
pub const ANNOTATION_NODECLAIM_MIN_VALUES_RELAXED: &str = "karpenter.sh/nodeclaim-min-values-relaxed";
/// On a NodeClaim: a NodeOverlay changed the price of one of the instance types it may launch.
pub const ANNOTATION_PRICE_OVERLAY_APPLIED: &str = "karpenter.sh/price-overlay-applied";
/// On a NodeClaim: a NodeOverlay added capacity to one of the instance types it may launch.
pub const ANNOTATION_CAPACITY_OVERLAY_APPLIED: &str = "karpenter.sh/capacity-overlay-applied";

// --- taints and finalizers ---------------------------------------------------------------------

/// Taint placed on a node until Karpenter has registered it (effect NoExecute).
pub const TAINT_UNREGISTERED: &str = "karpenter.sh/unregistered";
/// Taint placed on a node that is being disrupted (effect NoSchedule).
pub const TAINT_DISRUPTED: &str = "karpenter.sh/disrupted";
/// Taint the node lifecycle controller places on a node whose Ready condition is not True.
pub const TAINT_NODE_NOT_READY: &str = "node.kubernetes.io/not-ready";
/// Taint the node lifecycle controller places on a node it cannot reach.
pub const TAINT_NODE_UNREACHABLE: &str = "node.kubernetes.io/unreachable";
/// Taint the kubelet places on a node until an external cloud provider initializes it.
pub const TAINT_EXTERNAL_CLOUD_PROVIDER: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Finalizer on NodeClaims and Nodes that Karpenter terminates.
pub const FINALIZER_TERMINATION: &str = "karpenter.sh/termination";
/// Finalizer on EC2NodeClasses, removed once nothing uses the class.
pub const FINALIZER_EC2NODECLASS_TERMINATION: &str = "karpenter.k8s.aws/termination";

// --- karpenter.k8s.aws labels and annotations -------------------------------------------------

/// The EC2NodeClass a node was launched from.
pub const LABEL_EC2NODECLASS: &str = "karpenter.k8s.aws/ec2nodeclass";

/// The label naming the node class of a NodeClaim and its Node: `<group>/<kind in lower case>`
/// (`karpenter.k8s.aws/ec2nodeclass` for an EC2NodeClass), as upstream's `NodeClassLabelKey`.
pub fn node_class_label_key(group: &str, kind: &str) -> String {
    format!("{group}/{}", kind.to_lowercase())
}
/// Zone ID of a node (`topology.k8s.aws/zone-id`).
pub const LABEL_TOPOLOGY_ZONE_ID: &str = "topology.k8s.aws/zone-id";
/// Instance hypervisor (`nitro`, `xen`).
pub const LABEL_INSTANCE_HYPERVISOR: &str = "karpenter.k8s.aws/instance-hypervisor";
/// Whether the instance type supports encryption in transit.
pub const LABEL_INSTANCE_ENCRYPTION_IN_TRANSIT_SUPPORTED: &str =
    "karpenter.k8s.aws/instance-encryption-in-transit-supported";
/// Instance category (`c`, `m`, `r`, `g`, ...).
pub const LABEL_INSTANCE_CATEGORY: &str = "karpenter.k8s.aws/instance-category";
/// Instance family (`m5`, `c7g`, ...).
pub const LABEL_INSTANCE_FAMILY: &str = "karpenter.k8s.aws/instance-family";
/// Instance generation (`5`, `7`, ...).
pub const LABEL_INSTANCE_GENERATION: &str = "karpenter.k8s.aws/instance-generation";
/// Local NVMe storage in GiB.
pub const LABEL_INSTANCE_LOCAL_NVME: &str = "karpenter.k8s.aws/instance-local-nvme";
/// Instance size (`large`, `2xlarge`, ...).
pub const LABEL_INSTANCE_SIZE: &str = "karpenter.k8s.aws/instance-size";
/// Number of vCPUs.
pub const LABEL_INSTANCE_CPU: &str = "karpenter.k8s.aws/instance-cpu";
/// CPU manufacturer (`intel`, `amd`, `aws`).
pub const LABEL_INSTANCE_CPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-cpu-manufacturer";
/// Sustained CPU clock speed in MHz.
pub const LABEL_INSTANCE_CPU_SUSTAINED_CLOCK_SPEED_MHZ: &str =
    "karpenter.k8s.aws/instance-cpu-sustained-clock-speed-mhz";
/// Memory in MiB.
pub const LABEL_INSTANCE_MEMORY: &str = "karpenter.k8s.aws/instance-memory";
/// EBS bandwidth in Mbps.
pub const LABEL_INSTANCE_EBS_BANDWIDTH: &str = "karpenter.k8s.aws/instance-ebs-bandwidth";
/// Network bandwidth in Mbps.
pub const LABEL_INSTANCE_NETWORK_BANDWIDTH: &str = "karpenter.k8s.aws/instance-network-bandwidth";
/// GPU name (`t4`, `a100`, ...).
pub const LABEL_INSTANCE_GPU_NAME: &str = "karpenter.k8s.aws/instance-gpu-name";
/// GPU manufacturer (`nvidia`, `amd`).
pub const LABEL_INSTANCE_GPU_MANUFACTURER: &str = "karpenter.k8s.aws/instance-gpu-manufacturer";
/// Number of GPUs.
pub const LABEL_INSTANCE_GPU_COUNT: &str = "karpenter.k8s.aws/instance-gpu-count";
/// Memory per GPU in MiB.
pub const LABEL_INSTANCE_GPU_MEMORY: &str = "karpenter.k8s.aws/instance-gpu-memory";
/// Accelerator name (`inferentia`, `trainium`, ...).
pub const LABEL_INSTANCE_ACCELERATOR_NAME: &str = "karpenter.k8s.aws/instance-accelerator-name";
/// Accelerator manufacturer.
pub const LABEL_INSTANCE_ACCELERATOR_MANUFACTURER: &str =
    "karpenter.k8s.aws/instance-accelerator-manufacturer";
/// Number of accelerators.
pub const LABEL_INSTANCE_ACCELERATOR_COUNT: &str = "karpenter.k8s.aws/instance-accelerator-count";
/// Whether the instance type is a flex type (`c7i-flex.large`, `m7i-flex.xlarge`, ...).
pub const LABEL_INSTANCE_CAPABILITY_FLEX: &str = "karpenter.k8s.aws/instance-capability-flex";
/// Instance tenancy (`default`, `dedicated`).
pub const LABEL_INSTANCE_TENANCY: &str = "karpenter.k8s.aws/instance-tenancy";
/// The tenancy an instance launches with when nothing asks for another.
pub const TENANCY_DEFAULT: &str = "default";
/// Dedicated tenancy (`karpenter.k8s.aws/instance-tenancy: dedicated`).
pub const TENANCY_DEDICATED: &str = "dedicated";
/// Whether the capacity reservation may be interrupted.
pub const LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE: &str =
    "karpenter.k8s.aws/capacity-reservation-interruptible";
/// Capacity reservation a node was launched into.
pub const LABEL_CAPACITY_RESERVATION_ID: &str = "karpenter.k8s.aws/capacity-reservation-id";
/// Type of that capacity reservation (`default`, `capacity-block`).
pub const LABEL_CAPACITY_RESERVATION_TYPE: &str = "karpenter.k8s.aws/capacity-reservation-type";
/// Placement group a node was launched into (its id).
pub const LABEL_PLACEMENT_GROUP_ID: &str = "karpenter.k8s.aws/placement-group-id";
/// Partition of a partition placement group a node is in (`1`, `2`, ...).
pub const LABEL_PLACEMENT_GROUP_PARTITION: &str = "karpenter.k8s.aws/placement-group-partition";

/// Hash of the EC2NodeClass a NodeClaim was launched with (drift detection).
pub const ANNOTATION_EC2NODECLASS_HASH: &str = "karpenter.k8s.aws/ec2nodeclass-hash";
/// Version of the EC2NodeClass hashing scheme.
pub const ANNOTATION_EC2NODECLASS_HASH_VERSION: &str = "karpenter.k8s.aws/ec2nodeclass-hash-version";

/// Set on a NodeClaim whose instance has the tags added after registration (`Name`, ...).
pub const ANNOTATION_INSTANCE_TAGGED: &str = "karpenter.k8s.aws/tagged";
/// Upstream's older annotation for the same, set with it.
pub const ANNOTATION_CLUSTER_NAME_TAGGED: &str = "compatibility.karpenter.k8s.aws/cluster-name-tagged";

// --- EC2 tags ---------------------------------------------------------------------------------

/// Tag naming the NodeClaim an instance was launched for.
pub const TAG_NODECLAIM: &str = "karpenter.sh/nodeclaim";
/// Tag naming the EKS cluster an instance belongs to.
pub const TAG_EKS_CLUSTER_NAME: &str = "eks:eks-cluster-name";
/// The tag EC2 shows as an instance's name.
pub const TAG_NAME: &str = "Name";

// --- extended resources -------------------------------------------------------------------------

/// NVIDIA GPUs.
pub const RESOURCE_NVIDIA_GPU: &str = "nvidia.com/gpu";
/// AMD GPUs.
pub const RESOURCE_AMD_GPU: &str = "amd.com/gpu";
/// AWS Neuron devices.
pub const RESOURCE_AWS_NEURON: &str = "aws.amazon.com/neuron";
/// AWS Neuron cores.
pub const RESOURCE_AWS_NEURON_CORE: &str = "aws.amazon.com/neuroncore";
/// Habana Gaudi accelerators.
pub const RESOURCE_HABANA_GAUDI: &str = "habana.ai/gaudi";
/// Elastic Fabric Adapters.
pub const RESOURCE_EFA: &str = "vpc.amazonaws.com/efa";
/// The secondary private IPv4 addresses a Windows node gives its pods (the VPC resource
/// controller advertises them).
pub const RESOURCE_PRIVATE_IPV4_ADDRESS: &str = "vpc.amazonaws.com/PrivateIPv4Address";
/// Branch network interfaces for security groups for pods.
pub const RESOURCE_POD_ENI: &str = "vpc.amazonaws.com/pod-eni";

// --- label policy -------------------------------------------------------------------------------

/// Label domains users may not set in NodePool requirements or template labels, except for the
/// well-known labels.
pub const RESTRICTED_LABEL_DOMAINS: &[&str] = &["karpenter.sh", "karpenter.k8s.aws"];

/// Labels Karpenter understands natively: they may appear in requirements although their domain
/// is restricted.
pub const WELL_KNOWN_LABELS: &[&str] = &[
    LABEL_NODEPOOL,
    LABEL_TOPOLOGY_ZONE,
    LABEL_TOPOLOGY_REGION,
    LABEL_INSTANCE_TYPE,
    LABEL_ARCH,
    LABEL_OS,
    LABEL_CAPACITY_TYPE,
    LABEL_WINDOWS_BUILD,
    LABEL_EC2NODECLASS,
    LABEL_TOPOLOGY_ZONE_ID,
    LABEL_INSTANCE_HYPERVISOR,
    LABEL_INSTANCE_ENCRYPTION_IN_TRANSIT_SUPPORTED,
    LABEL_INSTANCE_CATEGORY,
    LABEL_INSTANCE_FAMILY,
    LABEL_INSTANCE_GENERATION,
    LABEL_INSTANCE_LOCAL_NVME,
    LABEL_INSTANCE_SIZE,
    LABEL_INSTANCE_CPU,
    LABEL_INSTANCE_CPU_MANUFACTURER,
    LABEL_INSTANCE_CPU_SUSTAINED_CLOCK_SPEED_MHZ,
    LABEL_INSTANCE_MEMORY,
    LABEL_INSTANCE_EBS_BANDWIDTH,
    LABEL_INSTANCE_NETWORK_BANDWIDTH,
    LABEL_INSTANCE_GPU_NAME,
    LABEL_INSTANCE_GPU_MANUFACTURER,
    LABEL_INSTANCE_GPU_COUNT,
    LABEL_INSTANCE_GPU_MEMORY,
    LABEL_INSTANCE_ACCELERATOR_NAME,
    LABEL_INSTANCE_ACCELERATOR_MANUFACTURER,
    LABEL_INSTANCE_ACCELERATOR_COUNT,
    LABEL_INSTANCE_CAPABILITY_FLEX,
    LABEL_INSTANCE_TENANCY,
    LABEL_CAPACITY_RESERVATION_ID,
    LABEL_CAPACITY_RESERVATION_TYPE,
    LABEL_CAPACITY_RESERVATION_INTERRUPTIBLE,
    LABEL_PLACEMENT_GROUP_ID,
    LABEL_PLACEMENT_GROUP_PARTITION,
];

/// Labels users may never set: the node's host name is the kubelet's.
pub const RESTRICTED_LABELS: &[&str] = &[LABEL_HOSTNAME];

/// The domain of a label key (the part before `/`), or `""` when it has none.
pub fn label_domain(key: &str) -> &str {
    key.split_once('/').map_or("", |(domain, _)| domain)
}

/// Whether users may put `key` into a NodePool requirement or template label.
///
/// Mirrors the CRD validation rules: the host name is restricted, well-known labels are allowed,
/// and otherwise a key is restricted when its domain is (a sub-domain of) a restricted domain.
pub fn is_restricted_label(key: &str) -> bool {
    if RESTRICTED_LABELS.contains(&key) {
        return true;
    }
    if WELL_KNOWN_LABELS.contains(&key) {
        return false;
    }
    let domain = label_domain(key);
    RESTRICTED_LABEL_DOMAINS.iter().any(|d| domain == *d || domain.ends_with(&format!(".{d}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restricted_label_policy() {
        assert!(!is_restricted_label(LABEL_INSTANCE_CATEGORY));
        assert!(!is_restricted_label(LABEL_CAPACITY_TYPE));
        assert!(!is_restricted_label("team"));
        assert!(!is_restricted_label("example.com/team"));
        assert!(!is_restricted_label("node.kubernetes.io/role"));
        assert!(!is_restricted_label("kubernetes.io/custom"));
        assert!(is_restricted_label("karpenter.sh/custom"));
        assert!(is_restricted_label("team.karpenter.sh/custom"));
        assert!(is_restricted_label("karpenter.k8s.aws/custom"));
        assert!(is_restricted_label(LABEL_HOSTNAME));
        assert!(is_restricted_label(LABEL_REGISTERED));
        assert_eq!(label_domain("a/b"), "a");
        assert_eq!(label_domain("plain"), "");
    }
}
