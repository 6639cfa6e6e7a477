//! The `recast` binary: command-line parsing, logging, the runtime, and signals.

use std::io::IsTerminal as _;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use recast::config::{Config, LogFormat};

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
    /// Print a new random secret key (64 hex digits) for RECAST_SECRET_KEY.
    NewKey,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Serve(config) => serve(*config),
        Command::NewKey => {
            println!("{}", recast::secrets::new_key_hex().map_err(anyhow::Error::msg)?);
            Ok(())
        }
    }
}

fn serve(config: Config) -> anyhow::Result<()> {
    init_logging(&config)?;
    // Before binding, so an exposed address is never opened with open admin endpoints.
    config.check_exposure(config.listen).map_err(anyhow::Error::msg)?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(workers) = config.workers {
        runtime.worker_threads(workers);
    }
    let runtime = runtime.enable_all().build().context("cannot start the runtime")?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("cannot listen on {}", config.listen))?;
        // The error says itself what went wrong (e.g. the data directory is in use).
        recast::server::run(listener, config, stop_signal()).await.map_err(anyhow::Error::from)
    })
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
