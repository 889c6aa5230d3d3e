//! AMI families: how an alias resolves to SSM parameters, which instance types each AMI variant
//! serves, and the default block devices.

use k8s_openapi::api::core::v1::NodeSelectorRequirement;

use crate::apis::ec2nodeclass::{AmiFamily, BlockDevice, BlockDeviceMapping, EC2NodeClassSpec, VolumeType};
use crate::apis::labels::{
    ARCH_AMD64, ARCH_ARM64, LABEL_ARCH, LABEL_INSTANCE_ACCELERATOR_COUNT, LABEL_INSTANCE_GPU_COUNT, LABEL_OS,
    LABEL_WINDOWS_BUILD,
};
use crate::scheduling::resources::parse_quantity;

/// Ephemeral storage when the node class does not size the root (data) volume.
pub const DEFAULT_EPHEMERAL_STORAGE: i64 = 20 << 30;

/// The AMI family of a node class: the alias's family, else `amiFamily`, else Custom.
pub fn family_of(spec: &EC2NodeClassSpec) -> AmiFamily {
    if let Some(family) = spec.ami_family {
        return family;
    }
    spec.ami_selector_terms
        .iter()
        .find_map(|t| t.alias.as_deref())
        .and_then(|alias| parse_alias(alias).map(|(f, _)| f))
        .unwrap_or(AmiFamily::Custom)
}

/// Splits `family@version` (`al2023@latest`, `bottlerocket@v1.50.0`).
pub fn parse_alias(alias: &str) -> Option<(AmiFamily, String)> {
    let (family, version) = alias.split_once('@')?;
    let family = match family {
        "al2" => AmiFamily::AL2,
        "al2023" => AmiFamily::AL2023,
        "bottlerocket" => AmiFamily::Bottlerocket,
        "windows2019" => AmiFamily::Windows2019,
        "windows2022" => AmiFamily::Windows2022,
        "windows2025" => AmiFamily::Windows2025,
        _ => return None,
    };
    (!version.is_empty()).then(|| (family, version.to_string()))
}

/// One SSM parameter an alias resolves through, with the requirements of the instance types
/// the AMI it names can boot.
#[derive(Clone, Debug, PartialEq)]
pub struct AliasQuery {
    /// SSM parameter name.
    pub parameter: String,
    /// Requirements an instance type must meet to use the AMI.
    pub requirements: Vec<NodeSelectorRequirement>,
}

fn req(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.to_string(),
        operator: operator.to_string(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

/// Which instance types an AMI variant serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    /// No GPUs, no accelerators.
    Standard,
    /// NVIDIA GPUs.
    Nvidia,
    /// Neuron accelerators.
    Neuron,
}

fn requirements(arch: &str, variant: Variant) -> Vec<NodeSelectorRequirement> {
    let mut r = vec![req(LABEL_ARCH, "In", &[arch])];
    match variant {
        Variant::Standard => {
            r.push(req(LABEL_INSTANCE_GPU_COUNT, "DoesNotExist", &[]));
            r.push(req(LABEL_INSTANCE_ACCELERATOR_COUNT, "DoesNotExist", &[]));
        }
        Variant::Nvidia => r.push(req(LABEL_INSTANCE_GPU_COUNT, "Exists", &[])),
        Variant::Neuron => r.push(req(LABEL_INSTANCE_ACCELERATOR_COUNT, "Exists", &[])),
    }
    r
}

fn ec2_arch(arch: &str) -> &'static str {
    if arch == ARCH_ARM64 { "arm64" } else { "x86_64" }
}

/// The Windows Server version and build of a Windows family (upstream's figures).
pub fn windows(family: AmiFamily) -> Option<(&'static str, &'static str)> {
    match family {
        AmiFamily::Windows2019 => Some(("2019", "10.0.17763")),
        AmiFamily::Windows2022 => Some(("2022", "10.0.20348")),
        AmiFamily::Windows2025 => Some(("2025", "10.0.26100")),
        _ => None,
    }
}

/// Why an alias cannot be resolved on Kubernetes `k8s_version`, as upstream says it: Windows
/// Server 2025 images exist from EKS 1.35 on.
pub fn alias_unsupported(family: AmiFamily, k8s_version: &str) -> Option<String> {
    let minor: u32 = k8s_version.split('.').nth(1)?.parse().ok()?;
    (family == AmiFamily::Windows2025 && minor < 35).then(|| {
        format!("Windows Server 2025 requires EKS version 1.35 or higher, current version: {k8s_version}")
    })
}

/// The SSM parameters an alias resolves through for Kubernetes `k8s_version` (`1.34`). The
/// Windows families have only `latest` (the API server refuses other versions): one image, for
/// `kubernetes.io/os: windows` and the family's `node.kubernetes.io/windows-build`. Empty for
/// Custom, and for an alias [`alias_unsupported`] refuses.
pub fn alias_queries(family: AmiFamily, version: &str, k8s_version: &str) -> Vec<AliasQuery> {
    let latest = version == "latest";
    let mut out = Vec::new();
    match family {
        AmiFamily::AL2023 => {
            let variants = [
                (ARCH_AMD64, Variant::Standard, "standard"),
                (ARCH_ARM64, Variant::Standard, "standard"),
                (ARCH_AMD64, Variant::Nvidia, "nvidia"),
                (ARCH_ARM64, Variant::Nvidia, "nvidia"),
                (ARCH_AMD64, Variant::Neuron, "neuron"),
            ];
            for (arch, variant, name) in variants {
                let a = ec2_arch(arch);
                let leaf = if latest {
                    "recommended".to_string()
                } else {
                    format!("amazon-eks-node-al2023-{a}-{name}-{k8s_version}-{version}")
                };
                out.push(AliasQuery {
                    parameter: format!(
                        "/aws/service/eks/optimized-ami/{k8s_version}/amazon-linux-2023/{a}/{name}/{leaf}/image_id"
                    ),
                    requirements: requirements(arch, variant),
                });
            }
        }
        AmiFamily::AL2 => {
            let variants = [
                ("amazon-linux-2", "amazon-eks-node", ARCH_AMD64, vec![Variant::Standard]),
                ("amazon-linux-2-arm64", "amazon-eks-arm64-node", ARCH_ARM64, vec![Variant::Standard]),
                (
                    "amazon-linux-2-gpu",
                    "amazon-eks-gpu-node",
                    ARCH_AMD64,
                    vec![Variant::Nvidia, Variant::Neuron],
                ),
            ];
            for (path, image, arch, kinds) in variants {
                let leaf = if latest {
                    "recommended".to_string()
                } else {
                    format!("{image}-{k8s_version}-{version}")
                };
                for variant in kinds {
                    out.push(AliasQuery {
                        parameter: format!(
                            "/aws/service/eks/optimized-ami/{k8s_version}/{path}/{leaf}/image_id"
                        ),
                        requirements: requirements(arch, variant),
                    });
                }
            }
        }
        AmiFamily::Bottlerocket => {
            let leaf =
                if latest { "latest".to_string() } else { version.trim_start_matches('v').to_string() };
            for (suffix, variant) in [("", Variant::Standard), ("-nvidia", Variant::Nvidia)] {
                for arch in [ARCH_AMD64, ARCH_ARM64] {
                    out.push(AliasQuery {
                        parameter: format!(
                            "/aws/service/bottlerocket/aws-k8s-{k8s_version}{suffix}/{}/{leaf}/image_id",
                            ec2_arch(arch)
                        ),
                        requirements: requirements(arch, variant),
                    });
                }
            }
        }
        AmiFamily::Windows2019 | AmiFamily::Windows2022 | AmiFamily::Windows2025 => {
            if let Some((release, build)) = windows(family).filter(|_| latest)
                && alias_unsupported(family, k8s_version).is_none()
            {
                out.push(AliasQuery {
                    parameter: format!(
                        "/aws/service/ami-windows-latest/Windows_Server-{release}-English-Core-EKS_Optimized-{k8s_version}/image_id"
                    ),
                    requirements: vec![req(LABEL_OS, "In", &["windows"]), req(LABEL_WINDOWS_BUILD, "In", &[build])],
                });
            }
        }
        AmiFamily::Custom => {}
    }
    out
}

/// The requirements of an AMI found by id, name or tags: just its architecture. `None` for
/// architectures no node runs (`i386`, the Mac ones).
pub fn arch_requirements(ec2_architecture: &str) -> Option<Vec<NodeSelectorRequirement>> {
    let arch = match ec2_architecture {
        "x86_64" => ARCH_AMD64,
        "arm64" => ARCH_ARM64,
        _ => return None,
    };
    Some(vec![req(LABEL_ARCH, "In", &[arch])])
}

/// The block devices Karpenter gives a family when the node class lists none.
pub fn default_block_device_mappings(family: AmiFamily) -> Vec<BlockDeviceMapping> {
    let volume = |device: &str, size: &str, root: bool| BlockDeviceMapping {
        device_name: Some(device.to_string()),
        ebs: Some(BlockDevice {
            encrypted: Some(true),
            volume_size: Some(size.to_string()),
            volume_type: Some(VolumeType::Gp3),
            ..Default::default()
        }),
        root_volume: root.then_some(true),
    };
    match family {
        AmiFamily::Bottlerocket => vec![volume("/dev/xvda", "4Gi", false), volume("/dev/xvdb", "20Gi", true)],
        AmiFamily::Custom => vec![],
        AmiFamily::Windows2019 | AmiFamily::Windows2022 | AmiFamily::Windows2025 => {
            vec![volume("/dev/sda1", "50Gi", true)]
        }
        AmiFamily::AL2 | AmiFamily::AL2023 => vec![volume("/dev/xvda", "20Gi", true)],
    }
}

/// The block devices of a node class (its own, else the family's defaults).
pub fn block_device_mappings(spec: &EC2NodeClassSpec, family: AmiFamily) -> Vec<BlockDeviceMapping> {
    if spec.block_device_mappings.is_empty() {
        default_block_device_mappings(family)
    } else {
        spec.block_device_mappings.clone()
    }
}

/// Size of the volume that holds the kubelet's ephemeral storage: the mapping marked as root
/// volume, else the family's data device, else the default 20Gi.
pub fn ephemeral_storage(spec: &EC2NodeClassSpec, family: AmiFamily) -> i64 {
    let mappings = block_device_mappings(spec, family);
    let data_device = if family == AmiFamily::Bottlerocket { "/dev/xvdb" } else { "/dev/xvda" };
    mappings
        .iter()
        .find(|m| m.root_volume == Some(true))
        .or_else(|| mappings.iter().find(|m| m.device_name.as_deref() == Some(data_device)))
        .and_then(|m| m.ebs.as_ref()?.volume_size.as_deref())
        .and_then(|size| parse_quantity(size, 1))
        .unwrap_or(DEFAULT_EPHEMERAL_STORAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::ec2nodeclass::AmiSelectorTerm;

    fn spec_with_alias(alias: &str) -> EC2NodeClassSpec {
        serde_json::from_value(serde_json::json!({
            "subnetSelectorTerms": [{"id": "subnet-1"}],
            "securityGroupSelectorTerms": [{"id": "sg-1"}],
            "amiSelectorTerms": [AmiSelectorTerm { alias: Some(alias.into()), ..Default::default() }],
            "role": "r",
        }))
        .unwrap()
    }

    #[test]
    fn aliases() {
        assert_eq!(parse_alias("al2023@latest"), Some((AmiFamily::AL2023, "latest".into())));
        assert_eq!(parse_alias("bottlerocket@v1.50.0"), Some((AmiFamily::Bottlerocket, "v1.50.0".into())));
        assert_eq!(parse_alias("ubuntu@latest"), None);
        assert_eq!(parse_alias("al2@"), None);
        assert_eq!(family_of(&spec_with_alias("bottlerocket@latest")), AmiFamily::Bottlerocket);
    }

    #[test]
    fn ssm_parameters() {
        let q = alias_queries(AmiFamily::AL2023, "latest", "1.34");
        assert_eq!(q.len(), 5);
        assert_eq!(
            q[0].parameter,
            "/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/x86_64/standard/recommended/image_id"
        );
        assert_eq!(
            q[3].parameter,
            "/aws/service/eks/optimized-ami/1.34/amazon-linux-2023/arm64/nvidia/recommended/image_id"
        );
        let pinned = alias_queries(AmiFamily::AL2023, "v20251015", "1.33");
        assert_eq!(
            pinned[1].parameter,
            "/aws/service/eks/optimized-ami/1.33/amazon-linux-2023/arm64/standard/amazon-eks-node-al2023-arm64-standard-1.33-v20251015/image_id"
        );
        let al2 = alias_queries(AmiFamily::AL2, "latest", "1.32");
        assert_eq!(
            al2[1].parameter,
            "/aws/service/eks/optimized-ami/1.32/amazon-linux-2-arm64/recommended/image_id"
        );
        assert_eq!(
            al2[2].parameter,
            "/aws/service/eks/optimized-ami/1.32/amazon-linux-2-gpu/recommended/image_id"
        );
        let al2_pinned = alias_queries(AmiFamily::AL2, "v20251015", "1.32");
        assert_eq!(
            al2_pinned[2].parameter,
            "/aws/service/eks/optimized-ami/1.32/amazon-linux-2-gpu/amazon-eks-gpu-node-1.32-v20251015/image_id"
        );
        let br = alias_queries(AmiFamily::Bottlerocket, "v1.49.0", "1.34");
        assert_eq!(br[0].parameter, "/aws/service/bottlerocket/aws-k8s-1.34/x86_64/1.49.0/image_id");
        assert_eq!(br[3].parameter, "/aws/service/bottlerocket/aws-k8s-1.34-nvidia/arm64/1.49.0/image_id");
        let win = alias_queries(AmiFamily::Windows2022, "latest", "1.34");
        assert_eq!(win.len(), 1);
        assert_eq!(
            win[0].parameter,
            "/aws/service/ami-windows-latest/Windows_Server-2022-English-Core-EKS_Optimized-1.34/image_id"
        );
        assert_eq!(win[0].requirements[0].values.as_deref(), Some(&["windows".to_string()][..]));
        assert_eq!(win[0].requirements[1].values.as_deref(), Some(&["10.0.20348".to_string()][..]));
        assert_eq!(
            alias_queries(AmiFamily::Windows2019, "latest", "1.32")[0].requirements[1].values.as_deref(),
            Some(&["10.0.17763".to_string()][..])
        );
        // Windows Server 2025 from EKS 1.35 on.
        assert!(alias_queries(AmiFamily::Windows2025, "latest", "1.34").is_empty());
        assert_eq!(
            alias_unsupported(AmiFamily::Windows2025, "1.34").as_deref(),
            Some("Windows Server 2025 requires EKS version 1.35 or higher, current version: 1.34")
        );
        assert_eq!(alias_queries(AmiFamily::Windows2025, "latest", "1.35").len(), 1);
        assert!(alias_unsupported(AmiFamily::Windows2022, "1.34").is_none());
    }

    #[test]
    fn architectures_of_selected_images() {
        let arch = |a: &str| arch_requirements(a).map(|r| r[0].values.clone().unwrap_or_default());
        assert_eq!(arch("x86_64"), Some(vec![ARCH_AMD64.to_string()]));
        assert_eq!(arch("arm64"), Some(vec![ARCH_ARM64.to_string()]));
        assert_eq!(arch("i386"), None);
        assert_eq!(arch("arm64_mac"), None);
    }

    #[test]
    fn ephemeral_storage_follows_block_devices() {
        let mut spec = spec_with_alias("al2023@latest");
        assert_eq!(ephemeral_storage(&spec, AmiFamily::AL2023), 20 << 30);
        assert_eq!(ephemeral_storage(&spec, AmiFamily::Bottlerocket), 20 << 30);
        spec.block_device_mappings = vec![BlockDeviceMapping {
            device_name: Some("/dev/xvda".into()),
            ebs: Some(BlockDevice { volume_size: Some("100Gi".into()), ..Default::default() }),
            root_volume: None,
        }];
        assert_eq!(ephemeral_storage(&spec, AmiFamily::AL2023), 100 << 30);
        assert_eq!(ephemeral_storage(&spec, AmiFamily::Bottlerocket), 20 << 30);
    }
}
