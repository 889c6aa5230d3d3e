//! The operator around the controllers: settings, leader election, health and metrics
//! endpoints, logging.

pub mod apiclient;
pub mod leader;
pub mod metrics;
pub mod run;
pub mod server;
pub mod settings;

pub use leader::error_chain;
pub use settings::Settings;

/// Installs the JSON log format on stderr, at `level` (`error`, `warn`, `info`, `debug`, or a
/// tracing filter); an unparsable level falls back to `info`.
pub fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    /// Only one rustls crypto provider (ring) is linked, so a TLS client is built without choosing
    /// one first; with a second provider linked, rustls would panic here.
    #[tokio::test]
    async fn a_tls_kube_client_can_be_built() {
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(kube::Client::try_from(config).is_ok());
    }
}
