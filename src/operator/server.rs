//! The operator's HTTP endpoints: `/healthz` and `/readyz` on the health-probe port, `/metrics`
//! (Prometheus text format) on the metrics port.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

use flate2::Compression;
use flate2::write::GzEncoder;

use crate::disruption::record::Decisions;
use crate::metrics::summary::Summaries;

/// Errors of the HTTP endpoints.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The port could not be bound.
    #[error("binding {addr}")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving on {addr}")]
    Serve {
        /// Address served.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Readiness shared between the controllers (which set it after their caches sync) and
/// `/readyz`.
#[derive(Clone, Default, Debug)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the operator ready (or not).
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Whether the operator is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Routes of the health-probe port.
pub fn health_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(readiness)
}

async fn readyz(State(readiness): State<Readiness>) -> impl IntoResponse {
    if readiness.get() { (StatusCode::OK, "ok") } else { (StatusCode::SERVICE_UNAVAILABLE, "not ready") }
}

/// Routes of the metrics port: `/metrics` (`registry`, then the `summaries`), and `/disruption`,
/// the disruption controller's latest decision about each node as JSON.
pub fn metrics_router(registry: Arc<Registry>, summaries: Arc<Summaries>, decisions: Decisions) -> Router {
    let exposition = Arc::new(Exposition { registry, summaries, last_len: AtomicUsize::new(0) });
    Router::new()
        .route(
            "/disruption",
            get(move || {
                let body = decisions.json();
                async move { ([(header::CONTENT_TYPE, "application/json")], body) }
            }),
        )
        .route("/metrics", get(metrics))
        .with_state(exposition)
}

/// What `/metrics` serves, and the length of its last plain answer.
struct Exposition {
    registry: Arc<Registry>,
    summaries: Arc<Summaries>,
    last_len: AtomicUsize,
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

impl Exposition {
    /// The text, in a buffer sized from the last answer: at a few thousand nodes the per-node
    /// families make tens of MB, and a buffer grown by doubling would briefly hold three times
    /// that.
    fn plain(&self) -> Result<String, EncodeError> {
        let last = self.last_len.load(Ordering::Relaxed);
        let mut text = String::with_capacity(last + last / 8);
        crate::metrics::summary::encode(&self.registry, &self.summaries, &mut text)
            .map_err(EncodeError::Format)?;
        self.last_len.store(text.len(), Ordering::Relaxed);
        Ok(text)
    }

    /// The text gzip-compressed as it is encoded (Prometheus asks for gzip): the whole text is
    /// never held, and the answer is a small part of its size.
    fn gzip(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Gzip { encoder: GzEncoder::new(Vec::new(), Compression::fast()), failed: None };
        let encoded = crate::metrics::summary::encode(&self.registry, &self.summaries, &mut out);
        match (encoded, out.failed) {
            (_, Some(source)) => Err(EncodeError::Compress(source)),
            (Err(source), None) => Err(EncodeError::Format(source)),
            (Ok(()), None) => out.encoder.finish().map_err(EncodeError::Compress),
        }
    }
}

/// Why `/metrics` could not be answered.
#[derive(Debug, thiserror::Error)]
enum EncodeError {
    /// A family could not be written as text.
    #[error("writing the metrics text")]
    Format(#[source] std::fmt::Error),
    /// The text could not be compressed.
    #[error("compressing the metrics text")]
    Compress(#[source] std::io::Error),
}

/// A `fmt::Write` into a gzip stream, keeping the stream's error (`fmt::Error` carries none).
struct Gzip {
    encoder: GzEncoder<Vec<u8>>,
    failed: Option<std::io::Error>,
}

impl std::fmt::Write for Gzip {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.encoder.write_all(s.as_bytes()).map_err(|e| {
            self.failed = Some(e);
            std::fmt::Error
        })
    }
}

/// Whether an `Accept-Encoding` value accepts gzip (not refused with `q=0`).
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT_ENCODING).iter().filter_map(|v| v.to_str().ok()).any(|v| {
        v.split(',').any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused =
                parts.any(|p| p.strip_prefix("q=").and_then(|q| q.parse::<f64>().ok()) == Some(0.0));
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
    })
}

async fn metrics(State(exposition): State<Arc<Exposition>>, headers: HeaderMap) -> Response {
    let gzip = accepts_gzip(&headers);
    // Encoding thousands of series is CPU work: off the async workers.
    let encoded = tokio::task::spawn_blocking(move || {
        if gzip { exposition.gzip().map(Body::from) } else { exposition.plain().map(Body::from) }
    })
    .await;
    match encoded {
        Ok(Ok(body)) if gzip => {
            ([(header::CONTENT_TYPE, OPENMETRICS), (header::CONTENT_ENCODING, "gzip")], body).into_response()
        }
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Ok(Err(error)) => failed(crate::util::error_chain(&error)),
        Err(error) => failed(format!("encoding metrics: {error}")),
    }
}

fn failed(message: String) -> Response {
    (StatusCode::INTERNAL_SERVER_ERROR, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message)
        .into_response()
}

/// Binds `addr` (port 0 picks a free port) and returns the listener with its actual address.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| ServerError::Bind { addr, source })?;
    let local = listener.local_addr().map_err(|source| ServerError::Bind { addr, source })?;
    Ok((listener, local))
}

/// Serves `router` on `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let addr = listener
        .local_addr()
        .map_err(|source| ServerError::Serve { addr: SocketAddr::from(([0, 0, 0, 0], 0)), source })?;
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            while !*stop.borrow() {
                if stop.changed().await.is_err() {
                    break;
                }
            }
        })
        .await
        .map_err(|source| ServerError::Serve { addr, source })
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use prometheus_client::metrics::counter::Counter;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response.split(' ').nth(1).unwrap().parse().unwrap();
        let body = response.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        (status, body)
    }

    /// The head and the raw body of a GET with `extra` header lines.
    async fn get_with(addr: SocketAddr, path: &str, extra: &str) -> (String, Vec<u8>) {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n{extra}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        let at = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        (String::from_utf8_lossy(&response[..at]).into_owned(), response[at + 4..].to_vec())
    }

    #[rstest::rstest]
    #[case("gzip", true)]
    #[case("gzip, deflate, br", true)]
    #[case("deflate, GZIP;q=0.5", true)]
    #[case("*", true)]
    #[case("gzip;q=0", false)]
    #[case("identity", false)]
    #[case("", false)]
    fn gzip_when_accepted(#[case] accept: &str, #[case] expected: bool) {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT_ENCODING, accept.parse().unwrap());
        assert_eq!(accepts_gzip(&headers), expected);
    }

    #[tokio::test]
    async fn health_and_readiness() {
        let readiness = Readiness::default();
        let (listener, addr) = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let (stop_tx, stop) = watch::channel(false);
        let server = tokio::spawn(serve(listener, health_router(readiness.clone()), stop));
        assert_eq!(get(addr, "/healthz").await.0, 200);
        assert_eq!(get(addr, "/readyz").await.0, 503);
        readiness.set(true);
        assert_eq!(get(addr, "/readyz").await.0, 200);
        assert_eq!(get(addr, "/nope").await.0, 404);
        stop_tx.send_replace(true);
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn metrics_in_prometheus_text_format() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("karpenter_nodeclaims_created", "Number of nodeclaims created", counter.clone());
        counter.inc();
        let (listener, addr) = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let (stop_tx, stop) = watch::channel(false);
        let decisions = Decisions::default();
        let server = tokio::spawn(serve(
            listener,
            metrics_router(Arc::new(registry), Arc::default(), decisions.clone()),
            stop,
        ));
        let (status, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(body.contains("karpenter_nodeclaims_created_total 1"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        // Asked for gzip, as Prometheus asks: the same text, compressed.
        let (head, compressed) = get_with(addr, "/metrics", "Accept-Encoding: gzip\r\n").await;
        assert!(head.to_ascii_lowercase().contains("content-encoding: gzip"), "{head}");
        let mut text = String::new();
        flate2::read::GzDecoder::new(compressed.as_slice()).read_to_string(&mut text).unwrap();
        assert_eq!(text, body);
        let (head, plain) = get_with(addr, "/metrics", "Accept-Encoding: gzip;q=0, identity\r\n").await;
        assert!(!head.to_ascii_lowercase().contains("content-encoding"), "{head}");
        assert_eq!(String::from_utf8(plain).unwrap(), body);
        // The disruption record: empty until a pass, then the latest one.
        let (status, body) = get(addr, "/disruption").await;
        assert_eq!((status, body.as_str()), (200, r#"{"at":null,"command":null,"nodes":{}}"#));
        decisions.set(crate::disruption::record::Record { command: Some("x".into()), ..Default::default() });
        assert!(get(addr, "/disruption").await.1.contains(r#""command":"x""#));
        stop_tx.send_replace(true);
        server.await.unwrap().unwrap();
    }
}
