//! The `karpenter` binary.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use karpenter::apis::crds;
use karpenter::operator::{self, Settings};
use karpenter::tools::simulate;
use karpenter::tools::{self, Target, live::Scale};
use karpenter::util::error_chain;

/// jemalloc hands freed memory back to the system after a short decay (its background thread,
/// started with the controller, does the purging): a controller whose caches shrink after a burst
/// (nodes scaled away) shrinks with them, where glibc's allocator keeps the pages of its
/// per-thread arenas.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Karpenter, the Kubernetes node autoscaler, for AWS EKS.
#[derive(Parser, Debug)]
#[command(name = "karpenter", version, about, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Settings of the controller when no subcommand is given.
    #[command(flatten)]
    settings: Settings,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the controller (the default when no subcommand is given).
    Controller(Box<Settings>),
    /// Print the CustomResourceDefinitions, or write one file per CRD into a directory.
    Crds {
        /// Write `<group>_<plural>.yaml` files into this directory instead of printing.
        #[arg(long, short = 'o', value_name = "DIR")]
        output_dir: Option<PathBuf>,
    },
    /// Show which NodeClaims Karpenter would launch for manifests, without a cluster; with
    /// `--from-cluster`, what the provisioner and consolidation would do on the live cluster plus
    /// the given changes.
    Simulate {
        /// A YAML file or a directory of them (NodePools, workloads, nodes); repeatable. With
        /// `--from-cluster`, objects added to the cluster's.
        #[arg(long = "file", short = 'f', value_name = "PATH", required_unless_present = "from_cluster")]
        files: Vec<PathBuf>,
        /// Instance-type catalog: `kwok` (generated), `aws` (the EC2 types of us-east-1, built
        /// in) or a catalog file. Default: `kwok`, or `aws` with `--from-cluster`.
        #[arg(long, value_name = "kwok|aws|FILE")]
        instance_types: Option<simulate::Catalog>,
        /// Output format.
        #[arg(long, short = 'o', value_enum, default_value_t = simulate::OutputFormat::Table)]
        output: simulate::OutputFormat,
        /// Start from the live cluster (the kubeconfig's current context, or `--context`).
        #[arg(long)]
        from_cluster: bool,
        /// With `--from-cluster`: scale a Deployment first (`deployment/NAME=N`, or
        /// `deployment/NAMESPACE/NAME=N`); repeatable.
        #[arg(long, value_name = "deployment/NAME=N", requires = "from_cluster")]
        scale: Vec<Scale>,
        /// With `--from-cluster`: remove a NodePool first (its nodes go); repeatable.
        #[arg(long, value_name = "NAME", requires = "from_cluster")]
        remove_nodepool: Vec<String>,
        /// With `--from-cluster`: the controller's feature gates, as its `FEATURE_GATES` setting.
        #[arg(long, value_name = "GATES", default_value = "")]
        feature_gates: karpenter::controllers::settings::FeatureGates,
        /// How NodePools plan burstable (T) types' CPU, as the controller's `BURSTABLE_CPU`:
        /// `baseline`, `unlimited` or `ignore`.
        #[arg(long, env = "BURSTABLE_CPU", value_name = "MODE", default_value = "baseline", value_parser = parse_burstable_cpu)]
        burstable_cpu: simulate::BurstableCpu,
        /// With `--from-cluster`: the namespace of `--scale` targets given without one
        /// (default: the kubeconfig context's, as kubectl).
        #[arg(long, short = 'n', value_name = "NAMESPACE", requires = "from_cluster")]
        namespace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Explain, from the live cluster, why a pod is where it is (or nowhere) and why a node is or
    /// is not being disrupted.
    Explain {
        #[command(subcommand)]
        what: Explain,
        /// Instance-type catalog for prices and launch simulations: `aws` (built in), `kwok` or a
        /// catalog file.
        #[arg(long, global = true, value_name = "kwok|aws|FILE", default_value = "aws")]
        instance_types: simulate::Catalog,
        /// Output format.
        #[arg(long, short = 'o', global = true, value_enum, default_value_t = simulate::OutputFormat::Table)]
        output: simulate::OutputFormat,
        /// The pod's namespace (or give it as `NAMESPACE/NAME`; default: the kubeconfig
        /// context's, as kubectl).
        #[arg(long, short = 'n', global = true, value_name = "NAMESPACE")]
        namespace: Option<String>,
        /// The controller's feature gates, as its `FEATURE_GATES` setting (`SpotToSpotConsolidation=true`).
        #[arg(long, global = true, value_name = "GATES", default_value = "")]
        feature_gates: karpenter::controllers::settings::FeatureGates,
        /// How NodePools plan burstable (T) types' CPU, as the controller's `BURSTABLE_CPU`:
        /// `baseline`, `unlimited` or `ignore`.
        #[arg(long, global = true, env = "BURSTABLE_CPU", value_name = "MODE", default_value = "baseline", value_parser = parse_burstable_cpu)]
        burstable_cpu: simulate::BurstableCpu,
        #[command(flatten)]
        target: Target,
    },
    /// The nodes by NodePool with their requests, prices and disruption flags; totals and
    /// pending pods. Redraws every second in a terminal (`q` quits).
    Top {
        /// Print one frame and exit (for scripts).
        #[arg(long)]
        once: bool,
        /// Output format of `--once`: the frame as drawn (`table`), or its data.
        #[arg(long, short = 'o', value_enum, default_value_t = simulate::OutputFormat::Table, requires = "once")]
        output: simulate::OutputFormat,
        /// Instance-type catalog for prices: `aws` (built in), `kwok` or a catalog file.
        #[arg(long, value_name = "kwok|aws|FILE", default_value = "aws")]
        instance_types: simulate::Catalog,
        /// How NodePools plan burstable (T) types' CPU, as the controller's `BURSTABLE_CPU`:
        /// `baseline`, `unlimited` or `ignore`.
        #[arg(long, env = "BURSTABLE_CPU", value_name = "MODE", default_value = "baseline", value_parser = parse_burstable_cpu)]
        burstable_cpu: simulate::BurstableCpu,
        #[command(flatten)]
        target: Target,
    },
    /// Rewrite v1beta1 NodePools and EC2NodeClasses as v1 (printed on stdout, each change in a
    /// comment). Exits 2 when something could not be converted (told on stderr and in the output).
    Convert {
        /// A YAML file (one or more documents); repeatable.
        #[arg(long = "file", short = 'f', value_name = "FILE", required = true)]
        files: Vec<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum Explain {
    /// Where the pod is or would go, and each NodePool's verdict for it.
    Pod {
        /// `NAME` or `NAMESPACE/NAME`.
        name: String,
    },
    /// Whether the node is a disruption candidate and why, its drift and expiry.
    Node {
        /// The Node's name.
        name: String,
    },
    /// As `node`, by NodeClaim name.
    #[command(name = "nodeclaim")]
    NodeClaim {
        /// The NodeClaim's name.
        name: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None => controller(&cli.settings),
        Some(Command::Controller(settings)) => controller(&settings),
        Some(Command::Crds { output_dir }) => match write_crds(output_dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("error: {message}");
                ExitCode::FAILURE
            }
        },
        Some(Command::Convert { files }) => run_convert(&files),
        Some(Command::Simulate {
            files, instance_types, output, from_cluster: false, burstable_cpu, ..
        }) => {
            let catalog = instance_types.unwrap_or(simulate::Catalog::Kwok);
            finish(run_simulate(&files, &catalog, output, burstable_cpu))
        }
        Some(Command::Simulate {
            files,
            instance_types,
            output,
            from_cluster: true,
            scale,
            remove_nodepool,
            namespace,
            feature_gates,
            burstable_cpu,
            target,
        }) => {
            let catalog = instance_types.unwrap_or(simulate::Catalog::Aws);
            let changes = tools::cli::Changes { files, scale, remove_nodepools: remove_nodepool, namespace };
            let spot_to_spot = feature_gates.spot_to_spot_consolidation;
            let run = async {
                tools::cli::simulate_from_cluster(
                    &target,
                    &catalog,
                    burstable_cpu,
                    &changes,
                    spot_to_spot,
                    output,
                )
                .await
            };
            finish(block_on(run))
        }
        Some(Command::Top { once: true, instance_types, output, burstable_cpu, target }) => {
            finish(block_on(tools::cli::top_once(&target, &instance_types, burstable_cpu, output)))
        }
        Some(Command::Top { once: false, instance_types, burstable_cpu, target, .. }) => {
            match tools::cli::top(&target, &instance_types, burstable_cpu) {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    eprintln!("error: {message}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(Command::Explain {
            what,
            instance_types,
            output,
            namespace,
            feature_gates,
            burstable_cpu,
            target,
        }) => {
            let spot_to_spot = feature_gates.spot_to_spot_consolidation;
            let run = async {
                match what {
                    Explain::Pod { name } => {
                        tools::cli::explain_pod(
                            &target,
                            &instance_types,
                            burstable_cpu,
                            namespace.as_deref(),
                            &name,
                            output,
                        )
                        .await
                    }
                    Explain::Node { name } => {
                        tools::cli::explain_node(
                            &target,
                            &instance_types,
                            burstable_cpu,
                            &name,
                            false,
                            spot_to_spot,
                            output,
                        )
                        .await
                    }
                    Explain::NodeClaim { name } => {
                        tools::cli::explain_node(
                            &target,
                            &instance_types,
                            burstable_cpu,
                            &name,
                            true,
                            spot_to_spot,
                            output,
                        )
                        .await
                    }
                }
            };
            finish(block_on(run))
        }
    }
}

fn parse_burstable_cpu(s: &str) -> Result<simulate::BurstableCpu, String> {
    s.parse()
}

/// Runs a command's future on a runtime of its own.
fn block_on<F: std::future::Future<Output = Result<String, String>>>(f: F) -> Result<String, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the async runtime: {e}"))?
        .block_on(f)
}

/// Prints a command's output, or its error on one line (exit 1).
fn finish(result: Result<String, String>) -> ExitCode {
    let out = match result {
        Ok(out) => out,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::FAILURE;
        }
    };
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: writing to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_convert(files: &[PathBuf]) -> ExitCode {
    let conversion = match karpenter::tools::convert::convert_files(files) {
        Ok(conversion) => conversion,
        Err(error) => {
            eprintln!("error: {}", error_chain(&error));
            return ExitCode::FAILURE;
        }
    };
    let yaml = match conversion.to_yaml() {
        Ok(yaml) => yaml,
        Err(error) => {
            eprintln!("error: {}", error_chain(&error));
            return ExitCode::FAILURE;
        }
    };
    match std::io::stdout().lock().write_all(yaml.as_bytes()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => {
            eprintln!("error: writing to stdout: {e}");
            return ExitCode::FAILURE;
        }
    }
    for problem in &conversion.problems {
        eprintln!("warning: {problem}");
    }
    if conversion.problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) }
}

fn run_simulate(
    files: &[PathBuf],
    catalog: &simulate::Catalog,
    format: simulate::OutputFormat,
    mode: simulate::BurstableCpu,
) -> Result<String, String> {
    let (out, warnings) = simulate::run(files, catalog, format, mode).map_err(|e| error_chain(&e))?;
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    Ok(out)
}

fn controller(settings: &Settings) -> ExitCode {
    for (path, error) in operator::init_logging(&settings.log_level, &settings.log_output_paths) {
        tracing::error!(path = %path, error = %error, "opening a LOG_OUTPUT_PATHS file; the log does not go there");
    }
    if let Err(error) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %error, "cannot start the allocator's background thread; freed memory is returned later");
    }
    if let Err(error) = settings.validate() {
        tracing::error!(error = %error, "invalid settings");
        return ExitCode::FAILURE;
    }
    let cores = std::thread::available_parallelism().map(usize::from).unwrap_or(2);
    let workers = settings.worker_threads(cores);
    tracing::debug!(workers, cpu_requests = settings.cpu_requests, "sizing the async runtime");
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build() {
            Ok(rt) => rt,
            Err(error) => {
                tracing::error!(error = %error, "starting the async runtime");
                return ExitCode::FAILURE;
            }
        };
    let outcome = runtime.block_on(operator::run::run(settings.clone()));
    // Every controller has stopped and the lease is released: work still on a blocking thread
    // (a decision over the whole cluster, an encoding of the metrics) has nothing left to apply,
    // and the process does not wait for it beyond a moment.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %error_chain(&error), "controller stopped");
            ExitCode::FAILURE
        }
    }
}

fn write_crds(output_dir: Option<PathBuf>) -> Result<(), String> {
    let rendered = crds::render_all().map_err(|e| error_chain(&e))?;
    match output_dir {
        None => {
            let mut out = std::io::stdout().lock();
            for crd in rendered {
                match out.write_all(crd.yaml.as_bytes()) {
                    Ok(()) => {}
                    // The reader went away (`karpenter crds | head`): nothing left to do.
                    Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                    Err(e) => return Err(format!("writing to stdout: {e}")),
                }
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

#[cfg(test)]
mod tests {
    /// The build configures the allocator with one arena (`.cargo/config.toml`), unless the run
    /// overrides it.
    #[test]
    fn the_allocator_has_one_arena() -> Result<(), tikv_jemalloc_ctl::Error> {
        if std::env::var_os("_RJEM_MALLOC_CONF").is_none() {
            assert_eq!(tikv_jemalloc_ctl::opt::narenas::read()?, 1);
        }
        Ok(())
    }
}
