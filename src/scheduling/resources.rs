//! Exact integer resource arithmetic.
//!
//! Quantities are kept as `i64`: CPU in milli-cores, memory and ephemeral storage in bytes, pods
//! and extended resources as counts. Parsing rounds up, as Kubernetes does when it converts a
//! quantity to an integer scale, so a request is never under-counted.

use std::collections::BTreeMap;
use std::fmt;

use crate::apis::pod::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use thiserror::Error;

use crate::apis::ResourceList;

/// Name of the CPU resource.
pub const CPU: &str = "cpu";
/// Name of the memory resource.
pub const MEMORY: &str = "memory";
/// Name of the ephemeral-storage resource.
pub const EPHEMERAL_STORAGE: &str = "ephemeral-storage";
/// Name of the pods resource (how many pods a node holds).
pub const PODS: &str = "pods";
/// Pseudo-resource of NodePool limits counting nodes.
pub const NODES: &str = "nodes";

/// A quantity that could not be parsed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("invalid quantity {quantity:?} for resource {resource}")]
pub struct QuantityError {
    /// The resource the quantity was given for.
    pub resource: String,
    /// The text that failed to parse.
    pub quantity: String,
}

/// A set of resource amounts. CPU is in milli-cores, memory and storage in bytes, everything else
/// a count. Missing resources are zero.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    /// CPU in milli-cores.
    pub cpu: i64,
    /// Memory in bytes.
    pub memory: i64,
    /// Ephemeral storage in bytes.
    pub ephemeral_storage: i64,
    /// Number of pods.
    pub pods: i64,
    /// Any other resource (GPUs, ENIs, ...), in whole units; zero entries are not stored.
    pub extended: BTreeMap<String, i64>,
}

impl Resources {
    /// Builds resources from `(name, amount)` pairs already in internal units.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, i64)>) -> Self {
        let mut r = Resources::default();
        for (k, v) in pairs {
            r.set(k, v);
        }
        r
    }

    /// Parses a Kubernetes resource list.
    pub fn from_list(list: &ResourceList) -> Result<Self, QuantityError> {
        let mut r = Resources::default();
        for (name, q) in list {
            r.set(name, parse_quantity_for(name, q)?);
        }
        Ok(r)
    }

    /// The amount of `name` (zero when absent).
    pub fn get(&self, name: &str) -> i64 {
        match name {
            CPU => self.cpu,
            MEMORY => self.memory,
            EPHEMERAL_STORAGE => self.ephemeral_storage,
            PODS => self.pods,
            other => self.extended.get(other).copied().unwrap_or(0),
        }
    }

    /// Sets the amount of `name`.
    pub fn set(&mut self, name: &str, value: i64) {
        match name {
            CPU => self.cpu = value,
            MEMORY => self.memory = value,
            EPHEMERAL_STORAGE => self.ephemeral_storage = value,
            PODS => self.pods = value,
            other => {
                if value == 0 {
                    self.extended.remove(other);
                } else {
                    self.extended.insert(other.to_string(), value);
                }
            }
        }
    }

    /// Iterates over the non-zero resources, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, i64)> {
        let fixed = [(CPU, self.cpu), (EPHEMERAL_STORAGE, self.ephemeral_storage), (MEMORY, self.memory)];
        let mut all: Vec<(&str, i64)> = fixed.into_iter().filter(|(_, v)| *v != 0).collect();
        if self.pods != 0 {
            all.push((PODS, self.pods));
        }
        all.extend(self.extended.iter().map(|(k, v)| (k.as_str(), *v)));
        all.sort_by(|a, b| a.0.cmp(b.0));
        all.into_iter()
    }

    /// Whether every amount is zero.
    pub fn is_zero(&self) -> bool {
        self.cpu == 0
            && self.memory == 0
            && self.ephemeral_storage == 0
            && self.pods == 0
            && self.extended.values().all(|v| *v == 0)
    }

    /// Adds `other` into `self`.
    pub fn add_assign(&mut self, other: &Resources) {
        self.cpu = self.cpu.saturating_add(other.cpu);
        self.memory = self.memory.saturating_add(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_add(other.ephemeral_storage);
        self.pods = self.pods.saturating_add(other.pods);
        for (k, v) in &other.extended {
            let e = self.extended.entry(k.clone()).or_insert(0);
            *e = e.saturating_add(*v);
        }
    }

    /// Subtracts `other` from `self` (amounts may become negative).
    pub fn sub_assign(&mut self, other: &Resources) {
        self.cpu = self.cpu.saturating_sub(other.cpu);
        self.memory = self.memory.saturating_sub(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.saturating_sub(other.ephemeral_storage);
        self.pods = self.pods.saturating_sub(other.pods);
        for (k, v) in &other.extended {
            let e = self.extended.entry(k.clone()).or_insert(0);
            *e = e.saturating_sub(*v);
        }
    }

    /// `self + other`.
    pub fn add(&self, other: &Resources) -> Resources {
        let mut r = self.clone();
        r.add_assign(other);
        r
    }

    /// `self - other`.
    pub fn sub(&self, other: &Resources) -> Resources {
        let mut r = self.clone();
        r.sub_assign(other);
        r
    }

    /// `self - other` with no amount below zero.
    pub fn sub_floored(&self, other: &Resources) -> Resources {
        let mut r = self.sub(other);
        for v in [&mut r.cpu, &mut r.memory, &mut r.ephemeral_storage, &mut r.pods] {
            *v = (*v).max(0);
        }
        r.extended.retain(|_, v| *v > 0);
        r
    }

    /// Element-wise maximum.
    pub fn max(&self, other: &Resources) -> Resources {
        let mut r = Resources {
            cpu: self.cpu.max(other.cpu),
            memory: self.memory.max(other.memory),
            ephemeral_storage: self.ephemeral_storage.max(other.ephemeral_storage),
            pods: self.pods.max(other.pods),
            extended: self.extended.clone(),
        };
        for (k, v) in &other.extended {
            let e = r.extended.entry(k.clone()).or_insert(0);
            *e = (*e).max(*v);
        }
        r
    }

    /// Whether `self` fits into `available`: every amount of `self` is at most the one available.
    pub fn fits(&self, available: &Resources) -> bool {
        self.cpu <= available.cpu
            && self.memory <= available.memory
            && self.ephemeral_storage <= available.ephemeral_storage
            && self.pods <= available.pods
            && self.extended.iter().all(|(k, v)| *v <= available.extended.get(k).copied().unwrap_or(0))
    }

    /// Whether `self + extra` fits into `available`, without allocating.
    pub fn fits_with(&self, extra: &Resources, available: &Resources) -> bool {
        self.cpu + extra.cpu <= available.cpu
            && self.memory + extra.memory <= available.memory
            && self.ephemeral_storage + extra.ephemeral_storage <= available.ephemeral_storage
            && self.pods + extra.pods <= available.pods
            && self.extended.iter().chain(extra.extended.iter()).all(|(k, _)| {
                self.extended.get(k).copied().unwrap_or(0) + extra.extended.get(k).copied().unwrap_or(0)
                    <= available.extended.get(k).copied().unwrap_or(0)
            })
    }

    /// As a Kubernetes resource list (`cpu: 1500m`, `memory: 2Gi`), zero amounts left out.
    pub fn to_list(&self) -> ResourceList {
        self.iter().map(|(k, v)| (k.to_string(), Quantity(format_quantity(k, v)))).collect()
    }

    /// Names of the resources of `self` that exceed `available`.
    pub fn exceeding(&self, available: &Resources) -> Vec<String> {
        self.iter().filter(|(k, v)| *v > available.get(k)).map(|(k, _)| k.to_string()).collect()
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (k, v) in self.iter() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{k} {}", format_quantity(k, v))?;
        }
        Ok(())
    }
}

/// Formats an amount in internal units the way Kubernetes would print it (`1500m`, `2Gi`, `3`).
pub fn format_quantity(resource: &str, value: i64) -> String {
    if resource == CPU {
        return if value % 1000 == 0 { (value / 1000).to_string() } else { format!("{value}m") };
    }
    if resource == MEMORY || resource == EPHEMERAL_STORAGE || resource.starts_with("hugepages-") {
        for (suffix, unit) in [("Ti", 1i64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
            if value != 0 && value % unit == 0 {
                return format!("{}{suffix}", value / unit);
            }
        }
    }
    value.to_string()
}

/// Whether `resource` is accounted in milli-units.
fn is_milli(resource: &str) -> bool {
    resource == CPU
}

/// Parses a quantity for `resource` into internal units (milli for CPU), rounding up.
pub fn parse_quantity_for(resource: &str, q: &Quantity) -> Result<i64, QuantityError> {
    let scale = if is_milli(resource) { 1000 } else { 1 };
    parse_quantity(&q.0, scale)
        .ok_or_else(|| QuantityError { resource: resource.to_string(), quantity: q.0.clone() })
}

/// Parses the Kubernetes quantity grammar and returns `ceil(value * scale)`.
///
/// Accepts an optional sign, a decimal number, and a binary suffix (`Ki`..`Ei`), a decimal suffix
/// (`n`, `u`, `m`, `k`, `M`..`E`) or an exponent (`e3`, `E-2`). Returns `None` when the text is not
/// a quantity or the value overflows.
pub fn parse_quantity(text: &str, scale: i64) -> Option<i64> {
    let s = text.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(num_end);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return None;
    }
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    let digits = format!("{int_part}{frac_part}");
    let mut mantissa: i128 = 0;
    for c in digits.bytes() {
        mantissa = mantissa.checked_mul(10)?.checked_add(i128::from(c - b'0'))?;
    }
    // value = mantissa * 10^exp10 * 2^exp2
    let mut exp10: i32 = -i32::try_from(frac_part.len()).ok()?;
    let mut exp2: u32 = 0;
    match suffix {
        "" => {}
        "Ki" => exp2 = 10,
        "Mi" => exp2 = 20,
        "Gi" => exp2 = 30,
        "Ti" => exp2 = 40,
        "Pi" => exp2 = 50,
        "Ei" => exp2 = 60,
        "n" => exp10 -= 9,
        "u" => exp10 -= 6,
        "m" => exp10 -= 3,
        "k" => exp10 += 3,
        "M" => exp10 += 6,
        "G" => exp10 += 9,
        "T" => exp10 += 12,
        "P" => exp10 += 15,
        "E" => exp10 += 18,
        exp if exp.starts_with(['e', 'E']) => {
            let e: i32 = exp[1..].parse().ok()?;
            exp10 = exp10.checked_add(e)?;
        }
        _ => return None,
    }
    let mut value = mantissa.checked_mul(i128::from(scale))?.checked_mul(1i128.checked_shl(exp2)?)?;
    if exp10 >= 0 {
        value = value.checked_mul(10i128.checked_pow(u32::try_from(exp10).ok()?)?)?;
    } else {
        let div = 10i128.checked_pow(u32::try_from(-exp10).ok()?);
        value = match div {
            Some(d) => {
                let q = value / d;
                if value % d != 0 { q + 1 } else { q }
            }
            None => i128::from(value != 0),
        };
    }
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

fn add_list(into: &mut Resources, list: Option<&ResourceList>) {
    if let Some(list) = list {
        for (name, q) in list {
            // An unparsable quantity would have been refused by the API server; count it as zero.
            let v = parse_quantity_for(name, q).unwrap_or(0);
            into.set(name, into.get(name).saturating_add(v));
        }
    }
}

/// The requests of one container: its requests, or its limits where a request is missing (the
/// API server defaults requests to limits).
pub fn container_requests(c: &Container) -> Resources {
    let mut r = Resources::default();
    let Some(res) = &c.resources else { return r };
    add_list(&mut r, res.requests.as_ref());
    if let Some(limits) = &res.limits {
        for (name, q) in limits {
            let has_request = res.requests.as_ref().is_some_and(|req| req.contains_key(name));
            if !has_request {
                r.set(name, parse_quantity_for(name, q).unwrap_or(0));
            }
        }
    }
    r
}

/// What a pod's containers need at their peak, of what `of` gives per container: the regular
/// containers plus the sidecars (init containers with `restartPolicy: Always`), or an init
/// container with the sidecars started before it, whichever is larger per resource.
fn containers_peak(spec: &PodSpec, of: impl Fn(&Container) -> Resources) -> Resources {
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add_assign(&of(c));
    }
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let own = of(c);
        if c.restart_policy.as_deref() == Some("Always") {
            sidecars.add_assign(&own);
            init_peak = init_peak.max(&sidecars);
        } else {
            init_peak = init_peak.max(&own.add(&sidecars));
        }
    }
    total.add_assign(&sidecars);
    total.max(&init_peak)
}

/// Whether a pod asks for Dynamic Resource Allocation: a pod-level resource claim or a
/// container's (init containers' too) `resources.claims`, as upstream tells them.
pub fn has_dra_requirements(pod: &Pod) -> bool {
    let Some(spec) = &pod.spec else { return false };
    let claims =
        |c: &Container| c.resources.as_ref().and_then(|r| r.claims.as_ref()).is_some_and(|c| !c.is_empty());
    spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
        || spec.containers.iter().any(claims)
        || spec.init_containers.iter().flatten().any(claims)
}

/// Whether pod-level requests (`spec.resources`) replace the containers' sum for this resource,
/// as kube-scheduler does with pod-level resources: CPU, memory and huge pages only.
fn pod_level(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}

/// The resources a pod needs on a node, as kube-scheduler computes them, plus one pod.
///
/// `max(regular containers + sidecars, max over init containers i of (init_i + sidecars started
/// before i))`; pod-level requests (`spec.resources`, on by default since Kubernetes 1.34), where
/// set, replace that for CPU, memory and huge pages (the API server defaults a pod-level request
/// to its limit, so a limit alone counts too); plus the pod overhead. Sidecars are init
/// containers with `restartPolicy: Always`.
pub fn pod_requests(pod: &Pod) -> Resources {
    let Some(spec) = &pod.spec else {
        return Resources { pods: 1, ..Resources::default() };
    };
    let mut r = containers_peak(spec, container_requests);
    if let Some(level) = &spec.resources {
        let requests = level.requests.iter().flatten();
        let limits_only =
            level.limits.iter().flatten().filter(|(name, _)| {
                level.requests.as_ref().is_none_or(|req| !req.contains_key(name.as_str()))
            });
        for (name, q) in requests.chain(limits_only) {
            if pod_level(name) {
                r.set(name, parse_quantity_for(name, q).unwrap_or(0));
            }
        }
    }
    add_list(&mut r, spec.overhead.as_ref());
    r.pods = 1;
    r
}

/// The limits of a pod, as Kubernetes computes them (`PodLimits`, what upstream's
/// `karpenter_nodes_total_pod_limits` sums): the regular containers' limits plus the sidecars',
/// or the limits of an init container with the sidecars started before it when larger; pod-level
/// limits (`spec.resources.limits`), where set, replace that for CPU, memory and huge pages; the
/// pod overhead adds to the limits that are set. Unlike [`pod_requests`], requests never stand in
/// for a missing limit and no pod is counted.
pub fn pod_limits(pod: &Pod) -> Resources {
    let Some(spec) = &pod.spec else { return Resources::default() };
    let limits = |c: &Container| {
        let mut r = Resources::default();
        add_list(&mut r, c.resources.as_ref().and_then(|res| res.limits.as_ref()));
        r
    };
    let mut r = containers_peak(spec, limits);
    if let Some(level) = &spec.resources {
        for (name, q) in level.limits.iter().flatten() {
            if pod_level(name) {
                r.set(name, parse_quantity_for(name, q).unwrap_or(0));
            }
        }
    }
    for (name, q) in spec.overhead.iter().flatten() {
        let limit = r.get(name);
        if limit != 0 {
            r.set(name, limit.saturating_add(parse_quantity_for(name, q).unwrap_or(0)));
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apis::pod::PodSpec;
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use rstest::rstest;

    #[test]
    fn pod_level_requests_replace_the_containers_sum_for_cpu_and_memory() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "3Gi"}},
                "overhead": {"cpu": "100m"},
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "1"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}}},
                ],
            }
        }))
        .unwrap();
        let r = pod_requests(&pod);
        assert_eq!(r.cpu, 2100, "the pod-level request, plus the overhead");
        assert_eq!(r.memory, 3 << 30, "a pod-level limit without a request is the request");
        assert_eq!(r.get("nvidia.com/gpu"), 1, "extended resources stay the containers'");
        assert_eq!(r.pods, 1);
    }

    #[test]
    fn dra_requirements_are_found_on_the_pod_and_its_containers() {
        let pod = |spec: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({"spec": spec})).unwrap()
        };
        assert!(!has_dra_requirements(&pod(serde_json::json!({"containers": [{"name": "a"}]}))));
        assert!(has_dra_requirements(&pod(serde_json::json!({
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpu"}],
            "containers": [{"name": "a"}],
        }))));
        assert!(has_dra_requirements(&pod(serde_json::json!({
            "containers": [{"name": "a"}],
            "initContainers": [{"name": "i", "resources": {"claims": [{"name": "gpu"}]}}],
        }))));
    }

    #[rstest]
    #[case("100m", 1000, Some(100))]
    #[case("1.5", 1000, Some(1500))]
    #[case("1", 1000, Some(1000))]
    #[case("2Gi", 1, Some(2 << 30))]
    #[case("512Mi", 1, Some(512 << 20))]
    #[case("1e3", 1, Some(1000))]
    #[case("1k", 1, Some(1000))]
    #[case("1.5Gi", 1, Some(3 << 29))]
    #[case("0.1", 1, Some(1))]
    #[case("1n", 1000, Some(1))]
    #[case("-2", 1, Some(-2))]
    #[case("+3M", 1, Some(3_000_000))]
    #[case("1E-3", 1000, Some(1))]
    #[case(".5", 1000, Some(500))]
    #[case("abc", 1, None)]
    #[case("1Qi", 1, None)]
    #[case("", 1, None)]
    #[case("1.2.3", 1, None)]
    #[case("9Ei", 1, None)]
    fn parses_quantities(#[case] text: &str, #[case] scale: i64, #[case] want: Option<i64>) {
        assert_eq!(parse_quantity(text, scale), want);
    }

    #[rstest]
    #[case(CPU, 1500, "1500m")]
    #[case(CPU, 70000, "70")]
    #[case(MEMORY, 2 << 30, "2Gi")]
    #[case(MEMORY, 100 << 20, "100Mi")]
    #[case(MEMORY, 1000, "1000")]
    #[case(PODS, 3, "3")]
    fn formats_quantities(#[case] res: &str, #[case] v: i64, #[case] want: &str) {
        assert_eq!(format_quantity(res, v), want);
    }

    fn container(cpu: &str, mem: &str, restart: Option<&str>) -> Container {
        Container {
            name: "c".into(),
            restart_policy: restart.map(str::to_string),
            resources: Some(ResourceRequirements {
                requests: Some(
                    [("cpu".to_string(), Quantity(cpu.into())), ("memory".to_string(), Quantity(mem.into()))]
                        .into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(containers: Vec<Container>, init: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec { containers, init_containers: Some(init), ..Default::default() }),
            ..Default::default()
        }
    }

    #[rstest]
    // containers only
    #[case(vec![("1", "1Gi", None), ("500m", "1Gi", None)], vec![], 1500, 2 << 30)]
    // an init container larger than the containers
    #[case(vec![("1", "1Gi", None)], vec![("4", "512Mi", None)], 4000, 1 << 30)]
    // sidecars add to the containers and to later init containers
    #[case(vec![("1", "1Gi", None)], vec![("500m", "256Mi", Some("Always")), ("2", "1Gi", None)], 2500, 5 << 28)]
    // an init container before the sidecar does not see it
    #[case(vec![("1", "1Gi", None)], vec![("2", "1Gi", None), ("500m", "256Mi", Some("Always"))], 2000, 5 << 28)]
    fn computes_pod_requests(
        #[case] containers: Vec<(&str, &str, Option<&str>)>,
        #[case] init: Vec<(&str, &str, Option<&str>)>,
        #[case] cpu: i64,
        #[case] mem: i64,
    ) {
        let mk =
            |v: Vec<(&str, &str, Option<&str>)>| v.into_iter().map(|(c, m, r)| container(c, m, r)).collect();
        let r = pod_requests(&pod(mk(containers), mk(init)));
        assert_eq!((r.cpu, r.memory, r.pods), (cpu, mem, 1));
    }

    #[test]
    fn limits_default_requests_and_overhead_counts() {
        let mut c = container("1", "1Gi", None);
        c.resources = Some(ResourceRequirements {
            limits: Some([("nvidia.com/gpu".to_string(), Quantity("2".into()))].into()),
            requests: Some([("cpu".to_string(), Quantity("1".into()))].into()),
            ..Default::default()
        });
        let mut p = pod(vec![c], vec![]);
        if let Some(spec) = p.spec.as_mut() {
            spec.overhead = Some([("cpu".to_string(), Quantity("250m".into()))].into());
        }
        let r = pod_requests(&p);
        assert_eq!(r.cpu, 1250);
        assert_eq!(r.get("nvidia.com/gpu"), 2);
        assert_eq!(r.to_string(), "cpu 1250m, nvidia.com/gpu 2, pods 1");
        let list = r.to_list();
        assert_eq!(list.get("cpu"), Some(&Quantity("1250m".into())));
        assert_eq!(Resources::from_list(&list).unwrap(), r);
    }

    #[test]
    fn pod_limits_sum_the_containers_limits_only() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "overhead": {"cpu": "100m", "memory": "64Mi"},
                "initContainers": [
                    // A sidecar: its limits add to the containers'.
                    {"name": "proxy", "restartPolicy": "Always",
                        "resources": {"limits": {"cpu": "250m"}}},
                    // An init container larger than everything that runs after it.
                    {"name": "setup", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"cpu": "1"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "2"}}},
                ],
            }
        }))
        .unwrap();
        let r = pod_limits(&pod);
        assert_eq!(r.cpu, 1350, "containers' and sidecar's limits, plus the overhead");
        assert_eq!(r.memory, 0, "requests do not stand in for limits; no overhead on an unset limit");
        assert_eq!(r.get("nvidia.com/gpu"), 2, "the init container's peak");
        assert_eq!(r.pods, 0);

        let pod_level: Pod = serde_json::from_value(serde_json::json!({
            "spec": {
                "resources": {"limits": {"cpu": "3", "memory": "2Gi"}},
                "containers": [{"name": "a", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}],
            }
        }))
        .unwrap();
        let r = pod_limits(&pod_level);
        assert_eq!((r.cpu, r.memory), (3000, 2 << 30), "pod-level limits replace the containers'");
        assert_eq!(r.get("nvidia.com/gpu"), 1, "extended resources stay the containers'");
        assert!(pod_limits(&Pod::default()).is_zero());
    }

    #[test]
    fn arithmetic_and_fit() {
        let a = Resources::from_pairs([(CPU, 1000), (MEMORY, 10), ("x/y", 1)]);
        let b = Resources::from_pairs([(CPU, 500), (MEMORY, 20)]);
        assert_eq!(a.add(&b).cpu, 1500);
        assert_eq!(a.sub(&b).memory, -10);
        assert_eq!(a.max(&b), Resources::from_pairs([(CPU, 1000), (MEMORY, 20), ("x/y", 1)]));
        assert!(b.fits(&a.add(&b)));
        assert!(!a.fits(&b));
        assert!(b.fits_with(&b, &Resources::from_pairs([(CPU, 1000), (MEMORY, 40)])));
        assert!(!a.fits_with(&b, &Resources::from_pairs([(CPU, 5000), (MEMORY, 40)])));
        assert_eq!(a.exceeding(&b), vec!["cpu".to_string(), "x/y".to_string()]);
    }
}
