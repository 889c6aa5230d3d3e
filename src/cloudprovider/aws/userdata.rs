//! User data that joins an instance to the cluster, per AMI family: AL2023 (nodeadm
//! `NodeConfig` in a MIME multi-part document), AL2 (`bootstrap.sh`), Bottlerocket (TOML
//! settings) and Custom (the class's user data, verbatim).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use thiserror::Error;

use crate::apis::Taint;
use crate::apis::ec2nodeclass::{AmiFamily, KubeletConfiguration};
use crate::util::parse_duration;

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
    /// Whether pods and nodes use IPv6: the cluster DNS address is an IPv6 one.
    pub fn is_ipv6(&self) -> bool {
        self.dns_ip().is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok())
    }

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
    /// `instanceStorePolicy: RAID0`: the instance-store volumes become one RAID0 array that
    /// holds the node's ephemeral storage.
    pub instance_store_raid0: bool,
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
    /// AL2023 nodes need the cluster's service CIDR, which only EKS DescribeCluster gives.
    #[error(
        "the cluster's service CIDR is unknown (EKS DescribeCluster did not answer); AL2023 nodes need it"
    )]
    MissingServiceCidr,
}

/// Generates the user data (plain text; the launch template carries it base64-encoded).
pub fn generate(b: &Bootstrap<'_>) -> Result<String, UserDataError> {
    match b.family {
        AmiFamily::AL2023 => al2023(b),
        AmiFamily::AL2 => Ok(al2(b)),
        AmiFamily::Bottlerocket => bottlerocket(b),
        AmiFamily::Custom => Ok(b.custom.unwrap_or_default().to_string()),
        AmiFamily::Windows2019 | AmiFamily::Windows2022 | AmiFamily::Windows2025 => Ok(windows(b)),
    }
}

/// A PowerShell string literal: single quotes, each inner one doubled.
fn powershell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Windows: the class's own PowerShell first, then the EKS bootstrap script with the cluster,
/// the kubelet flags and the cluster DNS address, in one `<powershell>` block, as upstream.
fn windows(b: &Bootstrap<'_>) -> String {
    let c = b.cluster;
    let mut script = String::from("<powershell>\n");
    if let Some(custom) = b.custom.filter(|c| !c.is_empty()) {
        script.push_str(custom);
        script.push('\n');
    }
    script.push_str(
        "[string]$EKSBootstrapScriptFile = \"$env:ProgramFiles\\Amazon\\EKS\\Start-EKSBootstrap.ps1\"\n",
    );
    script.push_str(&format!(
        "& $EKSBootstrapScriptFile -EKSClusterName {} -APIServerEndpoint {}",
        powershell_quote(&c.name),
        powershell_quote(&c.endpoint)
    ));
    if !c.ca_bundle.is_empty() {
        script.push_str(&format!(" -Base64ClusterCA {}", powershell_quote(&c.ca_bundle)));
    }
    script.push_str(&format!(" -KubeletExtraArgs {}", powershell_quote(&kubelet_extra_args(b).join(" "))));
    let dns = b
        .kubelet
        .and_then(|k| k.cluster_dns.as_ref())
        .and_then(|d| d.first().cloned())
        .or_else(|| c.dns_ip());
    if let Some(dns) = dns {
        script.push_str(&format!(" -DNSClusterIP {}", powershell_quote(&dns)));
    }
    script.push_str("\n</powershell>");
    script
}

/// A taint as kubelet's `--register-with-taints` reads it: `key=value:Effect`, or `key:Effect`
/// without a value.
fn taint_string(t: &Taint) -> String {
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(value) => format!("{}={value}:{}", t.key, t.effect.as_str()),
        None => format!("{}:{}", t.key, t.effect.as_str()),
    }
}

/// `s` in double quotes, backslashes and quotes escaped, the way upstream quotes flag values
/// (systemd strips the quotes when it splits the kubelet's arguments).
fn double_quote(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', r"\\").replace('"', "\\\""))
}

/// `--<name>="k1<sep>v1,k2<sep>v2"` in key order; `None` for an empty or absent map.
fn map_flag(name: &str, map: Option<&BTreeMap<String, String>>, separator: &str) -> Option<String> {
    let map = map.filter(|m| !m.is_empty())?;
    let joined: Vec<String> = map.iter().map(|(k, v)| format!("{k}{separator}{v}")).collect();
    Some(format!("--{name}={}", double_quote(&joined.join(","))))
}

fn node_labels_flag(labels: &BTreeMap<String, String>) -> Option<String> {
    map_flag("node-labels", Some(labels), "=")
}

/// A duration as Go prints it (`1m30s`, `1h0m0s`, `500ms`), which is how upstream's
/// `metav1.Duration` grace periods reach kubelet. Values that do not parse pass unchanged.
fn go_duration(value: &str) -> String {
    let Ok(d) = parse_duration(value) else { return value.to_string() };
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if nanos < 1_000_000_000 {
        let (unit, scale) = match nanos {
            n if n < 1_000 => ("ns", 1),
            n if n < 1_000_000 => ("µs", 1_000),
            _ => ("ms", 1_000_000),
        };
        return format!("{}{unit}", decimal(nanos, scale));
    }
    let secs = nanos / 1_000_000_000;
    let seconds = decimal(nanos % 60_000_000_000, 1_000_000_000);
    let (hours, minutes) = (secs / 3600, secs / 60 % 60);
    if hours > 0 {
        format!("{hours}h{minutes}m{seconds}s")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// `value / scale` in decimal, without trailing zeros in the fraction.
fn decimal(value: u128, scale: u128) -> String {
    let (whole, fraction) = (value / scale, value % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let width = scale.to_string().len() - 1;
    format!("{whole}.{}", format!("{fraction:0width$}").trim_end_matches('0'))
}

/// Grace periods with their durations in Go's notation.
fn go_durations(map: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), go_duration(v))).collect()
}

/// Pods per node: the kubelet's `maxPods`, else what the instance types of the launch template
/// allow.
fn max_pods(b: &Bootstrap<'_>) -> Option<i64> {
    b.kubelet.and_then(|k| k.max_pods).map(i64::from).or(b.max_pods)
}

/// The kubelet flags of `bootstrap.sh --kubelet-extra-args`, in upstream's order: labels,
/// taints (always, possibly empty), max pods, then the kubelet settings of the class.
fn kubelet_extra_args(b: &Bootstrap<'_>) -> Vec<String> {
    let mut args: Vec<String> = node_labels_flag(b.labels).into_iter().collect();
    let taints: Vec<String> = b.taints.iter().map(taint_string).collect();
    args.push(format!("--register-with-taints={}", double_quote(&taints.join(","))));
    if let Some(max_pods) = max_pods(b) {
        args.push(format!("--max-pods={max_pods}"));
    }
    let Some(k) = b.kubelet else { return args };
    if let Some(per_core) = k.pods_per_core {
        args.push(format!("--pods-per-core={per_core}"));
    }
    let grace_periods = k.eviction_soft_grace_period.as_ref().map(go_durations);
    let maps = [
        map_flag("system-reserved", k.system_reserved.as_ref(), "="),
        map_flag("kube-reserved", k.kube_reserved.as_ref(), "="),
        map_flag("eviction-hard", k.eviction_hard.as_ref(), "<"),
        map_flag("eviction-soft", k.eviction_soft.as_ref(), "<"),
        map_flag("eviction-soft-grace-period", grace_periods.as_ref(), "="),
    ];
    args.extend(maps.into_iter().flatten());
    if let Some(v) = k.eviction_max_pod_grace_period {
        args.push(format!("--eviction-max-pod-grace-period={v}"));
    }
    if let Some(v) = k.image_gc_high_threshold_percent {
        args.push(format!("--image-gc-high-threshold={v}"));
    }
    if let Some(v) = k.image_gc_low_threshold_percent {
        args.push(format!("--image-gc-low-threshold={v}"));
    }
    if let Some(v) = k.cpu_cfs_quota {
        args.push(format!("--cpu-cfs-quota={v}"));
    }
    args
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
    // The keys are those of the kubelet's KubeletConfiguration; the map keeps them sorted.
    let mut config = serde_json::Map::new();
    if let Some(max_pods) = max_pods(b) {
        config.insert("maxPods".into(), json!(max_pods));
    }
    if let Some(dns) =
        b.kubelet.and_then(|k| k.cluster_dns.clone()).or_else(|| b.cluster.dns_ip().map(|ip| vec![ip]))
    {
        config.insert("clusterDNS".into(), json!(dns));
    }
    if let Some(k) = b.kubelet {
        let grace_periods = k.eviction_soft_grace_period.as_ref().map(go_durations);
        let maps = [
            ("systemReserved", k.system_reserved.as_ref()),
            ("kubeReserved", k.kube_reserved.as_ref()),
            ("evictionHard", k.eviction_hard.as_ref()),
            ("evictionSoft", k.eviction_soft.as_ref()),
            ("evictionSoftGracePeriod", grace_periods.as_ref()),
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
    // nodeadm refuses a NodeConfig without the service CIDR.
    let cidr = b.cluster.service_cidr.as_ref().ok_or(UserDataError::MissingServiceCidr)?;
    cluster.insert("cidr".into(), json!(cidr));
    let mut spec = json!({"cluster": Value::Object(cluster), "kubelet": Value::Object(kubelet)});
    if b.instance_store_raid0 {
        spec["instance"] = json!({"localStorage": {"strategy": "RAID0"}});
    }
    let node_config = json!({
        "apiVersion": "node.eks.aws/v1alpha1",
        "kind": "NodeConfig",
        "spec": spec,
    });
    let yaml = serde_saphyr::to_string(&node_config).map_err(UserDataError::Yaml)?;
    let mut parts = custom_parts(b.custom, "application/node.eks.aws");
    parts.push(Part {
        content_type: "application/node.eks.aws".to_string(),
        body: format!("# Karpenter Generated NodeConfig\n{}", yaml.trim_end()),
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
    if dns.as_deref().is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()) {
        script.push_str(" \\\n--ip-family ipv6");
    }
    if let Some(dns) = dns {
        script.push_str(&format!(" \\\n--dns-cluster-ip {}", shell_quote(&dns)));
    }
    if max_pods(b).is_some() {
        // Otherwise bootstrap.sh would set its own ENI-based max pods.
        script.push_str(" \\\n--use-max-pods false");
    }
    let args = kubelet_extra_args(b);
    script.push_str(&format!(" \\\n--kubelet-extra-args {}", shell_quote(&args.join(" "))));
    if b.instance_store_raid0 {
        script.push_str(" \\\n--local-disks raid0");
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
    // One address is written as a string, several as an array; Bottlerocket takes either.
    match b.kubelet.and_then(|k| k.cluster_dns.as_deref()).filter(|d| !d.is_empty()) {
        Some([one]) => k8s["cluster-dns-ip"] = value(one),
        Some(several) => k8s["cluster-dns-ip"] = value(several.iter().collect::<Array>()),
        None => {
            if let Some(ip) = b.cluster.dns_ip() {
                k8s["cluster-dns-ip"] = value(ip);
            }
        }
    }
    if let Some(max_pods) = max_pods(b) {
        k8s["max-pods"] = value(max_pods);
    }
    if let Some(k) = b.kubelet {
        // Bottlerocket's thresholds are strings.
        if let Some(v) = k.image_gc_high_threshold_percent {
            k8s["image-gc-high-threshold-percent"] = value(v.to_string());
        }
        if let Some(v) = k.image_gc_low_threshold_percent {
            k8s["image-gc-low-threshold-percent"] = value(v.to_string());
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
    // Karpenter's taints replace any the class's user data lists.
    k8s.remove("node-taints");
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
    // Each map the class sets replaces the user data's table. Like upstream, soft eviction
    // thresholds and pods per core are not passed to Bottlerocket.
    if let Some(k) = b.kubelet {
        let maps = [
            ("eviction-hard", &k.eviction_hard),
            ("kube-reserved", &k.kube_reserved),
            ("system-reserved", &k.system_reserved),
        ];
        for (key, map) in maps {
            if let Some(m) = map {
                k8s.remove(key);
                let table = subtable(k8s, key, false).ok_or(UserDataError::Settings)?;
                for (name, v) in m {
                    table[name.as_str()] = value(v);
                }
            }
        }
    }
    if b.instance_store_raid0 {
        // Bottlerocket's API client assembles the instance-store volumes and binds the
        // directories that hold images, pods' volumes and logs onto them, on every boot.
        let settings = subtable(doc.as_table_mut(), "settings", true).ok_or(UserDataError::Settings)?;
        let commands = subtable(settings, "bootstrap-commands", true)
            .and_then(|c| subtable(c, "000-mount-instance-storage", false))
            .ok_or(UserDataError::Settings)?;
        let argv = |words: &[&str]| words.iter().copied().collect::<Array>();
        let mut list = Array::new();
        list.push(argv(&["apiclient", "ephemeral-storage", "init"]));
        list.push(argv(&[
            "apiclient",
            "ephemeral-storage",
            "bind",
            "--dirs",
            "/var/lib/containerd",
            "/var/lib/kubelet",
            "/var/log/pods",
        ]));
        commands["commands"] = value(list);
        commands["mode"] = value("always");
        commands["essential"] = value(true);
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
        Bootstrap {
            cluster: c,
            family,
            kubelet: None,
            max_pods: Some(29),
            labels,
            taints,
            custom,
            instance_store_raid0: false,
        }
    }

    /// A class setting every kubelet field user data carries.
    fn full_kubelet() -> KubeletConfiguration {
        let map = |pairs: &[(&str, &str)]| -> Option<BTreeMap<String, String>> {
            Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
        };
        KubeletConfiguration {
            cluster_dns: Some(vec!["10.0.100.10".into()]),
            max_pods: Some(110),
            pods_per_core: Some(10),
            system_reserved: map(&[("memory", "100Mi"), ("cpu", "100m"), ("ephemeral-storage", "1Gi")]),
            kube_reserved: map(&[("memory", "200Mi"), ("cpu", "200m"), ("ephemeral-storage", "3Gi")]),
            eviction_hard: map(&[
                ("nodefs.available", "10%"),
                ("memory.available", "5%"),
                ("nodefs.inodesFree", "10%"),
            ]),
            eviction_soft: map(&[
                ("nodefs.available", "15%"),
                ("memory.available", "500Mi"),
                ("nodefs.inodesFree", "15%"),
            ]),
            eviction_soft_grace_period: map(&[
                ("nodefs.available", "1m30s"),
                ("memory.available", "1m"),
                ("nodefs.inodesFree", "2h"),
            ]),
            eviction_max_pod_grace_period: Some(60),
            image_gc_high_threshold_percent: Some(85),
            image_gc_low_threshold_percent: Some(80),
            cpu_cfs_quota: Some(false),
        }
    }

    fn with_kubelet<'a>(b: Bootstrap<'a>, kubelet: &'a KubeletConfiguration) -> Bootstrap<'a> {
        Bootstrap { kubelet: Some(kubelet), ..b }
    }

    #[rstest::rstest]
    #[case("1m", "1m0s")]
    #[case("90s", "1m30s")]
    #[case("1m30s", "1m30s")]
    #[case("2h", "2h0m0s")]
    #[case("1.5h", "1h30m0s")]
    #[case("30s", "30s")]
    #[case("1500ms", "1.5s")]
    #[case("500ms", "500ms")]
    #[case("2us", "2µs")]
    #[case("0", "0s")]
    #[case("soon", "soon")]
    fn grace_periods_are_written_as_go_prints_durations(#[case] given: &str, #[case] want: &str) {
        assert_eq!(go_duration(given), want);
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

# Karpenter Generated NodeConfig
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
    - --node-labels="karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default"

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
--kubelet-extra-args '--node-labels="karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default" --register-with-taints="dedicated=gpu:NoSchedule,karpenter.sh/unregistered:NoExecute" --max-pods=29'

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
    fn al2023_golden_with_full_kubelet() {
        let (c, l, t, k) = (cluster(), labels(), taints(), full_kubelet());
        let got = generate(&with_kubelet(bootstrap(&c, AmiFamily::AL2023, &l, &t, None), &k)).unwrap();
        let want = r#"MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: application/node.eks.aws

# Karpenter Generated NodeConfig
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
      - "10.0.100.10"
      cpuCFSQuota: false
      evictionHard:
        memory.available: 5%
        nodefs.available: 10%
        nodefs.inodesFree: 10%
      evictionMaxPodGracePeriod: 60
      evictionSoft:
        memory.available: 500Mi
        nodefs.available: 15%
        nodefs.inodesFree: 15%
      evictionSoftGracePeriod:
        memory.available: 1m0s
        nodefs.available: 1m30s
        nodefs.inodesFree: 2h0m0s
      imageGCHighThresholdPercent: 85
      imageGCLowThresholdPercent: 80
      kubeReserved:
        cpu: 200m
        ephemeral-storage: 3Gi
        memory: 200Mi
      maxPods: 110
      podsPerCore: 10
      registerWithTaints:
      - effect: NoSchedule
        key: dedicated
        value: gpu
      - effect: NoExecute
        key: karpenter.sh/unregistered
      systemReserved:
        cpu: 100m
        ephemeral-storage: 1Gi
        memory: 100Mi
    flags:
    - --node-labels="karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default"

--//--
"#;
        assert_eq!(got, want, "\n{got}");
    }

    #[test]
    fn al2_golden_with_full_kubelet() {
        let (c, l, t, k) = (cluster(), labels(), taints(), full_kubelet());
        let got = generate(&with_kubelet(bootstrap(&c, AmiFamily::AL2, &l, &t, None), &k)).unwrap();
        let want = r#"MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="//"

--//
Content-Type: text/x-shellscript; charset="us-ascii"

#!/bin/bash -xe
exec > >(tee /var/log/user-data.log|logger -t user-data -s 2>/dev/console) 2>&1
/etc/eks/bootstrap.sh 'demo' --apiserver-endpoint 'https://example.eks.amazonaws.com' --b64-cluster-ca 'Q0E=' \
--dns-cluster-ip '10.0.100.10' \
--use-max-pods false \
--kubelet-extra-args '--node-labels="karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default" --register-with-taints="dedicated=gpu:NoSchedule,karpenter.sh/unregistered:NoExecute" --max-pods=110 --pods-per-core=10 --system-reserved="cpu=100m,ephemeral-storage=1Gi,memory=100Mi" --kube-reserved="cpu=200m,ephemeral-storage=3Gi,memory=200Mi" --eviction-hard="memory.available<5%,nodefs.available<10%,nodefs.inodesFree<10%" --eviction-soft="memory.available<500Mi,nodefs.available<15%,nodefs.inodesFree<15%" --eviction-soft-grace-period="memory.available=1m0s,nodefs.available=1m30s,nodefs.inodesFree=2h0m0s" --eviction-max-pod-grace-period=60 --image-gc-high-threshold=85 --image-gc-low-threshold=80 --cpu-cfs-quota=false'

--//--
"#;
        assert_eq!(got, want, "\n{got}");
    }

    #[test]
    fn bottlerocket_golden_with_full_kubelet() {
        let (c, l, t, k) = (cluster(), labels(), taints(), full_kubelet());
        let got = generate(&with_kubelet(bootstrap(&c, AmiFamily::Bottlerocket, &l, &t, None), &k)).unwrap();
        let want = r#"[settings.kubernetes]
cluster-name = "demo"
api-server = "https://example.eks.amazonaws.com"
cluster-certificate = "Q0E="
cluster-dns-ip = "10.0.100.10"
max-pods = 110
image-gc-high-threshold-percent = "85"
image-gc-low-threshold-percent = "80"
cpu-cfs-quota-enforced = false

[settings.kubernetes.node-labels]
"karpenter.sh/capacity-type" = "spot"
"karpenter.sh/nodepool" = "default"

[settings.kubernetes.node-taints]
dedicated = ["gpu:NoSchedule"]
"karpenter.sh/unregistered" = [":NoExecute"]

[settings.kubernetes.eviction-hard]
"memory.available" = "5%"
"nodefs.available" = "10%"
"nodefs.inodesFree" = "10%"

[settings.kubernetes.kube-reserved]
cpu = "200m"
ephemeral-storage = "3Gi"
memory = "200Mi"

[settings.kubernetes.system-reserved]
cpu = "100m"
ephemeral-storage = "1Gi"
memory = "100Mi"
"#;
        assert_eq!(got, want, "\n{got}");
    }

    #[test]
    fn al2_ipv6_dns_no_max_pods_and_no_taints() {
        let (c, l) = (cluster(), labels());
        let k = KubeletConfiguration { cluster_dns: Some(vec!["fd00:ec2::a".into()]), ..Default::default() };
        let b =
            Bootstrap { max_pods: None, ..with_kubelet(bootstrap(&c, AmiFamily::AL2, &l, &[], None), &k) };
        let got = generate(&b).unwrap();
        assert!(
            got.contains(
                "--b64-cluster-ca 'Q0E=' \\\n--ip-family ipv6 \\\n--dns-cluster-ip 'fd00:ec2::a' \\\n--kubelet-extra-args"
            ),
            "{got}"
        );
        assert!(!got.contains("--use-max-pods"), "bootstrap.sh keeps its own max pods: {got}");
        assert!(got.contains(" --register-with-taints=\"\"'"), "{got}");
        assert!(!got.contains("--max-pods"), "{got}");
    }

    #[test]
    fn bottlerocket_settings_replace_the_user_data_ones() {
        let (c, l, t) = (cluster(), labels(), taints());
        let k = KubeletConfiguration {
            cluster_dns: Some(vec!["10.0.0.10".into(), "10.0.0.11".into()]),
            eviction_hard: Some(BTreeMap::from([("memory.available".into(), "200Mi".into())])),
            eviction_soft: Some(BTreeMap::from([("memory.available".into(), "1Gi".into())])),
            eviction_soft_grace_period: Some(BTreeMap::from([("memory.available".into(), "1m".into())])),
            pods_per_core: Some(4),
            ..Default::default()
        };
        let custom = r#"[settings.kubernetes]
max-pods = 5

[settings.kubernetes.node-taints]
legacy = ["x:NoSchedule"]

[settings.kubernetes.eviction-hard]
"nodefs.available" = "20%"

[settings.kubernetes.eviction-soft]
"memory.available" = "300Mi"
"#;
        let b = with_kubelet(bootstrap(&c, AmiFamily::Bottlerocket, &l, &t, Some(custom)), &k);
        let doc: toml_edit::DocumentMut = generate(&b).unwrap().parse().unwrap();
        let k8s = &doc["settings"]["kubernetes"];
        let dns: Vec<&str> =
            k8s["cluster-dns-ip"].as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        assert_eq!(dns, ["10.0.0.10", "10.0.0.11"]);
        assert_eq!(k8s["max-pods"].as_integer(), Some(29));
        let taints = k8s["node-taints"].as_table().unwrap();
        assert_eq!(
            taints.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            ["dedicated", "karpenter.sh/unregistered"]
        );
        let hard = k8s["eviction-hard"].as_table().unwrap();
        assert_eq!(hard.iter().map(|(k, _)| k).collect::<Vec<_>>(), ["memory.available"]);
        assert_eq!(hard["memory.available"].as_str(), Some("200Mi"));
        // Not Karpenter's to write: soft thresholds and pods per core. The user data's own
        // settings stay.
        assert_eq!(k8s["eviction-soft"]["memory.available"].as_str(), Some("300Mi"));
        for key in ["eviction-soft-grace-period", "pods-per-core"] {
            assert!(k8s.get(key).is_none(), "{key}");
        }
    }

    #[test]
    fn custom_is_verbatim() {
        let (c, l) = (cluster(), labels());
        assert_eq!(
            generate(&bootstrap(&c, AmiFamily::Custom, &l, &[], Some("#!/bin/sh\necho x\n"))).unwrap(),
            "#!/bin/sh\necho x\n"
        );
    }

    #[test]
    fn windows_bootstraps_with_powershell_as_upstream() {
        let (c, l, t) = (cluster(), labels(), taints());
        let custom = "Write-Host 'before'";
        let got = generate(&bootstrap(&c, AmiFamily::Windows2022, &l, &t, Some(custom))).unwrap();
        let want = "<powershell>\n\
Write-Host 'before'\n\
[string]$EKSBootstrapScriptFile = \"$env:ProgramFiles\\Amazon\\EKS\\Start-EKSBootstrap.ps1\"\n\
& $EKSBootstrapScriptFile -EKSClusterName 'demo' -APIServerEndpoint 'https://example.eks.amazonaws.com' \
-Base64ClusterCA 'Q0E=' -KubeletExtraArgs '--node-labels=\"karpenter.sh/capacity-type=spot,karpenter.sh/nodepool=default\" \
--register-with-taints=\"dedicated=gpu:NoSchedule,karpenter.sh/unregistered:NoExecute\" --max-pods=29' \
-DNSClusterIP '172.20.0.10'\n\
</powershell>";
        assert_eq!(got, want);
        // The kubelet settings follow the flags; a quote in a value is doubled for PowerShell.
        let k = KubeletConfiguration { cluster_dns: Some(vec!["10.0.0.10".into()]), ..full_kubelet() };
        let quoted = BTreeMap::from([("team".to_string(), "o'brien".to_string())]);
        let got =
            generate(&with_kubelet(bootstrap(&c, AmiFamily::Windows2019, &quoted, &[], None), &k)).unwrap();
        assert!(got.contains("--node-labels=\"team=o''brien\""), "{got}");
        assert!(got.contains("--kube-reserved="), "{got}");
        assert!(got.ends_with(" -DNSClusterIP '10.0.0.10'\n</powershell>"), "{got}");
        assert!(!got.contains("Write-Host"));
    }

    #[test]
    fn raid0_instance_store_in_every_family() {
        let c = cluster();
        let labels = BTreeMap::new();
        let raid =
            |family| Bootstrap { instance_store_raid0: true, ..bootstrap(&c, family, &labels, &[], None) };

        let al2 = generate(&raid(AmiFamily::AL2)).unwrap();
        let script = al2.lines().skip_while(|l| !l.starts_with("/etc/eks/bootstrap.sh")).collect::<Vec<_>>();
        let last_flag = script.iter().rev().find(|l| l.starts_with("--") && !l.starts_with("--//"));
        assert_eq!(last_flag, Some(&"--local-disks raid0"), "{al2}");
        assert!(
            !generate(&bootstrap(&c, AmiFamily::AL2, &labels, &[], None)).unwrap().contains("local-disks")
        );

        let al2023 = generate(&raid(AmiFamily::AL2023)).unwrap();
        let yaml = &al2023[al2023.find("apiVersion: node.eks.aws").unwrap()..al2023.rfind("--//").unwrap()];
        let config: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
        assert_eq!(config["spec"]["instance"]["localStorage"]["strategy"], "RAID0", "{al2023}");

        let custom = "[settings.bootstrap-commands.010-mine]\ncommands = [[\"true\"]]\n";
        let br = generate(&Bootstrap { custom: Some(custom), ..raid(AmiFamily::Bottlerocket) }).unwrap();
        let doc: toml_edit::DocumentMut = br.parse().unwrap();
        let commands = &doc["settings"]["bootstrap-commands"];
        let mount = &commands["000-mount-instance-storage"];
        assert_eq!(mount["mode"].as_str(), Some("always"));
        assert_eq!(mount["essential"].as_bool(), Some(true));
        let argv: Vec<Vec<&str>> = mount["commands"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect())
            .collect();
        assert_eq!(argv[0], ["apiclient", "ephemeral-storage", "init"]);
        assert_eq!(argv[1][..4], ["apiclient", "ephemeral-storage", "bind", "--dirs"]);
        assert!(commands.get("010-mine").is_some(), "the class's own commands stay: {br}");
    }

    #[test]
    fn al2023_needs_the_service_cidr() {
        let c = ClusterInfo { service_cidr: None, ..cluster() };
        let labels = labels();
        let err = generate(&bootstrap(&c, AmiFamily::AL2023, &labels, &[], None)).unwrap_err();
        assert!(matches!(err, UserDataError::MissingServiceCidr), "{err}");
        assert!(generate(&bootstrap(&c, AmiFamily::AL2, &labels, &[], None)).is_ok(), "AL2 does without");
    }
}
