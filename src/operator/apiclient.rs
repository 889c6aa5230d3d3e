//! The Kubernetes client the controller uses: kube's default stack plus client-side limits.
//!
//! Like client-go's, requests are rate limited by a token bucket of `KUBE_CLIENT_QPS` tokens a
//! second holding up to `KUBE_CLIENT_BURST` (0 QPS turns the limit off). On top of that, at most
//! [`MAX_IN_FLIGHT`] requests other than watches are outstanding at once; the rest wait their
//! turn. The API server speaks HTTP/1.1 to this client, so every concurrent request holds a
//! connection of its own, with its TLS state and buffers: a burst of a thousand evictions or
//! events would otherwise open a thousand connections and keep them in the pool. Long-running
//! watches take a token but no in-flight slot.
//!
//! Every request is counted by method and answer code (`rest_client_requests_total` and
//! `client_go_request_total`), and timed by what it asked for
//! (`client_go_request_duration_seconds`), as upstream's client-go metrics do.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request, Response};
use http_body::{Body as HttpBody, Frame, SizeHint};
use kube::client::{Body, ClientBuilder};
use kube::{Client, Config};
use std::time::Instant;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::buffer::Buffer;
use tower::{BoxError, Layer, Service, ServiceExt};

use crate::metrics::{Labels, Metrics};
pub use crate::util::MAX_IN_FLIGHT;
use crate::util::bucket::TokenBucket;

/// Queue length of the buffer in front of kube's service stack.
const BUFFER: usize = 1024;

/// The configuration of the kubeconfig or in-cluster service account.
pub async fn config() -> Result<Config, kube::Error> {
    Config::infer().await.map_err(kube::Error::InferConfig)
}

/// A client for the cluster of `config`, with the limits of `qps`, `burst` and
/// [`MAX_IN_FLIGHT`].
pub fn limited(config: Config, qps: u32, burst: u32) -> Result<Client, kube::Error> {
    counted(config, qps, burst, None)
}

/// [`limited`], recording every request in `metrics`: counted by method and answer code in
/// `rest_client_requests_total` and `client_go_request_total` (a request that got no answer
/// counts as `<error>`), and timed in `client_go_request_duration_seconds` by the verb, group,
/// version, resource and subresource it asked for (requests outside `/api` and `/apis` are not
/// timed).
pub fn counted(
    config: Config,
    qps: u32,
    burst: u32,
    metrics: Option<Arc<Metrics>>,
) -> Result<Client, kube::Error> {
    let layer = LimitLayer::new(qps, burst, MAX_IN_FLIGHT).with_metrics(metrics);
    Ok(ClientBuilder::try_from(config)?.with_layer(&layer).build())
}

/// The labels of `client_go_request_duration_seconds` for a request of `method` to `path` (the
/// URI's path, without its query), derived from the path the way upstream's operatorpkg derives
/// them from client-go's templated URL; `None` for paths outside `/api` and `/apis` and for
/// those too short to name a resource (discovery).
///
/// `/api/<version>/...` is the core group (`""`), `/apis/<group>/<version>/...` a named one.
/// After the version comes an optional `namespaces/<namespace>/` prefix (only when something
/// follows it: `/api/v1/namespaces/<name>` is the namespace `<name>` itself), then
/// `<resource>[/<name>[/<subresource>]]`: `kind` is the resource's plural and `subresource` the
/// subresource when there is one, else empty. The verb is `CREATE` for a POST, `LIST` for a GET
/// without name (watches included) and `GET` with one, `CREATE` for a PUT without name and
/// `UPDATE` with one, and the method itself otherwise (`PATCH`, `DELETE`).
fn request_labels(method: &Method, path: &str) -> Option<Labels> {
    let parts: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    let (group, version_at) = match *parts.first()? {
        "api" => ("", 1),
        "apis" => (*parts.get(1)?, 2),
        _ => return None,
    };
    let version = *parts.get(version_at)?;
    let rest = parts.get(version_at + 1..)?;
    // A namespace prefix only when a resource follows it, as upstream's parser has it.
    let resource = match rest {
        ["namespaces", _, resource @ ..] if !resource.is_empty() => resource,
        _ => rest,
    };
    let kind = *resource.first().filter(|kind| !kind.is_empty())?;
    let subresource = match resource {
        [_, _, subresource] => *subresource,
        _ => "",
    };
    let named = resource.len() >= 2;
    let verb = if *method == Method::POST {
        "CREATE".to_string()
    } else if *method == Method::GET {
        (if named { "GET" } else { "LIST" }).to_string()
    } else if *method == Method::PUT {
        (if named { "UPDATE" } else { "CREATE" }).to_string()
    } else {
        method.as_str().to_ascii_uppercase()
    };
    Some(vec![
        ("verb", verb),
        ("group", group.to_string()),
        ("version", version.to_string()),
        ("kind", kind.to_string()),
        ("subresource", subresource.to_string()),
    ])
}

/// Records one request of `method` in `metrics`: its answer code (or `<error>` without an
/// answer) in both request counters, and its latency `elapsed` under `labels` when the request
/// has them.
fn record<B, E>(
    metrics: &Metrics,
    method: &Method,
    labels: Option<Labels>,
    response: &Result<Response<B>, E>,
    elapsed: Duration,
) {
    let code = match response {
        Ok(r) => r.status().as_u16().to_string(),
        Err(_) => "<error>".to_string(),
    };
    let result: Labels = vec![("code", code), ("method", method.as_str().to_string())];
    metrics.rest_client_requests.get_or_create(&result).inc();
    metrics.client_go_requests.get_or_create(&result).inc();
    if let Some(labels) = labels {
        crate::metrics::observe(&metrics.client_go_request_duration, labels, elapsed);
    }
}

/// The CA bundle the client trusts for the API server (from the kubeconfig or the in-cluster
/// service account), base64-encoded as `CLUSTER_CA_BUNDLE` takes it: the CA file's own bytes, as
/// upstream encodes them (the EC2NodeClass hash includes it, so the same bytes give the same hash
/// as upstream's), else the certificates the client parsed, in PEM. `None` when the configuration
/// names no CA of its own.
pub async fn cluster_ca_bundle() -> Option<String> {
    use base64::Engine;
    if let Some(raw) = raw_cluster_ca() {
        return Some(base64::engine::general_purpose::STANDARD.encode(raw));
    }
    let config = Config::infer().await.ok()?;
    ca_bundle(config.root_cert.as_deref()?)
}

/// Where a pod's service account CA is mounted.
const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// The bytes of the CA the client trusts, as configured: the kubeconfig's current cluster
/// (`certificate-authority-data` decoded, or the `certificate-authority` file), else in a pod the
/// service account's CA file.
fn raw_cluster_ca() -> Option<Vec<u8>> {
    use base64::Engine;
    if let Ok(kubeconfig) = kube::config::Kubeconfig::read() {
        let current = kubeconfig.current_context.as_deref()?;
        let context = kubeconfig.contexts.iter().find(|c| c.name == current)?.context.as_ref()?;
        let cluster = kubeconfig.clusters.iter().find(|c| c.name == context.cluster)?.cluster.as_ref()?;
        if let Some(data) = cluster.certificate_authority_data.as_deref() {
            return base64::engine::general_purpose::STANDARD.decode(data.trim()).ok();
        }
        return std::fs::read(cluster.certificate_authority.as_deref()?).ok();
    }
    std::env::var_os("KUBERNETES_SERVICE_HOST").and_then(|_| std::fs::read(SERVICE_ACCOUNT_CA).ok())
}

/// Base64 of the PEM encoding of DER certificates.
pub fn ca_bundle(certificates: &[Vec<u8>]) -> Option<String> {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    if certificates.is_empty() {
        return None;
    }
    let mut pem = String::new();
    for der in certificates {
        pem.push_str("-----BEGIN CERTIFICATE-----\n");
        let body = STANDARD.encode(der);
        for line in body.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END CERTIFICATE-----\n");
    }
    Some(STANDARD.encode(pem))
}

/// Whether a request is a watch (`?watch=true`), which may stay open for minutes.
fn is_watch<B>(req: &Request<B>) -> bool {
    req.uri().query().is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

/// Adds the limits, and the request metrics when it has them, to a service stack.
#[derive(Clone, Debug)]
pub struct LimitLayer {
    bucket: Arc<TokenBucket>,
    in_flight: Arc<Semaphore>,
    metrics: Option<Arc<Metrics>>,
}

impl LimitLayer {
    /// `qps` and `burst` for the token bucket; at most `max_in_flight` requests besides watches.
    pub fn new(qps: u32, burst: u32, max_in_flight: usize) -> Self {
        LimitLayer {
            bucket: Arc::new(TokenBucket::new(qps, burst)),
            in_flight: Arc::new(Semaphore::new(max_in_flight.max(1))),
            metrics: None,
        }
    }

    /// This layer, recording every request in `metrics` (nothing with `None`).
    pub fn with_metrics(mut self, metrics: Option<Arc<Metrics>>) -> Self {
        self.metrics = metrics;
        self
    }
}

impl<S, B> Layer<S> for LimitLayer
where
    S: Service<Request<Body>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send + Sync,
    B: 'static,
{
    type Service = LimitService<S::Future>;

    fn layer(&self, inner: S) -> Self::Service {
        LimitService {
            // The waiting happens in each request's own future, so that a request waiting for a
            // slot never holds up a watch behind it; the buffer lets those futures share `inner`.
            inner: Buffer::new(inner, BUFFER),
            bucket: self.bucket.clone(),
            in_flight: self.in_flight.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The service [`LimitLayer`] makes; its clones share the limits.
pub struct LimitService<F> {
    inner: Buffer<Request<Body>, F>,
    bucket: Arc<TokenBucket>,
    in_flight: Arc<Semaphore>,
    metrics: Option<Arc<Metrics>>,
}

impl<F: Send + 'static> Clone for LimitService<F> {
    fn clone(&self) -> Self {
        LimitService {
            inner: self.inner.clone(),
            bucket: self.bucket.clone(),
            in_flight: self.in_flight.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<F, B, E> Service<Request<Body>> for LimitService<F>
where
    F: std::future::Future<Output = Result<Response<B>, E>> + Send + 'static,
    E: Into<BoxError> + Send + Sync,
    B: Send + 'static,
{
    type Response = Response<PermitBody<B>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let inner = self.inner.clone();
        let bucket = self.bucket.clone();
        let in_flight = self.in_flight.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move {
            // As client-go's, the latency includes the wait for the rate limit (and here for an
            // in-flight slot), and ends with the response's headers (or the error).
            let start = Instant::now();
            bucket.acquire().await;
            let permit = if is_watch(&req) { None } else { Some(in_flight.acquire_owned().await?) };
            let method = req.method().clone();
            let labels = metrics.as_ref().and_then(|_| request_labels(&method, req.uri().path()));
            let response = inner.oneshot(req).await;
            if let Some(metrics) = &metrics {
                record(metrics, &method, labels, &response, start.elapsed());
            }
            Ok(response?.map(|body| PermitBody { body, permit }))
        })
    }
}

/// A response body that keeps its request's in-flight slot until it has been read or dropped.
pub struct PermitBody<B> {
    body: B,
    permit: Option<OwnedSemaphorePermit>,
}

impl<B> HttpBody for PermitBody<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.permit = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_bundles_are_base64_pem() {
        use base64::Engine;
        assert_eq!(ca_bundle(&[]), None);
        let der = vec![0x30u8; 100];
        let bundle = ca_bundle(&[der.clone(), vec![1, 2, 3]]).unwrap();
        let pem =
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(bundle).unwrap()).unwrap();
        let lines: Vec<&str> = pem.lines().collect();
        assert_eq!(lines[0], "-----BEGIN CERTIFICATE-----");
        assert_eq!(lines[1].len(), 64, "wrapped at 64 characters");
        assert_eq!(base64::engine::general_purpose::STANDARD.decode(lines[1..4].concat()).unwrap(), der);
        assert_eq!(lines[4], "-----END CERTIFICATE-----");
        assert_eq!(lines[5..], ["-----BEGIN CERTIFICATE-----", "AQID", "-----END CERTIFICATE-----"]);
    }

    #[test]
    fn watches_are_told_apart() {
        let req = |uri: &str| Request::get(uri).body(()).unwrap();
        assert!(is_watch(&req("/api/v1/pods?&watch=true&timeoutSeconds=290&resourceVersion=0")));
        assert!(is_watch(&req("/api/v1/namespaces/a/pods?watch=1")));
        assert!(!is_watch(&req("/api/v1/pods?labelSelector=watch%3Dtrue")));
        assert!(!is_watch(&req("/api/v1/pods")));
        assert!(!is_watch(&req("/api/v1/namespaces/watch/pods/watch")));
    }

    /// The labels of `client_go_request_duration_seconds`, in order.
    fn timed(verb: &str, group: &str, version: &str, kind: &str, subresource: &str) -> Labels {
        vec![
            ("verb", verb.to_string()),
            ("group", group.to_string()),
            ("version", version.to_string()),
            ("kind", kind.to_string()),
            ("subresource", subresource.to_string()),
        ]
    }

    #[test]
    fn request_labels_follow_client_go_url_templates() {
        let labels = |method: Method, uri: &str| {
            let uri: http::Uri = uri.parse().unwrap();
            request_labels(&method, uri.path())
        };
        // Core group, namespaced list.
        assert_eq!(
            labels(Method::GET, "/api/v1/namespaces/ns/pods?labelSelector=a%3Db"),
            Some(timed("LIST", "", "v1", "pods", ""))
        );
        // Cluster-scoped get.
        assert_eq!(labels(Method::GET, "/api/v1/nodes/n"), Some(timed("GET", "", "v1", "nodes", "")));
        // Named group, status subresource.
        assert_eq!(
            labels(Method::PATCH, "/apis/karpenter.sh/v1/nodeclaims/x/status"),
            Some(timed("PATCH", "karpenter.sh", "v1", "nodeclaims", "status"))
        );
        // Eviction: a create of a pod's subresource.
        assert_eq!(
            labels(Method::POST, "/api/v1/namespaces/ns/pods/p/eviction"),
            Some(timed("CREATE", "", "v1", "pods", "eviction"))
        );
        // A watch is a list; its query is not part of the path.
        assert_eq!(
            labels(Method::GET, "/apis/karpenter.sh/v1/nodepools?watch=true&resourceVersion=1"),
            Some(timed("LIST", "karpenter.sh", "v1", "nodepools", ""))
        );
        // A namespace itself, by name.
        assert_eq!(
            labels(Method::GET, "/api/v1/namespaces/kube-system"),
            Some(timed("GET", "", "v1", "namespaces", ""))
        );
        assert_eq!(
            labels(Method::GET, "/api/v1/namespaces"),
            Some(timed("LIST", "", "v1", "namespaces", ""))
        );
        // PUT: an update with a name, a create without.
        assert_eq!(
            labels(Method::PUT, "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/l"),
            Some(timed("UPDATE", "coordination.k8s.io", "v1", "leases", ""))
        );
        assert_eq!(
            labels(Method::PUT, "/api/v1/namespaces/ns/pods"),
            Some(timed("CREATE", "", "v1", "pods", ""))
        );
        // Other methods as they are, collections included.
        assert_eq!(
            labels(Method::DELETE, "/apis/karpenter.sh/v1/nodeclaims/x"),
            Some(timed("DELETE", "karpenter.sh", "v1", "nodeclaims", ""))
        );
        assert_eq!(
            labels(Method::DELETE, "/api/v1/namespaces/ns/pods"),
            Some(timed("DELETE", "", "v1", "pods", ""))
        );
        assert_eq!(
            labels(Method::POST, "/apis/events.k8s.io/v1/namespaces/ns/events"),
            Some(timed("CREATE", "events.k8s.io", "v1", "events", ""))
        );
        // Outside the API, or too short to name a resource (discovery): not timed.
        let untimed = [
            "/version",
            "/healthz",
            "/openapi/v2",
            "/",
            "",
            "/api",
            "/api/v1",
            "/apis",
            "/apis/karpenter.sh",
            "/apis/karpenter.sh/v1",
        ];
        for path in untimed {
            assert_eq!(request_labels(&Method::GET, path), None, "{path}");
        }
    }

    #[tokio::test]
    async fn requests_are_counted_and_timed() {
        let mut registry = prometheus_client::registry::Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry));
        // Evictions are refused after 20 ms; `/version` gets no answer.
        let api = tower::service_fn(|req: Request<Body>| {
            let path = req.uri().path().to_string();
            async move {
                if path == "/version" {
                    return Err(BoxError::from("connection refused"));
                }
                let status: u16 = if path.ends_with("/eviction") {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    429
                } else {
                    200
                };
                Ok(Response::builder().status(status).body(http_body_util::Full::new(Bytes::new())).unwrap())
            }
        });
        let service = LimitLayer::new(0, 0, 4).with_metrics(Some(metrics.clone())).layer(api);
        let send = |method: Method, uri: &str| {
            let request = Request::builder().method(method).uri(uri).body(Body::empty()).unwrap();
            service.clone().oneshot(request)
        };
        assert!(send(Method::GET, "/api/v1/namespaces/ns/pods").await.is_ok());
        assert!(send(Method::GET, "/apis/karpenter.sh/v1/nodepools?watch=true").await.is_ok());
        let refused = send(Method::POST, "/api/v1/namespaces/ns/pods/p/eviction").await.unwrap();
        assert_eq!(refused.status(), 429);
        assert!(send(Method::GET, "/version").await.is_err());

        let counted = |family: &crate::metrics::CounterFamily, code: &str, method: &str| {
            family.get(&vec![("code", code.to_string()), ("method", method.to_string())]).map(|c| c.get())
        };
        for family in [&metrics.client_go_requests, &metrics.rest_client_requests] {
            assert_eq!(counted(family, "200", "GET"), Some(2));
            assert_eq!(counted(family, "429", "POST"), Some(1));
            assert_eq!(counted(family, "<error>", "GET"), Some(1));
        }
        // Histograms have no public readers: read the encoded series.
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let observed = |labels: Labels, suffix: &str| -> Option<f64> {
            let set: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            let prefix = format!("client_go_request_duration_seconds_{suffix}{{{}}} ", set.join(","));
            text.lines().find_map(|l| l.strip_prefix(prefix.as_str())?.parse().ok())
        };
        assert_eq!(observed(timed("LIST", "", "v1", "pods", ""), "count"), Some(1.0));
        assert_eq!(observed(timed("LIST", "karpenter.sh", "v1", "nodepools", ""), "count"), Some(1.0));
        assert_eq!(observed(timed("CREATE", "", "v1", "pods", "eviction"), "count"), Some(1.0));
        let seconds = observed(timed("CREATE", "", "v1", "pods", "eviction"), "sum").unwrap();
        assert!(seconds >= 0.02, "{seconds}");
        // `/version` is counted but not timed: three series in all.
        let series =
            text.lines().filter(|l| l.starts_with("client_go_request_duration_seconds_count{")).count();
        assert_eq!(series, 3, "{text}");
    }

    /// A service that answers after a while, counting how many requests are open at once.
    #[derive(Clone)]
    struct Slow {
        open: Arc<std::sync::atomic::AtomicUsize>,
        peak: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Service<Request<Body>> for Slow {
        type Response = Response<http_body_util::Full<Bytes>>;
        type Error = BoxError;
        type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: Request<Body>) -> Self::Future {
            use std::sync::atomic::Ordering::SeqCst;
            let (open, peak) = (self.open.clone(), self.peak.clone());
            let watch = is_watch(&req);
            Box::pin(async move {
                let now = open.fetch_add(1, SeqCst) + 1;
                peak.fetch_max(now, SeqCst);
                // Watches stay open far longer than anything else.
                tokio::time::sleep(Duration::from_millis(if watch { 60_000 } else { 100 })).await;
                open.fetch_sub(1, SeqCst);
                Ok(Response::new(http_body_util::Full::new(Bytes::from_static(b"{}"))))
            })
        }
    }

    // Real time: only bounds that cannot depend on the machine's speed are asserted.
    #[tokio::test]
    async fn at_most_the_limit_is_in_flight_and_watches_do_not_count() {
        use std::sync::atomic::Ordering::SeqCst;
        let slow = Slow { open: Default::default(), peak: Default::default() };
        let layer = LimitLayer::new(0, 0, 4);
        let service = layer.layer(slow.clone());
        let mut calls = Vec::new();
        // Three watches first: they must not use up the slots.
        for _ in 0..3 {
            let mut s = service.clone();
            calls.push(tokio::spawn(async move {
                s.call(Request::get("/api/v1/pods?watch=true").body(Body::empty()).unwrap()).await.map(|_| ())
            }));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let start = Instant::now();
        let mut requests = Vec::new();
        for i in 0..20 {
            let mut s = service.clone();
            requests.push(tokio::spawn(async move {
                let response =
                    s.call(Request::get(format!("/api/v1/pods/p{i}")).body(Body::empty()).unwrap()).await?;
                // Reading the body releases the slot.
                http_body_util::BodyExt::collect(response.into_body())
                    .await
                    .map(|_| ())
                    .map_err(BoxError::from)
            }));
        }
        for r in requests {
            r.await.unwrap().unwrap();
        }
        // 20 requests of 100 ms, never more than four at a time besides the three watches.
        assert!(start.elapsed() >= Duration::from_millis(500), "{:?}", start.elapsed());
        let peak = slow.peak.load(SeqCst);
        assert!((3 + 2..=3 + 4).contains(&peak), "{peak} open at once");
        for c in calls {
            c.abort();
        }
    }
}
