//! User data that joins an instance to the cluster, per AMI family: AL2023 (nodeadm
//! `NodeConfig` in a MIME multi-part document), AL2 (`bootstrap.sh`), Bottlerocket (TOML
//! settings) and Custom (the class's user data, verbatim).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use thiserror::Error;

use crate::apis::Taint;
use crate::apis::ec2nodeclass::{AmiFamily, KubeletConfiguration};

/// Boundary of the MIME documents Karpenter writes.
pub const MIME_BOUNDARY: &str = "//";

/// What a node needs to know about its cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterInfo {
    /// Cluster name.
    pub name: String,
    /// API server endpoint (`https://...`).
    pub endpoint: String,
    /// Base64-encoded certificate authority bundle.
    pub ca_bundle: String,
    /// Service CIDR (`172.20.0.0/16`).
    pub service_cidr: Option<String>,
    /// Kubernetes minor version (`1.34`).
    pub version: String,
    /// Cluster IP of the `kube-system/kube-dns` Service, when the cluster has one.
    pub kube_dns_ip: Option<String>,
}

impl ClusterInfo {
    /// The cluster DNS address: the `kube-dns` Service's IP, else the tenth address of the
    /// service CIDR (IPv4), which is where EKS puts it.
    pub fn dns_ip(&self) -> Option<String> {
        if let Some(ip) = &self.kube_dns_ip {
            return Some(ip.clone());
        }
        let cidr = self.service_cidr.as_deref()?;
        let base: std::net::Ipv4Addr = cidr.split('/').next()?.parse().ok()?;
        Some(std::net::Ipv4Addr::from(u32::from(base).wrapping_add(10)).to_string())
    }
}

/// Everything the user data of one launch template depends on.
#[derive(Clone, Debug)]
pub struct Bootstrap<'a> {
    /// The cluster.
    pub cluster: &'a ClusterInfo,
    /// AMI family.
    pub family: AmiFamily,
    /// Kubelet settings of the class.
    pub kubelet: Option<&'a KubeletConfiguration>,
    /// Pods per node for the instance types of this launch template.
    pub max_pods: Option<i64>,
    /// Labels the node registers with.
    pub labels: &'a BTreeMap<String, String>,
    /// Taints the node registers with (taints and startup taints).
    pub taints: &'a [Taint],
    /// The class's own user data.
    pub custom: Option<&'a str>,
}

/// User data that cannot be generated.
#[derive(Debug, Error)]
pub enum UserDataError {
    /// The class's Bottlerocket user data is not valid TOML.
    #[error("user data is not valid TOML")]
    Toml(#[source] toml_edit::TomlError),
    /// The NodeConfig could not be rendered.
    #[error("cannot render the NodeConfig")]
    Yaml(#[source] serde_saphyr::ser::Error),
    /// The Bottlerocket settings could not be placed into the user data's TOML.
    #[error("user data has no room for settings.kubernetes")]
    Settings,
    /// Windows families are not supported yet.
    #[error("AMI family {0:?} is not supported")]
    Unsupported(AmiFamily),
}

/// Generates the user data (plain text; the launch template carries it base64-encoded).
pub fn generate(b: &Bootstrap<'_>) -> Result<String, UserDataError> {
    match b.family {
        AmiFamily::AL2023 => al2023(b),
        AmiFamily::AL2 => Ok(al2(b)),
        AmiFamily::Bottlerocket => bottlerocket(b),
        AmiFamily::Custom => Ok(b.custom.unwrap_or_default().to_string()),
        other => Err(UserDataError::Unsupported(other)),
    }
}

fn taint_string(t: &Taint) -> String {
    format!("{}={}:{}", t.key, t.value.as_deref().unwrap_or_default(), t.effect.as_str())
}

fn node_labels_flag(labels: &BTreeMap<String, String>) -> Option<String> {
    (!labels.is_empty()).then(|| {
        let joined: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("--node-labels={}", joined.join(","))
    })
}

/// One part of a MIME multi-part document.
struct Part {
    content_type: String,
    body: String,
}

/// Splits a MIME multi-part document into its parts; `None` when `text` is not one.
fn mime_parts(text: &str) -> Option<Vec<Part>> {
    let header_end = text.find("\n\n").or_else(|| text.find("\r\n\r\n"))?;
    let headers = &text[..header_end];
    if !headers.lines().any(|l| l.to_ascii_lowercase().starts_with("mime-version:")) {
        return None;
    }
    let boundary = headers.split("boundary=").nth(1)?.trim().trim_matches('"').to_string();
    let delimiter = format!("--{boundary}");
    let mut parts = Vec::new();
    for chunk in text[header_end..].split(&delimiter).skip(1) {
        if chunk.starts_with("--") {
            break;
        }
        let chunk = chunk.trim_start_matches(['\r', '\n']);
        let (head, body) = chunk.split_once("\n\n").or_else(|| chunk.split_once("\r\n\r\n"))?;
        let content_type = head
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-type")))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "text/x-shellscript".to_string());
        parts.push(Part { content_type, body: body.trim_end().to_string() });
    }
    Some(parts)
}

fn mime(parts: &[Part]) -> String {
    let mut out =
        format!("MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"{MIME_BOUNDARY}\"\n\n");
    for p in parts {
        out.push_str(&format!("--{MIME_BOUNDARY}\nContent-Type: {}\n\n{}\n\n", p.content_type, p.body));
    }
    out.push_str(&format!("--{MIME_BOUNDARY}--\n"));
    out
}

/// The class's user data as MIME parts: a multi-part document's parts, a shell script, or a
/// NodeConfig.
fn custom_parts(custom: Option<&str>, default_type: &str) -> Vec<Part> {
    let Some(text) = custom.filter(|t| !t.trim().is_empty()) else { return Vec::new() };
    if let Some(parts) = mime_parts(text) {
        return parts;
    }
    let content_type =
        if text.starts_with("#!") { "text/x-shellscript; charset=\"us-ascii\"" } else { default_type };
    vec![Part { content_type: content_type.to_string(), body: text.trim_end().to_string() }]
}

fn al2023(b: &Bootstrap<'_>) -> Result<String, UserDataError> {
    let mut config = serde_json::Map::new();
    if let Some(max_pods) = b.kubelet.and_then(|k| k.max_pods).map(i64::from).or(b.max_pods) {
        config.insert("maxPods".into(), json!(max_pods));
    }
    if let Some(dns) =
        b.kubelet.and_then(|k| k.cluster_dns.clone()).or_else(|| b.cluster.dns_ip().map(|ip| vec![ip]))
    {
        config.insert("clusterDNS".into(), json!(dns));
    }
    if let Some(k) = b.kubelet {
        let maps = [
            ("systemReserved", &k.system_reserved),
            ("kubeReserved", &k.kube_reserved),
            ("evictionHard", &k.eviction_hard),
            ("evictionSoft", &k.eviction_soft),
            ("evictionSoftGracePeriod", &k.eviction_soft_grace_period),
        ];
        for (key, map) in maps {
            if let Some(m) = map {
                config.insert(key.into(), json!(m));
            }
        }
        let scalars = [
            ("podsPerCore", k.pods_per_core.map(|v| json!(v))),
            ("evictionMaxPodGracePeriod", k.eviction_max_pod_grace_period.map(|v| json!(v))),
            ("imageGCHighThresholdPercent", k.image_gc_high_threshold_percent.map(|v| json!(v))),
            ("imageGCLowThresholdPercent", k.image_gc_low_threshold_percent.map(|v| json!(v))),
            ("cpuCFSQuota", k.cpu_cfs_quota.map(|v| json!(v))),
        ];
        for (key, v) in scalars {
            if let Some(v) = v {
                config.insert(key.into(), v);
            }
        }
    }
    if !b.taints.is_empty() {
        let taints: Vec<Value> = b
            .taints
            .iter()
            .map(|t| {
                let mut m = serde_json::Map::new();
                m.insert("key".into(), json!(t.key));
                if let Some(v) = &t.value {
                    m.insert("value".into(), json!(v));
                }
                m.insert("effect".into(), json!(t.effect.as_str()));
                Value::Object(m)
            })
            .collect();
        config.insert("registerWithTaints".into(), Value::Array(taints));
    }
    let mut kubelet = serde_json::Map::new();
    kubelet.insert("config".into(), Value::Object(config));
    if let Some(flag) = node_labels_flag(b.labels) {
        kubelet.insert("flags".into(), json!([flag]));
    }
    let mut cluster = serde_json::Map::new();
    cluster.insert("name".into(), json!(b.cluster.name));
    cluster.insert("apiServerEndpoint".into(), json!(b.cluster.endpoint));
    cluster.insert("certificateAuthority".into(), json!(b.cluster.ca_bundle));
    if let Some(cidr) = &b.cluster.service_cidr {
        cluster.insert("cidr".into(), json!(cidr));
    }
    let node_config = json!({
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": {"cluster": Value::Object(cluster), "kubelet": Value::Object(kubelet)},
    });
    let yaml = serde_saphyr::to_string(&node_config).map_err(UserDataError::Yaml)?;
    let mut parts = custom_parts(b.custom, "application/node.eks.aws");
    parts.push(Part {
        content_type: "application/node.eks.aws".to_string(),
        body: yaml.trim_end().to_string(),
    });
    Ok(mime(&parts))
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn al2(b: &Bootstrap<'_>) -> String {
    let c = b.cluster;
    let mut script = String::from(
        "#!/bin/bash -xe\nexec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1\n",
    );
    script.push_str(&format!(
        "/etc/eks/bootstrap.sh {} --apiserver-endpoint {} --b64-cluster-ca {}",
        shell_quote(&c.name),
        shell_quote(&c.endpoint),
        shell_quote(&c.ca_bundle)
    ));
    let dns = b
        .kubelet
        .and_then(|k| k.cluster_dns.as_ref())
        .and_then(|d| d.first().cloned())
        .or_else(|| c.dns_ip());
    if let Some(dns) = dns {
        script.push_str(&format!(" \\\n--dns-cluster-ip {}", shell_quote(&dns)));
    }
    script.push_str(" \\\n--use-max-pods false");
    let mut args = Vec::new();
    if let Some(labels) = node_labels_flag(b.labels) {
        args.push(labels);
    }
    if !b.taints.is_empty() {
        let taints: Vec<String> = b.taints.iter().map(taint_string).collect();
        args.push(format!("--register-with-taints={}", taints.join(",")));
    }
    if let Some(max_pods) = b.kubelet.and_then(|k| k.max_pods).map(i64::from).or(b.max_pods) {
        args.push(format!("--max-pods={max_pods}"));
    }
    if !args.is_empty() {
        script.push_str(&format!(" \\\n--kubelet-extra-args {}", shell_quote(&args.join(" "))));
    }
    let mut parts = custom_parts(b.custom, "text/x-shellscript; charset=\"us-ascii\"");
    parts.push(Part { content_type: "text/x-shellscript; charset=\"us-ascii\"".to_string(), body: script });
    mime(&parts)
}

/// The sub-table `key` of `parent`, created (or converted from an inline table) as needed.
fn subtable<'a>(
    parent: &'a mut toml_edit::Table,
    key: &str,
    implicit: bool,
) -> Option<&'a mut toml_edit::Table> {
    use toml_edit::{Item, Table, Value};
    let item = parent.entry(key).or_insert(Item::None);
    let table = match std::mem::take(item) {
        Item::Table(t) => t,
        Item::Value(Value::InlineTable(t)) => t.into_table(),
        _ => {
            let mut t = Table::new();
            t.set_implicit(implicit);
            t
        }
    };
    *item = Item::Table(table);
    item.as_table_mut()
}

fn bottlerocket(b: &Bootstrap<'_>) -> Result<String, UserDataError> {
    use toml_edit::{Array, DocumentMut, value};
    let mut doc: DocumentMut = b.custom.unwrap_or_default().parse().map_err(UserDataError::Toml)?;
    let k8s = subtable(doc.as_table_mut(), "settings", true)
        .and_then(|s| subtable(s, "kubernetes", false))
        .ok_or(UserDataError::Settings)?;
    k8s["cluster-name"] = value(&b.cluster.name);
    k8s["api-server"] = value(&b.cluster.endpoint);
    k8s["cluster-certificate"] = value(&b.cluster.ca_bundle);
    let dns = b.kubelet.and_then(|k| k.cluster_dns.as_ref()).and_then(|d| d.first().cloned());
    if let Some(dns) = dns.or_else(|| b.cluster.dns_ip()) {
        k8s["cluster-dns-ip"] = value(dns);
    }
    if let Some(max_pods) = b.kubelet.and_then(|k| k.max_pods).map(i64::from).or(b.max_pods) {
        k8s["max-pods"] = value(max_pods);
    }
    if let Some(k) = b.kubelet {
        if let Some(v) = k.image_gc_high_threshold_percent {
            k8s["image-gc-high-threshold-percent"] = value(i64::from(v));
        }
        if let Some(v) = k.image_gc_low_threshold_percent {
            k8s["image-gc-low-threshold-percent"] = value(i64::from(v));
        }
        if let Some(v) = k.cpu_cfs_quota {
            k8s["cpu-cfs-quota-enforced"] = value(v);
        }
    }
    if !b.labels.is_empty() {
        let labels = subtable(k8s, "node-labels", false).ok_or(UserDataError::Settings)?;
        for (k, v) in b.labels {
            labels[k.as_str()] = value(v);
        }
    }
    if !b.taints.is_empty() {
        let mut by_key: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for t in b.taints {
            by_key.entry(&t.key).or_default().push(format!(
                "{}:{}",
                t.value.as_deref().unwrap_or_default(),
                t.effect.as_str()
            ));
        }
        let taints = subtable(k8s, "node-taints", false).ok_or(UserDataError::Settings)?;
        for (k, vs) in by_key {
            taints[k] = value(vs.into_iter().collect::<Array>());
        }
    }
    if let Some(k) = b.kubelet {
        let maps = [
            ("system-reserved", &k.system_reserved),
            ("kube-reserved", &k.kube_reserved),
            ("eviction-hard", &k.eviction_hard),
        ];
        for (key, map) in maps {
            if let Some(m) = map {
                let table = subtable(k8s, key, false).ok_or(UserDataError::Settings)?;
                for (name, v) in m {
                    table[name.as_str()] = value(v);
                }
            }
        }
    }
    Ok(doc.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::TaintEffect;

    fn cluster() -> ClusterInfo {
        ClusterInfo {
            name: "demo".into(),
            endpoint: "https://example.eks.amazonaws.com".into(),
            ca_bundle: "Q0E=".into(),
            service_cidr: Some("172.20.0.0/16".into()),
            version: "1.34".into(),
            kube_dns_ip: None,
        }
    }

    fn labels() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("karpenter.sh/capacity-type".to_string(), "spot".to_string()),
            ("karpenter.sh/nodepool".to_string(), "default".to_string()),
        ])
    }

    fn taints() -> Vec<Taint> {
        vec![
            Taint {
                key: "dedicated".into(),
                value: Some("gpu".into()),
                effect: TaintEffect::NoSchedule,
                time_added: None,
            },
            Taint::new("karpenter.sh/unregistered", TaintEffect::NoExecute),
        ]
    }

    fn bootstrap<'a>(
        c: &'a ClusterInfo,
        family: AmiFamily,
        labels: &'a BTreeMap<String, String>,
        taints: &'a [Taint],
        custom: Option<&'a str>,
    ) -> Bootstrap<'a> {
        Bootstrap { cluster: c, family, kubelet: None, max_pods: Some(29), labels, taints, custom }
    }

    #[test]
    fn dns_ip_is_tenth_service_address() {
        assert_eq!(cluster().dns_ip().as_deref(), Some("172.20.0.10"));
        assert_eq!(
            ClusterInfo { service_cidr: Some("10.100.0.0/16".into()), ..cluster() }.dns_ip().as_deref(),
            Some("10.100.0.10")
        );
        assert_eq!(ClusterInfo { service_cidr: None, ..cluster() }.dns_ip(), None);
        // The kube-dns Service's address wins when the cluster has one.
        let with_service = ClusterInfo { kube_dns_ip: Some("10.100.0.53".into()), ..cluster() };
        assert_eq!(with_service.dns_ip().as_deref(), Some("10.100.0.53"));
    }

    #[test]
    fn al2023_golden() {
        let (c, l, t) = (cluster(), labels(), taints());
        let got = generate(&bootstrap(&c, AmiFamily::AL2023, &l, &t, None)).unwrap();
        let want = r#"MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: application/node.eks.aws

apiVersion: node.eks.aws/v1alpha1
kind: NodeConfig
spec:
  cluster:
    apiServerEndpoint: https://example.eks.amazonaws.com
    certificateAuthority: Q0E=
    cidr: 172.20.0.0/16
    name: demo
  kubelet:
    config:
      clusterDNS:
      - "172.20.0.10"
      maxPods: 29
      registerWithTaints:
      - effect: NoSchedule
        key: dedicated
        value: gpu
      - effect: NoExecute
        key: karpenter.sh/unregistered
    flags:
    - --node-labels=karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default

--//--
"#;
        assert_eq!(got, want, "\n{got}");
    }

    #[test]
    fn al2023_keeps_custom_parts_first() {
        let (c, l) = (cluster(), labels());
        let custom = "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"BOUNDARY\"\n\n--BOUNDARY\nContent-Type: text/x-shellscript\n\n#!/bin/bash\necho hi\n--BOUNDARY--\n";
        let got = generate(&bootstrap(&c, AmiFamily::AL2023, &l, &[], Some(custom))).unwrap();
        let script = got.find("echo hi").unwrap();
        let config = got.find("kind: NodeConfig").unwrap();
        assert!(script < config);
        assert!(got.contains("Content-Type: text/x-shellscript\n\n#!/bin/bash\necho hi\n\n--//\n"), "{got}");
        let plain =
            generate(&bootstrap(&c, AmiFamily::AL2023, &l, &[], Some("#!/bin/bash\necho plain"))).unwrap();
        assert!(
            plain.contains(
                "Content-Type: text/x-shellscript; charset=\"us-ascii\"\n\n#!/bin/bash\necho plain"
            )
        );
    }

    #[test]
    fn al2_golden() {
        let (c, l, t) = (cluster(), labels(), taints());
        let got = generate(&bootstrap(&c, AmiFamily::AL2, &l, &t, None)).unwrap();
        let want = r#"MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: text/x-shellscript; charset="us-ascii"

#!/bin/bash -xe
exec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1
/etc/eks/bootstrap.sh 'demo' --apiserver-endpoint 'https://example.eks.amazonaws.com' --b64-cluster-ca 'Q0E=' \
--dns-cluster-ip '172.20.0.10' \
--use-max-pods false \
--kubelet-extra-args '--node-labels=karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default --register-with-taints=dedicated=gpu:NoSchedule,karpenter.sh/unregistered=:NoExecute --max-pods=29'

--//--
"#;
        assert_eq!(got, want, "\n{got}");
    }

    #[test]
    fn bottlerocket_golden_and_merge() {
        let (c, l, t) = (cluster(), labels(), taints());
        let got = generate(&bootstrap(&c, AmiFamily::Bottlerocket, &l, &t, None)).unwrap();
        let want = r#"[settings.kubernetes]
cluster-name = "demo"
api-server = "https://example.eks.amazonaws.com"
cluster-certificate = "Q0E="
cluster-dns-ip = "172.20.0.10"
max-pods = 29

[settings.kubernetes.node-labels]
"karpenter.sh/capacity-type" = "spot"
"karpenter.sh/nodepool" = "default"

[settings.kubernetes.node-taints]
dedicated = ["gpu:NoSchedule"]
"karpenter.sh/unregistered" = [":NoExecute"]
"#;
        assert_eq!(got, want, "\n{got}");

        let custom = "[settings.kubernetes]\ncluster-name = \"wrong\"\n\n[settings.kubernetes.node-labels]\nteam = \"a\"\n\n[settings.host-containers.admin]\nenabled = true\n";
        let merged = generate(&bootstrap(&c, AmiFamily::Bottlerocket, &l, &[], Some(custom))).unwrap();
        let parsed: toml_edit::DocumentMut = merged.parse().unwrap();
        assert_eq!(parsed["settings"]["kubernetes"]["cluster-name"].as_str(), Some("demo"));
        assert_eq!(parsed["settings"]["kubernetes"]["node-labels"]["team"].as_str(), Some("a"));
        assert_eq!(
            parsed["settings"]["kubernetes"]["node-labels"]["karpenter.sh/nodepool"].as_str(),
            Some("default")
        );
        assert_eq!(parsed["settings"]["host-containers"]["admin"]["enabled"].as_bool(), Some(true));
        assert!(generate(&bootstrap(&c, AmiFamily::Bottlerocket, &l, &[], Some("not = [toml"))).is_err());
    }

    #[test]
    fn custom_is_verbatim() {
        let (c, l) = (cluster(), labels());
        assert_eq!(
            generate(&bootstrap(&c, AmiFamily::Custom, &l, &[], Some("#!/bin/sh\necho x\n"))).unwrap(),
            "#!/bin/sh\necho x\n"
        );
        assert!(matches!(
            generate(&bootstrap(&c, AmiFamily::Windows2022, &l, &[], None)),
            Err(UserDataError::Unsupported(AmiFamily::Windows2022))
        ));
    }
}
