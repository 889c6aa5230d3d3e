//! The controller's Prometheus metrics, with upstream Karpenter's names and labels so that
//! existing dashboards and alerts keep working.
//!
//! Counters are registered without their `_total` suffix: the OpenMetrics encoder adds it.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

pub mod summary;
use summary::{Summaries, SummaryFamily};

/// Label set of a metric: `(name, value)` pairs in a fixed order.
pub type Labels = Vec<(&'static str, String)>;

/// A float gauge family.
pub type GaugeFamily = Family<Labels, Gauge<f64, AtomicU64>>;
/// Labels of one series of a per-node family: the node's labels, one allocation shared by every
/// series of the node (a few thousand series at 500 nodes), then `resource_type` where the family
/// has it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeSeries {
    /// The node's labels, in order.
    pub node: Arc<Labels>,
    /// `resource_type`, last.
    pub resource_type: Option<String>,
}

impl EncodeLabelSet for NodeSeries {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.node.as_slice().encode(encoder)?;
        match &self.resource_type {
            Some(r) => [("resource_type", r.as_str())].encode(encoder),
            None => Ok(()),
        }
    }
}

/// A float gauge family of per-node series.
pub type NodeGaugeFamily = Family<NodeSeries, Gauge<f64, AtomicU64>>;

/// Labels of one series of a per-object family, in three parts encoded in order, each one
/// allocation that other series share: the object's own labels (every series of the object), and
/// parts whose values repeat across objects (a condition's type, status and reason; a kind's
/// extra labels), which the caller interns.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SharedLabels(pub [Arc<Labels>; 3]);

impl EncodeLabelSet for SharedLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), std::fmt::Error> {
        self.0.iter().try_for_each(|part| part.as_slice().encode(encoder))
    }
}

/// Label parts whose values repeat across series (a condition's type, status and reason; a
/// kind's extra labels; a node's labels), one shared allocation per distinct value: at 2,000
/// NodeClaims and 2,000 Nodes the per-object series number in the tens of thousands, at 20,000
/// pods `karpenter_pods_state` has one series per pod.
#[derive(Debug, Default)]
pub struct LabelParts(pub(crate) std::collections::HashMap<Labels, Arc<Labels>>);

impl LabelParts {
    /// The shared part with these labels.
    pub fn get(&mut self, labels: Labels) -> Arc<Labels> {
        if let Some(part) = self.0.get(&labels) {
            return Arc::clone(part);
        }
        let part = Arc::new(labels.clone());
        self.0.insert(labels, Arc::clone(&part));
        part
    }

    /// Forgets the parts no series holds any more.
    pub fn prune(&mut self) {
        self.0.retain(|_, part| Arc::strong_count(part) > 1);
    }
}

/// A float gauge family of per-object series.
pub type ObjectGaugeFamily = Family<SharedLabels, Gauge<f64, AtomicU64>>;
/// A counter family.
pub type CounterFamily = Family<Labels, Counter>;
/// A histogram family with upstream's duration buckets.
pub type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Upstream's duration buckets (seconds, its `DurationBuckets`), from 5 ms to 10 min.
pub const DURATION_BUCKETS: [f64; 45] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25,
    1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 150.0, 300.0, 450.0, 600.0,
];

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

fn histogram_family() -> HistogramFamily {
    Family::new_with_constructor(duration_histogram as fn() -> Histogram)
}

/// Every metric the controllers export.
#[derive(Debug)]
pub struct Metrics {
    /// `karpenter_build_info{version}`: constant 1.
    pub build_info: GaugeFamily,
    /// `karpenter_nodeclaims_created_total{reason, nodepool, min_values_relaxed}`.
    pub nodeclaims_created: CounterFamily,
    /// `karpenter_nodeclaims_launched_total{nodepool}`.
    pub nodeclaims_launched: CounterFamily,
    /// `karpenter_nodeclaims_registered_total{nodepool}`.
    pub nodeclaims_registered: CounterFamily,
    /// `karpenter_nodeclaims_initialized_total{nodepool}`.
    pub nodeclaims_initialized: CounterFamily,
    /// `karpenter_nodeclaims_terminated_total{nodepool, capacity_type, zone}`.
    pub nodeclaims_terminated: CounterFamily,
    /// `karpenter_nodeclaims_disrupted_total{reason, nodepool}`.
    pub nodeclaims_disrupted: CounterFamily,
    /// `karpenter_nodeclaims_unhealthy_disrupted_total{condition, nodepool, capacity_type, image_id}`.
    pub nodeclaims_unhealthy_disrupted: CounterFamily,
    /// `karpenter_nodeclaims_termination_duration_seconds{nodepool}`.
    pub nodeclaims_termination_duration: HistogramFamily,
    /// `karpenter_interruption_received_messages_total{message_type}`.
    pub interruption_received_messages: CounterFamily,
    /// `karpenter_interruption_deleted_messages_total`.
    pub interruption_deleted_messages: CounterFamily,
    /// `karpenter_interruption_message_queue_duration_seconds`: from the event to its handling.
    pub interruption_message_queue_duration: HistogramFamily,
    /// `karpenter_interruption_instance_status_unhealthy_total{category}`.
    pub interruption_instance_status_unhealthy: CounterFamily,
    /// `karpenter_nodeclaims_instance_termination_duration_seconds{nodepool}`.
    pub nodeclaims_instance_termination_duration: HistogramFamily,
    /// `karpenter_nodes_created_total{nodepool}`.
    pub nodes_created: CounterFamily,
    /// `karpenter_nodes_terminated_total{nodepool}`.
    pub nodes_terminated: CounterFamily,
    /// `karpenter_nodes_termination_duration_seconds{nodepool}`: a summary, as upstream's.
    pub nodes_termination_duration: Arc<SummaryFamily>,
    /// `karpenter_nodes_drained_total{nodepool}`.
    pub nodes_drained: CounterFamily,
    /// `karpenter_nodes_lifetime_duration_seconds{nodepool}`: how long each node Karpenter
    /// terminated lived, from its creation to the removal of its termination finalizer
    /// ([`LIFETIME_BUCKETS`]).
    pub nodes_lifetime_duration: HistogramFamily,
    /// `karpenter_pods_eviction_requests_total{code}`: eviction requests made while draining
    /// nodes, by the API server's status code (`200` on success; requests without an answer are
    /// not counted).
    pub pods_eviction_requests: CounterFamily,
    /// `karpenter_pods_drained_total{reason}`: pods evicted while draining nodes, by the
    /// NodeClaim's `DisruptionReason` (`Forceful Termination` without one, empty without
    /// NodeClaim).
    pub pods_drained: CounterFamily,
    /// `karpenter_pods_state{name, namespace, owner, node, nodepool, zone, arch, capacity_type,
    /// instance_type, phase}`.
    pub pods_state: ObjectGaugeFamily,
    /// `karpenter_pods_startup_duration_seconds`: from a pod's creation to its Ready condition
    /// (a summary, as upstream's).
    pub pods_startup_duration: Arc<SummaryFamily>,
    /// `karpenter_pods_bound_duration_seconds`: from a pod's creation to its PodScheduled
    /// condition.
    pub pods_bound_duration: HistogramFamily,
    /// `karpenter_pods_unbound_time_seconds{name, namespace}`: how long each pending pod has not
    /// been bound.
    pub pods_unbound_time: GaugeFamily,
    /// `karpenter_pods_unstarted_time_seconds{name, namespace}`: how long each pod seen pending
    /// has not been Ready.
    pub pods_unstarted_time: GaugeFamily,
    /// `karpenter_pods_provisioning_bound_duration_seconds`: from the first placement the
    /// provisioner found for a pod to its binding.
    pub pods_provisioning_bound_duration: HistogramFamily,
    /// `karpenter_pods_provisioning_startup_duration_seconds`: from the first placement the
    /// provisioner found for a pod to its Ready condition.
    pub pods_provisioning_startup_duration: HistogramFamily,
    /// `karpenter_pods_provisioning_unbound_time_seconds{name, namespace}`: since the first
    /// placement, for pods not bound yet.
    pub pods_provisioning_unbound_time: GaugeFamily,
    /// `karpenter_pods_provisioning_unstarted_time_seconds{name, namespace}`: since the first
    /// placement, for pods not Ready yet.
    pub pods_provisioning_unstarted_time: GaugeFamily,
    /// `karpenter_pods_provisioning_scheduling_undecided_time_seconds{name, namespace}`: since the
    /// provisioner first saw a pod, while it has decided nothing about it.
    pub pods_provisioning_scheduling_undecided_time: GaugeFamily,
    /// `karpenter_pods_scheduling_decision_duration_seconds`: from the provisioner first seeing a
    /// pod to its first decision about it.
    pub pods_scheduling_decision_duration: HistogramFamily,
    /// `karpenter_scheduler_scheduling_duration_seconds{controller}`.
    pub scheduler_scheduling_duration: HistogramFamily,
    /// `karpenter_scheduler_queue_depth{controller, scheduling_id}`.
    pub scheduler_queue_depth: GaugeFamily,
    /// `karpenter_scheduler_unfinished_work_seconds{controller, scheduling_id}`: while a
    /// simulation runs, how long it has run.
    pub scheduler_unfinished_work_seconds: GaugeFamily,
    /// `karpenter_scheduler_pending_pods_by_effective_zone_count{controller, zone}`: the pending
    /// pods of the last simulation by the one zone they can go to (`flexible` for several,
    /// `none` for none).
    pub scheduler_pending_pods_by_effective_zone: GaugeFamily,
    /// `karpenter_scheduler_unschedulable_pods_count{controller}`: pods the last provisioning
    /// simulation could place nowhere (ignored pods aside).
    pub scheduler_unschedulable_pods_count: GaugeFamily,
    /// `karpenter_scheduler_ignored_pods_count`: pending pods the last provisioning pass ignored
    /// as invalid (requirements that cannot be parsed, volumes that cannot be resolved).
    pub scheduler_ignored_pods_count: GaugeFamily,
    /// `karpenter_provisioner_scheduling_duration_seconds`: a whole provisioning pass.
    pub provisioner_scheduling_duration: HistogramFamily,
    /// `karpenter_provisioner_batch_size`: pods in each closed batch.
    pub provisioner_batch_size: GaugeFamily,
    /// `karpenter_provisioner_batch_window_duration_seconds`: how long each batch stayed open.
    pub provisioner_batch_window_duration: HistogramFamily,
    /// `karpenter_cloudprovider_duration_seconds{controller, method, provider}`.
    pub cloudprovider_duration: HistogramFamily,
    /// `karpenter_cloudprovider_errors_total{controller, method, provider, error}`.
    pub cloudprovider_errors: CounterFamily,
    /// `karpenter_nodepools_usage{nodepool, resource_type}`.
    pub nodepools_usage: GaugeFamily,
    /// `karpenter_nodepools_limit{nodepool, resource_type}`.
    pub nodepools_limit: GaugeFamily,
    /// `karpenter_nodepools_allowed_disruptions{nodepool, reason}`.
    pub nodepools_allowed_disruptions: GaugeFamily,
    /// `karpenter_nodepools_nodes_consuming_budgets{nodepool, reason}`.
    pub nodepools_nodes_consuming_budgets: GaugeFamily,
    /// `karpenter_nodepools_cost_total{nodepool}`: $/h of the NodePool's NodeClaims.
    pub nodepools_cost_total: GaugeFamily,
    /// `karpenter_nodepools_cost_tracker_errors_total{nodepool}`: NodeClaims whose cost could not
    /// be counted (their NodePool or their offering's price unknown).
    pub nodepools_cost_tracker_errors: CounterFamily,
    /// `karpenter_nodes_allocatable{node_name, ..., resource_type}`.
    pub nodes_allocatable: NodeGaugeFamily,
    /// `karpenter_nodes_total_pod_requests{node_name, ..., resource_type}`.
    pub nodes_total_pod_requests: NodeGaugeFamily,
    /// `karpenter_nodes_total_pod_limits{node_name, ..., resource_type}`: limits of the pods
    /// bound to a node, DaemonSet pods included.
    pub nodes_total_pod_limits: NodeGaugeFamily,
    /// `karpenter_nodes_total_daemon_requests{node_name, ..., resource_type}`.
    pub nodes_total_daemon_requests: NodeGaugeFamily,
    /// `karpenter_nodes_total_daemon_limits{node_name, ..., resource_type}`: limits of the
    /// DaemonSet pods bound to a node.
    pub nodes_total_daemon_limits: NodeGaugeFamily,
    /// `karpenter_nodes_system_overhead{node_name, ..., resource_type}`.
    pub nodes_system_overhead: NodeGaugeFamily,
    /// `karpenter_nodes_current_lifetime_seconds{node_name, ...}`.
    pub nodes_current_lifetime_seconds: NodeGaugeFamily,
    /// `karpenter_nodes_price_per_hour{node_name, ...}` (not upstream's): the list price.
    pub nodes_price_per_hour: NodeGaugeFamily,
    /// `karpenter_nodes_cost_per_hour{node_name, ...}` (not upstream's): the full cost.
    pub nodes_cost_per_hour: NodeGaugeFamily,
    /// `karpenter_cluster_utilization_percent{resource_type}`.
    pub cluster_utilization_percent: GaugeFamily,
    /// `karpenter_cluster_state_node_count`.
    pub cluster_state_node_count: GaugeFamily,
    /// `karpenter_cluster_state_synced`: 0 while the leader's caches list, 1 once every watch
    /// has listed.
    pub cluster_state_synced: GaugeFamily,
    /// `karpenter_cluster_state_unsynced_time_seconds`: while the leader waits for every watch
    /// to list, the seconds it has waited; 0 once synced.
    pub cluster_state_unsynced_time_seconds: GaugeFamily,
    /// `karpenter_cloudprovider_instance_type_cpu_cores{instance_type}`: vCPUs of each instance
    /// type the NodePools can launch (AWS provider).
    pub cloudprovider_instance_type_cpu_cores: GaugeFamily,
    /// `karpenter_cloudprovider_instance_type_memory_bytes{instance_type}`: memory of each
    /// instance type the NodePools can launch, as EC2 reports it (before any overhead).
    pub cloudprovider_instance_type_memory_bytes: GaugeFamily,
    /// `karpenter_cloudprovider_instance_type_offering_available{instance_type, capacity_type,
    /// zone}`: 1 when an offering the NodePools can launch is available, 0 when it is not (out
    /// of capacity, or a reserved offering without reservation).
    pub cloudprovider_instance_type_offering_available: GaugeFamily,
    /// `karpenter_cloudprovider_instance_type_offering_price_estimate{instance_type,
    /// capacity_type, zone}`: the hourly price of each of those offerings.
    pub cloudprovider_instance_type_offering_price_estimate: GaugeFamily,
    /// `karpenter_voluntary_disruption_decision_evaluation_duration_seconds{reason,consolidation_type}`.
    pub disruption_evaluation_duration: HistogramFamily,
    /// `karpenter_voluntary_disruption_decisions_total{decision,reason,consolidation_type}`.
    pub disruption_decisions: CounterFamily,
    /// `karpenter_voluntary_disruption_decisions_by_nodepool_total{nodepool,decision,reason,consolidation_type}`.
    pub disruption_decisions_by_nodepool: CounterFamily,
    /// `karpenter_voluntary_disruption_eligible_nodes{reason}`.
    pub disruption_eligible_nodes: GaugeFamily,
    /// `karpenter_voluntary_disruption_consolidation_timeouts_total{consolidation_type}`.
    pub disruption_consolidation_timeouts: CounterFamily,
    /// `karpenter_voluntary_disruption_failed_validations_total{consolidation_type}`.
    pub disruption_failed_validations: CounterFamily,
    /// `karpenter_voluntary_disruption_queue_failures_total{decision,reason,consolidation_type}`.
    pub disruption_queue_failures: CounterFamily,
    /// `karpenter_consolidation_moves_total{decision,nodepool,policy}`.
    pub consolidation_moves: CounterFamily,
    /// `karpenter_consolidation_score{decision,nodepool,policy}`.
    pub consolidation_score: HistogramFamily,
    /// `controller_runtime_reconcile_total{controller,result}`: reconciles, by controller and
    /// outcome (`success`, `error`), under controller-runtime's name.
    pub controller_reconcile: CounterFamily,
    /// `controller_runtime_reconcile_errors_total{controller}`: failed reconciles.
    pub controller_reconcile_errors: CounterFamily,
    /// `controller_runtime_reconcile_time_seconds{controller}`: how long each reconcile (or pass,
    /// of the controllers that work in passes) took, in controller-runtime's buckets.
    pub controller_reconcile_time: HistogramFamily,
    /// `controller_runtime_reconcile_panics_total{controller}`: reconciles that panicked.
    pub controller_reconcile_panics: CounterFamily,
    /// `controller_runtime_reconcile_timeouts_total{controller}`: reconciles cut short (none are).
    pub controller_reconcile_timeouts: CounterFamily,
    /// `controller_runtime_terminal_reconcile_errors_total{controller}`: failures not retried.
    pub controller_terminal_reconcile_errors: CounterFamily,
    /// `controller_runtime_active_workers{controller}`: reconciles under way.
    pub controller_active_workers: GaugeFamily,
    /// `controller_runtime_max_concurrent_reconciles{controller}`: the controller's workers.
    pub controller_max_concurrent_reconciles: GaugeFamily,
    /// The `workqueue_*` families of the controllers' queues.
    pub workqueue: WorkqueueMetrics,
    /// `leader_election_master_status{name}`: 1 while this replica leads.
    pub leader_election_master_status: GaugeFamily,
    /// `rest_client_requests_total{code,method}`: requests to the API server (leader election
    /// aside), under client-go's name.
    pub rest_client_requests: CounterFamily,
    /// `client_go_request_total{code,method}`: the same requests under the name upstream exports.
    pub client_go_requests: CounterFamily,
    /// `client_go_request_duration_seconds{verb,group,version,kind,subresource}`: how long each
    /// request took.
    pub client_go_request_duration: HistogramFamily,
    /// The summary families, written after the others.
    pub summaries: Arc<Summaries>,
    /// The `operator_*` status-condition and termination families, per kind and deprecated.
    pub status: StatusMetrics,
}

/// Registers metrics, remembering each one's name and type.
struct Registrar<'a> {
    registry: &'a mut Registry,
    names: Vec<(String, Kind)>,
    summaries: Summaries,
}

/// What kind of metric a registered name is.
#[derive(Clone, Copy, Debug)]
enum Kind {
    /// One of `prometheus-client`'s.
    Client(MetricType),
    /// A [`summary`] family.
    Summary,
}

impl Registrar<'_> {
    /// Registers `metric` in the registry under `name` with `help`, records its name and type,
    /// and returns it.
    fn add<M: Metric + TypedMetric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M {
        self.names.push((name.to_string(), Kind::Client(M::TYPE)));
        self.registry.register(name, help, metric.clone());
        metric
    }

    /// Registers a summary family under `name` with `help` and returns it.
    fn summary(&mut self, name: &str, help: &str) -> Arc<SummaryFamily> {
        self.names.push((name.to_string(), Kind::Summary));
        self.summaries.add(name, help)
    }
}

/// `register_metrics! { r; field: family, "name", "help"; ... }`: the [`Metrics`] whose `field`s
/// are the given families, each registered through the [`Registrar`] `r` under `name` with `help`
/// (counters without `_total`). Rows are registered in the order written, which is the order of
/// `/metrics`.
macro_rules! register_metrics {
    ($r:ident; $($field:ident: $family:expr, $name:literal, $help:literal;)* $(+ $rest:ident: $value:expr;)*) => {
        Metrics { $($field: $r.add($name, $help, $family),)* $($rest: $value,)* }
    };
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        Metrics::registered(registry).0
    }

    /// [`Metrics::new`], and the name and type of everything it registered.
    fn registered(registry: &mut Registry) -> (Self, Vec<(String, Kind)>) {
        let mut r = Registrar { registry, names: Vec::new(), summaries: Summaries::default() };
        let m = register_metrics! { r;
            rest_client_requests: CounterFamily::default(),
                "rest_client_requests",
                "Number of HTTP requests to the API server, partitioned by status code and method.";
            controller_reconcile: CounterFamily::default(),
                "controller_runtime_reconcile",
                "Total number of reconciliations per controller.";
            controller_reconcile_errors: CounterFamily::default(),
                "controller_runtime_reconcile_errors",
                "Total number of reconciliation errors per controller.";
            controller_reconcile_time: Family::new_with_constructor(reconcile_time_histogram as fn() -> Histogram),
                "controller_runtime_reconcile_time_seconds",
                "Length of time per reconciliation per controller";
            controller_reconcile_panics: CounterFamily::default(),
                "controller_runtime_reconcile_panics",
                "Total number of reconciliation panics per controller";
            controller_reconcile_timeouts: CounterFamily::default(),
                "controller_runtime_reconcile_timeouts",
                "Total number of reconciliation timeouts per controller";
            controller_terminal_reconcile_errors: CounterFamily::default(),
                "controller_runtime_terminal_reconcile_errors",
                "Total number of terminal reconciliation errors per controller";
            controller_active_workers: GaugeFamily::default(),
                "controller_runtime_active_workers",
                "Number of currently used workers per controller";
            controller_max_concurrent_reconciles: GaugeFamily::default(),
                "controller_runtime_max_concurrent_reconciles",
                "Maximum number of concurrent reconciles per controller";
            leader_election_master_status: GaugeFamily::default(),
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.";
            client_go_requests: CounterFamily::default(),
                "client_go_request",
                "Number of HTTP requests, partitioned by status code and method.";
            client_go_request_duration: Family::new_with_constructor(client_request_histogram as fn() -> Histogram),
                "client_go_request_duration_seconds",
                "Request latency in seconds. Broken down by verb, group, version, kind, and subresource.";
            build_info: GaugeFamily::default(),
                "karpenter_build_info",
                "A metric with a constant '1' value labeled by the version karpenter was built from.";
            nodeclaims_created: CounterFamily::default(),
                "karpenter_nodeclaims_created",
                "Number of nodeclaims created, by the reason they were created and their nodepool.";
            nodeclaims_launched: CounterFamily::default(),
                "karpenter_nodeclaims_launched",
                "Number of nodeclaims launched, by nodepool.";
            nodeclaims_registered: CounterFamily::default(),
                "karpenter_nodeclaims_registered",
                "Number of nodeclaims registered, by nodepool.";
            nodeclaims_initialized: CounterFamily::default(),
                "karpenter_nodeclaims_initialized",
                "Number of nodeclaims initialized, by nodepool.";
            nodeclaims_terminated: CounterFamily::default(),
                "karpenter_nodeclaims_terminated",
                "Number of nodeclaims terminated, by nodepool, capacity type and zone.";
            nodeclaims_disrupted: CounterFamily::default(),
                "karpenter_nodeclaims_disrupted",
                "Number of nodeclaims disrupted, by reason, nodepool and capacity type.";
            nodeclaims_unhealthy_disrupted: CounterFamily::default(),
                "karpenter_nodeclaims_unhealthy_disrupted",
                "Number of unhealthy nodeclaims disrupted by node repair, by the node condition, nodepool, capacity type and image.";
            interruption_received_messages: CounterFamily::default(),
                "karpenter_interruption_received_messages",
                "Count of messages received from the SQS queue. Broken down by message type.";
            interruption_deleted_messages: CounterFamily::default(),
                "karpenter_interruption_deleted_messages",
                "Count of messages deleted from the SQS queue.";
            interruption_message_queue_duration: histogram_family(),
                "karpenter_interruption_message_queue_duration_seconds",
                "Time from an interruption event to its handling by the controller.";
            interruption_instance_status_unhealthy: CounterFamily::default(),
                "karpenter_interruption_instance_status_unhealthy",
                "Count of unhealthy instance statuses found with EC2 DescribeInstanceStatus, once per instance and category.";
            nodeclaims_termination_duration: Family::new_with_constructor(nodeclaim_termination_histogram as fn() -> Histogram),
                "karpenter_nodeclaims_termination_duration_seconds",
                "Time from a nodeclaim's deletion request to the removal of its finalizer.";
            nodeclaims_instance_termination_duration: Family::new_with_constructor(instance_termination_histogram as fn() -> Histogram),
                "karpenter_nodeclaims_instance_termination_duration_seconds",
                "Time the cloud provider took to terminate a nodeclaim's instance.";
            nodes_created: CounterFamily::default(),
                "karpenter_nodes_created",
                "Number of nodes created, by nodepool.";
            nodes_terminated: CounterFamily::default(),
                "karpenter_nodes_terminated",
                "Number of nodes terminated, by nodepool.";
            nodes_drained: CounterFamily::default(),
                "karpenter_nodes_drained",
                "Number of nodes drained, by nodepool.";
            nodes_lifetime_duration: Family::new_with_constructor(lifetime_histogram as fn() -> Histogram),
                "karpenter_nodes_lifetime_duration_seconds",
                "The lifetime duration of the nodes since creation.";
            pods_eviction_requests: CounterFamily::default(),
                "karpenter_pods_eviction_requests",
                "The total number of pod eviction requests made by Karpenter, labeled by response code";
            pods_drained: CounterFamily::default(),
                "karpenter_pods_drained",
                "The total number of pods drained during node termination by Karpenter, labeled by reason";
            pods_state: ObjectGaugeFamily::default(),
                "karpenter_pods_state",
                "Pod state: one series per pod, labeled by its node, nodepool, zone, type and phase.";
            pods_bound_duration: histogram_family(),
                "karpenter_pods_bound_duration_seconds",
                "The time from pod creation until the pod is bound.";
            pods_unbound_time: GaugeFamily::default(),
                "karpenter_pods_unbound_time_seconds",
                "The time from pod creation until the pod is bound.";
            pods_unstarted_time: GaugeFamily::default(),
                "karpenter_pods_unstarted_time_seconds",
                "The time from pod creation until the pod is running.";
            pods_provisioning_bound_duration: histogram_family(),
                "karpenter_pods_provisioning_bound_duration_seconds",
                "The time from when Karpenter first thinks the pod can schedule until it binds. Note: this calculated from a point in memory, not by the pod creation timestamp.";
            pods_provisioning_startup_duration: histogram_family(),
                "karpenter_pods_provisioning_startup_duration_seconds",
                "The time from when Karpenter first thinks the pod can schedule until the pod is running. Note: this calculated from a point in memory, not by the pod creation timestamp.";
            pods_provisioning_unbound_time: GaugeFamily::default(),
                "karpenter_pods_provisioning_unbound_time_seconds",
                "The time from when Karpenter first thinks the pod can schedule until it binds. Note: this calculated from a point in memory, not by the pod creation timestamp.";
            pods_provisioning_unstarted_time: GaugeFamily::default(),
                "karpenter_pods_provisioning_unstarted_time_seconds",
                "The time from when Karpenter first thinks the pod can schedule until the pod is running. Note: this calculated from a point in memory, not by the pod creation timestamp.";
            pods_provisioning_scheduling_undecided_time: GaugeFamily::default(),
                "karpenter_pods_provisioning_scheduling_undecided_time_seconds",
                "The time from when Karpenter has seen a pod without making a scheduling decision for the pod. Note: this calculated from a point in memory, not by the pod creation timestamp.";
            pods_scheduling_decision_duration: histogram_family(),
                "karpenter_pods_scheduling_decision_duration_seconds",
                "The time it takes for Karpenter to first try to schedule a pod after it's been seen.";
            scheduler_scheduling_duration: histogram_family(),
                "karpenter_scheduler_scheduling_duration_seconds",
                "Duration of scheduling simulations, by the controller that ran them.";
            scheduler_queue_depth: GaugeFamily::default(),
                "karpenter_scheduler_queue_depth",
                "Pods waiting to be placed by the running scheduling simulation.";
            scheduler_unfinished_work_seconds: GaugeFamily::default(),
                "karpenter_scheduler_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been considered in the scheduling duration.";
            scheduler_pending_pods_by_effective_zone: GaugeFamily::default(),
                "karpenter_scheduler_pending_pods_by_effective_zone_count",
                "The number of pending pods by the zone they can run in: a zone, flexible for several, none for none.";
            scheduler_unschedulable_pods_count: GaugeFamily::default(),
                "karpenter_scheduler_unschedulable_pods_count",
                "The number of unschedulable Pods.";
            scheduler_ignored_pods_count: GaugeFamily::default(),
                "karpenter_scheduler_ignored_pods_count",
                "Number of pods ignored during scheduling by Karpenter";
            provisioner_scheduling_duration: histogram_family(),
                "karpenter_provisioner_scheduling_duration_seconds",
                "Duration of a whole provisioning pass: snapshot, simulation and nodeclaim creation.";
            provisioner_batch_size: GaugeFamily::default(),
                "karpenter_provisioner_batch_size",
                "Number of pending pods in the last provisioning batch.";
            provisioner_batch_window_duration: histogram_family(),
                "karpenter_provisioner_batch_window_duration_seconds",
                "How long provisioning batches stayed open.";
            cloudprovider_duration: histogram_family(),
                "karpenter_cloudprovider_duration_seconds",
                "Duration of cloud provider calls, by controller, method and provider.";
            cloudprovider_errors: CounterFamily::default(),
                "karpenter_cloudprovider_errors",
                "Number of failed cloud provider calls, by controller, method, provider and error.";
            nodepools_usage: GaugeFamily::default(),
                "karpenter_nodepools_usage",
                "Resources the nodes of a nodepool provide, by nodepool and resource type.";
            nodepools_limit: GaugeFamily::default(),
                "karpenter_nodepools_limit",
                "Limits of a nodepool, by nodepool and resource type.";
            nodepools_allowed_disruptions: GaugeFamily::default(),
                "karpenter_nodepools_allowed_disruptions",
                "Nodes of a nodepool its disruption budgets allow disrupting now, by nodepool and reason.";
            nodepools_nodes_consuming_budgets: GaugeFamily::default(),
                "karpenter_nodepools_nodes_consuming_budgets",
                "Nodes of a nodepool that count against its disruption budgets (not ready or going away), by nodepool and reason.";
            nodepools_cost_total: GaugeFamily::default(),
                "karpenter_nodepools_cost_total",
                "Hourly price of a nodepool's nodeclaims at their offerings' prices, by nodepool.";
            nodepools_cost_tracker_errors: CounterFamily::default(),
                "karpenter_nodepools_cost_tracker_errors",
                "Number of nodeclaims whose cost could not be tracked, by nodepool.";
            nodes_allocatable: NodeGaugeFamily::default(),
                "karpenter_nodes_allocatable",
                "Node allocatable are the resources allocatable by nodes.";
            nodes_total_pod_requests: NodeGaugeFamily::default(),
                "karpenter_nodes_total_pod_requests",
                "Resources requested by the pods bound to a node, DaemonSet pods included.";
            nodes_total_daemon_requests: NodeGaugeFamily::default(),
                "karpenter_nodes_total_daemon_requests",
                "Resources requested by the DaemonSet pods bound to a node.";
            nodes_total_pod_limits: NodeGaugeFamily::default(),
                "karpenter_nodes_total_pod_limits",
                "Node total pod limits are the resources specified by pod limits, including the DaemonSet pods.";
            nodes_total_daemon_limits: NodeGaugeFamily::default(),
                "karpenter_nodes_total_daemon_limits",
                "Node total daemon limits are the resources specified by DaemonSet pod limits.";
            nodes_system_overhead: NodeGaugeFamily::default(),
                "karpenter_nodes_system_overhead",
                "Resources reserved for system use: a node's capacity minus its allocatable.";
            nodes_current_lifetime_seconds: NodeGaugeFamily::default(),
                "karpenter_nodes_current_lifetime_seconds",
                "Seconds since a node was created.";
            nodes_price_per_hour: NodeGaugeFamily::default(),
                "karpenter_nodes_price_per_hour",
                "Hourly list price of a node's offering (instance type, capacity type, zone).";
            nodes_cost_per_hour: NodeGaugeFamily::default(),
                "karpenter_nodes_cost_per_hour",
                "Hourly cost of a node: its offering's list price and what comes with the node (volumes, public IPv4 address, burstable CPU surplus) where the cloud provider prices it.";
            cluster_utilization_percent: GaugeFamily::default(),
                "karpenter_cluster_utilization_percent",
                "Requests of the pods bound to nodes over the nodes' allocatable, in percent, by resource type.";
            cluster_state_node_count: GaugeFamily::default(),
                "karpenter_cluster_state_node_count",
                "Nodes and nodeclaims in the controller's cluster state.";
            cluster_state_synced: GaugeFamily::default(),
                "karpenter_cluster_state_synced",
                "1 when the controller's cluster state has listed every watched kind, else 0.";
            cluster_state_unsynced_time_seconds: GaugeFamily::default(),
                "karpenter_cluster_state_unsynced_time_seconds",
                "The time for which cluster state is not synced";
            cloudprovider_instance_type_cpu_cores: GaugeFamily::default(),
                "karpenter_cloudprovider_instance_type_cpu_cores",
                "VCPUs cores for a given instance type.";
            cloudprovider_instance_type_memory_bytes: GaugeFamily::default(),
                "karpenter_cloudprovider_instance_type_memory_bytes",
                "Memory, in bytes, for a given instance type.";
            cloudprovider_instance_type_offering_available: GaugeFamily::default(),
                "karpenter_cloudprovider_instance_type_offering_available",
                "Instance type offering availability, based on instance type, capacity type, and zone";
            cloudprovider_instance_type_offering_price_estimate: GaugeFamily::default(),
                "karpenter_cloudprovider_instance_type_offering_price_estimate",
                "Instance type offering estimated hourly price used when making informed decisions on node cost calculation, based on instance type, capacity type, and zone.";
            disruption_evaluation_duration: histogram_family(),
                "karpenter_voluntary_disruption_decision_evaluation_duration_seconds",
                "Duration of a disruption method's evaluation, by reason and consolidation type.";
            disruption_decisions: CounterFamily::default(),
                "karpenter_voluntary_disruption_decisions",
                "Number of disruption decisions made, by decision, reason and consolidation type.";
            disruption_decisions_by_nodepool: CounterFamily::default(),
                "karpenter_voluntary_disruption_decisions_by_nodepool",
                "Number of disruption decisions made, by nodepool, decision, reason and consolidation type.";
            disruption_eligible_nodes: GaugeFamily::default(),
                "karpenter_voluntary_disruption_eligible_nodes",
                "Nodes eligible for disruption, by reason.";
            disruption_consolidation_timeouts: CounterFamily::default(),
                "karpenter_voluntary_disruption_consolidation_timeouts",
                "Number of consolidation evaluations that timed out, by consolidation type.";
            disruption_failed_validations: CounterFamily::default(),
                "karpenter_voluntary_disruption_failed_validations",
                "Number of disruption commands that failed their validation, by consolidation type.";
            disruption_queue_failures: CounterFamily::default(),
                "karpenter_voluntary_disruption_queue_failures",
                "Number of disruption commands that failed once started, by decision, reason and consolidation type.";
            consolidation_moves: CounterFamily::default(),
                "karpenter_consolidation_moves",
                "Consolidation moves of Balanced nodepools, by decision, nodepool and policy.";
            consolidation_score: Family::new_with_constructor(score_histogram as fn() -> Histogram),
                "karpenter_consolidation_score",
                "Scores of Balanced consolidation moves, by decision, nodepool and policy.";
            + status: StatusMetrics::register(&mut r);
            + workqueue: WorkqueueMetrics::register(&mut r);
            + pods_startup_duration: r.summary(
                "karpenter_pods_startup_duration_seconds",
                "The time from pod creation until the pod is running.",
            );
            + nodes_termination_duration: r.summary(
                "karpenter_nodes_termination_duration_seconds",
                "The time taken between a node's deletion request and the removal of its finalizer",
            );
            + summaries: Arc::new(std::mem::take(&mut r.summaries));
        };
        // Timeouts never happen here (no evaluation is cut short), but dashboards expect the series.
        for kind in ["empty", "multi", "single"] {
            let _ = m
                .disruption_consolidation_timeouts
                .get_or_create(&vec![("consolidation_type", kind.to_string())]);
        }
        m.build_info.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())]).set(1.0);
        (m, r.names)
    }

    /// Metrics registered in a throw-away registry, for tests.
    pub fn unregistered() -> Self {
        Metrics::new(&mut Registry::default())
    }
}

/// The `operator_<kind>_*` families of one kind of object, or the deprecated kind-agnostic
/// `operator_*` ones (labelled `group` and `kind`), as upstream's status-condition controllers
/// export them.
#[derive(Debug)]
pub struct StatusFamilies {
    /// `..._status_condition_count`: 1 per object and current (type, status, reason).
    pub condition_count: ObjectGaugeFamily,
    /// `..._status_condition_current_status_seconds`: how long each condition has had its status.
    pub condition_current_status_seconds: ObjectGaugeFamily,
    /// `..._status_condition_transitions_total`, by the new type, status and reason.
    pub condition_transitions: CounterFamily,
    /// `..._status_condition_transition_seconds`: how long a condition had its previous status.
    pub condition_transition_seconds: HistogramFamily,
    /// `..._termination_current_time_seconds`: how long an object has been terminating.
    pub termination_current_time_seconds: ObjectGaugeFamily,
    /// `..._termination_duration_seconds`: how long an object took to terminate.
    pub termination_duration_seconds: HistogramFamily,
}

impl StatusFamilies {
    fn register(r: &mut Registrar<'_>, prefix: &str, buckets: fn() -> Histogram) -> Self {
        let condition = format!("{prefix}_status_condition");
        let termination = format!("{prefix}_termination");
        StatusFamilies {
            condition_count: r.add(
                &format!("{condition}_count"),
                "The number of an condition for a given object, type and status. e.g. Alarm := Available=False > 0",
                ObjectGaugeFamily::default(),
            ),
            condition_current_status_seconds: r.add(
                &format!("{condition}_current_status_seconds"),
                "The current amount of time in seconds that a status condition has been in a specific state. Alarm := P99(Updated=Unknown) > 5 minutes",
                ObjectGaugeFamily::default(),
            ),
            condition_transitions: r.add(
                &format!("{condition}_transitions"),
                "The count of transitions of a given object, type and status.",
                CounterFamily::default(),
            ),
            condition_transition_seconds: r.add(
                &format!("{condition}_transition_seconds"),
                "The amount of time a condition was in a given state before transitioning. e.g. Alarm := P99(Updated=False) > 5 minutes",
                Family::new_with_constructor(buckets),
            ),
            termination_current_time_seconds: r.add(
                &format!("{termination}_current_time_seconds"),
                "The current amount of time in seconds that an object has been in terminating state.",
                ObjectGaugeFamily::default(),
            ),
            termination_duration_seconds: r.add(
                &format!("{termination}_duration_seconds"),
                "The amount of time taken by an object to terminate completely.",
                Family::new_with_constructor(buckets),
            ),
        }
    }
}

/// The `workqueue_*` families of the keyed controllers' queues, labelled `name` and
/// `controller` (both the controller's name), as controller-runtime exports them.
#[derive(Debug)]
pub struct WorkqueueMetrics {
    /// `workqueue_adds_total`: keys that became ready.
    pub adds: CounterFamily,
    /// `workqueue_depth{name, controller, priority}`: keys ready and waiting for a worker.
    pub depth: GaugeFamily,
    /// `workqueue_queue_duration_seconds`: how long a key waited, ready, for a worker.
    pub queue_duration: HistogramFamily,
    /// `workqueue_work_duration_seconds`: how long a worker held a key.
    pub work_duration: HistogramFamily,
    /// `workqueue_unfinished_work_seconds`: the seconds the keys held now have been held, summed.
    pub unfinished_work_seconds: GaugeFamily,
    /// `workqueue_longest_running_processor_seconds`: the longest a key held now has been held.
    pub longest_running_processor_seconds: GaugeFamily,
    /// `workqueue_retries_total`: keys added back after a delay (a requeue or a retry).
    pub retries: CounterFamily,
}

impl WorkqueueMetrics {
    fn register(r: &mut Registrar<'_>) -> Self {
        WorkqueueMetrics {
            adds: r.add("workqueue_adds", "Total number of adds handled by workqueue", CounterFamily::default()),
            depth: r.add("workqueue_depth", "Current depth of workqueue", GaugeFamily::default()),
            queue_duration: r.add(
                "workqueue_queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested",
                Family::new_with_constructor(workqueue_histogram as fn() -> Histogram),
            ),
            work_duration: r.add(
                "workqueue_work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
                Family::new_with_constructor(workqueue_histogram as fn() -> Histogram),
            ),
            unfinished_work_seconds: r.add(
                "workqueue_unfinished_work_seconds",
                "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
                GaugeFamily::default(),
            ),
            longest_running_processor_seconds: r.add(
                "workqueue_longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                GaugeFamily::default(),
            ),
            retries: r.add("workqueue_retries", "Total number of retries handled by workqueue", CounterFamily::default()),
        }
    }
}

/// Every kind's [`StatusFamilies`].
#[derive(Debug)]
pub struct StatusMetrics {
    /// `operator_nodeclaim_*`.
    pub nodeclaim: StatusFamilies,
    /// `operator_nodepool_*`.
    pub nodepool: StatusFamilies,
    /// `operator_node_*`.
    pub node: StatusFamilies,
    /// `operator_ec2nodeclass_*`.
    pub ec2nodeclass: StatusFamilies,
    /// The deprecated `operator_status_condition_*` and `operator_termination_*`, fed for
    /// NodeClaims, NodePools and EC2NodeClasses.
    pub deprecated: StatusFamilies,
}

impl StatusMetrics {
    fn register(r: &mut Registrar<'_>) -> Self {
        StatusMetrics {
            nodeclaim: StatusFamilies::register(r, "operator_nodeclaim", status_histogram),
            nodepool: StatusFamilies::register(r, "operator_nodepool", status_histogram),
            node: StatusFamilies::register(r, "operator_node", status_histogram),
            ec2nodeclass: StatusFamilies::register(r, "operator_ec2nodeclass", default_histogram),
            deprecated: StatusFamilies::register(r, "operator", default_histogram),
        }
    }
}

/// Upstream's buckets of the NodeClaim, NodePool and Node status families: 0.5 s doubling to
/// 8192 s.
pub const STATUS_BUCKETS: [f64; 15] =
    [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0];

fn status_histogram() -> Histogram {
    Histogram::new(STATUS_BUCKETS)
}

/// Prometheus' default buckets, which upstream's EC2NodeClass and deprecated status families use.
pub const DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

/// controller-runtime's buckets of `controller_runtime_reconcile_time_seconds` as upstream sets
/// them: the first 40 of [`DURATION_BUCKETS`], 5 ms to 60 s.
fn reconcile_time_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS[..40].iter().copied())
}

/// client-go's and the work queues' buckets, as controller-runtime sets them: 10 ns to 1000 s,
/// ten times apart.
pub const WORKQUEUE_BUCKETS: [f64; 12] =
    [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0];

fn workqueue_histogram() -> Histogram {
    Histogram::new(WORKQUEUE_BUCKETS)
}

/// Buckets of `client_go_request_duration_seconds`, as upstream registers it: 1 ms growing by
/// half, 20 of them (to 2.2 s).
fn client_request_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(0.001, 1.5, 20))
}

/// Upstream's buckets of `karpenter_nodeclaims_termination_duration_seconds`: 1 s doubling to
/// 2048 s.
fn nodeclaim_termination_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(1.0, 2.0, 12))
}

/// Upstream's buckets of `karpenter_nodeclaims_instance_termination_duration_seconds`: 1 s
/// doubling to 1024 s.
fn instance_termination_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(1.0, 2.0, 11))
}

fn score_histogram() -> Histogram {
    Histogram::new([0.1, 0.25, 0.33, 0.5, 1.0, 2.0, 5.0, 10.0])
}

/// Upstream's buckets of `karpenter_nodes_lifetime_duration_seconds` (seconds): 15, 30 and 45
/// minutes, 1, 2, 4, 6, 8, 10, 12, 16 and 20 hours, 1, 2, 3, 5, 10, 15, 20, 25 and 30 days.
pub const LIFETIME_BUCKETS: [f64; 21] = [
    900.0, 1800.0, 2700.0, 3600.0, 7200.0, 14400.0, 21600.0, 28800.0, 36000.0, 43200.0, 57600.0, 72000.0,
    86400.0, 172800.0, 259200.0, 432000.0, 864000.0, 1296000.0, 1728000.0, 2160000.0, 2592000.0,
];

fn lifetime_histogram() -> Histogram {
    Histogram::new(LIFETIME_BUCKETS)
}

/// The names of every series this controller can export, as they appear in `/metrics`: counters
/// with `_total`, histograms with `_bucket`, `_sum` and `_count`.
pub fn exported_names() -> std::collections::BTreeSet<String> {
    let (_, names) = Metrics::registered(&mut Registry::default());
    let mut out = std::collections::BTreeSet::new();
    for (name, kind) in names {
        match kind {
            Kind::Client(MetricType::Counter) => {
                out.insert(format!("{name}_total"));
            }
            Kind::Client(MetricType::Histogram) => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            Kind::Summary => {
                for suffix in ["", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            Kind::Client(_) => {
                out.insert(name);
            }
        }
    }
    out
}

/// A scheduling simulation under way, in `karpenter_scheduler_queue_depth` (the pods it was given,
/// 0 once it ends) and `karpenter_scheduler_unfinished_work_seconds` (how long it has run,
/// updated every 100 ms and removed once it ends), labelled with the controller and an id of
/// the simulation. Ends when dropped.
#[derive(Debug)]
pub struct UnfinishedWork {
    metrics: Arc<Metrics>,
    labels: Labels,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

/// Ids of simulations, unique in this process.
static SIMULATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl UnfinishedWork {
    /// Starts following a simulation of `controller` over `pods` pods. Outside a Tokio runtime
    /// the elapsed time is not updated.
    pub fn start(metrics: &Arc<Metrics>, controller: &str, pods: usize) -> Self {
        let id = SIMULATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let labels: Labels = vec![
            ("controller", controller.to_string()),
            ("scheduling_id", format!("{}-{id}", std::process::id())),
        ];
        // The previous simulations' depth series go, as upstream clears them at each start.
        metrics.scheduler_queue_depth.clear();
        metrics.scheduler_queue_depth.get_or_create(&labels).set(pods as f64);
        metrics.scheduler_unfinished_work_seconds.get_or_create(&labels).set(0.0);
        let ticker = tokio::runtime::Handle::try_current().ok().map(|runtime| {
            let (metrics, labels) = (metrics.clone(), labels.clone());
            runtime.spawn(async move {
                let started = tokio::time::Instant::now();
                let mut every = tokio::time::interval(Duration::from_millis(100));
                loop {
                    every.tick().await;
                    metrics
                        .scheduler_unfinished_work_seconds
                        .get_or_create(&labels)
                        .set(started.elapsed().as_secs_f64());
                }
            })
        });
        UnfinishedWork { metrics: metrics.clone(), labels, ticker }
    }
}

impl Drop for UnfinishedWork {
    fn drop(&mut self) {
        if let Some(ticker) = self.ticker.take() {
            ticker.abort();
        }
        self.metrics.scheduler_unfinished_work_seconds.remove(&self.labels);
        self.metrics.scheduler_queue_depth.get_or_create(&self.labels).set(0.0);
    }
}

/// Families of upstream's metrics reference this controller does not export, and why.
pub const UPSTREAM_NOT_EXPORTED: [(&str, &str); 9] = [
    ("aws_sdk_go_request_attempt_duration_seconds", "the Go SDK's; the Rust SDK has no such metrics"),
    ("aws_sdk_go_request_attempt_total", "the Go SDK's"),
    ("aws_sdk_go_request_duration_seconds", "the Go SDK's"),
    ("aws_sdk_go_request_retry_count", "the Go SDK's"),
    ("aws_sdk_go_request_total", "the Go SDK's"),
    ("controller_runtime_conversion_webhook_panics_total", "no conversion webhook is served"),
    ("leader_election_slowpath_total", "upstream defines it but never registers it either"),
    ("karpenter_cloudprovider_batcher_batch_size", "EC2 calls are not batched over a time window"),
    ("karpenter_cloudprovider_batcher_batch_time_seconds", "EC2 calls are not batched over a time window"),
];

/// Observes `elapsed` in the histogram of `family` with `labels`.
pub fn observe(family: &HistogramFamily, labels: Labels, elapsed: Duration) {
    family.get_or_create(&labels).observe(elapsed.as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metric names in a PromQL expression: identifiers not followed by `(` (functions) that are
    /// not keywords or label names (inside `{...}`, `by (...)`, `on (...)`).
    fn metric_names(expr: &str) -> Vec<String> {
        let mut out = Vec::new();
        let (mut braces, mut parens_of_labels) = (0, 0);
        let bytes = expr.as_bytes();
        let mut i = 0;
        while i < bytes.len() {
            let c = bytes[i] as char;
            if c == '"' {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += 1;
                }
            } else if c == '#' {
                // A comment, to the end of the line.
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            } else if c == '[' {
                // A range or subquery: `[5m]`, `[1h:5m]`.
                while i < bytes.len() && bytes[i] != b']' {
                    i += 1;
                }
            } else if c == '{' {
                braces += 1;
            } else if c == '}' {
                braces -= 1;
            } else if c == ')' && parens_of_labels > 0 {
                parens_of_labels -= 1;
            } else if c.is_ascii_alphabetic() || c == '_' {
                let start = i;
                while i < bytes.len()
                    && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b':')
                {
                    i += 1;
                }
                let word = &expr[start..i];
                let next = expr[i..].trim_start();
                const KEYWORDS: [&str; 6] = ["and", "or", "unless", "offset", "bool", "atan2"];
                // Aggregations may put their grouping first: `sum by (x) (...)`.
                const AGGREGATIONS: [&str; 8] =
                    ["sum", "min", "max", "avg", "count", "topk", "bottomk", "quantile"];
                if ["by", "on", "without", "ignoring", "group_left", "group_right"].contains(&word) {
                    if next.starts_with('(') {
                        parens_of_labels += 1;
                    }
                } else if braces == 0
                    && parens_of_labels == 0
                    && !next.starts_with('(')
                    && !KEYWORDS.contains(&word)
                    && !(AGGREGATIONS.contains(&word)
                        && (next.starts_with("by") || next.starts_with("without")))
                {
                    out.push(word.to_string());
                }
                continue;
            }
            i += 1;
        }
        out
    }

    #[test]
    fn promql_names_are_found() {
        assert_eq!(
            metric_names(
                r#"sum by (nodepool) (a_b{x="y"} * on (n) group_left () (1 - c / d)) or vector(0) + rate(e[5m])"#
            ),
            ["a_b", "c", "d", "e"]
        );
    }

    #[test]
    fn dashboards_query_only_exported_metrics() {
        let exported = exported_names();
        assert!(exported.contains("karpenter_nodepools_cost_total"), "{exported:?}");
        assert!(exported.contains("karpenter_scheduler_scheduling_duration_seconds_bucket"));
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        // Ours, and upstream's (its getting-started guide's), which users already have.
        let mut files = 0;
        for dir in ["charts/karpenter/dashboards", "tests/fixtures/upstream/dashboards"] {
            for entry in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_none_or(|e| e != "json") {
                    continue;
                }
                let dashboard: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                files += 1;
                let mut exprs = Vec::new();
                target_exprs(&dashboard, &mut exprs);
                assert!(!exprs.is_empty(), "{}: no query", path.display());
                for expr in exprs {
                    let names = metric_names(&expr);
                    assert!(!names.is_empty(), "{}: no metric in {expr}", path.display());
                    for name in names {
                        // node-exporter's, not ours.
                        if name.starts_with("node_") {
                            continue;
                        }
                        assert!(
                            exported.contains(&name),
                            "{}: {name} is not exported ({expr})",
                            path.display()
                        );
                    }
                }
            }
        }
        assert_eq!(
            files, 6,
            "ours: capacity, cost, disruption, performance; upstream's: capacity, performance"
        );
    }

    /// The `expr` of every panel target of a dashboard, nested rows included.
    fn target_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(targets) = map.get("targets").and_then(|t| t.as_array()) {
                    out.extend(targets.iter().filter_map(|t| t["expr"].as_str()).map(String::from));
                }
                for (key, v) in map {
                    if key != "targets" {
                        target_exprs(v, out);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| target_exprs(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_family_of_upstreams_reference_is_exported() {
        let exported = exported_names();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/upstream/metrics-v1.14.1.txt");
        let reference: Vec<String> = std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(String::from)
            .collect();
        assert!(reference.len() > 100, "{}", reference.len());
        let skipped: std::collections::BTreeMap<&str, &str> = UPSTREAM_NOT_EXPORTED.into_iter().collect();
        let missing: Vec<&String> = reference
            .iter()
            .filter(|name| !skipped.contains_key(name.as_str()))
            .filter(|name| {
                // A histogram or summary is exported as its series.
                !exported.contains(*name) && !exported.contains(&format!("{name}_count"))
            })
            .collect();
        assert!(missing.is_empty(), "upstream families not exported: {missing:?}");
        for name in skipped.keys() {
            assert!(reference.iter().any(|r| r == name), "{name} is not in upstream's reference");
            assert!(!exported.contains(*name), "{name} is exported: remove it from UPSTREAM_NOT_EXPORTED");
        }
    }

    #[test]
    fn names_are_upstreams() {
        fn labels(pairs: &[(&'static str, &str)]) -> Labels {
            pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
        }
        let mut registry = Registry::default();
        let m = Metrics::new(&mut registry);
        m.nodeclaims_created
            .get_or_create(&vec![
                ("reason", "provisioned".into()),
                ("nodepool", "default".into()),
                ("min_values_relaxed", "false".into()),
            ])
            .inc();
        observe(&m.scheduler_scheduling_duration, vec![("controller", "provisioner".into())], Duration::ZERO);
        // Families added for parity with upstream, with their labels.
        observe(
            &m.nodes_lifetime_duration,
            labels(&[("nodepool", "default")]),
            Duration::from_secs(2 * 3600),
        );
        m.pods_eviction_requests.get_or_create(&labels(&[("code", "429")])).inc();
        m.pods_drained.get_or_create(&labels(&[("reason", "Underutilized")])).inc();
        m.scheduler_unschedulable_pods_count
            .get_or_create(&labels(&[("controller", "provisioner")]))
            .set(2.0);
        m.scheduler_ignored_pods_count.get_or_create(&vec![]).set(1.0);
        m.cluster_state_unsynced_time_seconds.get_or_create(&vec![]).set(3.0);
        let node = NodeSeries {
            node: Arc::new(labels(&[("node_name", "n1"), ("nodepool", "default")])),
            resource_type: Some("cpu".into()),
        };
        m.nodes_total_pod_limits.get_or_create(&node).set(1.5);
        m.nodes_total_daemon_limits.get_or_create(&node).set(0.5);
        m.cloudprovider_instance_type_cpu_cores
            .get_or_create(&labels(&[("instance_type", "m5.large")]))
            .set(2.0);
        m.cloudprovider_instance_type_memory_bytes
            .get_or_create(&labels(&[("instance_type", "m5.large")]))
            .set(8589934592.0);
        let offering =
            labels(&[("instance_type", "m5.large"), ("capacity_type", "spot"), ("zone", "us-west-2a")]);
        m.cloudprovider_instance_type_offering_available.get_or_create(&offering).set(1.0);
        m.cloudprovider_instance_type_offering_price_estimate.get_or_create(&offering).set(0.04);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                "karpenter_nodeclaims_created_total{reason=\"provisioned\",nodepool=\"default\",min_values_relaxed=\"false\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("karpenter_scheduler_scheduling_duration_seconds_bucket"), "{text}");
        assert!(text.contains("karpenter_build_info{version="), "{text}");
        for series in [
            "karpenter_nodes_lifetime_duration_seconds_bucket{le=\"900.0\",nodepool=\"default\"} 0",
            "karpenter_nodes_lifetime_duration_seconds_count{nodepool=\"default\"} 1",
            "karpenter_pods_eviction_requests_total{code=\"429\"} 1",
            "karpenter_pods_drained_total{reason=\"Underutilized\"} 1",
            "karpenter_scheduler_unschedulable_pods_count{controller=\"provisioner\"} ",
            "karpenter_scheduler_ignored_pods_count",
            "karpenter_cluster_state_unsynced_time_seconds",
            "karpenter_nodes_total_pod_limits{node_name=\"n1\",nodepool=\"default\",resource_type=\"cpu\"} ",
            "karpenter_nodes_total_daemon_limits{node_name=\"n1\",nodepool=\"default\",resource_type=\"cpu\"} ",
            "karpenter_cloudprovider_instance_type_cpu_cores{instance_type=\"m5.large\"} ",
            "karpenter_cloudprovider_instance_type_memory_bytes{instance_type=\"m5.large\"} ",
            "karpenter_cloudprovider_instance_type_offering_available{instance_type=\"m5.large\",capacity_type=\"spot\",zone=\"us-west-2a\"} ",
            "karpenter_cloudprovider_instance_type_offering_price_estimate{instance_type=\"m5.large\",capacity_type=\"spot\",zone=\"us-west-2a\"} ",
        ] {
            assert!(text.contains(series), "{series} in\n{text}");
        }
        // Two hours fall in the 2 h bucket, not in the 1 h one.
        let bucket = |le: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("karpenter_nodes_lifetime_duration_seconds_bucket")
                        && l.contains(&format!("le=\"{le}\""))
                })
                .map(|l| l.rsplit(' ').next().unwrap_or_default().to_string())
        };
        assert_eq!(bucket("3600.0").as_deref(), Some("0"), "{text}");
        assert_eq!(bucket("7200.0").as_deref(), Some("1"), "{text}");
        assert_eq!(LIFETIME_BUCKETS.len(), 21);
        assert_eq!(LIFETIME_BUCKETS[0], 15.0 * 60.0);
        assert_eq!(LIFETIME_BUCKETS[20], 30.0 * 86400.0);
        assert!(LIFETIME_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        let exported = exported_names();
        for name in [
            "karpenter_nodes_lifetime_duration_seconds_bucket",
            "karpenter_pods_eviction_requests_total",
            "karpenter_pods_drained_total",
            "karpenter_scheduler_unschedulable_pods_count",
            "karpenter_scheduler_ignored_pods_count",
            "karpenter_cluster_state_unsynced_time_seconds",
            "karpenter_nodes_total_pod_limits",
            "karpenter_nodes_total_daemon_limits",
            "karpenter_cloudprovider_instance_type_cpu_cores",
            "karpenter_cloudprovider_instance_type_memory_bytes",
            "karpenter_cloudprovider_instance_type_offering_available",
            "karpenter_cloudprovider_instance_type_offering_price_estimate",
        ] {
            assert!(exported.contains(name), "{name} exported");
        }
    }
}
