//! `karpenter controller`: starts the endpoints, the cluster-state watches and the cloud
//! provider, campaigns for the leader-election Lease, runs the controllers while leading, and
//! shuts down cleanly on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::apiclient;
use super::leader::{LeaderElector, Timing};
use super::server::{self, Readiness};
use super::settings::{CloudProviderKind, Settings};
use crate::cloudprovider::aws::provider::{AwsClients, AwsCloudProvider, Options};
use crate::cloudprovider::metered::Metered;
use crate::cloudprovider::overlay::{Adjustments, LearnedStore, Overlaid, Overlays};
use crate::cloudprovider::{CloudProvider, ProviderControllers};
use crate::controllers::{self, Context, Events};
use crate::metrics::Metrics;
use crate::state::ClusterState;
use crate::util::error_chain;

/// Errors that stop the controller.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("connecting to the Kubernetes API server")]
    Kube(#[source] kube::Error),
    /// An endpoint could not be served.
    #[error(transparent)]
    Server(#[from] server::ServerError),
    /// The cloud provider could not be set up.
    #[error("starting the {provider} cloud provider")]
    CloudProvider {
        /// Which provider.
        provider: &'static str,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The settings cannot be used.
    #[error(transparent)]
    Settings(#[from] super::settings::SettingsError),
    /// Leadership was lost while the controllers ran; the process exits so that its
    /// replacement starts from a clean state.
    #[error("leader election lost")]
    LeadershipLost,
    /// A controller (or the cluster-state watches) stopped on its own while leading: the process
    /// exits, releasing the Lease, so that a standby takes over with every controller running.
    #[error("controller {name} stopped unexpectedly{}", if *.panicked { " (it panicked)" } else { "" })]
    ControllerEnded {
        /// Which controller.
        name: &'static str,
        /// Whether it panicked (else it returned).
        panicked: bool,
    },
}

/// The controllers' tasks, each with its name.
#[derive(Default)]
struct Controllers {
    tasks: JoinSet<()>,
    names: std::collections::HashMap<tokio::task::Id, &'static str>,
}

impl Controllers {
    fn spawn(&mut self, name: &'static str, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let handle = self.tasks.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// The name of the task that ended as `ended` says, and whether it panicked.
    fn ended(&self, ended: Result<(tokio::task::Id, ()), tokio::task::JoinError>) -> (&'static str, bool) {
        let (id, panicked) = match ended {
            Ok((id, ())) => (id, false),
            Err(error) => (error.id(), error.is_panic()),
        };
        (self.names.get(&id).copied().unwrap_or("unknown"), panicked)
    }
}

/// Why the leader stops leading.
#[derive(Debug, PartialEq)]
enum Stop {
    /// A stop signal.
    Signal,
    /// The Lease was lost.
    LeadershipLost,
    /// A task ended on its own.
    Ended { name: &'static str, panicked: bool },
}

/// Waits until the leader must stop: a stop signal, the loss of the Lease, or a controller task
/// (or the cluster-state `watches`) ending on its own, which a controller never does while
/// leading.
async fn supervise(
    controllers: &mut Controllers,
    watches: &mut tokio::task::JoinHandle<()>,
    stop: &mut watch::Receiver<bool>,
    leading: &mut watch::Receiver<bool>,
) -> Stop {
    loop {
        tokio::select! {
            _ = stop.changed() => if *stop.borrow() { return Stop::Signal },
            r = leading.changed() => {
                if r.is_err() || !*leading.borrow() {
                    return Stop::LeadershipLost;
                }
            }
            Some(ended) = controllers.tasks.join_next_with_id() => {
                let (name, panicked) = controllers.ended(ended);
                return Stop::Ended { name, panicked };
            }
            ended = &mut *watches => {
                let panicked = ended.as_ref().err().is_some_and(|e| e.is_panic());
                return Stop::Ended { name: "cluster-state", panicked };
            }
        }
    }
}

/// How long the controllers get to finish after a stop signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long the first launches wait for the first fetch of instance types and prices.
const FIRST_REFRESH_WAIT: Duration = Duration::from_secs(30);
/// How often `karpenter_cluster_state_unsynced_time_seconds` is updated while the caches list.
const UNSYNCED_TICK: Duration = Duration::from_secs(1);

/// Runs the controller until SIGTERM/Ctrl-C (`Ok`) or a fatal error.
pub async fn run(settings: Settings) -> Result<(), RunError> {
    let settings = Arc::new(settings);
    tracing::info!(settings = ?settings.summary(), version = env!("CARGO_PKG_VERSION"), "starting karpenter");
    settings.warn_unimplemented();
    let mut registry = Registry::default();
    let metrics = Arc::new(Metrics::new(&mut registry));
    let config = apiclient::config().await.map_err(RunError::Kube)?;
    let client = apiclient::counted(
        config.clone(),
        settings.kube_client_qps,
        settings.kube_client_burst,
        Some(metrics.clone()),
    )
    .map_err(RunError::Kube)?;
    let readiness = Readiness::default();
    let (stop_tx, stop) = watch::channel(false);

    let mut servers = JoinSet::new();
    let (health_listener, health_addr) =
        server::bind(SocketAddr::from(([0, 0, 0, 0], settings.health_probe_port))).await?;
    let (metrics_listener, metrics_addr) =
        server::bind(SocketAddr::from(([0, 0, 0, 0], settings.metrics_port))).await?;
    servers.spawn(server::serve(health_listener, server::health_router(readiness.clone()), stop.clone()));
    let decisions = crate::disruption::record::Decisions::default();
    let metrics_routes =
        server::metrics_router(Arc::new(registry), metrics.summaries.clone(), decisions.clone());
    servers.spawn(server::serve(metrics_listener, metrics_routes, stop.clone()));
    tracing::info!(health = %health_addr, metrics = %metrics_addr, "serving health probes and metrics");

    tokio::spawn(signals(stop_tx.clone()));
    if let Some(limit) = settings.memory_limit() {
        tokio::spawn(super::memory::run(limit, stop.clone()));
    }

    let adjustments = Adjustments {
        overlays: settings.feature_gates.node_overlay.then(Overlays::new),
        learned: settings.learn_extended_resources.then(LearnedStore::new),
    };
    let (cloud, provider_controllers) = cloud_provider(&settings, &client, &adjustments).await?;
    let cloud: Arc<dyn CloudProvider> = Arc::new(Metered::new(cloud, metrics.clone()));
    // Every decision sees the adjustments; the NodeOverlay controller alone reads the provider's
    // own figures, and the learned-resources controller the overlays without what was learned.
    let overlays =
        adjustments.overlays.clone().map(|overlays| OverlaySource { cloud: cloud.clone(), overlays });
    let learned = adjustments.learned.clone().map(|learned| {
        let only_overlays = Adjustments { overlays: adjustments.overlays.clone(), learned: None };
        let cloud: Arc<dyn CloudProvider> = Arc::new(Overlaid::new(cloud.clone(), only_overlays));
        LearnedSource { cloud, learned }
    });
    let cloud: Arc<dyn CloudProvider> =
        if adjustments.is_empty() { cloud } else { Arc::new(Overlaid::new(cloud, adjustments)) };
    let identity = identity();
    let events = Events::new(client.clone(), Some(identity.clone()));
    let ctx = Context {
        client: client.clone(),
        cloud,
        settings: Arc::new(settings.controllers()?),
        metrics: metrics.clone(),
        events,
        decisions,
        surges: Default::default(),
    };

    // Leadership. A standby holds nothing of the cluster: its memory does not grow with the
    // cluster, and it watches nothing the API server must send it. It lists every kind when it
    // takes over, a second or two at 500 nodes beside the 15 s the Lease takes to expire. It is
    // ready while it waits; a leader is ready once its caches have synced.
    readiness.set(!settings.disable_leader_election);
    let (elector_stop_tx, elector_stop) = watch::channel(false);
    let (leading_tx, mut leading) = watch::channel(settings.disable_leader_election);
    let elector = if settings.disable_leader_election {
        None
    } else {
        let elector = LeaderElector::new(
            &config,
            settings.lease_namespace(),
            &settings.leader_election_name,
            &identity,
            Timing::default(),
        )
        .map_err(RunError::Kube)?
        .with_metrics(&metrics);
        tracing::info!(lease = %settings.leader_election_name, namespace = %settings.lease_namespace(), identity = %identity, "attempting to acquire leader lease");
        Some(tokio::spawn(elector.run(leading_tx, elector_stop)))
    };
    let mut waiting = stop.clone();
    while !*leading.borrow() {
        tokio::select! {
            r = leading.changed() => if r.is_err() { break },
            _ = waiting.changed() => {}
        }
        if *waiting.borrow() {
            break;
        }
    }

    let mut outcome = Ok(());
    let mut watches = None;
    if !*stop.borrow() && *leading.borrow() {
        readiness.set(false);
        let (state, driver) = ClusterState::start(client.clone());
        let watches = watches.insert(tokio::spawn(driver));
        let mut stopping = stop.clone();
        // Until every cache has listed: `karpenter_cluster_state_synced` 0 and
        // `karpenter_cluster_state_unsynced_time_seconds` the seconds spent waiting.
        let synced_gauge = metrics.cluster_state_synced.get_or_create_owned(&vec![]);
        let unsynced_gauge = metrics.cluster_state_unsynced_time_seconds.get_or_create_owned(&vec![]);
        synced_gauge.set(0.0);
        unsynced_gauge.set(0.0);
        let unsynced_since = std::time::Instant::now();
        let mut tick = tokio::time::interval(UNSYNCED_TICK);
        let synced = loop {
            tokio::select! {
                _ = state.wait_synced() => break true,
                _ = stopping.wait_for(|s| *s) => break false,
                _ = leading.wait_for(|l| !*l) => break false,
                _ = tick.tick() => {
                    unsynced_gauge.set(unsynced_since.elapsed().as_secs_f64());
                }
            }
        };
        if synced {
            synced_gauge.set(1.0);
            unsynced_gauge.set(0.0);
            readiness.set(true);
            tracing::info!("cluster state synced");
        }
        outcome = if synced {
            let parts = Parts {
                provider: provider_controllers.as_ref(),
                overlays: overlays.as_ref(),
                learned: learned.as_ref(),
            };
            lead(&ctx, &settings, &state, parts, watches, &stop, &mut leading).await
        } else if *leading.borrow() {
            Ok(()) // stopped while syncing
        } else {
            Err(RunError::LeadershipLost)
        };
    }
    elector_stop_tx.send_replace(true);
    if let Some(elector) = elector {
        let _ = elector.await;
    }
    stop_tx.send_replace(true);
    if let Some(watches) = watches {
        watches.abort();
    }
    while servers.join_next().await.is_some() {}
    tracing::info!("stopped");
    outcome
}

/// Runs the controllers until a stop signal (`Ok`), the loss of leadership, or a controller (or
/// the cluster-state `watches`) ending on its own.
async fn lead(
    ctx: &Context,
    settings: &Settings,
    state: &ClusterState,
    parts: Parts<'_>,
    watches: &mut tokio::task::JoinHandle<()>,
    stop: &watch::Receiver<bool>,
    leading: &mut watch::Receiver<bool>,
) -> Result<(), RunError> {
    tracing::info!("starting controllers");
    let (ctrl_stop_tx, ctrl_stop) = watch::channel(false);
    let mut controllers = start_controllers(ctx, settings, state, parts, &ctrl_stop);
    let mut stopping = stop.clone();
    let why = supervise(&mut controllers, watches, &mut stopping, leading).await;
    let outcome = match why {
        Stop::Signal => Ok(()),
        Stop::LeadershipLost => Err(RunError::LeadershipLost),
        Stop::Ended { name, panicked } => Err(RunError::ControllerEnded { name, panicked }),
    };
    let tasks = &mut controllers.tasks;
    match &outcome {
        Err(RunError::LeadershipLost) => {
            // Another replica may lead as soon as the Lease expires: nothing more is done here,
            // not even finishing what is under way.
            tracing::error!("leadership lost, stopping every controller now");
            tasks.abort_all();
        }
        Err(error) => {
            // This replica cannot do its whole job: it stops at once and releases the Lease, so
            // that a standby with every controller running takes over.
            tracing::error!(error = %error, "a controller stopped unexpectedly, giving up leadership");
            tasks.abort_all();
        }
        Ok(()) => {
            tracing::info!("stopping controllers");
            ctrl_stop_tx.send_replace(true);
            let drained = async {
                tokio::select! {
                    _ = async { while tasks.join_next().await.is_some() {} } => true,
                    _ = leading.wait_for(|l| !*l) => false,
                    _ = tokio::time::sleep(SHUTDOWN_GRACE) => false,
                }
            };
            if !drained.await {
                tracing::warn!(
                    "controllers did not stop within {SHUTDOWN_GRACE:?} (or leadership ended); aborting them"
                );
                tasks.abort_all();
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    outcome
}

/// What the controllers run with besides the context: the cloud provider's own controllers, and
/// with the NodeOverlay gate, what the overlay controller reads and writes, and what the
/// learned-resources controller reads and writes.
#[derive(Clone, Copy)]
struct Parts<'a> {
    provider: &'a dyn ProviderControllers,
    overlays: Option<&'a OverlaySource>,
    learned: Option<&'a LearnedSource>,
}

/// The learned-resources controller's inputs: the provider with the NodeOverlays only, and what
/// it keeps current for the launches.
struct LearnedSource {
    cloud: Arc<dyn CloudProvider>,
    learned: Arc<LearnedStore>,
}

/// The NodeOverlay controller's inputs: the provider without overlays, and the evaluation it
/// keeps current for the decorated one.
struct OverlaySource {
    cloud: Arc<dyn CloudProvider>,
    overlays: Arc<Overlays>,
}

/// Starts every controller, each stopping when `stop` turns true: the cloud provider's own, then
/// the others.
fn start_controllers(
    ctx: &Context,
    settings: &Settings,
    state: &ClusterState,
    parts: Parts<'_>,
    stop: &watch::Receiver<bool>,
) -> Controllers {
    let mut tasks = Controllers::default();
    let (provider_tasks, first_refresh) = parts.provider.start(ctx, state, stop);
    for (name, task) in provider_tasks {
        tasks.spawn(name, task);
    }
    {
        // The first launches wait (a little) for the instance types and current prices, so that a
        // NodePool allowing spot does not start on on-demand for want of spot prices. The other
        // controllers start at once.
        let (ctx, state, stop) = (ctx.clone(), state.clone(), stop.clone());
        tasks.spawn(controllers::provisioning::CONTROLLER, async move {
            if let Some(fetched) = first_refresh
                && tokio::time::timeout(FIRST_REFRESH_WAIT, fetched).await.is_err()
            {
                tracing::warn!("instance types and prices are not fetched yet; starting without them");
            }
            controllers::provisioning::run(ctx, state, stop).await;
        });
    }
    tasks.spawn(
        controllers::nodeclaim::lifecycle::CONTROLLER,
        controllers::nodeclaim::lifecycle::run(ctx.clone(), state.clone(), stop.clone()),
    );
    tasks.spawn(
        controllers::node::termination::CONTROLLER,
        controllers::node::termination::run(ctx.clone(), state.clone(), stop.clone()),
    );
    tasks.spawn(
        controllers::nodeclaim::garbagecollection::CONTROLLER,
        controllers::nodeclaim::garbagecollection::run(ctx.clone(), state.clone(), stop.clone()),
    );
    tasks.spawn(
        controllers::nodeclaim::drift::CONTROLLER,
        controllers::nodeclaim::drift::run(ctx.clone(), state.clone(), stop.clone()),
    );
    tasks.spawn(
        controllers::nodepool::status::CONTROLLER,
        controllers::nodepool::status::run(ctx.clone(), state.clone(), stop.clone()),
    );
    if settings.disable_cluster_state_observability {
        for controller in [controllers::node::metrics::CONTROLLER, controllers::pod_metrics::CONTROLLER] {
            tracing::info!(controller, "not started: DISABLE_CLUSTER_STATE_OBSERVABILITY is set");
        }
    } else {
        tasks.spawn(
            controllers::node::metrics::CONTROLLER,
            controllers::node::metrics::run(ctx.clone(), state.clone(), stop.clone()),
        );
        tasks.spawn(
            controllers::pod_metrics::CONTROLLER,
            controllers::pod_metrics::run(ctx.clone(), state.clone(), stop.clone()),
        );
    }
    tasks.spawn(
        controllers::status_metrics::CONTROLLER,
        controllers::status_metrics::run(
            ctx.clone(),
            state.clone(),
            !settings.disable_cluster_state_observability,
            stop.clone(),
        ),
    );
    tasks.spawn(
        controllers::nodeclaim::consolidatable::CONTROLLER,
        controllers::nodeclaim::consolidatable::run(ctx.clone(), state.clone(), stop.clone()),
    );
    tasks.spawn(
        controllers::nodeclaim::expiration::CONTROLLER,
        controllers::nodeclaim::expiration::run(ctx.clone(), state.clone(), stop.clone()),
    );
    tasks.spawn(
        controllers::disruption::CONTROLLER,
        controllers::disruption::run(ctx.clone(), state.clone(), stop.clone()),
    );
    if settings.feature_gates.capacity_buffer {
        tasks.spawn(
            controllers::capacitybuffer::CONTROLLER,
            controllers::capacitybuffer::run(ctx.clone(), state.clone(), stop.clone()),
        );
    }
    if settings.feature_gates.static_capacity {
        tasks.spawn(
            controllers::nodepool::static_capacity::CONTROLLER,
            controllers::nodepool::static_capacity::run(ctx.clone(), state.clone(), stop.clone()),
        );
    }
    if let Some(source) = parts.overlays {
        tasks.spawn(
            controllers::nodeoverlay::CONTROLLER,
            controllers::nodeoverlay::run(
                ctx.clone(),
                source.cloud.clone(),
                source.overlays.clone(),
                state.clone(),
                stop.clone(),
            ),
        );
    }
    if let Some(source) = parts.learned {
        tasks.spawn(
            controllers::learned::CONTROLLER,
            controllers::learned::run(
                ctx.clone(),
                source.cloud.clone(),
                source.learned.clone(),
                state.clone(),
                stop.clone(),
            ),
        );
    }
    tasks.spawn(controllers::surge::CONTROLLER, controllers::surge::run(ctx.clone(), stop.clone()));
    if controllers::node::health::enabled(ctx) {
        tasks.spawn(
            controllers::node::health::CONTROLLER,
            controllers::node::health::run(ctx.clone(), state.clone(), stop.clone()),
        );
    }
    tasks
}

/// The identity in the Lease and in events: the pod name in a cluster, else host and process.
fn identity() -> String {
    if let Ok(pod) = std::env::var("POD_NAME")
        && !pod.is_empty()
    {
        return pod;
    }
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "karpenter".into());
    format!("{host}_{}", std::process::id())
}

/// Turns SIGTERM or Ctrl-C into `stop`.
async fn signals(stop: watch::Sender<bool>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("received SIGTERM, shutting down"),
                    _ = tokio::signal::ctrl_c() => tracing::info!("received interrupt, shutting down"),
                }
            }
            Err(error) => {
                tracing::warn!(error = %error, "cannot listen for SIGTERM");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    stop.send_replace(true);
}

/// Builds the provider the controller runs with `--cloud-provider kwok`: the catalog of
/// `--kwok-instance-types` (for `aws`, computed with the settings' VM memory overhead and
/// reserved ENIs) and the delay of `--kwok-registration-delay`.
fn kwok_provider(
    client: kube::Client,
    settings: &Settings,
    adjustments: &Adjustments,
) -> Result<crate::cloudprovider::kwok::KwokCloudProvider, crate::cloudprovider::kwok::KwokError> {
    let types = match &settings.kwok_instance_types {
        crate::cloudprovider::catalog::Catalog::Aws => {
            let aws = crate::cloudprovider::aws::instancetype::Settings {
                vm_memory_overhead_percent: settings.vm_memory_overhead_percent,
                reserved_enis: i64::from(settings.reserved_enis),
                ..crate::cloudprovider::aws::embedded::default_settings()
            };
            crate::cloudprovider::aws::embedded::instance_types_with(&aws)
                .map_err(crate::cloudprovider::kwok::KwokError::AwsCatalog)?
        }
        other => other.load().map_err(crate::cloudprovider::kwok::KwokError::Catalog)?,
    };
    let provider =
        crate::cloudprovider::kwok::KwokCloudProvider::new(client, types, settings.kwok_registration_delay);
    Ok(provider.with_adjustments(adjustments.clone()))
}

/// The cloud provider the settings ask for, and its own controllers.
async fn cloud_provider(
    settings: &Settings,
    client: &kube::Client,
    adjustments: &Adjustments,
) -> Result<(Arc<dyn CloudProvider>, Box<dyn ProviderControllers>), RunError> {
    match settings.cloud_provider {
        CloudProviderKind::Kwok => {
            let provider = kwok_provider(client.clone(), settings, adjustments)
                .map_err(|e| RunError::CloudProvider { provider: "kwok", source: Box::new(e) })?;
            Ok((Arc::new(provider), Box::new(crate::cloudprovider::kwok::controllers::Controllers)))
        }
        CloudProviderKind::Aws => {
            let fail = |e: crate::cloudprovider::CloudProviderError| {
                tracing::error!(error = %error_chain(&e), "starting the aws cloud provider");
                RunError::CloudProvider { provider: "aws", source: Box::new(e) }
            };
            let clients = AwsClients::for_controller().await.map_err(fail)?;
            let mut options = Options::new(settings.cluster_name.clone().unwrap_or_default());
            options.cluster_endpoint = settings.cluster_endpoint.clone();
            options.node_class_refresh = settings.nodeclass_refresh();
            options.disable_dry_run = settings.disable_dry_run;
            options.reserved_capacity = settings.feature_gates.reserved_capacity;
            // Without CLUSTER_CA_BUNDLE, nodes trust the CA this controller trusts (in a cluster,
            // its service account's), as upstream; EKS's answer only when there is none.
            options.cluster_ca_bundle = match &settings.cluster_ca_bundle {
                Some(ca) => Some(ca.clone()),
                None => apiclient::cluster_ca_bundle().await,
            };
            // EKS_CONTROL_PLANE: the version EKS's DescribeCluster gives, as upstream.
            options.kubernetes_version = match client.apiserver_version().await {
                Ok(_) if settings.eks_control_plane => None,
                Ok(info) => {
                    Some(crate::cloudprovider::aws::provider::minor_version(&info.major, &info.minor))
                }
                Err(e) => {
                    tracing::warn!(error = %error_chain(&e), "reading the API server's version; using the EKS cluster's");
                    None
                }
            };
            options.reserved_enis = i64::from(settings.reserved_enis);
            options.burstable_cpu = settings.burstable_cpu;
            options.vm_memory_overhead_percent = settings.vm_memory_overhead_percent;
            options.kube_dns_ip = crate::cloudprovider::aws::provider::kube_dns_ip(client).await;
            options.adjustments = adjustments.clone();
            let provider = Arc::new(AwsCloudProvider::new(clients, options).await.map_err(fail)?);
            let controllers = crate::cloudprovider::aws::controllers::Controllers {
                provider: provider.clone(),
                isolated_vpc: settings.isolated_vpc,
                interruption_queue: settings.interruption_queue().map(str::to_string),
            };
            Ok((provider, Box::new(controllers)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels() -> (watch::Sender<bool>, watch::Receiver<bool>, watch::Sender<bool>, watch::Receiver<bool>)
    {
        let (stop_tx, stop) = watch::channel(false);
        let (leading_tx, leading) = watch::channel(true);
        (stop_tx, stop, leading_tx, leading)
    }

    fn running() -> tokio::task::JoinHandle<()> {
        tokio::spawn(futures::future::pending())
    }

    #[tokio::test]
    async fn a_controller_that_returns_stops_the_leader() {
        let (_stop_tx, mut stop, _leading_tx, mut leading) = channels();
        let mut controllers = Controllers::default();
        controllers.spawn("steady", futures::future::pending());
        controllers.spawn("broken", async {});
        let why = supervise(&mut controllers, &mut running(), &mut stop, &mut leading).await;
        assert_eq!(why, Stop::Ended { name: "broken", panicked: false });
    }

    #[tokio::test]
    async fn a_controller_that_panics_stops_the_leader() {
        let (_stop_tx, mut stop, _leading_tx, mut leading) = channels();
        let mut controllers = Controllers::default();
        controllers.spawn("steady", futures::future::pending());
        controllers.spawn("crashing", async { panic!("boom") });
        let why = supervise(&mut controllers, &mut running(), &mut stop, &mut leading).await;
        assert_eq!(why, Stop::Ended { name: "crashing", panicked: true });
    }

    #[tokio::test]
    async fn the_cluster_state_watches_ending_stop_the_leader() {
        let (_stop_tx, mut stop, _leading_tx, mut leading) = channels();
        let mut controllers = Controllers::default();
        controllers.spawn("steady", futures::future::pending());
        let mut watches = tokio::spawn(async {});
        let why = supervise(&mut controllers, &mut watches, &mut stop, &mut leading).await;
        assert_eq!(why, Stop::Ended { name: "cluster-state", panicked: false });
    }

    #[tokio::test]
    async fn a_stop_signal_and_a_lost_lease_are_told_apart() {
        let (stop_tx, mut stop, leading_tx, mut leading) = channels();
        let mut controllers = Controllers::default();
        controllers.spawn("steady", futures::future::pending());
        stop_tx.send_replace(true);
        assert_eq!(supervise(&mut controllers, &mut running(), &mut stop, &mut leading).await, Stop::Signal);
        let (_stop_tx, mut stop, _, _) = channels();
        leading_tx.send_replace(false);
        assert_eq!(
            supervise(&mut controllers, &mut running(), &mut stop, &mut leading).await,
            Stop::LeadershipLost
        );
    }

    #[test]
    fn the_error_names_the_controller() {
        let error = RunError::ControllerEnded { name: "disruption", panicked: true };
        assert_eq!(error.to_string(), "controller disruption stopped unexpectedly (it panicked)");
    }
}
