//! Controller settings: command-line flags, each also read from the environment variable that
//! upstream Karpenter's chart sets, with upstream's defaults.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::BoolishValueParser;

use crate::cloudprovider::aws::nodecost::BurstableCpu;
use crate::cloudprovider::catalog::Catalog;
use crate::controllers::settings::{ConsolidationPreferencePolicy, FeatureGates};
use crate::scheduling::defaultspread::DefaultSpread;
use crate::scheduling::{MinValuesPolicy, PreferencePolicy};
use crate::util::parse_duration;

/// Which cloud provider the controller drives.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloudProviderKind {
    /// Amazon EC2.
    Aws,
    /// Simulated nodes (kwok): Node objects created directly, for tests, demos and scale runs.
    Kwok,
}

/// Settings of `karpenter controller`.
#[derive(clap::Args, Clone, Debug)]
pub struct Settings {
    /// Name of the EKS cluster; required with the aws cloud provider.
    #[arg(long, env = "CLUSTER_NAME")]
    pub cluster_name: Option<String>,
    /// API server endpoint written into node bootstrap; discovered through EKS when unset.
    #[arg(long, env = "CLUSTER_ENDPOINT")]
    pub cluster_endpoint: Option<String>,
    /// Base64 CA bundle of the API server for node bootstrap; discovered through EKS when unset.
    #[arg(long, env = "CLUSTER_CA_BUNDLE")]
    pub cluster_ca_bundle: Option<String>,
    /// SQS queue receiving spot interruption and instance state events.
    #[arg(long, env = "INTERRUPTION_QUEUE")]
    pub interruption_queue: Option<String>,
    /// Longest a provisioning batch stays open.
    #[arg(long, env = "BATCH_MAX_DURATION", default_value = "10s", value_parser = parse_duration)]
    pub batch_max_duration: Duration,
    /// A batch closes after this long without new pending pods.
    #[arg(long, env = "BATCH_IDLE_DURATION", default_value = "1s", value_parser = parse_duration)]
    pub batch_idle_duration: Duration,
    /// Share of an instance type's memory taken by the hypervisor and OS.
    #[arg(long, env = "VM_MEMORY_OVERHEAD_PERCENT", default_value_t = 0.075)]
    pub vm_memory_overhead_percent: f64,
    /// ENIs kept back from pod networking when computing max pods.
    #[arg(long, env = "RESERVED_ENIS", default_value_t = 0)]
    pub reserved_enis: u32,
    /// The VPC has no internet access: skip the public Pricing API.
    #[arg(long, env = "ISOLATED_VPC", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub isolated_vpc: bool,
    /// Respect or Ignore preferred scheduling constraints.
    #[arg(long, env = "PREFERENCE_POLICY", default_value = "Respect")]
    pub preference_policy: PreferencePolicy,
    /// Strict or BestEffort handling of `minValues`.
    #[arg(long, env = "MIN_VALUES_POLICY", default_value = "Strict")]
    pub min_values_policy: MinValuesPolicy,
    /// Feature gates, e.g. `SpotToSpotConsolidation=true,NodeRepair=false`.
    #[arg(long, env = "FEATURE_GATES", default_value = "")]
    pub feature_gates: FeatureGates,
    /// Log level: error, warn, info, debug (or a tracing filter).
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Requests per second to the API server (a token bucket; 0 turns the limit off).
    #[arg(long, env = "KUBE_CLIENT_QPS", default_value_t = 200)]
    pub kube_client_qps: u32,
    /// Requests the token bucket holds for a burst.
    #[arg(long, env = "KUBE_CLIENT_BURST", default_value_t = 300)]
    pub kube_client_burst: u32,
    /// Port of the Prometheus metrics endpoint.
    #[arg(long, env = "METRICS_PORT", default_value_t = 8080)]
    pub metrics_port: u16,
    /// Port of /healthz and /readyz.
    #[arg(long, env = "HEALTH_PROBE_PORT", default_value_t = 8081)]
    pub health_probe_port: u16,
    /// Act without holding the leader-election Lease (a single local replica).
    #[arg(long, env = "DISABLE_LEADER_ELECTION", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub disable_leader_election: bool,
    /// Namespace of the leader-election Lease (the release namespace).
    #[arg(long, env = "SYSTEM_NAMESPACE", default_value = "kube-system")]
    pub system_namespace: String,
    /// Cloud provider: aws or kwok.
    #[arg(long, env = "CLOUD_PROVIDER", value_enum, default_value = "aws")]
    pub cloud_provider: CloudProviderKind,
    /// Instance types of the kwok provider: `aws` (the built-in us-east-1 EC2 catalog), `kwok`
    /// (the generated family) or the path of a catalog file.
    #[arg(long, env = "KWOK_INSTANCE_TYPES", value_name = "aws|kwok|FILE", default_value = "aws")]
    pub kwok_instance_types: Catalog,
    /// How often the AMIs of each EC2NodeClass are resolved again: an AMI newly published under
    /// an alias or matching a selector is picked up (and drifts the nodes) within this time. At
    /// least 1m, as upstream.
    #[arg(long, env = "AMI_REFRESH_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub ami_refresh_interval: Duration,
    /// How often the subnets (and security groups) of each EC2NodeClass are resolved again. At
    /// least 1m, as upstream.
    #[arg(long, env = "SUBNET_REFRESH_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub subnet_refresh_interval: Duration,
    /// Overrides both refresh intervals, below their 1m floor too (karpenter-rs only: for tests
    /// and demos that change EC2 under a running controller).
    #[arg(long, env = "NODECLASS_REFRESH_INTERVAL", value_parser = parse_duration, hide = true)]
    pub nodeclass_refresh_interval: Option<Duration>,
    /// On an EC2 rebalance recommendation, replace the node before the spot interruption comes:
    /// its replacement is launched and Initialized first, then it drains (as a drifted node is
    /// replaced, within the NodePool's `Drifted` budget). Upstream only tells the recommendation
    /// (karpenter-rs only; needs `INTERRUPTION_QUEUE`).
    #[arg(long, env = "REBALANCE_REPLACEMENT", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub rebalance_replacement: bool,
    /// How plans treat burstable (T) types' CPU: `baseline` plans only what the type sustains
    /// unless the NodePool asks for the type, `unlimited` prices the CPU above it at the
    /// surplus-credit rate, `ignore` plans its full CPU at the list price, as upstream
    /// (karpenter-rs only; the `aws` provider).
    #[arg(long, env = "BURSTABLE_CPU", default_value = "baseline", value_parser = parse_burstable_cpu)]
    pub burstable_cpu: BurstableCpu,
    /// How much dearer per unit (CPU or memory) a larger instance type may be and still take a
    /// NodeClaim's next pods, in per cent (`3` or `3%`): within it, a plan with fewer, larger
    /// nodes wins, as each node brings costs its price leaves out (another set of DaemonSets, an
    /// IP address, API traffic). `0` takes the cheapest per unit however many nodes it needs
    /// (karpenter-rs only).
    #[arg(long, env = "FEWER_NODES_MARGIN", default_value = "3%", value_parser = parse_margin)]
    pub fewer_nodes_margin: f64,
    /// Give pending pods of a workload (ReplicaSet, StatefulSet, ReplicationController) that set
    /// no topology spread constraints kube-scheduler's default ones when planning capacity, so
    /// that new nodes are spread over the zones the way kube-scheduler will spread the pods
    /// (karpenter-rs only; upstream plans such pods as if they had none).
    #[arg(long, env = "DEFAULT_POD_TOPOLOGY_SPREAD", default_value_t = true, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub default_pod_topology_spread: bool,
    /// Teach each NodePool's instance types the extended resources (device plugins' `vendor/name`
    /// resources, huge pages) that its registered nodes report and the types lack, keep them in
    /// the NodePool's `karpenter-rs.dev/learned-resources` annotation, and provision for pods
    /// that request them (karpenter-rs only; upstream leaves such pods pending).
    #[arg(long, env = "LEARN_EXTENDED_RESOURCES", default_value_t = true, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub learn_extended_resources: bool,
    /// A KubeSchedulerConfiguration file: the PodTopologySpread args of its default profile give
    /// the default spreads, as they do kube-scheduler's; empty, kube-scheduler's built-in ones
    /// (karpenter-rs only).
    #[arg(long, env = "KUBE_SCHEDULER_CONFIG", default_value = "")]
    pub kube_scheduler_config: String,
    /// How the disruption simulations treat pods' preferences (preferred node and pod affinity,
    /// `ScheduleAnyway` spreads): `Soft` as kube-scheduler, which places a pod on a node that
    /// leaves a preference unmet when no other has room, so a node whose pods fit on the others
    /// that way is consolidated; `Respect` as upstream, where a preference new capacity could
    /// honour keeps the node, or has it replaced (karpenter-rs only).
    #[arg(long, env = "CONSOLIDATION_PREFERENCE_POLICY", default_value = "Soft")]
    pub consolidation_preference_policy: ConsolidationPreferencePolicy,
    /// How long after a launch the kwok provider creates the Node.
    #[arg(long, env = "KWOK_REGISTRATION_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub kwok_registration_delay: Duration,
    /// Name of the Service in front of the controller. Upstream reads it for a webhook
    /// certificate; neither upstream v1.x nor karpenter-rs serves a webhook, so it has no effect.
    #[arg(long, env = "KARPENTER_SERVICE", default_value = "")]
    pub karpenter_service: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "LEADER_ELECTION_NAME", default_value = super::leader::LEASE_NAME)]
    pub leader_election_name: String,
    /// Namespace of the leader-election Lease; empty means `SYSTEM_NAMESPACE`.
    #[arg(long, env = "LEADER_ELECTION_NAMESPACE", default_value = "")]
    pub leader_election_namespace: String,
    /// The container's memory limit in bytes (-1: none). Upstream sets its garbage collector's
    /// soft limit to 90% of it; karpenter-rs has no garbage collector and warns when its resident
    /// memory passes 90% of it.
    #[arg(long, env = "MEMORY_LIMIT", default_value_t = -1, allow_negative_numbers = true)]
    pub memory_limit: i64,
    /// The container's CPU requests in millicores: the async runtime gets one worker thread per
    /// requested core (at least two, at most the machine's cores), as upstream sizes its
    /// scheduler's concurrency from it.
    #[arg(long, env = "CPU_REQUESTS", default_value_t = 1000, allow_negative_numbers = true)]
    pub cpu_requests: i64,
    /// Where the JSON log goes: a comma-separated list of `stdout`, `stderr` or file paths.
    #[arg(long, env = "LOG_OUTPUT_PATHS", default_value = "stdout")]
    pub log_output_paths: String,
    /// Where the logger's own errors go (upstream's zap setting). The logger here writes none
    /// of its own, so only the value's form is checked.
    #[arg(long, env = "LOG_ERROR_OUTPUT_PATHS", default_value = "stderr")]
    pub log_error_output_paths: String,
    /// Profiling on the metrics endpoint (upstream: Go's pprof). Not available here.
    #[arg(long, env = "ENABLE_PROFILING", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub enable_profiling: bool,
    /// Upstream: when false, a standby starts its watches before it leads. A karpenter-rs standby
    /// always waits (its memory stays flat), so only `true` is honoured.
    #[arg(long, env = "DISABLE_CONTROLLER_WARMUP", default_value_t = true, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub disable_controller_warmup: bool,
    /// No node, pod or NodePool state metrics (as upstream, which then also skips its status
    /// condition metrics).
    #[arg(long, env = "DISABLE_CLUSTER_STATE_OBSERVABILITY", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub disable_cluster_state_observability: bool,
    /// Pods' Dynamic Resource Allocation claims are ignored by the scheduling simulation.
    #[arg(long, env = "IGNORE_DRA_REQUESTS", default_value_t = true, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub ignore_dra_requests: bool,
    /// The Kubernetes version comes from EKS's DescribeCluster rather than the API server.
    #[arg(long, env = "EKS_CONTROL_PLANE", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub eks_control_plane: bool,
    /// No dry-run EC2 calls to validate EC2NodeClasses.
    #[arg(long, env = "DISABLE_DRY_RUN", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub disable_dry_run: bool,
    /// Leave out zones under an ARC zonal shift (upstream). Not available here.
    #[arg(long, env = "ENABLE_ZONAL_SHIFT", default_value_t = false, action = clap::ArgAction::Set, value_parser = BoolishValueParser::new())]
    pub enable_zonal_shift: bool,
    /// Set by upstream's chart for a library it no longer uses; read by neither.
    #[arg(long, env = "KUBERNETES_MIN_VERSION", default_value = "")]
    pub kubernetes_min_version: String,
}

/// The floor upstream puts on the AMI and subnet refresh intervals.
const MIN_REFRESH: Duration = Duration::from_secs(60);

/// Settings that cannot work together.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SettingsError {
    /// The aws provider needs the cluster's name.
    #[error("CLUSTER_NAME (--cluster-name) is required with the aws cloud provider")]
    MissingClusterName,
    /// A percentage outside 0..1.
    #[error("VM_MEMORY_OVERHEAD_PERCENT must be between 0 and 1, got {0}")]
    MemoryOverhead(f64),
    /// A refresh interval below upstream's floor.
    #[error("{name} must be at least 1m, got {value:?}")]
    RefreshInterval {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: Duration,
    },
    /// A log destination that is neither a stream nor a path.
    #[error("{name} has an empty entry in {value:?}")]
    LogPaths {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
    },
    /// The KubeSchedulerConfiguration file cannot be read or is refused.
    #[error("KUBE_SCHEDULER_CONFIG {path}: {reason}")]
    KubeSchedulerConfig {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The idle window cannot exceed the whole batch.
    #[error("BATCH_IDLE_DURATION ({idle:?}) must not exceed BATCH_MAX_DURATION ({max:?})")]
    BatchDurations {
        /// Idle duration.
        idle: Duration,
        /// Maximum duration.
        max: Duration,
    },
}

impl Settings {
    /// Checks the combinations that flags and environment alone cannot express.
    pub fn validate(&self) -> Result<(), SettingsError> {
        if self.cloud_provider == CloudProviderKind::Aws
            && self.cluster_name.as_deref().is_none_or(|n| n.trim().is_empty())
        {
            return Err(SettingsError::MissingClusterName);
        }
        if !(0.0..1.0).contains(&self.vm_memory_overhead_percent) {
            return Err(SettingsError::MemoryOverhead(self.vm_memory_overhead_percent));
        }
        self.default_spread()?;
        if self.batch_idle_duration > self.batch_max_duration {
            return Err(SettingsError::BatchDurations {
                idle: self.batch_idle_duration,
                max: self.batch_max_duration,
            });
        }
        for (name, value) in [
            ("AMI_REFRESH_INTERVAL", self.ami_refresh_interval),
            ("SUBNET_REFRESH_INTERVAL", self.subnet_refresh_interval),
        ] {
            if value < MIN_REFRESH {
                return Err(SettingsError::RefreshInterval { name, value });
            }
        }
        for (name, value) in [
            ("LOG_OUTPUT_PATHS", &self.log_output_paths),
            ("LOG_ERROR_OUTPUT_PATHS", &self.log_error_output_paths),
        ] {
            if value.split(',').any(|p| p.trim().is_empty()) {
                return Err(SettingsError::LogPaths { name, value: value.clone() });
            }
        }
        Ok(())
    }

    /// How often each EC2NodeClass is resolved again when nothing changes.
    pub fn nodeclass_refresh(&self) -> Duration {
        self.nodeclass_refresh_interval.unwrap_or(self.ami_refresh_interval.min(self.subnet_refresh_interval))
    }

    /// Namespace of the leader-election Lease.
    pub fn lease_namespace(&self) -> &str {
        let ns = self.leader_election_namespace.trim();
        if ns.is_empty() { &self.system_namespace } else { ns }
    }

    /// Worker threads of the async runtime: one per requested core, at least two, at most `cores`.
    pub fn worker_threads(&self, cores: usize) -> usize {
        let requested = usize::try_from((self.cpu_requests.max(1) + 999) / 1000).unwrap_or(usize::MAX);
        requested.max(2).min(cores.max(2))
    }

    /// The memory limit in bytes, when one is set.
    pub fn memory_limit(&self) -> Option<u64> {
        u64::try_from(self.memory_limit).ok().filter(|b| *b > 0)
    }

    /// kube-scheduler's default spreads as the simulations plan them: none when
    /// `DEFAULT_POD_TOPOLOGY_SPREAD` is off, else those of `KUBE_SCHEDULER_CONFIG` or the
    /// built-in ones.
    pub fn default_spread(&self) -> Result<DefaultSpread, SettingsError> {
        let path = self.kube_scheduler_config.trim();
        if !self.default_pod_topology_spread {
            return Ok(DefaultSpread::none());
        }
        if path.is_empty() {
            return Ok(DefaultSpread::builtin());
        }
        let error = |reason: String| SettingsError::KubeSchedulerConfig { path: path.to_string(), reason };
        let text = std::fs::read_to_string(path).map_err(|e| error(e.to_string()))?;
        DefaultSpread::from_kube_scheduler_config(&text).map_err(|e| error(e.to_string()))
    }

    /// What the controllers read of these settings; an error when the KubeSchedulerConfiguration
    /// cannot be read (see [`Settings::validate`]).
    pub fn controllers(&self) -> Result<crate::controllers::Settings, SettingsError> {
        Ok(crate::controllers::Settings {
            feature_gates: self.feature_gates.clone(),
            batch_idle_duration: self.batch_idle_duration,
            batch_max_duration: self.batch_max_duration,
            min_values_policy: self.min_values_policy,
            preference_policy: self.preference_policy,
            rebalance_replacement: self.rebalance_replacement,
            fewer_nodes_margin: self.fewer_nodes_margin,
            default_spread: Arc::new(self.default_spread()?),
            consolidation_preference_policy: self.consolidation_preference_policy,
        })
    }

    /// The interruption queue's name, when one is set.
    pub fn interruption_queue(&self) -> Option<&str> {
        self.interruption_queue.as_deref().map(str::trim).filter(|q| !q.is_empty())
    }

    /// What the settings ask for that this version does not do yet, one sentence each.
    pub fn unimplemented(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.rebalance_replacement {
            let why = if self.cloud_provider != CloudProviderKind::Aws {
                Some("only the aws provider reads an interruption queue")
            } else if self.interruption_queue().is_none() {
                Some("INTERRUPTION_QUEUE is not set")
            } else {
                None
            };
            if let Some(why) = why {
                out.push(format!(
                    "REBALANCE_REPLACEMENT is set, but rebalance recommendations come from the interruption queue and {why}: ignored"
                ));
            }
        }
        if let Some(queue) = self.interruption_queue()
            && self.cloud_provider != CloudProviderKind::Aws
        {
            out.push(format!(
                "INTERRUPTION_QUEUE ({queue}) is set, but only the aws provider reads an interruption queue: ignored"
            ));
        }
        if self.enable_profiling {
            out.push(
                "ENABLE_PROFILING is set, but there is no Go profiler here to serve: ignored".to_string(),
            );
        }
        if !self.disable_controller_warmup {
            out.push(
                "DISABLE_CONTROLLER_WARMUP=false asks a standby to fill its caches before it leads; a standby here watches nothing until it leads: ignored"
                    .to_string(),
            );
        }
        if self.enable_zonal_shift {
            out.push(
                "ENABLE_ZONAL_SHIFT is set, but zonal shifts are not read yet: zones under a shift are still used"
                    .to_string(),
            );
        }
        if self.eks_control_plane && self.cloud_provider != CloudProviderKind::Aws {
            out.push("EKS_CONTROL_PLANE is set, but only the aws provider asks EKS: ignored".to_string());
        }
        if !self.ignore_dra_requests {
            out.push(
                "IGNORE_DRA_REQUESTS=false asks for Dynamic Resource Allocation in scheduling, which is not implemented: pods with DRA claims get no capacity, as with true"
                    .to_string(),
            );
        }
        out
    }

    /// Logs one warning per setting that is accepted but not acted on yet.
    pub fn warn_unimplemented(&self) {
        for message in self.unimplemented() {
            tracing::warn!(setting = %message, "setting ignored");
        }
    }

    /// The settings as `name=value` pairs, for the start-up log line.
    pub fn summary(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([
            ("clusterName", self.cluster_name.clone().unwrap_or_default()),
            ("batchMaxDuration", format!("{:?}", self.batch_max_duration)),
            ("batchIdleDuration", format!("{:?}", self.batch_idle_duration)),
            ("cloudProvider", format!("{:?}", self.cloud_provider).to_lowercase()),
            ("featureGates", format!("{:?}", self.feature_gates)),
            ("leaderElectionDisabled", self.disable_leader_election.to_string()),
            ("kwokInstanceTypes", self.kwok_instance_types.to_string()),
            ("kwokRegistrationDelay", format!("{:?}", self.kwok_registration_delay)),
            ("amiRefreshInterval", format!("{:?}", self.ami_refresh_interval)),
            ("subnetRefreshInterval", format!("{:?}", self.subnet_refresh_interval)),
            ("nodeclassRefresh", format!("{:?}", self.nodeclass_refresh())),
            ("leaderElection", format!("{}/{}", self.lease_namespace(), self.leader_election_name)),
            ("memoryLimit", self.memory_limit.to_string()),
            ("cpuRequests", self.cpu_requests.to_string()),
            ("logOutputPaths", self.log_output_paths.clone()),
            ("ignoreDRARequests", self.ignore_dra_requests.to_string()),
            ("eksControlPlane", self.eks_control_plane.to_string()),
            ("disableClusterStateObservability", self.disable_cluster_state_observability.to_string()),
            ("rebalanceReplacement", self.rebalance_replacement.to_string()),
            ("fewerNodesMargin", format!("{}%", self.fewer_nodes_margin * 100.0)),
            ("defaultPodTopologySpread", self.default_pod_topology_spread.to_string()),
            ("kubeSchedulerConfig", self.kube_scheduler_config.clone()),
            ("learnExtendedResources", self.learn_extended_resources.to_string()),
            ("consolidationPreferencePolicy", format!("{:?}", self.consolidation_preference_policy)),
        ])
    }
}

fn parse_burstable_cpu(s: &str) -> Result<BurstableCpu, String> {
    s.parse()
}

/// A margin in per cent, `3` or `3%`, as a fraction; between 0 and 100.
fn parse_margin(s: &str) -> Result<f64, String> {
    let number = s.trim().trim_end_matches('%').trim();
    match number.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v / 100.0),
        _ => Err(format!("{s:?} is not a percentage between 0 and 100, such as 3%")),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: Settings,
    }

    fn parse(args: &[&str]) -> Result<Settings, clap::Error> {
        let mut argv = vec!["karpenter"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|c| c.settings)
    }

    #[test]
    fn settings_not_acted_on_yet_are_named() {
        // Upstream's defaults are all acted on, dry-run validation of EC2NodeClasses included.
        let quiet = parse(&["--cluster-name", "demo"]).unwrap();
        assert!(quiet.unimplemented().is_empty(), "{:?}", quiet.unimplemented());
        assert!(!quiet.disable_dry_run);
        let none = parse(&["--cluster-name", "demo", "--disable-dry-run", "true"]).unwrap();
        assert!(none.unimplemented().is_empty(), "{:?}", none.unimplemented());
        let aws = parse(&[
            "--cluster-name",
            "demo",
            "--interruption-queue",
            "demo-queue",
            "--disable-dry-run=true",
            "--preference-policy=Ignore",
            "--eks-control-plane=true",
        ])
        .unwrap();
        assert!(aws.unimplemented().is_empty(), "read by the aws provider: {:?}", aws.unimplemented());
        assert_eq!(aws.interruption_queue(), Some("demo-queue"));
        let s = parse(&[
            "--cluster-name",
            "demo",
            "--cloud-provider",
            "kwok",
            "--interruption-queue",
            "demo-queue",
            "--feature-gates",
            "SpotToSpotConsolidation=true,ReservedCapacity=true,NodeRepair=true",
            "--enable-profiling=true",
            "--disable-controller-warmup=false",
            "--enable-zonal-shift=true",
            "--eks-control-plane=true",
            "--ignore-dra-requests=false",
        ])
        .unwrap();
        let messages = s.unimplemented();
        let leads: Vec<&str> = messages.iter().map(|m| m.split_whitespace().next().unwrap_or("")).collect();
        assert_eq!(
            leads,
            [
                "INTERRUPTION_QUEUE",
                "ENABLE_PROFILING",
                "DISABLE_CONTROLLER_WARMUP=false",
                "ENABLE_ZONAL_SHIFT",
                "EKS_CONTROL_PLANE",
                "IGNORE_DRA_REQUESTS=false",
            ],
            "{messages:?}"
        );
        assert!(
            messages[0].contains("INTERRUPTION_QUEUE (demo-queue)") && messages[0].contains("aws provider")
        );

        // REBALANCE_REPLACEMENT needs the aws provider's queue; each missing part is named.
        let with_queue = parse(&[
            "--cluster-name",
            "demo",
            "--interruption-queue",
            "q",
            "--rebalance-replacement",
            "true",
            "--disable-dry-run=true",
        ])
        .unwrap();
        assert!(with_queue.unimplemented().is_empty(), "{:?}", with_queue.unimplemented());
        let no_queue =
            parse(&["--cluster-name", "demo", "--rebalance-replacement", "true", "--disable-dry-run=true"])
                .unwrap();
        assert_eq!(no_queue.unimplemented().len(), 1);
        assert!(
            no_queue.unimplemented()[0].contains("INTERRUPTION_QUEUE is not set"),
            "{:?}",
            no_queue.unimplemented()
        );
        let kwok =
            parse(&["--cluster-name", "demo", "--cloud-provider", "kwok", "--rebalance-replacement", "true"])
                .unwrap();
        assert!(kwok.unimplemented()[0].contains("only the aws provider"), "{:?}", kwok.unimplemented());
    }

    #[test]
    fn upstream_defaults() {
        let s = parse(&["--cluster-name", "demo"]).unwrap();
        assert_eq!(s.batch_max_duration, Duration::from_secs(10));
        assert_eq!(s.batch_idle_duration, Duration::from_secs(1));
        assert_eq!(s.vm_memory_overhead_percent, 0.075);
        assert_eq!(s.reserved_enis, 0);
        assert_eq!((s.metrics_port, s.health_probe_port), (8080, 8081));
        assert_eq!(s.preference_policy, PreferencePolicy::Respect);
        assert_eq!(s.min_values_policy, MinValuesPolicy::Strict);
        assert_eq!(s.feature_gates, FeatureGates::default());
        assert_eq!(s.cloud_provider, CloudProviderKind::Aws);
        assert!(!s.disable_leader_election && !s.isolated_vpc);
        assert_eq!(s.kwok_instance_types, Catalog::Aws);
        assert_eq!((s.ami_refresh_interval, s.subnet_refresh_interval), (MIN_REFRESH, MIN_REFRESH));
        assert_eq!(s.nodeclass_refresh(), MIN_REFRESH);
        assert_eq!(s.lease_namespace(), "kube-system");
        assert_eq!(s.leader_election_name, "karpenter-leader-election");
        assert_eq!((s.memory_limit(), s.cpu_requests), (None, 1000));
        assert_eq!((s.log_output_paths.as_str(), s.log_error_output_paths.as_str()), ("stdout", "stderr"));
        assert!(s.ignore_dra_requests && s.disable_controller_warmup);
        assert!(!s.enable_profiling && !s.enable_zonal_shift && !s.eks_control_plane);
        assert_eq!(s.kwok_registration_delay, Duration::ZERO);
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn default_spreads_come_from_kube_schedulers_defaults_or_its_configuration() {
        let s = parse(&["--cluster-name", "demo"]).unwrap();
        assert!(s.default_pod_topology_spread && s.learn_extended_resources);
        assert_eq!(*s.controllers().unwrap().default_spread, DefaultSpread::builtin());
        let off = parse(&["--cluster-name", "demo", "--default-pod-topology-spread", "false"]).unwrap();
        assert_eq!(off.default_spread(), Ok(DefaultSpread::none()));
        let dir = std::env::temp_dir().join(format!("karpenter-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("scheduler.yaml");
        std::fs::write(
            &file,
            "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- pluginConfig:\n  - name: PodTopologySpread\n    args: {defaultingType: List}\n",
        )
        .unwrap();
        let path = file.to_string_lossy().to_string();
        let listed = parse(&["--cluster-name", "demo", "--kube-scheduler-config", &path]).unwrap();
        assert_eq!(listed.default_spread(), Ok(DefaultSpread::none()), "an empty list: no defaults");
        std::fs::write(&file, "kind: Pod\n").unwrap();
        let refused = parse(&["--cluster-name", "demo", "--kube-scheduler-config", &path]).unwrap();
        let err = refused.validate().unwrap_err().to_string();
        assert!(err.starts_with(&format!("KUBE_SCHEDULER_CONFIG {path}: ")), "{err}");
        assert!(refused.controllers().is_err());
        let missing =
            parse(&["--cluster-name", "demo", "--kube-scheduler-config", "/nonexistent/k.yaml"]).unwrap();
        assert!(missing.validate().unwrap_err().to_string().contains("/nonexistent/k.yaml"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_fewer_nodes_margin_is_a_percentage() {
        assert_eq!(parse(&["--cluster-name", "demo"]).unwrap().fewer_nodes_margin, 0.03);
        // (value, fraction)
        for (value, want) in
            [("1", Some(0.01)), ("2.5%", Some(0.025)), ("0", Some(0.0)), (" 10 % ", Some(0.1))]
        {
            assert_eq!(parse_margin(value).ok(), want, "{value}");
        }
        for bad in ["", "-1", "101%", "one", "NaN"] {
            let err = parse_margin(bad).unwrap_err();
            assert!(err.contains("not a percentage between 0 and 100"), "{bad}: {err}");
        }
        let s = parse(&["--cluster-name", "demo", "--fewer-nodes-margin", "1%"]).unwrap();
        assert_eq!(s.controllers().unwrap().scheduler_options().fewer_nodes_margin, 0.01);
    }

    #[test]
    fn flags_with_upstream_values() {
        let s = parse(&[
            "--cluster-name=demo",
            "--batch-max-duration=20s",
            "--batch-idle-duration=2s",
            "--preference-policy=Ignore",
            "--min-values-policy=BestEffort",
            "--feature-gates=SpotToSpotConsolidation=true,NodeRepair=true,Drift=true",
            "--isolated-vpc=true",
            "--cloud-provider=kwok",
        ])
        .unwrap();
        assert_eq!(s.batch_max_duration, Duration::from_secs(20));
        assert_eq!(s.preference_policy, PreferencePolicy::Ignore);
        assert_eq!(s.min_values_policy, MinValuesPolicy::BestEffort);
        assert!(s.feature_gates.spot_to_spot_consolidation && s.feature_gates.node_repair);
        assert!(s.feature_gates.reserved_capacity, "untouched gates keep their defaults");
        assert!(s.isolated_vpc);
        assert_eq!(s.cloud_provider, CloudProviderKind::Kwok);
    }

    #[test]
    fn upstream_charts_feature_gates_are_all_known() {
        // What upstream v1.14.1's chart renders with its default values.
        let gates = "ReservedCapacity=true,SpotToSpotConsolidation=false,NodeRepair=false,NodeOverlay=false,StaticCapacity=false,CapacityBuffer=false";
        let s = parse(&[&format!("--feature-gates={gates}")]).unwrap();
        assert!(!s.feature_gates.capacity_buffer);
        assert!(
            s.unimplemented().is_empty(),
            "every gate of upstream's chart is acted on: {:?}",
            s.unimplemented()
        );
        let s = parse(&["--feature-gates=CapacityBuffer=true,NodeOverlay=true,StaticCapacity=true"]).unwrap();
        assert!(
            s.feature_gates.capacity_buffer
                && s.feature_gates.node_overlay
                && s.feature_gates.static_capacity
        );
        assert!(!s.unimplemented().iter().any(|m| m.starts_with("feature gate")), "{:?}", s.unimplemented());
    }

    #[test]
    fn upstream_deployment_settings() {
        let s = parse(&[
            "--leader-election-name=other",
            "--leader-election-namespace=karpenter",
            "--memory-limit=1073741824",
            "--cpu-requests=3500",
            "--log-output-paths=stdout,/var/log/karpenter.log",
            "--ami-refresh-interval=5m",
            "--subnet-refresh-interval=2m",
            "--karpenter-service=karpenter",
        ])
        .unwrap();
        assert_eq!((s.leader_election_name.as_str(), s.lease_namespace()), ("other", "karpenter"));
        assert_eq!(s.memory_limit(), Some(1 << 30));
        assert_eq!((s.worker_threads(16), s.worker_threads(2)), (4, 2), "one per requested core, capped");
        assert_eq!(parse(&["--cpu-requests=100"]).unwrap().worker_threads(8), 2, "at least two");
        assert_eq!(s.nodeclass_refresh(), Duration::from_secs(120), "the shorter of the two");
        let fast = parse(&["--nodeclass-refresh-interval=5s"]).unwrap();
        assert_eq!(fast.nodeclass_refresh(), Duration::from_secs(5), "the karpenter-rs override");
        assert_eq!(parse(&["--memory-limit=-1"]).unwrap().memory_limit(), None);

        // Upstream's floor and upstream's bad values.
        let mut s = parse(&["--cluster-name=demo", "--ami-refresh-interval=30s"]).unwrap();
        assert_eq!(
            s.validate(),
            Err(SettingsError::RefreshInterval {
                name: "AMI_REFRESH_INTERVAL",
                value: Duration::from_secs(30)
            })
        );
        s.ami_refresh_interval = Duration::from_secs(60);
        s.log_output_paths = "stdout,".into();
        assert!(matches!(s.validate(), Err(SettingsError::LogPaths { name: "LOG_OUTPUT_PATHS", .. })));
        assert!(parse(&["--memory-limit=lots"]).is_err());
        assert!(parse(&["--enable-profiling=maybe"]).is_err());
    }

    #[test]
    fn kwok_settings() {
        let s = parse(&[
            "--cloud-provider=kwok",
            "--kwok-instance-types=kwok",
            "--kwok-registration-delay=1m30s",
        ])
        .unwrap();
        assert_eq!(s.kwok_instance_types, Catalog::Kwok);
        assert_eq!(s.kwok_registration_delay, Duration::from_secs(90));
        let s = parse(&["--kwok-instance-types=/etc/types.yaml"]).unwrap();
        assert_eq!(s.kwok_instance_types, Catalog::File("/etc/types.yaml".into()));
        assert!(parse(&["--kwok-registration-delay=soon"]).is_err());
        assert_eq!(s.summary()["kwokInstanceTypes"], "/etc/types.yaml");
    }

    #[test]
    fn invalid_settings_are_explained() {
        assert!(parse(&["--feature-gates=Nope=true"]).is_err());
        assert!(parse(&["--feature-gates=NodeRepair=maybe"]).is_err());
        assert!(parse(&["--batch-max-duration=ten"]).is_err());
        // Set explicitly: the test environment may export CLUSTER_NAME.
        let mut s = parse(&[]).unwrap();
        s.cluster_name = None;
        assert_eq!(s.validate(), Err(SettingsError::MissingClusterName));
        assert_eq!(parse(&["--cloud-provider=kwok"]).unwrap().validate(), Ok(()));
        let s = parse(&["--cluster-name=demo", "--batch-idle-duration=20s"]).unwrap();
        assert!(matches!(s.validate(), Err(SettingsError::BatchDurations { .. })));
        let s = parse(&["--cluster-name=demo", "--vm-memory-overhead-percent=1.5"]).unwrap();
        assert_eq!(s.validate(), Err(SettingsError::MemoryOverhead(1.5)));
    }
}
