//! The `recast` binary: command-line parsing, logging, the runtime, and signals.

#![deny(unsafe_code)]

use std::io::IsTerminal as _;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::builder::TypedValueParser as _;
use clap::{CommandFactory as _, Parser, Subcommand};
use recast::cli::{self, Exit};
use recast::config::{Config, LogFormat};
use recast::rules::Limits;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "recast",
    version,
    about = "Calls upstream JSON APIs and reshapes their answers by stored mapping rules"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service. Every setting is a flag and a RECAST_* environment variable.
    Serve(Box<Config>),
    /// Compile a rules file and list every problem (exit 1 when there is one).
    #[command(group = clap::ArgGroup::new("what").required(true))]
    Check {
        /// The rules: a JSON file holding the rules object, or a JSON string holding it (`-`:
        /// standard input).
        #[arg(long, group = "what")]
        rules: Option<PathBuf>,
        /// A whole registration body (`POST /v1/mapping`), a composed route's sources and their
        /// graph included, checked as the service checks it before its live call (`-`: standard
        /// input).
        #[arg(long, group = "what")]
        registration: Option<PathBuf>,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Map a sample upstream answer with a rules file, offline, as POST /v1/preview does.
    Preview {
        /// The rules: a JSON file holding the rules object, or a JSON string holding it (`-`:
        /// standard input).
        #[arg(long)]
        rules: PathBuf,
        /// The sample upstream answer (JSON; `-`: standard input).
        #[arg(long)]
        input: PathBuf,
        /// Print {"output", "trace", "warnings"}: what each target read and why.
        #[arg(long)]
        trace: bool,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// List, show, delete, purge or count (stats) the routes of a running service; export and import routes
    /// between a data directory and a cluster's database.
    Routes {
        /// The service's address.
        #[arg(long, global = true, env = "RECAST_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The service's admin token (RECAST_ADMIN_TOKEN of the service).
        #[arg(long, global = true, env = recast::config::ADMIN_TOKEN, hide_env_values = true)]
        token: Option<String>,
        #[command(subcommand)]
        command: cli::RoutesCommand,
    },
    /// Show the key ring's use or re-seal every stored route with its first key, on a running
    /// service.
    Keys {
        /// The service's address.
        #[arg(long, global = true, env = "RECAST_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The service's admin token (RECAST_ADMIN_TOKEN of the service).
        #[arg(long, global = true, env = recast::config::ADMIN_TOKEN, hide_env_values = true)]
        token: Option<String>,
        #[command(subcommand)]
        command: cli::KeysCommand,
    },
    /// Manage the consumers of a running service and their API keys (who may call routes).
    Consumers {
        /// The service's address.
        #[arg(long, global = true, env = "RECAST_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The service's admin token (RECAST_ADMIN_TOKEN of the service).
        #[arg(long, global = true, env = recast::config::ADMIN_TOKEN, hide_env_values = true)]
        token: Option<String>,
        #[command(subcommand)]
        command: cli::ConsumersCommand,
    },
    /// Routes as files (SPEC §2.5): validate a file offline, diff it against a running service,
    /// apply it, or dump the service's routes as one.
    Config {
        /// The service's address.
        #[arg(long, global = true, env = "RECAST_URL", default_value = "http://127.0.0.1:8080")]
        url: String,
        /// The service's admin token (RECAST_ADMIN_TOKEN of the service).
        #[arg(long, global = true, env = recast::config::ADMIN_TOKEN, hide_env_values = true)]
        token: Option<String>,
        #[command(subcommand)]
        command: recast::cli::config::ConfigCommand,
        #[command(flatten)]
        limits: LimitArgs,
    },
    /// Print a new random secret key (64 hex digits) for RECAST_SECRET_KEY or RECAST_SECRET_KEYS.
    NewKey,
}

/// The engine limits of the offline commands, as the service has them.
#[derive(clap::Args)]
struct LimitArgs {
    /// Most targets in one rules document.
    #[arg(long, env = recast::config::MAX_RULES, default_value_t = recast::config::DEFAULT_MAX_RULES)]
    max_rules: usize,
    /// Deepest nesting of JSON documents, and longest `parents`/`each` path in rules.
    #[arg(long, env = recast::config::MAX_DEPTH, default_value_t = recast::config::DEFAULT_MAX_DEPTH, value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from))]
    max_depth: usize,
    /// Bytes the values built by one mapping's expressions may take.
    #[arg(long, env = recast::config::MAX_EXPR_BYTES, default_value_t = recast::config::DEFAULT_MAX_EXPR_BYTES)]
    max_expr_bytes: usize,
    /// Bytes of the answer one mapping may write.
    #[arg(long, env = recast::config::MAX_RESPONSE_BYTES, default_value_t = recast::config::DEFAULT_MAX_RESPONSE_BYTES)]
    max_response_bytes: usize,
    /// Steps of work one mapping may take.
    #[arg(long, env = recast::config::MAX_MAPPING_STEPS, default_value_t = recast::config::DEFAULT_MAX_MAPPING_STEPS, value_parser = clap::value_parser!(u64).range(1..))]
    max_mapping_steps: u64,
    /// Requests one call of a composed route may send, retries counted.
    #[arg(long, env = recast::config::MAX_SOURCE_CALLS, default_value_t = recast::config::DEFAULT_MAX_SOURCE_CALLS, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    max_source_calls: usize,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits {
            max_rules: self.max_rules,
            max_depth: self.max_depth,
            max_expr_bytes: self.max_expr_bytes,
            max_response_bytes: self.max_response_bytes,
            max_mapping_steps: self.max_mapping_steps,
            max_source_calls: self.max_source_calls,
        }
    }
}

fn main() -> ExitCode {
    let outcome = match parsed().command {
        Command::Serve(config) => {
            return match serve(*config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("Error: {e:#}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::NewKey => match recast::secrets::new_key_hex() {
            Ok(key) => cli::Outcome::ok(format!("{key}\n").into_bytes(), String::new()),
            Err(why) => cli::Outcome::failed(Exit::Unavailable, format!("{why}\n")),
        },
        Command::Check { rules: Some(rules), limits, .. } => cli::check(&rules, &limits.limits()),
        Command::Check { registration: Some(registration), limits, .. } => {
            cli::check_registration(&registration, &limits.limits())
        }
        Command::Check { .. } => {
            cli::Outcome::failed(Exit::Usage, "give --rules or --registration\n".to_owned())
        }
        Command::Preview { rules, input, trace, limits } => {
            cli::preview(&rules, &input, trace, &limits.limits())
        }
        Command::Routes { url, token, command } => {
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(cli::routes(&url, token.as_deref(), &command)),
                Err(e) => cli::Outcome::failed(Exit::Unavailable, format!("cannot start: {e}\n")),
            }
        }
        Command::Keys { url, token, command } => {
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(cli::keys(&url, token.as_deref(), &command)),
                Err(e) => cli::Outcome::failed(Exit::Unavailable, format!("cannot start: {e}\n")),
            }
        }
        Command::Consumers { url, token, command } => {
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(cli::consumers(&url, token.as_deref(), &command)),
                Err(e) => cli::Outcome::failed(Exit::Unavailable, format!("cannot start: {e}\n")),
            }
        }
        Command::Config { url, token, command, limits } => {
            match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(recast::cli::config::run(
                    &url,
                    token.as_deref(),
                    &command,
                    &limits.limits(),
                )),
                Err(e) => cli::Outcome::failed(Exit::Unavailable, format!("cannot start: {e}\n")),
            }
        }
    };
    let _ = std::io::stdout().write_all(&outcome.stdout);
    eprint!("{}", outcome.stderr);
    ExitCode::from(outcome.exit.code())
}

/// The command line, or the end of the process with clap's message. A value that came from a
/// `RECAST_*` variable and not from its flag is named by the variable in that message.
fn parsed() -> Cli {
    Cli::try_parse().unwrap_or_else(|mut error| {
        name_the_variable(&mut error);
        error.exit()
    })
}

/// In an error about a value that was not given as its flag on the command line but is set in
/// the environment, names the variable (`RECAST_WORKERS (--workers)`) instead of the flag alone.
fn name_the_variable(error: &mut clap::Error) {
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(invalid)) = error.get(ContextKind::InvalidArg) else { return };
    let invalid = invalid.clone();
    let mut command = Cli::command();
    // Built, so that its arguments can be written as clap writes them in its messages.
    command.build();
    let given: Vec<String> = std::env::args_os().map(|arg| arg.to_string_lossy().into_owned()).collect();
    for sub in std::iter::once(&command).chain(command.get_subcommands()) {
        let Some(arg) = sub.get_arguments().find(|arg| arg.to_string() == invalid) else { continue };
        let (Some(variable), Some(long)) = (arg.get_env(), arg.get_long()) else { return };
        let flag = format!("--{long}");
        let on_the_line = given.iter().any(|g| *g == flag || g.starts_with(&format!("{flag}=")));
        // Only whether it is set, to name it in clap's message: its value is clap's to read.
        #[allow(clippy::disallowed_methods)]
        let set = std::env::var_os(variable).is_some();
        if !on_the_line && set {
            let named = format!("{} (the {flag} flag)", variable.to_string_lossy());
            error.insert(ContextKind::InvalidArg, ContextValue::String(named));
        }
        return;
    }
}

fn serve(config: Config) -> anyhow::Result<()> {
    init_logging(&config)?;
    // Before binding, so an exposed address is never opened with open admin endpoints.
    config.check_exposure(config.listen).map_err(anyhow::Error::msg)?;
    // This runtime accepts connections and runs the background work; the connections themselves
    // are served by the workers (`recast::workers`), each on its own runtime.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let served = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        // The error says itself what went wrong (e.g. the data directory is in use).
        recast::server::run(listener, config, stop_signal()).await.map_err(anyhow::Error::from)
    });
    // `run` waited for what it must within the grace period; blocking work still running past
    // it (a name lookup that hangs) is not waited for, and neither are busy workers.
    runtime.shutdown_background();
    served
}

/// Completes on the first SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        tracing::error!("cannot listen for signals; stop the process with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "stopping"),
        _ = int.recv() => tracing::info!(signal = "SIGINT", "stopping"),
    }
}

fn init_logging(config: &Config) -> anyhow::Result<()> {
    config.check_log_filter().map_err(anyhow::Error::msg)?;
    let filter = tracing_subscriber::EnvFilter::try_new(&config.log)
        .with_context(|| format!("RECAST_LOG: `{}` is not a log filter", config.log))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match config.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}
