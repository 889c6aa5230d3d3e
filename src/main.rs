//! The `karpenter` binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use karpenter::apis::crds;

/// Karpenter, the Kubernetes node autoscaler, for AWS EKS.
#[derive(Parser, Debug)]
#[command(name = "karpenter", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller (the default when no subcommand is given).
    Controller,
    /// Print the CustomResourceDefinitions, or write one file per CRD into a directory.
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long, short = 'o', value_name = "DIR")]
        output_dir: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Controller) {
        Command::Controller => {
            init_json_logging();
            tracing::error!(
                "the controller is not implemented in this release; only `karpenter crds` is available (see README)"
            );
            ExitCode::FAILURE
        }
        Command::Crds { output_dir } => match write_crds(output_dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("error: {message}");
                ExitCode::FAILURE
            }
        },
    }
}

/// JSON log lines on stderr, level from `LOG_LEVEL` (default `info`), as the controller logs.
fn init_json_logging() {
    let level = std::env::var("LOG_LEVEL").unwrap_or_else(|_| "info".to_string());
    let filter = tracing_subscriber::EnvFilter::try_new(&level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().json().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn write_crds(output_dir: Option<PathBuf>) -> Result<(), String> {
    let rendered = crds::render_all().map_err(|e| error_chain(&e))?;
    match output_dir {
        None => {
            for crd in rendered {
                print!("{}", crd.yaml);
            }
        }
        Some(dir) => {
            std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            for crd in rendered {
                let path = dir.join(&crd.file_name);
                std::fs::write(&path, &crd.yaml).map_err(|e| format!("writing {}: {e}", path.display()))?;
            }
        }
    }
    Ok(())
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}
