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

/// Selects ring as rustls' process-wide crypto provider.
///
/// Two providers are linked: ring (the Kubernetes client's) and aws-lc-rs (the AWS SDK's HTTPS
/// client), and with both present rustls refuses to guess, so every process that talks to the API
/// server calls this first. Calling it again is harmless.
pub fn install_crypto_provider() {
    // An error only means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

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
    /// With both ring and aws-lc-rs linked, building a TLS client panics unless a crypto provider
    /// was chosen; this builds one the way the controller and the tests do.
    #[tokio::test]
    async fn a_tls_kube_client_can_be_built() {
        super::install_crypto_provider();
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(kube::Client::try_from(config).is_ok());
    }
}
