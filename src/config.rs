//! Settings (SPEC §5): one typed struct, read in one place from `RECAST_*` environment variables,
//! each of which is also a `recast serve` flag. Tests build the struct directly.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use std::time::Duration;

use crate::policy::AllowList;
use crate::rules::Limits;
use crate::secrets::Secret;

pub const LISTEN: &str = "RECAST_LISTEN";
pub const DATA_DIR: &str = "RECAST_DATA_DIR";
pub const UPSTREAM_ALLOW: &str = "RECAST_UPSTREAM_ALLOW";
pub const UPSTREAM_CONNECT_TIMEOUT_MS: &str = "RECAST_UPSTREAM_CONNECT_TIMEOUT_MS";
pub const UPSTREAM_TIMEOUT_MS: &str = "RECAST_UPSTREAM_TIMEOUT_MS";
pub const MAX_UPSTREAM_BYTES: &str = "RECAST_MAX_UPSTREAM_BYTES";
pub const MAX_REQUEST_BYTES: &str = "RECAST_MAX_REQUEST_BYTES";
pub const MAX_RULES: &str = "RECAST_MAX_RULES";
pub const MAX_DEPTH: &str = "RECAST_MAX_DEPTH";
pub const MAX_EXPR_BYTES: &str = "RECAST_MAX_EXPR_BYTES";
pub const MAX_RESPONSE_BYTES: &str = "RECAST_MAX_RESPONSE_BYTES";
pub const MAX_MAPPING_STEPS: &str = "RECAST_MAX_MAPPING_STEPS";
pub const MAX_SOURCE_CALLS: &str = "RECAST_MAX_SOURCE_CALLS";
pub const MAX_COMPOSED_BYTES: &str = "RECAST_MAX_COMPOSED_BYTES";
pub const MAX_BUFFERED_BYTES: &str = "RECAST_MAX_BUFFERED_BYTES";
pub const SHUTDOWN_GRACE_MS: &str = "RECAST_SHUTDOWN_GRACE_MS";
pub const WORKERS: &str = "RECAST_WORKERS";
pub const LOG: &str = "RECAST_LOG";
pub const LOG_FORMAT: &str = "RECAST_LOG_FORMAT";
pub const METRICS_ROUTE_LABEL: &str = "RECAST_METRICS_ROUTE_LABEL";
pub const SECRET_KEY: &str = "RECAST_SECRET_KEY";
pub const SECRET_KEYS: &str = "RECAST_SECRET_KEYS";
pub const ADMIN_TOKEN: &str = "RECAST_ADMIN_TOKEN";
pub const MAX_INFLIGHT: &str = "RECAST_MAX_INFLIGHT";
pub const MAX_HEADER_BYTES: &str = "RECAST_MAX_HEADER_BYTES";
pub const MAX_HEADERS: &str = "RECAST_MAX_HEADERS";
pub const HEADER_TIMEOUT_MS: &str = "RECAST_HEADER_TIMEOUT_MS";
pub const IDLE_TIMEOUT_MS: &str = "RECAST_IDLE_TIMEOUT_MS";
pub const DATABASE_URL: &str = "RECAST_DATABASE_URL";
pub const ROUTES_FILE: &str = "RECAST_ROUTES_FILE";
pub const DATABASE_TIMEOUT_MS: &str = "RECAST_DATABASE_TIMEOUT_MS";
pub const SYNC_INTERVAL_MS: &str = "RECAST_SYNC_INTERVAL_MS";
pub const HEARTBEAT_MS: &str = "RECAST_HEARTBEAT_MS";
pub const MAX_STALENESS_MS: &str = "RECAST_MAX_STALENESS_MS";
pub const TOMBSTONE_RETENTION_MS: &str = "RECAST_TOMBSTONE_RETENTION_MS";
pub const UPSTREAM_COMPRESSION: &str = "RECAST_UPSTREAM_COMPRESSION";
pub const PROPAGATE_BAGGAGE: &str = "RECAST_PROPAGATE_BAGGAGE";
pub const CALLERS_REQUIRED: &str = "RECAST_CALLERS_REQUIRED";
pub const UPSTREAM_CA_FILE: &str = "RECAST_UPSTREAM_CA_FILE";
pub const UPSTREAM_HTTP2: &str = "RECAST_UPSTREAM_HTTP2";
pub const TLS_CERT: &str = "RECAST_TLS_CERT";
pub const TLS_KEY: &str = "RECAST_TLS_KEY";
pub const TLS_CLIENT_CA: &str = "RECAST_TLS_CLIENT_CA";
pub const H2C: &str = "RECAST_H2C";
pub const H2_MAX_STREAMS: &str = "RECAST_H2_MAX_STREAMS";
pub const CACHE_BYTES: &str = "RECAST_CACHE_BYTES";
pub const BREAKER_FAILURES: &str = "RECAST_BREAKER_FAILURES";
pub const BREAKER_COOLDOWN_MS: &str = "RECAST_BREAKER_COOLDOWN_MS";
// Traces take the names every OpenTelemetry SDK reads (docs/observability.md).
pub const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
pub const OTLP_TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
pub const OTLP_HEADERS: &str = "OTEL_EXPORTER_OTLP_HEADERS";
pub const OTLP_TRACES_HEADERS: &str = "OTEL_EXPORTER_OTLP_TRACES_HEADERS";
pub const OTLP_TIMEOUT: &str = "OTEL_EXPORTER_OTLP_TIMEOUT";
pub const OTLP_PROTOCOL: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
pub const OTLP_CERTIFICATE: &str = "OTEL_EXPORTER_OTLP_CERTIFICATE";
pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
pub const RESOURCE_ATTRIBUTES: &str = "OTEL_RESOURCE_ATTRIBUTES";
pub const TRACES_SAMPLER: &str = "OTEL_TRACES_SAMPLER";
pub const TRACES_SAMPLER_ARG: &str = "OTEL_TRACES_SAMPLER_ARG";
pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
pub const BSP_MAX_QUEUE_SIZE: &str = "OTEL_BSP_MAX_QUEUE_SIZE";
pub const BSP_SCHEDULE_DELAY: &str = "OTEL_BSP_SCHEDULE_DELAY";
pub const BSP_MAX_EXPORT_BATCH_SIZE: &str = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE";

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_DATA_DIR: &str = "./recast-data";
pub const DEFAULT_UPSTREAM_CONNECT_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_UPSTREAM_TIMEOUT_MS: u64 = 15_000;
pub const DEFAULT_MAX_UPSTREAM_BYTES: usize = 16 << 20;
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1 << 20;
pub const DEFAULT_MAX_RULES: usize = 1024;
pub const DEFAULT_MAX_DEPTH: usize = 64;
pub const DEFAULT_MAX_EXPR_BYTES: usize = crate::rules::DEFAULT_MAX_EXPR_BYTES;
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = crate::rules::DEFAULT_MAX_RESPONSE_BYTES;
pub const DEFAULT_MAX_MAPPING_STEPS: u64 = crate::rules::DEFAULT_MAX_MAPPING_STEPS;
pub const DEFAULT_MAX_SOURCE_CALLS: usize = crate::rules::DEFAULT_MAX_SOURCE_CALLS;
pub const DEFAULT_MAX_COMPOSED_BYTES: usize = 64 << 20;
pub const DEFAULT_MAX_BUFFERED_BYTES: usize = 1 << 30;
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 10_000;
pub const DEFAULT_LOG: &str = "info";
pub const DEFAULT_MAX_INFLIGHT: usize = 4096;
pub const DEFAULT_MAX_HEADER_BYTES: usize = 16 << 10;
pub const DEFAULT_MAX_HEADERS: usize = 100;
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
pub const DEFAULT_H2_MAX_STREAMS: u32 = 128;
pub const DEFAULT_DATABASE_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_SYNC_INTERVAL_MS: u64 = 1_000;
pub const DEFAULT_HEARTBEAT_MS: u64 = 1_000;
pub const DEFAULT_TOMBSTONE_RETENTION_MS: u64 = 7 * 24 * 3_600_000;
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;
pub const DEFAULT_BREAKER_FAILURES: u32 = 5;
pub const DEFAULT_BREAKER_COOLDOWN_MS: u64 = 5_000;
pub const DEFAULT_OTLP_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_TRACES_SAMPLER: &str = "parentbased_always_on";
pub const DEFAULT_BSP_MAX_QUEUE_SIZE: usize = 2048;
pub const DEFAULT_BSP_SCHEDULE_DELAY_MS: u64 = 5_000;
pub const DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE: usize = 512;

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

    /// Time to connect to an upstream (resolving its name, TCP and the TLS handshake), in
    /// milliseconds.
    #[arg(long, env = UPSTREAM_CONNECT_TIMEOUT_MS, default_value_t = DEFAULT_UPSTREAM_CONNECT_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_connect_timeout_ms: u64,

    /// Deadline for a whole upstream exchange (connect, send, read the answer), in milliseconds.
    #[arg(long, env = UPSTREAM_TIMEOUT_MS, default_value_t = DEFAULT_UPSTREAM_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_timeout_ms: u64,

    /// Largest upstream answer body read, in bytes, counted after decoding a gzip or br body;
    /// larger answers get 502.
    #[arg(long, env = MAX_UPSTREAM_BYTES, default_value_t = DEFAULT_MAX_UPSTREAM_BYTES)]
    pub max_upstream_bytes: usize,

    /// Whether upstreams are asked for compressed answers (`Accept-Encoding: gzip, br`); `false`
    /// asks for `identity`. gzip and br answers are decoded either way.
    #[arg(long, env = UPSTREAM_COMPRESSION, default_value_t = true, action = clap::ArgAction::Set)]
    pub upstream_compression: bool,

    /// A PEM bundle of certificate authorities every upstream (and token endpoint) may be
    /// certified by, besides the public web's roots (Mozilla's) [default: none].
    #[arg(long, env = UPSTREAM_CA_FILE)]
    pub upstream_ca_file: Option<PathBuf>,

    /// Whether `https` upstreams are offered HTTP/2 by ALPN: `auto` (they pick) or `off`
    /// (HTTP/1.1 only).
    #[arg(long, env = UPSTREAM_HTTP2, default_value = "auto", value_parser = ["auto", "off"])]
    pub upstream_http2: String,

    /// The listener's certificate chain (PEM; SPEC §7): with `RECAST_TLS_KEY`, recast serves
    /// HTTPS (TLS 1.2 and 1.3, `h2` and `http/1.1` by ALPN), reading both files again on SIGHUP
    /// and when they change [default: none: plain HTTP].
    #[arg(long, env = TLS_CERT)]
    pub tls_cert: Option<PathBuf>,

    /// The listener's private key (PEM: PKCS#8, RSA or EC), the key of `RECAST_TLS_CERT`'s first
    /// certificate [default: none].
    #[arg(long, env = TLS_KEY)]
    pub tls_key: Option<PathBuf>,

    /// The authorities (PEM) whose client certificates the listener asks for and verifies in
    /// the handshake (SPEC §7): a certificate another signed is refused there; a client without
    /// one may still call routes that do not name `certificates`. Needs `RECAST_TLS_CERT`; read
    /// again with it [default: none: no client certificate asked for].
    #[arg(long, env = TLS_CLIENT_CA)]
    pub tls_client_ca: Option<PathBuf>,

    /// Whether a plain listener also serves HTTP/2 with prior knowledge (h2c).
    #[arg(long, env = H2C, default_value_t = false, action = clap::ArgAction::Set)]
    pub h2c: bool,

    /// Most streams an HTTP/2 client may have open at once on one connection.
    #[arg(long, env = H2_MAX_STREAMS, default_value_t = DEFAULT_H2_MAX_STREAMS, value_parser = clap::value_parser!(u32).range(1..=65_535))]
    pub h2_max_streams: u32,

    /// Most bytes the cache of mapped answers holds, for all routes together (answers, keys and
    /// bookkeeping); 0 turns caching off. Only routes registered with `cache` use it.
    #[arg(long, env = CACHE_BYTES, default_value_t = DEFAULT_CACHE_BYTES)]
    pub cache_bytes: u64,

    /// Failures in a row (no connection, a broken one, the deadline passed, a 5xx answer) after
    /// which an upstream origin's breaker opens and its calls are refused with 503 at once; 0
    /// turns breakers off.
    #[arg(long, env = BREAKER_FAILURES, default_value_t = DEFAULT_BREAKER_FAILURES)]
    pub breaker_failures: u32,

    /// How long an open breaker refuses calls before one call probes the upstream, in
    /// milliseconds.
    #[arg(long, env = BREAKER_COOLDOWN_MS, default_value_t = DEFAULT_BREAKER_COOLDOWN_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub breaker_cooldown_ms: u64,

    /// Largest request body accepted, in bytes; larger bodies get 413.
    #[arg(long, env = MAX_REQUEST_BYTES, default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Most targets (`newBodyFields` entries) in one rules document.
    #[arg(long, env = MAX_RULES, default_value_t = DEFAULT_MAX_RULES)]
    pub max_rules: usize,

    /// Deepest nesting of JSON documents, and longest `parents`/`each` path in rules.
    #[arg(long, env = MAX_DEPTH, default_value_t = DEFAULT_MAX_DEPTH, value_parser = clap::value_parser!(u16).range(1..=1024).map(usize::from))]
    pub max_depth: usize,

    /// Bytes the values built by one call's expressions may take (multi-selects, sorted copies,
    /// text), each charged what writing it out takes; past it the call answers 502
    /// `mapping-limit` (a preview 422).
    #[arg(long, env = MAX_EXPR_BYTES, default_value_t = DEFAULT_MAX_EXPR_BYTES)]
    pub max_expr_bytes: usize,

    /// Bytes of the answer one call's mapping may write; past it the call answers 502
    /// `mapping-limit` (a preview 422).
    #[arg(long, env = MAX_RESPONSE_BYTES, default_value_t = DEFAULT_MAX_RESPONSE_BYTES)]
    pub max_response_bytes: usize,

    /// Steps of work one call's mapping may take (each object mapped, value compared, element
    /// built, 64 bytes of text read...); past it the call answers 502 `mapping-limit` (a preview
    /// 422). The default holds one mapping to some tens of milliseconds.
    #[arg(long, env = MAX_MAPPING_STEPS, default_value_t = DEFAULT_MAX_MAPPING_STEPS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_mapping_steps: u64,

    /// Requests one call of a composed route may send, retries counted (SPEC §2.3); a
    /// composition whose worst case sends more is refused at registration.
    #[arg(long, env = MAX_SOURCE_CALLS, default_value_t = DEFAULT_MAX_SOURCE_CALLS, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub max_source_calls: usize,

    /// Bytes all the upstream answers of one call of a composed route may take together; past
    /// it the call answers 502 `mapping-limit`.
    #[arg(long, env = MAX_COMPOSED_BYTES, default_value_t = DEFAULT_MAX_COMPOSED_BYTES)]
    pub max_composed_bytes: usize,

    /// Bytes of upstream answers all calls may hold at once (from an answer's arrival until its
    /// call has answered); past it new route calls answer 503 with `Retry-After`.
    #[arg(long, env = MAX_BUFFERED_BYTES, default_value_t = DEFAULT_MAX_BUFFERED_BYTES)]
    pub max_buffered_bytes: usize,

    /// How long in-flight requests may take to finish after SIGTERM/SIGINT, in milliseconds.
    #[arg(long, env = SHUTDOWN_GRACE_MS, default_value_t = DEFAULT_SHUTDOWN_GRACE_MS)]
    pub shutdown_grace_ms: u64,

    /// Threads serving connections, each with its own event loop [default: number of cores].
    #[arg(long, env = WORKERS, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub workers: Option<usize>,

    /// Log filter, e.g. `info`, `debug`, `recast=trace`.
    #[arg(long, env = LOG, default_value = DEFAULT_LOG)]
    pub log: String,

    /// Log line format.
    #[arg(long, env = LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// What `recast_requests_total` names a route call by: `uuid`, its route's (a series per
    /// route and status), or `none` (every route's answers summed under `route="all_routes"`).
    #[arg(long, env = METRICS_ROUTE_LABEL, value_enum, default_value_t = RouteLabel::Uuid)]
    pub metrics_route_label: RouteLabel,

    /// Key that seals stored routes and their credentials: 64 hex digits (`recast new-key`).
    /// Unset: a key file `secret.key` is created in the data directory (mode 0600).
    #[arg(long, env = SECRET_KEY, hide_env_values = true)]
    pub secret_key: Option<Secret>,

    /// The key ring: a comma list of keys of 64 hex digits. The first seals stored routes, every
    /// one opens them; to rotate, put a new key first, restart, re-seal (`POST /v1/keys/reseal`),
    /// then drop the old key. Instead of RECAST_SECRET_KEY, never with it.
    #[arg(long, env = SECRET_KEYS, hide_env_values = true)]
    pub secret_keys: Option<Secret>,

    /// Bearer token that the admin endpoints (`/v1/mapping`, `/v1/routes...`) require.
    /// Unset: they are open, which recast allows only on a loopback listen address.
    #[arg(long, env = ADMIN_TOKEN, hide_env_values = true)]
    pub admin_token: Option<Secret>,

    /// Most requests served at once; above it, 503 with `Retry-After` at once (`/healthz` and
    /// `/readyz` are exempt).
    #[arg(long, env = MAX_INFLIGHT, default_value_t = DEFAULT_MAX_INFLIGHT, value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub max_inflight: usize,

    /// Largest request head (request line and headers), in bytes; larger gets 431.
    #[arg(long, env = MAX_HEADER_BYTES, default_value_t = DEFAULT_MAX_HEADER_BYTES, value_parser = clap::value_parser!(u32).range(1024..).map(|n| n as usize))]
    pub max_header_bytes: usize,

    /// Most headers in a request; more gets 431.
    #[arg(long, env = MAX_HEADERS, default_value_t = DEFAULT_MAX_HEADERS, value_parser = clap::value_parser!(u16).range(1..).map(usize::from))]
    pub max_headers: usize,

    /// Time a client has to send a whole request head, in milliseconds (against slow clients).
    #[arg(long, env = HEADER_TIMEOUT_MS, default_value_t = DEFAULT_HEADER_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout_ms: u64,

    /// Time an idle keep-alive connection stays open, in milliseconds.
    #[arg(long, env = IDLE_TIMEOUT_MS, default_value_t = DEFAULT_IDLE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_ms: u64,

    /// Cluster mode: the PostgreSQL database that holds every node's routes, as a `postgres://`
    /// URL (`sslmode=require` for TLS). Unset: routes live in the data directory's RocksDB alone.
    /// Set: the database is the source of truth and the data directory holds this node's
    /// snapshot; RECAST_SECRET_KEY is then required.
    #[arg(long, env = DATABASE_URL, hide_env_values = true)]
    pub database_url: Option<Secret>,

    /// A node from a file (SPEC §2.5): the routes file (YAML or JSON) whose routes and consumers
    /// this node serves, compiled at start with no live call and nothing stored (no data
    /// directory is opened); its admin API is read-only. Read again on SIGHUP and when it
    /// changes; a file with any problem keeps the routes that serve [default: none].
    #[arg(long, env = ROUTES_FILE)]
    pub routes_file: Option<PathBuf>,

    /// Cluster mode: time to connect to the database and for each statement, in milliseconds; a
    /// connection that does not answer within it is dropped and made again.
    #[arg(long, env = DATABASE_TIMEOUT_MS, default_value_t = DEFAULT_DATABASE_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub database_timeout_ms: u64,

    /// Cluster mode: how often a node checks the database for changes it was not told of, in
    /// milliseconds (a lost notification costs at most this long).
    #[arg(long, env = SYNC_INTERVAL_MS, default_value_t = DEFAULT_SYNC_INTERVAL_MS, value_parser = clap::value_parser!(u64).range(10..))]
    pub sync_interval_ms: u64,

    /// Cluster mode: how often a node says in the database that it is alive, in milliseconds. A
    /// node not heard of for three times this long (and at least this plus
    /// `RECAST_DATABASE_TIMEOUT_MS`) is gone, and the others take its share of every outbound
    /// rate limit.
    #[arg(long, env = HEARTBEAT_MS, default_value_t = DEFAULT_HEARTBEAT_MS, value_parser = clap::value_parser!(u64).range(100..))]
    pub heartbeat_ms: u64,

    /// Cluster mode: how long a node may be cut off from the database before `/readyz` answers
    /// 503, in milliseconds [default: never; the node keeps serving the routes it has].
    #[arg(long, env = MAX_STALENESS_MS)]
    pub max_staleness_ms: Option<u64>,

    /// Cluster mode: how long the database keeps a deleted route's tombstone, in milliseconds. A
    /// node that was away longer reloads every route once.
    #[arg(long, env = TOMBSTONE_RETENTION_MS, default_value_t = DEFAULT_TOMBSTONE_RETENTION_MS)]
    pub tombstone_retention_ms: u64,

    /// Traces: the OTLP/HTTP collector spans are sent to, `/v1/traces` added to its path (e.g.
    /// `http://localhost:4318`). Unset, with no traces endpoint either: nothing is exported, and
    /// `traceparent` is still read and passed on to upstreams.
    #[arg(long, env = OTLP_ENDPOINT)]
    pub otel_exporter_otlp_endpoint: Option<String>,

    /// Traces: the full URL spans are sent to, taken as written; wins over the endpoint above.
    #[arg(long, env = OTLP_TRACES_ENDPOINT)]
    pub otel_exporter_otlp_traces_endpoint: Option<String>,

    /// Traces: headers of every export, `name=value` pairs separated by commas, values
    /// percent-encoded (e.g. `x-honeycomb-team=KEY`).
    #[arg(long, env = OTLP_HEADERS, hide_env_values = true)]
    pub otel_exporter_otlp_headers: Option<Secret>,

    /// Traces: headers of every export, as above; a name given in both takes this value.
    #[arg(long, env = OTLP_TRACES_HEADERS, hide_env_values = true)]
    pub otel_exporter_otlp_traces_headers: Option<Secret>,

    /// Traces: time one export may take, in milliseconds; a slower collector loses that batch.
    #[arg(long, env = OTLP_TIMEOUT, default_value_t = DEFAULT_OTLP_TIMEOUT_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub otel_exporter_otlp_timeout: u64,

    /// Traces: the OTLP transport; only `http/protobuf` is spoken [default: http/protobuf].
    #[arg(long, env = OTLP_PROTOCOL)]
    pub otel_exporter_otlp_protocol: Option<String>,

    /// Traces: a PEM bundle of certificate authorities an `https` collector may be certified by,
    /// besides the public web's roots.
    #[arg(long, env = OTLP_CERTIFICATE)]
    pub otel_exporter_otlp_certificate: Option<PathBuf>,

    /// Traces: the `service.name` of every span [default: a `service.name` of
    /// OTEL_RESOURCE_ATTRIBUTES, else `recast`].
    #[arg(long, env = SERVICE_NAME)]
    pub otel_service_name: Option<String>,

    /// Traces: more resource attributes, `key=value` pairs separated by commas, values
    /// percent-encoded (e.g. `deployment.environment.name=prod`).
    #[arg(long, env = RESOURCE_ATTRIBUTES)]
    pub otel_resource_attributes: Option<String>,

    /// Traces: which traces are recorded: `parentbased_always_on`, `parentbased_always_off`,
    /// `parentbased_traceidratio`, `always_on`, `always_off` or `traceidratio`.
    #[arg(long, env = TRACES_SAMPLER, default_value = DEFAULT_TRACES_SAMPLER)]
    pub otel_traces_sampler: String,

    /// Traces: the ratio of the `traceidratio` samplers, 0 to 1 [default: 1].
    #[arg(long, env = TRACES_SAMPLER_ARG)]
    pub otel_traces_sampler_arg: Option<String>,

    /// Whether a caller's W3C `baggage` is passed on to upstreams (SPEC §2.2); its
    /// `traceparent` context and `tracestate` always are.
    #[arg(long, env = PROPAGATE_BAGGAGE, default_value_t = false, action = clap::ArgAction::Set)]
    pub propagate_baggage: bool,

    /// Whether every registration and update must say who may call the route (`callers`, or
    /// `"callers": "open"` on purpose; SPEC §2.4).
    #[arg(long, env = CALLERS_REQUIRED, default_value_t = false, action = clap::ArgAction::Set)]
    pub callers_required: bool,

    /// Traces: `true` records and exports no span whatever the endpoint (`traceparent` is still
    /// passed on).
    #[arg(long, env = SDK_DISABLED, default_value_t = false, action = clap::ArgAction::Set, value_parser = parse_otel_bool)]
    pub otel_sdk_disabled: bool,

    /// Traces: most spans waiting to be exported; more are dropped and counted.
    #[arg(long, env = BSP_MAX_QUEUE_SIZE, default_value_t = DEFAULT_BSP_MAX_QUEUE_SIZE, value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub otel_bsp_max_queue_size: usize,

    /// Traces: longest wait between two exports, in milliseconds.
    #[arg(long, env = BSP_SCHEDULE_DELAY, default_value_t = DEFAULT_BSP_SCHEDULE_DELAY_MS, value_parser = clap::value_parser!(u64).range(1..))]
    pub otel_bsp_schedule_delay: u64,

    /// Traces: most spans in one export (a fuller queue is exported at once).
    #[arg(long, env = BSP_MAX_EXPORT_BATCH_SIZE, default_value_t = DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE, value_parser = clap::value_parser!(u32).range(1..).map(|n| n as usize))]
    pub otel_bsp_max_export_batch_size: usize,
}

/// `true` or `false` in any case, as OpenTelemetry's boolean settings are written.
fn parse_otel_bool(text: &str) -> Result<bool, String> {
    match text.trim() {
        t if t.eq_ignore_ascii_case("true") => Ok(true),
        t if t.eq_ignore_ascii_case("false") || t.is_empty() => Ok(false),
        other => Err(format!("`{other}` is neither true nor false")),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How `/metrics` labels the answers of route calls (`RECAST_METRICS_ROUTE_LABEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RouteLabel {
    /// By the route's uuid: a series per route and status.
    Uuid,
    /// All routes together, `route="all_routes"`: a series per status, however many routes.
    None,
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
            upstream_compression: true,
            upstream_ca_file: None,
            upstream_http2: "auto".to_owned(),
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            routes_file: None,
            h2c: false,
            h2_max_streams: DEFAULT_H2_MAX_STREAMS,
            cache_bytes: DEFAULT_CACHE_BYTES,
            breaker_failures: DEFAULT_BREAKER_FAILURES,
            breaker_cooldown_ms: DEFAULT_BREAKER_COOLDOWN_MS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_rules: DEFAULT_MAX_RULES,
            max_depth: DEFAULT_MAX_DEPTH,
            max_expr_bytes: DEFAULT_MAX_EXPR_BYTES,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            max_mapping_steps: DEFAULT_MAX_MAPPING_STEPS,
            max_source_calls: DEFAULT_MAX_SOURCE_CALLS,
            max_composed_bytes: DEFAULT_MAX_COMPOSED_BYTES,
            max_buffered_bytes: DEFAULT_MAX_BUFFERED_BYTES,
            shutdown_grace_ms: DEFAULT_SHUTDOWN_GRACE_MS,
            workers: None,
            log: DEFAULT_LOG.to_owned(),
            log_format: LogFormat::Text,
            metrics_route_label: RouteLabel::Uuid,
            secret_key: None,
            secret_keys: None,
            admin_token: None,
            max_inflight: DEFAULT_MAX_INFLIGHT,
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            header_timeout_ms: DEFAULT_HEADER_TIMEOUT_MS,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            database_url: None,
            database_timeout_ms: DEFAULT_DATABASE_TIMEOUT_MS,
            sync_interval_ms: DEFAULT_SYNC_INTERVAL_MS,
            heartbeat_ms: DEFAULT_HEARTBEAT_MS,
            max_staleness_ms: None,
            tombstone_retention_ms: DEFAULT_TOMBSTONE_RETENTION_MS,
            otel_exporter_otlp_endpoint: None,
            otel_exporter_otlp_traces_endpoint: None,
            otel_exporter_otlp_headers: None,
            otel_exporter_otlp_traces_headers: None,
            otel_exporter_otlp_timeout: DEFAULT_OTLP_TIMEOUT_MS,
            otel_exporter_otlp_protocol: None,
            otel_exporter_otlp_certificate: None,
            otel_service_name: None,
            otel_resource_attributes: None,
            otel_traces_sampler: DEFAULT_TRACES_SAMPLER.to_owned(),
            otel_traces_sampler_arg: None,
            propagate_baggage: false,
            callers_required: false,
            otel_sdk_disabled: false,
            otel_bsp_max_queue_size: DEFAULT_BSP_MAX_QUEUE_SIZE,
            otel_bsp_schedule_delay: DEFAULT_BSP_SCHEDULE_DELAY_MS,
            otel_bsp_max_export_batch_size: DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE,
        }
    }
}

impl Config {
    /// The limits rules are compiled under.
    pub fn limits(&self) -> Limits {
        Limits {
            max_rules: self.max_rules,
            max_depth: self.max_depth,
            max_expr_bytes: self.max_expr_bytes,
            max_response_bytes: self.max_response_bytes,
            max_mapping_steps: self.max_mapping_steps,
            max_source_calls: self.max_source_calls,
        }
    }

    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }

    /// Refuses to serve on `listen` with open admin endpoints unless it is a loopback address
    /// (SPEC §5), and refuses an empty admin token.
    /// The key ring's setting: `RECAST_SECRET_KEYS`, or `RECAST_SECRET_KEY` as a ring of one;
    /// `None` for the data directory's key file. Both set is refused.
    pub fn keys(&self) -> Result<Option<&Secret>, String> {
        match (&self.secret_keys, &self.secret_key) {
            (Some(_), Some(_)) => Err(format!(
                "{SECRET_KEYS} and {SECRET_KEY} are both set: give the key ring in {SECRET_KEYS} alone \
                 (its first key seals)"
            )),
            (Some(ring), None) => Ok(Some(ring)),
            (None, key) => Ok(key.as_ref()),
        }
    }

    /// Checks `RECAST_LOG` before the log is set up: a word that is neither a level nor
    /// recast's own target would be read as the name of another target, and every line recast
    /// writes would be dropped, its errors included. Such a filter stops the start instead.
    pub fn check_log_filter(&self) -> Result<(), String> {
        check_log_filter(&self.log)
    }

    pub fn check_exposure(&self, listen: SocketAddr) -> Result<(), String> {
        match &self.admin_token {
            Some(token) if token.expose().trim().is_empty() => {
                Err("RECAST_ADMIN_TOKEN is set but empty; give it a value or unset it".to_owned())
            }
            Some(_) => Ok(()),
            None if is_loopback(listen.ip()) => Ok(()),
            None => Err(format!(
                "recast would listen on {listen}, which is not a loopback address, with its admin \
                 endpoints open; set RECAST_ADMIN_TOKEN (or listen on 127.0.0.1)"
            )),
        }
    }

    /// The settings of the upstream client.
    pub fn upstream(&self) -> crate::upstream::UpstreamSettings {
        crate::upstream::UpstreamSettings {
            connect_timeout: Duration::from_millis(self.upstream_connect_timeout_ms),
            total_timeout: Duration::from_millis(self.upstream_timeout_ms),
            max_body: self.max_upstream_bytes,
            compression: self.upstream_compression,
            workers: self.workers(),
            breaker: crate::upstream::BreakerSettings {
                failures: self.breaker_failures,
                cooldown: Duration::from_millis(self.breaker_cooldown_ms),
            },
            http2: self.upstream_http2 != "off",
        }
    }

    /// The trace settings (`OTEL_*`), or why recast cannot follow them.
    pub fn traces(&self) -> Result<crate::telemetry::TraceSettings, String> {
        crate::telemetry::TraceSettings::read(&crate::telemetry::settings::Given {
            endpoint: self.otel_exporter_otlp_endpoint.as_deref(),
            traces_endpoint: self.otel_exporter_otlp_traces_endpoint.as_deref(),
            headers: self.otel_exporter_otlp_headers.as_ref().map(Secret::expose),
            traces_headers: self.otel_exporter_otlp_traces_headers.as_ref().map(Secret::expose),
            timeout_ms: self.otel_exporter_otlp_timeout,
            protocol: self.otel_exporter_otlp_protocol.as_deref(),
            certificate: self.otel_exporter_otlp_certificate.as_deref(),
            service_name: self.otel_service_name.as_deref(),
            resource_attributes: self.otel_resource_attributes.as_deref(),
            sampler: &self.otel_traces_sampler,
            sampler_arg: self.otel_traces_sampler_arg.as_deref(),
            disabled: self.otel_sdk_disabled,
            max_queue: self.otel_bsp_max_queue_size,
            schedule_delay_ms: self.otel_bsp_schedule_delay,
            max_batch: self.otel_bsp_max_export_batch_size,
        })
    }

    /// How many threads serve connections: `RECAST_WORKERS`, or one per core.
    pub fn workers(&self) -> usize {
        self.workers.unwrap_or_else(cores)
    }
}

/// The number of cores recast may run on (1 if that cannot be told).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// 127.0.0.0/8, ::1, or an IPv4-mapped loopback address (`::ffff:127.0.0.1`).
pub(crate) fn is_loopback(ip: std::net::IpAddr) -> bool {
    match ip {
        std::net::IpAddr::V4(v4) => v4.is_loopback(),
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(v6.is_loopback(), |v4| v4.is_loopback()),
    }
}

/// The level words of a log filter.
const LOG_LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// [`Config::check_log_filter`] of a filter's text: each of its comma-separated directives is a
/// level, `target=level`, or recast's own target (`recast`, `recast::server`).
pub fn check_log_filter(text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err(format!(
            "RECAST_LOG is empty, which would silence every line: give a level ({})",
            LOG_LEVELS.join(", ")
        ));
    }
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if directive.contains('=') || directive.contains('[') {
            continue;
        }
        let word = directive.to_ascii_lowercase();
        if LOG_LEVELS.contains(&word.as_str()) || word == "recast" || word.starts_with("recast::") {
            continue;
        }
        let meant = crate::suggest::closest(&word, LOG_LEVELS.iter().copied())
            .map(|level| format!(" (did you mean `{level}`?)"))
            .unwrap_or_default();
        return Err(format!(
            "RECAST_LOG: `{directive}` is neither a level ({}) nor `target=level`, and as a target of its own it would silence every line recast writes{meant}",
            LOG_LEVELS.join(", ")
        ));
    }
    Ok(())
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
            MAX_EXPR_BYTES,
            MAX_RESPONSE_BYTES,
            MAX_MAPPING_STEPS,
            MAX_SOURCE_CALLS,
            MAX_COMPOSED_BYTES,
            MAX_BUFFERED_BYTES,
            SHUTDOWN_GRACE_MS,
            WORKERS,
            LOG,
            LOG_FORMAT,
            METRICS_ROUTE_LABEL,
            SECRET_KEY,
            SECRET_KEYS,
            ADMIN_TOKEN,
            MAX_INFLIGHT,
            MAX_HEADER_BYTES,
            MAX_HEADERS,
            HEADER_TIMEOUT_MS,
            IDLE_TIMEOUT_MS,
            DATABASE_URL,
            ROUTES_FILE,
            DATABASE_TIMEOUT_MS,
            SYNC_INTERVAL_MS,
            HEARTBEAT_MS,
            MAX_STALENESS_MS,
            TOMBSTONE_RETENTION_MS,
            UPSTREAM_COMPRESSION,
            UPSTREAM_CA_FILE,
            UPSTREAM_HTTP2,
            TLS_CERT,
            TLS_KEY,
            TLS_CLIENT_CA,
            H2C,
            H2_MAX_STREAMS,
            CACHE_BYTES,
            BREAKER_FAILURES,
            BREAKER_COOLDOWN_MS,
            OTLP_ENDPOINT,
            OTLP_TRACES_ENDPOINT,
            OTLP_HEADERS,
            OTLP_TRACES_HEADERS,
            OTLP_TIMEOUT,
            OTLP_PROTOCOL,
            OTLP_CERTIFICATE,
            SERVICE_NAME,
            RESOURCE_ATTRIBUTES,
            TRACES_SAMPLER,
            TRACES_SAMPLER_ARG,
            SDK_DISABLED,
            PROPAGATE_BAGGAGE,
            CALLERS_REQUIRED,
            BSP_MAX_QUEUE_SIZE,
            BSP_SCHEDULE_DELAY,
            BSP_MAX_EXPORT_BATCH_SIZE,
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
            "--upstream-compression",
            "false",
            "--cache-bytes",
            "0",
        ]);
        assert_eq!(cli.config.listen.port(), 0);
        assert_eq!(cli.config.max_depth, 8);
        assert_eq!(cli.config.log_format, LogFormat::Json);
        assert!(!cli.config.upstream().compression);
        assert_eq!(cli.config.cache_bytes, 0);
        let defaults = Cli::parse_from(["recast"]).config;
        assert!(defaults.upstream().compression);
        assert_eq!(defaults.cache_bytes, 256 << 20);
        assert!(Cli::try_parse_from(["recast", "--upstream-compression", "maybe"]).is_err());
        assert!(Cli::try_parse_from(["recast", "--max-depth", "0"]).is_err());
        assert!(Cli::try_parse_from(["recast", "--workers", "0"]).is_err());
        assert!(Cli::try_parse_from(["recast", "--listen", "nowhere"]).is_err());
    }

    #[test]
    fn a_log_filter_that_would_silence_recast_is_refused() {
        for good in ["info", "WARN", "recast=debug,hyper=warn", "debug,recast::server=trace", "recast", "off"]
        {
            assert_eq!(check_log_filter(good), Ok(()), "{good}");
        }
        let refused = check_log_filter("verbose").unwrap_err();
        assert!(refused.starts_with("RECAST_LOG: `verbose` is neither a level"), "{refused}");
        assert!(check_log_filter("recast=debug,infoo").unwrap_err().contains("did you mean `info`?"));
        assert!(check_log_filter(" ").unwrap_err().contains("RECAST_LOG is empty"));
    }
}
