//! The operator's HTTP endpoints: `/healthz` and `/readyz` on the health-probe port, `/metrics`
//! (Prometheus text format) on the metrics port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

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
    Router::new()
        .route(
            "/disruption",
            get(move || {
                let body = decisions.json();
                async move { ([(header::CONTENT_TYPE, "application/json")], body) }
            }),
        )
        .route("/metrics", get(metrics))
        .with_state((registry, summaries))
}

async fn metrics(State((registry, summaries)): State<(Arc<Registry>, Arc<Summaries>)>) -> impl IntoResponse {
    let mut body = String::new();
    match crate::metrics::summary::encode(&registry, &summaries, &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
            body,
        ),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding metrics: {error}"),
        ),
    }
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
        // The disruption record: empty until a pass, then the latest one.
        let (status, body) = get(addr, "/disruption").await;
        assert_eq!((status, body.as_str()), (200, r#"{"at":null,"command":null,"nodes":{}}"#));
        decisions.set(crate::disruption::record::Record { command: Some("x".into()), ..Default::default() });
        assert!(get(addr, "/disruption").await.1.contains(r#""command":"x""#));
        stop_tx.send_replace(true);
        server.await.unwrap().unwrap();
    }
}
