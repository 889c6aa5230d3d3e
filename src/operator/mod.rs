//! The operator around the controllers: settings, leader election, health and metrics
//! endpoints, logging.

pub mod apiclient;
pub mod leader;
pub mod memory;
pub mod run;
pub mod server;
pub mod settings;

pub use settings::Settings;

/// Installs the JSON log format at `level` (`error`, `warn`, `info`, `debug`, or a tracing
/// filter; an unparsable level falls back to `info`), written to each of `outputs`
/// (`LOG_OUTPUT_PATHS`: `stdout`, `stderr` or file paths, comma-separated). A file that cannot be
/// opened is left out and returned, to be logged; with none left the log goes to stderr.
pub fn init_logging(level: &str, outputs: &str) -> Vec<(String, std::io::Error)> {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, failed) = LogOutputs::open(outputs);
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_env_filter(filter)
        .with_writer(writer)
        .init();
    failed
}

/// One place the log goes.
#[derive(Debug)]
enum Output {
    Stdout,
    Stderr,
    File(std::sync::Mutex<std::fs::File>),
}

/// Every place the log goes; each line is written whole to each of them.
#[derive(Debug)]
pub struct LogOutputs(Vec<Output>);

impl LogOutputs {
    /// Opens the comma-separated `paths` (files are appended to); returns those that failed.
    pub fn open(paths: &str) -> (Self, Vec<(String, std::io::Error)>) {
        let mut outputs = Vec::new();
        let mut failed = Vec::new();
        for path in paths.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match path {
                "stdout" => outputs.push(Output::Stdout),
                "stderr" => outputs.push(Output::Stderr),
                file => match std::fs::OpenOptions::new().create(true).append(true).open(file) {
                    Ok(f) => outputs.push(Output::File(std::sync::Mutex::new(f))),
                    Err(e) => failed.push((file.to_string(), e)),
                },
            }
        }
        if outputs.is_empty() {
            outputs.push(Output::Stderr);
        }
        (LogOutputs(outputs), failed)
    }
}

/// A writer to every output of a [`LogOutputs`].
pub struct Tee<'a>(&'a [Output]);

impl std::io::Write for Tee<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // A destination that fails (a full disk, a closed pipe) does not keep the line from the
        // others; the first error is reported to the logger, which drops it.
        let mut first_error = None;
        for output in self.0 {
            let result = match output {
                Output::Stdout => std::io::stdout().lock().write_all(buf),
                Output::Stderr => std::io::stderr().lock().write_all(buf),
                Output::File(file) => match file.lock() {
                    Ok(mut f) => f.write_all(buf),
                    Err(poisoned) => poisoned.into_inner().write_all(buf),
                },
            };
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) if self.0.len() == 1 => Err(e),
            _ => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        for output in self.0 {
            match output {
                Output::Stdout => std::io::stdout().flush()?,
                Output::Stderr => std::io::stderr().flush()?,
                Output::File(file) => match file.lock() {
                    Ok(mut f) => f.flush()?,
                    Err(poisoned) => poisoned.into_inner().flush()?,
                },
            }
        }
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogOutputs {
    type Writer = Tee<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Tee(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::LogOutputs;

    #[test]
    fn log_lines_go_to_every_output() {
        let dir = std::env::temp_dir().join(format!("karpenter-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.log"), dir.join("b.log"));
        let missing = dir.join("no-such-dir").join("c.log");
        let paths = format!("{},{}, {}", a.display(), b.display(), missing.display());
        let (outputs, failed) = LogOutputs::open(&paths);
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert_eq!(failed[0].0, missing.display().to_string());
        let mut writer = tracing_subscriber::fmt::MakeWriter::make_writer(&outputs);
        writer.write_all(b"{\"message\":\"one\"}\n").unwrap();
        for file in [&a, &b] {
            assert_eq!(std::fs::read_to_string(file).unwrap(), "{\"message\":\"one\"}\n");
        }
        let (fallback, failed) = LogOutputs::open(&missing.display().to_string());
        assert_eq!((fallback.0.len(), failed.len()), (1, 1), "stderr when nothing else opens");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Only one rustls crypto provider (ring) is linked, so a TLS client is built without choosing
    /// one first; with a second provider linked, rustls would panic here.
    #[tokio::test]
    async fn a_tls_kube_client_can_be_built() {
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        assert!(kube::Client::try_from(config).is_ok());
    }
}
