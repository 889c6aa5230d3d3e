//! The operator around the controllers: settings, leader election, health and metrics
//! endpoints, logging.

pub mod leader;
pub mod server;
pub mod settings;

pub use leader::error_chain;
pub use settings::Settings;

/// Installs the JSON log format on stderr, at `level` (`error`, `warn`, `info`, `debug`, or a
/// tracing filter); an unparsable level falls back to `info`.
pub fn init_logging(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().json().with_env_filter(filter).with_writer(std::io::stderr).init();
}
