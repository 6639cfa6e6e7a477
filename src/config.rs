//! Settings (SPEC §5): one typed struct, read in one place from `RECAST_*` environment variables,
//! each of which is also a `recast serve` flag. Tests build the struct directly.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use std::time::Duration;

use crate::policy::AllowList;
use crate::rules::Limits;

pub const LISTEN: &str = "RECAST_LISTEN";
pub const DATA_DIR: &str = "RECAST_DATA_DIR";
pub const UPSTREAM_ALLOW: &str = "RECAST_UPSTREAM_ALLOW";
pub const UPSTREAM_CONNECT_TIMEOUT_MS: &str = "RECAST_UPSTREAM_CONNECT_TIMEOUT_MS";
pub const UPSTREAM_TIMEOUT_MS: &str = "RECAST_UPSTREAM_TIMEOUT_MS";
pub const MAX_UPSTREAM_BYTES: &str = "RECAST_MAX_UPSTREAM_BYTES";
pub const MAX_REQUEST_BYTES: &str = "RECAST_MAX_REQUEST_BYTES";
pub const MAX_RULES: &str = "RECAST_MAX_RULES";
pub const MAX_DEPTH: &str = "RECAST_MAX_DEPTH";
pub const SHUTDOWN_GRACE_MS: &str = "RECAST_SHUTDOWN_GRACE_MS";
pub const WORKERS: &str = "RECAST_WORKERS";
pub const LOG: &str = "RECAST_LOG";
pub const LOG_FORMAT: &str = "RECAST_LOG_FORMAT";

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_DATA_DIR: &str = "./recast-data";
pub const DEFAULT_UPSTREAM_CONNECT_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_UPSTREAM_TIMEOUT_MS: u64 = 15_000;
pub const DEFAULT_MAX_UPSTREAM_BYTES: usize = 16 << 20;
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;
pub const DEFAULT_MAX_RULES: usize = 1024;
pub const DEFAULT_MAX_DEPTH: usize = 64;
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
pub const DEFAULT_LOG: &str = "info";

/// Everything the service can be tuned by.
#[derive(Debug, Clone, PartialEq, Eq, clap::Args)]
pub struct Config {
    /// Address and port to listen on.
    #[arg(long, env = LISTEN, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,

    /// Directory of the route store (RocksDB); created when missing.
    #[arg(long, env = DATA_DIR, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,

    /// Networks (CIDR or address) and host names upstreams may have beyond public addresses,
    /// comma-separated, e.g. `127.0.0.1/32,10.0.0.0/8,api.internal`.
    #[arg(long, env = UPSTREAM_ALLOW, default_value = "")]
    pub upstream_allow: AllowList,

    /// Time to connect to an upstream, in milliseconds.
    #[arg(long, env = UPSTREAM_CONNECT_TIMEOUT_MS, default_value_t = DEFAULT_UPSTREAM_CONNECT_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_connect_timeout_ms: u64,

    /// Deadline for a whole upstream exchange (connect, send, read the answer), in milliseconds.
    #[arg(long, env = UPSTREAM_TIMEOUT_MS, default_value_t = DEFAULT_UPSTREAM_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_timeout_ms: u64,

    /// Largest upstream answer body read, in bytes; larger answers get 502.
    #[arg(long, env = MAX_UPSTREAM_BYTES, default_value_t = DEFAULT_MAX_UPSTREAM_BYTES)]
    pub max_upstream_bytes: usize,

    /// Largest request body accepted, in bytes; larger bodies get 413.
    #[arg(long, env = MAX_REQUEST_BYTES, default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Most targets (`newBodyFields` entries) in one rules document.
    #[arg(long, env = MAX_RULES, default_value_t = DEFAULT_MAX_RULES)]
    pub max_rules: usize,

    /// Deepest nesting of JSON documents, and longest `parents`/`each` path in rules.
    #[arg(long, env = MAX_DEPTH, default_value_t = DEFAULT_MAX_DEPTH, value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from))]
    pub max_depth: usize,

    /// How long in-flight requests may take to finish after SIGTERM/SIGINT, in milliseconds.
    #[arg(long, env = SHUTDOWN_GRACE_MS, default_value_t = DEFAULT_SHUTDOWN_GRACE_MS)]
    pub shutdown_grace_ms: u64,

    /// Worker threads of the runtime [default: number of cores].
    #[arg(long, env = WORKERS, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub workers: Option<usize>,

    /// Log filter, e.g. `info`, `debug`, `recast=trace`.
    #[arg(long, env = LOG, default_value = DEFAULT_LOG)]
    pub log: String,

    /// Log line format.
    #[arg(long, env = LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: DEFAULT_LISTEN.parse().expect("the default listen address is valid"),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            upstream_allow: AllowList::default(),
            upstream_connect_timeout_ms: DEFAULT_UPSTREAM_CONNECT_TIMEOUT_MS,
            upstream_timeout_ms: DEFAULT_UPSTREAM_TIMEOUT_MS,
            max_upstream_bytes: DEFAULT_MAX_UPSTREAM_BYTES,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_rules: DEFAULT_MAX_RULES,
            max_depth: DEFAULT_MAX_DEPTH,
            shutdown_grace_ms: DEFAULT_SHUTDOWN_GRACE_MS,
            workers: None,
            log: DEFAULT_LOG.to_owned(),
            log_format: LogFormat::Text,
        }
    }
}

impl Config {
    /// The limits rules are compiled under.
    pub fn limits(&self) -> Limits {
        Limits { max_rules: self.max_rules, max_depth: self.max_depth }
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }

    /// The settings of the upstream client.
    pub fn upstream(&self) -> crate::upstream::UpstreamSettings {
        crate::upstream::UpstreamSettings {
            connect_timeout: Duration::from_millis(self.upstream_connect_timeout_ms),
            total_timeout: Duration::from_millis(self.upstream_timeout_ms),
            max_body: self.max_upstream_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: Config,
    }

    #[test]
    fn flag_defaults_match_the_default_struct() {
        use clap::{CommandFactory, FromArgMatches};
        // The same command with its environment bindings removed, so the caller's RECAST_*
        // variables cannot change what is compared.
        let command = Cli::command().mut_args(|arg| arg.env(None::<&str>));
        let matches = command.try_get_matches_from(["recast"]).expect("no arguments are needed");
        assert_eq!(Cli::from_arg_matches(&matches).unwrap().config, Config::default());
    }

    #[test]
    fn every_setting_has_its_environment_variable() {
        use clap::CommandFactory;
        let names: Vec<String> = Cli::command()
            .get_arguments()
            .filter_map(|arg| arg.get_env().map(|e| e.to_string_lossy().into_owned()))
            .collect();
        let all = [
            LISTEN,
            DATA_DIR,
            UPSTREAM_ALLOW,
            UPSTREAM_CONNECT_TIMEOUT_MS,
            UPSTREAM_TIMEOUT_MS,
            MAX_UPSTREAM_BYTES,
            MAX_REQUEST_BYTES,
            MAX_RULES,
            MAX_DEPTH,
            SHUTDOWN_GRACE_MS,
            WORKERS,
            LOG,
            LOG_FORMAT,
        ];
        for name in all {
            assert!(names.iter().any(|n| n == name), "{name} is not bound");
        }
        assert_eq!(names.len(), all.len(), "{names:?}");
    }

    #[test]
    fn flags_override_defaults_and_are_checked() {
        let cli = Cli::parse_from([
            "recast",
            "--listen",
            "127.0.0.1:0",
            "--max-depth",
            "8",
            "--log-format",
            "json",
        ]);
        assert_eq!(cli.config.listen.port(), 0);
        assert_eq!(cli.config.max_depth, 8);
        assert_eq!(cli.config.log_format, LogFormat::Json);
        assert!(Cli::try_parse_from(["recast", "--max-depth", "0"]).is_err());
        assert!(Cli::try_parse_from(["recast", "--workers", "0"]).is_err());
        assert!(Cli::try_parse_from(["recast", "--listen", "nowhere"]).is_err());
    }
}
