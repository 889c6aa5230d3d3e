//! What the journeys share: the controller process, a fixture of uniquely named objects, and
//! waiting helpers.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use karpenter::apis::{EC2NodeClass, NodeClaim, NodeOverlay, NodePool, crds};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::OnceCell;

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Who acts on the shared cluster now: journeys that run their own controllers act alone;
/// journeys that share the one kwok controller of [`Shared`] act side by side (each keeps to its
/// own NodePool, namespace and pods). Waiting shared journeys go before waiting lone ones, so
/// that the shared ones of a run overlap as much as they can.
struct Gate {
    alone: bool,
    sharing: usize,
    waiting_to_share: usize,
}

static GATE: StdMutex<Gate> = StdMutex::new(Gate { alone: false, sharing: 0, waiting_to_share: 0 });

fn gate() -> std::sync::MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held by a journey that runs its own controllers: no other journey acts meanwhile.
pub struct Alone(());

impl Drop for Alone {
    fn drop(&mut self) {
        gate().alone = false;
    }
}

/// Waits until the journey may run its own controllers with nothing else acting on the cluster.
pub async fn alone() -> Alone {
    loop {
        {
            let mut g = gate();
            if !g.alone && g.sharing == 0 && g.waiting_to_share == 0 {
                g.alone = true;
                return Alone(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits, when `KARPENTER_RS_E2E_AFTER_AWS_TESTS` names a file, until that file exists: `make
/// test` runs the AWS emulator's own tests (tests/aws.rs) beside the journeys and writes it when
/// they end, so that the journeys which publish node images or change the emulator's catalog never
/// act while those tests read it.
pub async fn after_the_aws_emulator_tests() {
    let Some(done) = std::env::var_os("KARPENTER_RS_E2E_AFTER_AWS_TESTS") else { return };
    let done = PathBuf::from(done);
    while !done.exists() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

struct Sharing(());

impl Drop for Sharing {
    fn drop(&mut self) {
        gate().sharing -= 1;
    }
}

async fn share() -> Sharing {
    gate().waiting_to_share += 1;
    loop {
        {
            let mut g = gate();
            if !g.alone {
                g.waiting_to_share -= 1;
                g.sharing += 1;
                return Sharing(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The kwok controller the journeys of [`Shared::kwok`] share while they overlap.
static SHARED_KWOK: StdMutex<Weak<Controller>> = StdMutex::new(Weak::new());

/// A journey's use of the shared kwok controller (started by the first journey that needs it,
/// stopped and checked by the last one to finish). Its settings are the defaults plus the
/// `NodeRepair` gate, which acts only on nodes whose conditions turn unhealthy, the
/// `NodeOverlay` gate, whose overlays act only on the NodePools they select, the
/// `StaticCapacity` gate, which acts only on NodePools with `replicas`, and the `CapacityBuffer`
/// gate, whose buffers keep room only where their pods may go. kube-scheduler's default spreads
/// are off (`DEFAULT_POD_TOPOLOGY_SPREAD=false`): they act on every workload, and these journeys
/// assert upstream's plans; `default_spread_with_kwok` runs them with a controller of its own.
pub struct Shared {
    controller: Option<Arc<Controller>>,
    _sharing: Sharing,
}

impl Shared {
    pub const ENV: &[(&str, &str)] = &[
        ("FEATURE_GATES", "NodeRepair=true,NodeOverlay=true,StaticCapacity=true,CapacityBuffer=true"),
        ("DEFAULT_POD_TOPOLOGY_SPREAD", "false"),
    ];

    pub async fn kwok() -> Shared {
        let sharing = share().await;
        let mut slot = SHARED_KWOK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let controller = slot.upgrade().unwrap_or_else(|| {
            let started = Arc::new(Controller::start("kwok", Self::ENV));
            *slot = Arc::downgrade(&started);
            started
        });
        Shared { controller: Some(controller), _sharing: sharing }
    }

    /// The journey is done with the controller; the last one out stops it and checks its exit.
    pub fn release(mut self) {
        let Some(controller) = self.controller.take() else { return };
        let mut slot = SHARED_KWOK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if Arc::strong_count(&controller) > 1 {
            // Let go under the lock, so that the journey finishing next sees itself last.
            drop(controller);
            return;
        }
        *slot = Weak::new();
        drop(slot);
        if let Ok(controller) = Arc::try_unwrap(controller) {
            controller.stop_and_check();
        }
    }
}

impl std::ops::Deref for Shared {
    type Target = Controller;

    fn deref(&self) -> &Controller {
        self.controller.as_deref().expect("released")
    }
}

static CRDS: OnceCell<()> = OnceCell::const_new();

pub async fn client() -> Client {
    let client = Client::try_default()
        .await
        .expect("a kubeconfig for the local control plane (run through `make test`, or eval \"$(make -s cluster-up)\")");
    CRDS.get_or_init(|| async {
        crds::install(&client, "karpenter-rs-tests", Duration::from_secs(30)).await.expect("CRDs installed");
    })
    .await;
    client
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A `karpenter controller` process, logging to a file.
pub struct Controller {
    child: Child,
    log: PathBuf,
    metrics_port: u16,
    health_port: u16,
}

impl Controller {
    /// Starts the controller with `--cloud-provider <provider>` and leader election off.
    pub fn start(provider: &str, env: &[(&str, &str)]) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = repo().join("target").join("e2e-logs");
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join(format!(
            "controller-{provider}-{}-{}.log",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let file = std::fs::File::create(&log).unwrap();
        let metrics_port = free_port();
        let health_port = free_port();
        // KARPENTER_BIN runs another build (e.g. the release binary, for measurements).
        let bin =
            std::env::var("KARPENTER_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_karpenter").to_string());
        let mut cmd = Command::new(bin);
        cmd.args(["controller", "--cloud-provider", provider])
            .env("DISABLE_LEADER_ELECTION", "true")
            .env("METRICS_PORT", metrics_port.to_string())
            .env("HEALTH_PROBE_PORT", health_port.to_string())
            // E2E_LOG_LEVEL=debug for a closer look at a failing journey.
            .env("LOG_LEVEL", std::env::var("E2E_LOG_LEVEL").unwrap_or_else(|_| "info".to_string()))
            // The log goes to stdout (LOG_OUTPUT_PATHS' default); anything on stderr joins it.
            .stdout(file.try_clone().expect("share the log file"))
            .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start the karpenter binary");
        Controller { child, log, metrics_port, health_port }
    }

    /// The whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_contains(&self, needle: &str) -> bool {
        self.log().contains(needle)
    }

    /// Waits (up to 15 s) for a line containing `needle`: the controller logs most actions once
    /// they are answered, so the line may follow what the journey saw.
    pub async fn wait_logged(&self, needle: &str) {
        wait_for(&format!("a log line {needle:?}"), Duration::from_secs(15), self, || async {
            self.log_contains(needle)
        })
        .await;
    }

    /// The last lines of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let from = lines.len().saturating_sub(40);
        format!("--- controller log ({}) ---\n{}", self.log.display(), lines[from..].join("\n"))
    }

    /// The lines of the log that contain any of `needles`, for a failure's message: how NodeClaims
    /// came and went, say, where the last 40 lines show only the end.
    pub fn log_lines_with(&self, needles: &[&str]) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().filter(|l| needles.iter().any(|n| l.contains(n))).collect();
        format!(
            "--- controller log ({}), lines with {needles:?} ---\n{}",
            self.log.display(),
            lines.join("\n")
        )
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A memory figure of `/proc/<pid>/status` (KiB): `VmHWM` (peak resident) or `VmRSS`.
    fn proc_status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Peak resident memory of the process so far (KiB).
    pub fn peak_rss_kib(&self) -> u64 {
        self.proc_status_kib("VmHWM")
    }

    /// Resident memory of the process now (KiB).
    pub fn rss_kib(&self) -> u64 {
        self.proc_status_kib("VmRSS")
    }

    /// The sum of the samples of a metric family (all label sets) in `/metrics`.
    pub async fn metric_sum(&self, family: &str) -> f64 {
        self.metric_sum_where(family, "").await
    }

    /// The sum of the samples of a metric family whose label set contains `label` (such as
    /// `reason="expired"`) in `/metrics`.
    pub async fn metric_sum_where(&self, family: &str, label: &str) -> f64 {
        self.metric_sum_where_all(family, &[label]).await
    }

    /// The sum of the samples of a metric family whose label set contains every one of `labels`.
    pub async fn metric_sum_where_all(&self, family: &str, labels: &[&str]) -> f64 {
        self.metrics()
            .await
            .lines()
            .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
            .filter(|l| labels.iter().all(|label| l.contains(label)))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    }

    /// Of the histogram `family` (summed over its label sets): how many observations it has, how
    /// many of them were at most `within`, and the smallest bucket bound that holds them all.
    pub async fn histogram_within(&self, family: &str, within: f64) -> (f64, f64, f64) {
        let prefix = format!("{family}_bucket{{");
        let mut buckets: BTreeMap<u64, f64> = BTreeMap::new();
        for line in self.metrics().await.lines().filter(|l| l.starts_with(&prefix)) {
            let le = line.split_once("le=\"").and_then(|(_, rest)| rest.split_once('"')).map(|(v, _)| v);
            let bound = match le {
                Some("+Inf") => f64::INFINITY,
                Some(v) => v.parse().unwrap_or(f64::NAN),
                None => continue,
            };
            let count = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
            *buckets.entry(bound.to_bits()).or_insert(0.0) += count;
        }
        let mut cumulative: Vec<(f64, f64)> =
            buckets.into_iter().map(|(b, c)| (f64::from_bits(b), c)).collect();
        cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = cumulative.last().map_or(0.0, |b| b.1);
        let held = cumulative.iter().filter(|b| b.0 <= within).map(|b| b.1).fold(0.0, f64::max);
        let all = cumulative.iter().find(|b| b.1 >= total).map_or(f64::NAN, |b| b.0);
        (total, held, all)
    }

    /// The text of `/metrics`, asked for gzip-compressed as Prometheus asks (so the controller never
    /// holds the whole text, which at 2,000 nodes would add tens of MiB to the peak measured).
    pub async fn metrics(&self) -> String {
        let port = self.metrics_port;
        tokio::task::spawn_blocking(move || {
            let answer = get_bytes(port, "/metrics", "Accept-Encoding: gzip\r\n");
            let split = answer.windows(4).position(|w| w == b"\r\n\r\n").map_or(answer.len(), |i| i + 4);
            let (head, body) = answer.split_at(split);
            let head = String::from_utf8_lossy(head).into_owned();
            let mut text = String::new();
            if head.to_ascii_lowercase().contains("content-encoding: gzip") {
                flate2::read::GzDecoder::new(body).read_to_string(&mut text).unwrap();
            } else {
                text = String::from_utf8_lossy(body).into_owned();
            }
            head + &text
        })
        .await
        .unwrap()
    }

    /// The answer (headers and body) to a GET of `path` on the metrics port.
    pub async fn metrics_port_get(&self, path: &str) -> String {
        get(self.metrics_port, path).await
    }

    /// Whether `/readyz` on the health-probe port answers 200.
    pub async fn is_ready(&self) -> bool {
        get(self.health_port, "/readyz").await.starts_with("HTTP/1.1 200")
    }

    /// Sends SIGTERM and checks the process exits cleanly and promptly.
    pub fn stop_and_check(mut self) {
        let status = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status().unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "clean exit on SIGTERM, got {status}\n{}", self.log_tail());
                assert!(self.log_contains("received SIGTERM"), "{}", self.log_tail());
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the controller exits within 20 s of SIGTERM\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Controller {
    /// Kills the process at once (SIGKILL), as a crash would: no Lease release, no cleanup.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The answer (headers and body) to a GET of `path` on a local port.
async fn get(port: u16, path: &str) -> String {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || String::from_utf8_lossy(&get_bytes(port, &path, "")).into_owned())
        .await
        .unwrap()
}

/// The raw answer to a GET of `path` on a local port, with `headers` (each ending in CRLF) added.
fn get_bytes(port: u16, path: &str, headers: &str) -> Vec<u8> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n");
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    stream.read_to_end(&mut out).unwrap();
    out
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `check` holds, failing with the controller's log after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, controller: &Controller, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}\n{}",
            controller.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Seconds from `started` to the latest of `times` (NaN when there is none).
pub fn latest_after(
    started: k8s_openapi::jiff::Timestamp,
    times: impl IntoIterator<Item = Option<k8s_openapi::jiff::Timestamp>>,
) -> f64 {
    times.into_iter().flatten().map(|t| t.duration_since(started).as_secs_f64()).fold(f64::NAN, f64::max)
}

/// The status of condition `type_` of a NodeClaim.
pub fn condition(claim: &NodeClaim, type_: &str) -> Option<String> {
    claim
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| serde_json::to_value(c.status).unwrap().as_str().unwrap_or_default().to_string())
}

pub fn is_running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        && pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
}

/// CPU seconds (user and system) used so far by each process of the local control plane (by
/// binary name: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok-controller)
/// and by the `karpenter` controllers, from `/proc`. The scale runs print the difference over a
/// run, to show which part of the machine's two cores went where.
pub fn cpu_seconds_by_process() -> BTreeMap<String, f64> {
    const NAMES: [&str; 6] = [
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
        "kube-controller-manager",
        "kwok-controller",
        "karpenter",
    ];
    // Clock ticks per second: 100 on every Linux this runs on (USER_HZ).
    const TICKS: f64 = 100.0;
    let mut by_name = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return by_name };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(cmdline) = std::fs::read(path.join("cmdline")) else { continue };
        let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        let program = String::from_utf8_lossy(program);
        let Some(name) = NAMES.iter().find(|n| program.rsplit('/').next() == Some(**n)) else { continue };
        let Ok(stat) = std::fs::read_to_string(path.join("stat")) else { continue };
        // Fields after the command name in parentheses: state is field 3, utime 14, stime 15.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = fields.get(11..13).into_iter().flatten().filter_map(|f| f.parse::<f64>().ok()).sum();
        *by_name.entry(name.to_string()).or_insert(0.0) += ticks / TICKS;
    }
    by_name
}

/// `after - before` of [`cpu_seconds_by_process`], as `name 12.3 s, ...`, largest first.
pub fn cpu_seconds_used(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> String {
    let mut used: Vec<(&String, f64)> =
        after.iter().map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0.0))).collect();
    used.sort_by(|a, b| b.1.total_cmp(&a.1));
    used.iter().map(|(k, v)| format!("{k} {v:.0} s")).collect::<Vec<_>>().join(", ")
}

/// Objects as a watch sees them: the scale runs count pods and nodes every second without
/// listing thousands of them from the API server each time.
pub struct Watched<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    store: kube::runtime::reflector::Store<K>,
    task: tokio::task::JoinHandle<()>,
}

impl<K> Watched<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    pub async fn start(api: Api<K>, labels: Option<&str>) -> Self {
        use futures::StreamExt;
        use kube::runtime::{WatchStreamExt, reflector, watcher};
        let (store, writer) = reflector::store();
        let config = match labels {
            Some(selector) => watcher::Config::default().labels(selector),
            None => watcher::Config::default(),
        };
        let stream = reflector(writer, watcher(api, config)).default_backoff().touched_objects();
        let task = tokio::spawn(stream.for_each(|_| std::future::ready(())));
        store.wait_until_ready().await.unwrap();
        Self { store, task }
    }

    pub fn objects(&self) -> Vec<Arc<K>> {
        self.store.state()
    }
}

/// Of `pods`, how many are not being deleted, and of those how many are Running on a node.
pub fn live_and_running<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> (usize, usize) {
    pods.into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .fold((0, 0), |(live, running), p| (live + 1, running + usize::from(is_running(p))))
}

impl Watched<Pod> {
    /// Pods not being deleted, and of those the ones Running on a node.
    pub fn live_and_running(&self) -> (usize, usize) {
        live_and_running(self.objects().iter().map(|p| p.as_ref()))
    }

    /// Waits until exactly `n` live pods exist and all of them are Running.
    pub async fn wait_running(&self, n: usize, timeout: Duration, controller: &Controller) {
        wait_for(&format!("{n} pods Running"), timeout, controller, || async {
            self.live_and_running() == (n, n)
        })
        .await;
    }
}

impl<K: kube::Resource<DynamicType = ()> + Clone + 'static> Drop for Watched<K> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The cluster the journeys run against: `CLUSTER_NAME` as exported by `hack/cluster-up.sh`.
pub fn cluster_name() -> String {
    std::env::var("CLUSTER_NAME").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| "karpenter-demo".into())
}

/// An example manifest; the examples name the cluster `karpenter-demo` (discovery tags, node
/// role), which becomes the cluster of the journeys.
fn read_example<K: DeserializeOwned>(file: &str) -> K {
    let text = std::fs::read_to_string(repo().join("examples").join(file)).unwrap();
    let text = text.replace("karpenter-demo", &cluster_name());
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("examples/{file}: {e}"))
}

/// Uniquely named objects of one journey: a namespace, an EC2NodeClass, a NodePool (from the
/// examples) and the inflate Deployment pinned to that NodePool.
pub struct Fixture {
    pub client: Client,
    pub ns: String,
    pub pool: String,
    pub class: String,
}

static SWEPT: OnceCell<()> = OnceCell::const_new();

/// Deletes what earlier, failed runs left behind (their namespaces, NodePools and EC2NodeClasses
/// are named `e2e-<tag>-<pid>`); their NodeClaims follow their NodePools through the garbage
/// collector and are terminated by the next controller that runs.
async fn sweep_leftovers(client: &Client) {
    let mine = format!("-{}", std::process::id());
    let stale = |name: &str| name.starts_with("e2e-") && !name.ends_with(&mine);
    let dp = DeleteParams::default();
    let pools = Api::<NodePool>::all(client.clone());
    for p in pools.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        if stale(&p.name_any()) {
            let _ = pools.delete(&p.name_any(), &dp).await;
        }
    }
    let overlays = Api::<NodeOverlay>::all(client.clone());
    for o in overlays.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        if stale(&o.name_any()) {
            let _ = overlays.delete(&o.name_any(), &dp).await;
        }
    }
    let classes = Api::<EC2NodeClass>::all(client.clone());
    for c in classes.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        if stale(&c.name_any()) {
            let _ = classes.delete(&c.name_any(), &dp).await;
        }
    }
    let namespaces = Api::<Namespace>::all(client.clone());
    for n in namespaces.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        if stale(&n.name_any()) {
            let _ = namespaces.delete(&n.name_any(), &dp).await;
        }
    }
}

impl Fixture {
    pub async fn new(tag: &str) -> Self {
        let client = client().await;
        SWEPT.get_or_init(|| sweep_leftovers(&client)).await;
        let id = format!("e2e-{tag}-{}", std::process::id());
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": id}})).unwrap();
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        Fixture { client, ns: id.clone(), pool: id.clone(), class: id }
    }

    /// Whether the controller logged `message` about this fixture's objects (on a line naming its
    /// NodePool or namespace, which its NodeClaims and Nodes are named after): journeys may share
    /// a controller.
    pub fn logged(&self, controller: &Controller, message: &str) -> bool {
        controller
            .log()
            .lines()
            .any(|l| l.contains(message) && (l.contains(&self.pool) || l.contains(&self.ns)))
    }

    /// Waits (up to 15 s) for a line of `message` about this fixture's objects: a controller logs
    /// most actions once they are answered, so the line may follow what the journey saw.
    pub async fn wait_logged(&self, controller: &Controller, message: &str) {
        wait_for(&format!("a log line {message:?}"), Duration::from_secs(15), controller, || async {
            self.logged(controller, message)
        })
        .await;
    }

    /// The label that picks this fixture's NodePool's series out of a metric family.
    pub fn pool_label(&self) -> String {
        format!("nodepool=\"{}\"", self.pool)
    }

    /// The NODES column of `kubectl get nodepool` for the fixture's NodePool.
    pub async fn nodepool_nodes(&self) -> i64 {
        let pool = Api::<NodePool>::all(self.client.clone()).get(&self.pool).await.unwrap();
        pool.status.map(|s| s.nodes).unwrap_or_default()
    }

    pub fn claims_api(&self) -> Api<NodeClaim> {
        Api::all(self.client.clone())
    }

    /// The namespace's pods, as a watch sees them.
    pub async fn watch_pods(&self) -> Watched<Pod> {
        Watched::start(Api::namespaced(self.client.clone(), &self.ns), None).await
    }

    /// The pool's Nodes, as a watch sees them.
    pub async fn watch_nodes(&self) -> Watched<Node> {
        Watched::start(Api::all(self.client.clone()), Some(&format!("karpenter.sh/nodepool={}", self.pool)))
            .await
    }

    fn pool_selector(&self) -> ListParams {
        ListParams::default().labels(&format!("karpenter.sh/nodepool={}", self.pool))
    }

    pub async fn apply_class_and_pool(&self, cpu_limit: i64) {
        let mut class: EC2NodeClass = read_example("ec2nodeclass.yaml");
        class.metadata.name = Some(self.class.clone());
        Api::<EC2NodeClass>::all(self.client.clone()).create(&PostParams::default(), &class).await.unwrap();
        let mut pool: NodePool = read_example("nodepool-general-purpose.yaml");
        pool.metadata.name = Some(self.pool.clone());
        pool.spec.template.spec.node_class_ref.name = self.class.clone();
        pool.spec.limits = Some(
            [(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(cpu_limit.to_string()),
            )]
            .into(),
        );
        Api::<NodePool>::all(self.client.clone()).create(&PostParams::default(), &pool).await.unwrap();
    }

    pub async fn set_cpu_limit(&self, cpu: i64) {
        Api::<NodePool>::all(self.client.clone())
            .patch(
                &self.pool,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"limits": {"cpu": cpu.to_string()}}})),
            )
            .await
            .unwrap();
    }

    /// Creates a Deployment `name` of `replicas` pause pods requesting `cpu` and `memory`, in the
    /// fixture's namespace and pinned to its pool, with `pod_spec` merged into its pods' spec.
    pub async fn apply_deployment(
        &self,
        name: &str,
        replicas: i32,
        cpu: &str,
        memory: &str,
        pod_spec: serde_json::Value,
    ) {
        let mut spec = json!({
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {"karpenter.sh/nodepool": self.pool},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": cpu, "memory": memory}}}]
        });
        if let (Some(spec), serde_json::Value::Object(extra)) = (spec.as_object_mut(), pod_spec) {
            spec.extend(extra);
        }
        let d: Deployment = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}}, "spec": spec}
            }
        }))
        .unwrap();
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
    }

    /// The inflate Deployment of the examples, in the fixture's namespace and pinned to its pool.
    pub async fn apply_inflate(&self) {
        let mut d: Deployment = read_example("inflate.yaml");
        d.metadata.namespace = Some(self.ns.clone());
        let mut value = serde_json::to_value(&d).unwrap();
        value["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = json!([self.pool]);
        let d: Deployment = serde_json::from_value(value).unwrap();
        Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &d)
            .await
            .unwrap();
    }

    /// `kubectl scale deployment karpenter-inflate --replicas n`.
    pub async fn scale(&self, replicas: i32) {
        let out = Command::new("kubectl")
            .args([
                "scale",
                "deployment",
                "karpenter-inflate",
                "-n",
                &self.ns,
                "--replicas",
                &replicas.to_string(),
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    pub async fn pods(&self) -> Vec<Pod> {
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    pub async fn pods_on(&self, node: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .pods()
            .await
            .into_iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .map(|p| p.name_any())
            .collect();
        names.sort();
        names
    }

    pub async fn wait_running(&self, n: usize, timeout: Duration, controller: &Controller) {
        wait_for(&format!("{n} pods Running"), timeout, controller, || async {
            let pods = self.pods().await;
            let live: Vec<&Pod> = pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
            live.len() == n && live.iter().all(|p| is_running(p))
        })
        .await;
    }

    pub async fn claims(&self) -> Vec<NodeClaim> {
        self.claims_api().list(&self.pool_selector()).await.unwrap().items
    }

    /// Names of the pool's NodeClaims (those being deleted included), sorted. Journeys share the
    /// API server, so a claim of another journey's NodePool never counts here.
    pub async fn claim_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.claims().await.iter().map(|c| c.name_any()).collect();
        names.sort();
        names
    }

    /// CPU the pool's NodeClaims hold (launched capacity), in milli-cores.
    pub async fn claimed_cpu_millis(&self) -> i64 {
        self.claims()
            .await
            .iter()
            .filter_map(|c| c.status.as_ref()?.capacity.as_ref()?.get("cpu").cloned())
            .map(|q| karpenter::scheduling::resources::parse_quantity_for("cpu", &q).unwrap_or(0))
            .sum()
    }

    pub async fn nodes(&self) -> Vec<Node> {
        Api::<Node>::all(self.client.clone()).list(&self.pool_selector()).await.unwrap().items
    }

    pub async fn node_exists(&self, name: &str) -> bool {
        Api::<Node>::all(self.client.clone()).get_opt(name).await.unwrap().is_some()
    }

    /// Every column of `kubectl get nodeclaim -o wide` up to NODECLASS has a value.
    pub fn assert_wide_columns_filled(&self) {
        let out = Command::new("kubectl")
            .args(["get", "nodeclaim", "-o", "wide", "-l", &format!("karpenter.sh/nodepool={}", self.pool)])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            [
                "NAME",
                "TYPE",
                "CAPACITY",
                "ZONE",
                "NODE",
                "READY",
                "AGE",
                "IMAGEID",
                "ID",
                "NODEPOOL",
                "NODECLASS",
                "DRIFTED"
            ],
            "{text}"
        );
        for line in lines {
            let cols: Vec<&str> = line.split_whitespace().collect();
            assert!(cols.len() >= 11, "{text}");
            assert!(cols[..11].iter().all(|c| *c != "<none>"), "every column filled:\n{text}");
            assert_eq!(cols[5], "True", "{text}");
            assert_eq!(cols[9], self.pool, "{text}");
            assert_eq!(cols[10], self.class, "{text}");
        }
    }

    /// A pod of the fixture's namespace requesting `cpu`, optionally pinned to its pool.
    pub async fn create_pod(&self, name: &str, cpu: &str, pinned: bool) -> Pod {
        let mut spec = json!({
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"requests": {"cpu": cpu}}}]
        });
        if pinned {
            spec["nodeSelector"] = json!({"karpenter.sh/nodepool": self.pool});
        }
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": self.ns}, "spec": spec}))
                .unwrap();
        Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap()
    }

    pub async fn delete_pod(&self, name: &str) {
        let _ = Api::<Pod>::namespaced(self.client.clone(), &self.ns)
            .delete(name, &DeleteParams::default())
            .await;
    }

    /// Messages of the events with `reason` about the cluster-scoped `kind` `name` (a Node, a
    /// NodeClaim, a NodePool).
    pub async fn cluster_events(&self, kind: &str, name: &str, reason: &str) -> Vec<String> {
        self.events_about("default", kind, name, reason).await
    }

    /// The messages of the events with `reason` about the pod `name` of the fixture's namespace.
    pub async fn pod_events(&self, name: &str, reason: &str) -> Vec<String> {
        self.events_about(&self.ns, "Pod", name, reason).await
    }

    /// Patches the fixture's NodePool.
    pub async fn patch_pool(&self, patch: serde_json::Value) {
        Api::<NodePool>::all(self.client.clone())
            .patch(&self.pool, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    /// The messages of events with `reason` about the object `kind`/`name` of the fixture's
    /// namespace.
    pub async fn ns_events(&self, kind: &str, name: &str, reason: &str) -> Vec<String> {
        self.events_about(&self.ns, kind, name, reason).await
    }

    async fn events_about(&self, namespace: &str, kind: &str, name: &str, reason: &str) -> Vec<String> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let lp = ListParams::default()
            .fields(&format!("involvedObject.kind={kind},involvedObject.name={name},reason={reason}"));
        api.list(&lp)
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| e.message)
            .collect()
    }

    /// Waits for an event with `reason` about `pod` written by Karpenter; returns its message.
    pub async fn wait_event(
        &self,
        pod: &Pod,
        reason: &str,
        timeout: Duration,
        controller: &Controller,
    ) -> String {
        let name = pod.name_any();
        let deadline = Instant::now() + timeout;
        loop {
            let messages = self.events_about(&self.ns, "Pod", &name, reason).await;
            // The kube-scheduler writes FailedScheduling too ("0/3 nodes are available: ..", "no
            // nodes available to schedule pods"); Karpenter's start as upstream's do.
            let ours = |m: &String| reason != "FailedScheduling" || m.starts_with("Failed to schedule pod");
            if let Some(m) = messages.into_iter().find(ours) {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for a {reason} event on pod {name}\n{}",
                controller.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits for an event with `reason` about the node `name`.
    pub async fn wait_node_event(
        &self,
        name: &str,
        reason: &str,
        timeout: Duration,
        controller: &Controller,
    ) {
        wait_for(&format!("a {reason} event on node {name}"), timeout, controller, || async {
            !self.events_about("default", "Node", name, reason).await.is_empty()
        })
        .await;
    }

    pub async fn create_pdb(&self, max_unavailable: i32) {
        let pdb: PodDisruptionBudget = serde_json::from_value(json!({
            "metadata": {"name": "inflate", "namespace": self.ns},
            "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": "karpenter-inflate"}}}
        }))
        .unwrap();
        Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &pdb)
            .await
            .unwrap();
    }

    pub async fn delete_pdb(&self) {
        Api::<PodDisruptionBudget>::namespaced(self.client.clone(), &self.ns)
            .delete("inflate", &DeleteParams::default())
            .await
            .unwrap();
    }

    /// When the kube-scheduler first found each pod of the namespace unschedulable (its first
    /// `FailedScheduling` event), by pod name: the provisioner acts on no pod before that.
    pub async fn first_failed_scheduling(&self) -> BTreeMap<String, k8s_openapi::jiff::Timestamp> {
        self.first_pod_events("FailedScheduling").await
    }

    /// The pods of the namespace the control plane deleted for a `NoExecute` taint of their Node
    /// (`TaintManagerEviction` events), by name. The kube-controller-manager can still see a
    /// new Node's `karpenter.sh/unregistered` taint when the kube-scheduler, which saw it
    /// removed, binds a pod there; the pod's successor then needs room while it terminates.
    pub async fn taint_evictions(&self) -> BTreeMap<String, k8s_openapi::jiff::Timestamp> {
        self.first_pod_events("TaintManagerEviction").await
    }

    /// When each pod of the namespace first had an event of `reason`, by pod name.
    async fn first_pod_events(&self, reason: &str) -> BTreeMap<String, k8s_openapi::jiff::Timestamp> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), &self.ns);
        let mut first: BTreeMap<String, k8s_openapi::jiff::Timestamp> = BTreeMap::new();
        let params = ListParams::default().fields(&format!("reason={reason}"));
        for e in events.list(&params).await.unwrap().items {
            let at = e.event_time.map(|t| t.0).or(e.first_timestamp.map(|t| t.0));
            if let (Some(pod), Some(at)) = (e.involved_object.name, at) {
                let earliest = first.entry(pod).or_insert(at);
                *earliest = (*earliest).min(at);
            }
        }
        first
    }

    /// Waits until the namespace has no pods left.
    pub async fn wait_pods_gone(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.pods().await.is_empty() {
            assert!(Instant::now() < deadline, "the pods of {} gone", self.ns);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// `kubectl delete nodeclaim` of every claim of the pool.
    pub async fn delete_all_claims(&self) {
        let out = Command::new("kubectl")
            .args([
                "delete",
                "nodeclaim",
                "-l",
                &format!("karpenter.sh/nodepool={}", self.pool),
                "--wait=false",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    /// The last `n` lines about this journey's NodePool in the logs of the controllers this test
    /// process started, for failure messages.
    pub fn controller_lines(&self, n: usize) -> String {
        let dir = repo().join("target").join("e2e-logs");
        let mine = format!("-{}-", std::process::id());
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.file_name().is_some_and(|f| f.to_string_lossy().contains(&mine)))
            .collect();
        files.sort();
        let mut lines = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            lines.extend(text.lines().filter(|l| l.contains(&self.pool)).map(str::to_string));
        }
        let from = lines.len().saturating_sub(n);
        format!("--- controller log lines about {} ---\n{}", self.pool, lines[from..].join("\n"))
    }

    /// Deletes the journey's NodePool, EC2NodeClass and namespace and releases every finalizer of
    /// the claims and nodes left, after a failed cleanup.
    async fn remove_by_force(&self, claims: &[NodeClaim], nodes: &[Node]) {
        let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
        let params = PatchParams::default();
        let (claims_api, nodes_api) = (self.claims_api(), Api::<Node>::all(self.client.clone()));
        for c in claims {
            let _ = claims_api.patch(&c.name_any(), &params, &release).await;
            let _ = claims_api.delete(&c.name_any(), &DeleteParams::default()).await;
        }
        for n in nodes {
            let _ = nodes_api.patch(&n.name_any(), &params, &release).await;
            let _ = nodes_api.delete(&n.name_any(), &DeleteParams::default()).await;
        }
        let _ = Api::<NodePool>::all(self.client.clone()).delete(&self.pool, &DeleteParams::default()).await;
        let classes = Api::<EC2NodeClass>::all(self.client.clone());
        let _ = classes.patch(&self.class, &params, &release).await;
        let _ = classes.delete(&self.class, &DeleteParams::default()).await;
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.ns, &DeleteParams::default()).await;
    }

    /// Removes what the journey created; NodeClaims go through the controller, which must still
    /// be running.
    pub async fn cleanup(&self) {
        let _ = Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .delete("karpenter-inflate", &DeleteParams::default())
            .await;
        // Pods still running on a NodeClaim being deleted get new capacity (as upstream): the
        // workloads go first.
        self.wait_pods_gone(Duration::from_secs(120)).await;
        self.delete_all_claims().await;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (claims, nodes) = (self.claims().await, self.nodes().await);
            if claims.is_empty() && nodes.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let left = describe_left(&claims, &nodes);
                let lines = self.controller_lines(40);
                // What is left would otherwise act on the journeys that follow (another
                // journey's controller sees this pool too): it goes without its finalizers.
                self.remove_by_force(&claims, &nodes).await;
                panic!("NodeClaims and Nodes of {} removed; left:\n{left}\n{lines}", self.pool);
            }
            // A claim made after the deletion (the controller launched for a pod whose deletion
            // its cache had not seen yet, as upstream's may) is deleted too.
            if claims.iter().any(|c| c.metadata.deletion_timestamp.is_none()) {
                self.delete_all_claims().await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let _ = Api::<NodePool>::all(self.client.clone()).delete(&self.pool, &DeleteParams::default()).await;
        let classes = Api::<EC2NodeClass>::all(self.client.clone());
        let _ = classes.delete(&self.class, &DeleteParams::default()).await;
        let _ = Api::<Namespace>::all(self.client.clone()).delete(&self.ns, &DeleteParams::default()).await;
        // With the aws provider the class carries a finalizer the controller removes once it has
        // cleaned up after the class: the controller must not stop before.
        let deadline = Instant::now() + Duration::from_secs(60);
        while classes.get_opt(&self.class).await.unwrap().is_some() {
            assert!(Instant::now() < deadline, "EC2NodeClass {} removed (finalizer released)", self.class);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until the fixture's EC2NodeClass reports `Ready=True`.
    pub async fn wait_class_ready(&self, timeout: Duration, controller: &Controller) {
        let api = Api::<EC2NodeClass>::all(self.client.clone());
        wait_for(&format!("EC2NodeClass {} Ready", self.class), timeout, controller, || async {
            let class = api.get(&self.class).await.unwrap();
            class.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Ready" && serde_json::to_value(c.status).unwrap().as_str() == Some("True")
                })
            })
        })
        .await;
    }
}

/// A Helm release of charts/karpenter, uninstalled on drop.
pub struct HelmRelease {
    name: String,
    namespace: String,
}

impl HelmRelease {
    pub fn install(name: &str, namespace: &str, args: &[&str]) -> Self {
        let out = Command::new("helm")
            .args(["upgrade", "--install", name])
            .arg(repo().join("charts").join("karpenter"))
            .args(["--namespace", namespace, "--skip-crds"])
            .args(args)
            .output()
            .expect("helm on PATH (eval \"$(make -s cluster-up)\")");
        assert!(out.status.success(), "helm install: {}", String::from_utf8_lossy(&out.stderr));
        HelmRelease { name: name.to_string(), namespace: namespace.to_string() }
    }
}

impl Drop for HelmRelease {
    fn drop(&mut self) {
        let _ = Command::new("helm").args(["uninstall", &self.name, "--namespace", &self.namespace]).output();
    }
}

/// A kubeconfig for the ServiceAccount `name` in `namespace`: the current cluster's server and
/// CA, and a token from the TokenRequest API (`kubectl create token`).
pub fn service_account_kubeconfig(name: &str, namespace: &str) -> PathBuf {
    let out = Command::new("kubectl")
        .args(["create", "token", name, "-n", namespace, "--duration", "2h"])
        .output()
        .unwrap();
    assert!(out.status.success(), "kubectl create token: {}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let out =
        Command::new("kubectl").args(["config", "view", "--raw", "--minify", "-o", "json"]).output().unwrap();
    let current: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cluster = current["clusters"][0]["cluster"].clone();
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": name}}],
        "current-context": "sa",
    });
    let dir = repo().join("target").join("e2e-logs");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("kubeconfig-{name}"));
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    path
}

/// Where the AWS emulator answers and how to sign for it: the environment `hack/cluster-up.sh`
/// exports, else the emulator's defaults. Also the `CLUSTER_NAME` the aws provider needs.
pub fn aws_env() -> Vec<(String, String)> {
    let var = |name: &str, default: String| (name.to_string(), std::env::var(name).unwrap_or(default));
    let port = std::env::var("MOTO_PORT").unwrap_or_else(|_| "14566".into());
    vec![
        var("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")),
        var("AWS_REGION", "us-west-2".into()),
        var("AWS_ACCESS_KEY_ID", "testing".into()),
        var("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("CLUSTER_NAME".to_string(), cluster_name()),
    ]
}

/// The value of `name` in [`aws_env`].
pub fn aws_var(name: &str) -> String {
    aws_env().into_iter().find(|(k, _)| k == name).map(|(_, v)| v).unwrap_or_default()
}

/// POSTs `body` as JSON to the plain-HTTP `url` (`http://host:port/path`); returns the status
/// code and the body of the answer.
pub async fn http_post_json(url: &str, body: &serde_json::Value) -> (u16, String) {
    http_request("POST", url, Some(body)).await
}

/// A `method` request to the plain-HTTP `url` (`http://host:port/path`), with `body` as JSON if
/// given; returns the status code and the body of the answer.
pub async fn http_request(method: &str, url: &str, body: Option<&serde_json::Value>) -> (u16, String) {
    let rest = url.strip_prefix("http://").expect("a plain http:// url");
    let (authority, path) =
        rest.split_once('/').map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let content_type = if body.is_empty() { "" } else { "Content-Type: application/json\r\n" };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {authority}\r\n{content_type}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let authority = authority.to_string();
    let answer = tokio::task::spawn_blocking(move || {
        let mut stream = std::net::TcpStream::connect(authority.as_str()).unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap();
    let status = answer.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// [`aws_env`] in the shape [`Controller::start`] takes, with `AWS_ENDPOINT_URL` replaced by
/// `endpoint` when given.
pub fn aws_controller_env(endpoint: Option<&str>) -> Vec<(String, String)> {
    aws_env()
        .into_iter()
        .map(|(k, v)| match endpoint {
            Some(e) if k == "AWS_ENDPOINT_URL" => (k, e.to_string()),
            _ => (k, v),
        })
        .collect()
}

/// Borrows an owned environment as the `&[(&str, &str)]` of [`Controller::start`].
pub fn env_refs(env: &[(String, String)]) -> Vec<(&str, &str)> {
    env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

/// An EC2 instance as the journeys look at it.
#[derive(Clone, Debug)]
pub struct Ec2Instance {
    pub id: String,
    pub state: String,
    pub image_id: String,
    /// The `karpenter.sh/nodeclaim` tag.
    pub claim: Option<String>,
    /// The `Name` tag.
    pub name: Option<String>,
}

impl Ec2Instance {
    pub fn is_live(&self) -> bool {
        !matches!(self.state.as_str(), "terminated" | "shutting-down")
    }
}

/// An SQS client for the emulator.
pub async fn sqs() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&emulator_config().await)
}

async fn emulator_config() -> aws_config::SdkConfig {
    karpenter::cloudprovider::aws::config_loader()
        .endpoint_url(aws_var("AWS_ENDPOINT_URL"))
        .region(aws_config::Region::new(aws_var("AWS_REGION")))
        .credentials_provider(aws_sdk_ec2::config::Credentials::new(
            aws_var("AWS_ACCESS_KEY_ID"),
            aws_var("AWS_SECRET_ACCESS_KEY"),
            None,
            None,
            "e2e",
        ))
        .load()
        .await
}

/// An EC2 client for the emulator.
pub async fn ec2() -> aws_sdk_ec2::Client {
    aws_sdk_ec2::Client::new(&emulator_config().await)
}

/// Every instance (in any state) of the cluster tagged for `pool`.
fn tag(instance: &aws_sdk_ec2::types::Instance, key: &str) -> Option<String> {
    instance.tags().iter().find(|t| t.key() == Some(key)).and_then(|t| t.value()).map(str::to_string)
}

pub async fn pool_instances(ec2: &aws_sdk_ec2::Client, pool: &str) -> Vec<Ec2Instance> {
    use aws_sdk_ec2::types::Filter;
    let out = ec2
        .describe_instances()
        .filters(
            Filter::builder()
                .name(format!("tag:kubernetes.io/cluster/{}", cluster_name()))
                .values("owned")
                .build(),
        )
        .filters(Filter::builder().name("tag:karpenter.sh/nodepool").values(pool).build())
        .send()
        .await
        .unwrap();
    out.reservations()
        .iter()
        .flat_map(|r| r.instances())
        .map(|i| Ec2Instance {
            id: i.instance_id().unwrap_or_default().to_string(),
            state: i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default(),
            image_id: i.image_id().unwrap_or_default().to_string(),
            claim: tag(i, "karpenter.sh/nodeclaim"),
            name: tag(i, "Name"),
        })
        .collect()
}

/// Names of the launch templates Karpenter made for the EC2NodeClass `class` of this cluster.
pub async fn launch_templates_of(ec2: &aws_sdk_ec2::Client, class: &str) -> Vec<String> {
    use aws_sdk_ec2::types::Filter;
    let out = ec2
        .describe_launch_templates()
        .filters(Filter::builder().name("tag:karpenter.k8s.aws/cluster").values(cluster_name()).build())
        .filters(Filter::builder().name("tag:karpenter.k8s.aws/ec2nodeclass").values(class).build())
        .send()
        .await
        .unwrap();
    out.launch_templates().iter().filter_map(|t| t.launch_template_name()).map(str::to_string).collect()
}

/// The kubelet stand-in (`hack/standin-up.sh`): a Node for every running emulator instance of the
/// cluster. Stopped on drop, unless it was running already.
pub struct Standin {
    started: bool,
}

impl Standin {
    pub fn start() -> Self {
        let out = Command::new(repo().join("hack/standin-up.sh"))
            .args(["--interval", "0.5"])
            .envs(aws_env())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "hack/standin-up.sh:\n{stderr}");
        Standin { started: !stderr.contains("already running") }
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        if self.started {
            let _ = Command::new(repo().join("hack/standin-down.sh")).envs(aws_env()).output();
        }
    }
}

/// A TCP relay in front of the AWS emulator that crashes the controller at the worst moment of
/// a launch: once armed with the controller's pid, the answer to the next CreateFleet request
/// that passes through (a dry run's aside) is held back, the controller is killed with SIGKILL and the answer is
/// dropped. The instance exists in EC2, but the controller never learned its id and wrote
/// nothing to the NodeClaim.
pub struct CreateFleetTrap {
    pub url: String,
    pid: std::sync::Arc<std::sync::atomic::AtomicU32>,
    fired: std::sync::Arc<std::sync::atomic::AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

impl CreateFleetTrap {
    /// Starts the relay in front of `upstream` (an `http://host:port` URL).
    pub async fn start(upstream: &str) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::AtomicU32;
        let upstream = upstream.trim_start_matches("http://").trim_end_matches('/').to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let pid = Arc::new(AtomicU32::new(0));
        let fired = Arc::new(AtomicU32::new(0));
        let (pid2, fired2) = (pid.clone(), fired.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { continue };
                tokio::spawn(relay(client, server, pid2.clone(), fired2.clone()));
            }
        });
        CreateFleetTrap { url, pid, fired, task }
    }

    /// Kills `pid` at the next CreateFleet answer.
    pub fn arm(&self, pid: u32) {
        self.pid.store(pid, Ordering::SeqCst);
    }

    /// The pid killed so far (0: none yet).
    pub fn fired(&self) -> u32 {
        self.fired.load(Ordering::SeqCst)
    }

    /// Waits until the trap has fired on `pid`.
    pub async fn wait_fired(&self, pid: u32, timeout: Duration, controller: &Controller) {
        wait_for("the controller killed at a CreateFleet answer", timeout, controller, || async {
            self.fired() == pid
        })
        .await;
    }
}

impl Drop for CreateFleetTrap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relays one connection; see [`CreateFleetTrap`]. HTTP/1.1 answers come in the order of the
/// requests, so the first bytes upstream sends after a CreateFleet request are its answer.
async fn relay(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    pid: std::sync::Arc<std::sync::atomic::AtomicU32>,
    fired: std::sync::Arc<std::sync::atomic::AtomicU32>,
) {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const NEEDLE: &[u8] = b"Action=CreateFleet";
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let create_fleet = Arc::new(AtomicBool::new(false));
    let seen = create_fleet.clone();
    let upstream = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        // The end of the previous read, so that a needle split across reads is found too.
        let mut tail: Vec<u8> = Vec::new();
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            tail.extend_from_slice(&buf[..n]);
            if tail.windows(NEEDLE.len()).any(|w| w == NEEDLE) {
                seen.store(true, Ordering::SeqCst);
            }
            let keep = tail.len().saturating_sub(NEEDLE.len());
            tail.drain(..keep);
            if server_tx.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_tx.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match server_rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        // The answer to a dry run (an EC2NodeClass's validation) launched nothing: let it pass.
        // EC2 answers one with 412 (DryRunOperation), and the status line comes first.
        let dry_run = buf[..n].starts_with(b"HTTP/1.1 412");
        if create_fleet.swap(false, Ordering::SeqCst) && !dry_run {
            let target = pid.swap(0, Ordering::SeqCst);
            if target != 0 {
                let status = Command::new("kill").args(["-KILL", &target.to_string()]).status().unwrap();
                assert!(status.success(), "kill -KILL {target}");
                fired.store(target, Ordering::SeqCst);
                break;
            }
        }
        if client_tx.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    upstream.abort();
}

/// The families a `/metrics` text serves (its `# TYPE` lines), counters also under their `_total`
/// name, as upstream's reference names them.
pub fn served_families(text: &str) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for line in text.lines() {
        let mut words = line.strip_prefix("# TYPE ").unwrap_or_default().split_whitespace();
        if let (Some(name), Some(kind)) = (words.next(), words.next()) {
            if kind == "counter" {
                out.insert(format!("{name}_total"));
            }
            out.insert(name.to_string());
        }
    }
    out
}

/// The sum of the samples of `series` (a metric name as it appears in samples, `_count` or
/// `_total` included) in a `/metrics` text.
pub fn sample_sum(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(series).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What is left of NodeClaims and Nodes: deletion, finalizers, taints and true conditions.
fn describe_left(claims: &[NodeClaim], nodes: &[Node]) -> String {
    let mut out = Vec::new();
    for c in claims {
        let conditions: Vec<String> = c
            .status
            .iter()
            .flat_map(|s| s.conditions.iter())
            .filter(|c| c.status == karpenter::apis::common::ConditionStatus::True)
            .map(|c| c.type_.clone())
            .collect();
        out.push(format!(
            "nodeclaim {}: deleting {:?}, finalizers {:?}, provider {:?}, true {:?}",
            c.name_any(),
            c.metadata.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
            c.finalizers(),
            c.status.as_ref().and_then(|s| s.provider_id.clone()),
            conditions
        ));
    }
    for n in nodes {
        let taints: Vec<String> =
            n.spec.iter().flat_map(|s| s.taints.iter().flatten()).map(|t| t.key.clone()).collect();
        out.push(format!(
            "node {}: deleting {:?}, finalizers {:?}, taints {:?}",
            n.name_any(),
            n.metadata.deletion_timestamp.as_ref().map(|t| t.0.to_string()),
            n.finalizers(),
            taints
        ));
    }
    out.join("\n")
}
