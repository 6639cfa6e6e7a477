//! The commands besides `serve`: offline `check` and `preview` with the service's own engine, and
//! `routes list|get|delete|purge` against a running service. Each returns what to print and an
//! [`Exit`] code that scripts can rely on (see `docs/cli.md`).

pub mod config;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

use crate::json;
use crate::rules::{Limits, compile_json};
use crate::server::preview_output;
use crate::upstream::{error_chain, https_or_http};

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Done; for `check`, the rules compile.
    Ok = 0,
    /// The rules or the input have problems, or the service answered with an error.
    Problems = 1,
    /// (clap) The command line is not valid.
    Usage = 2,
    /// A file could not be read, or the service could not be reached.
    Unavailable = 3,
    /// `recast config diff --exit-code`: the file and the service differ (the process exits 2).
    Differs = 20,
}

impl Exit {
    /// The process's exit code.
    pub fn code(self) -> u8 {
        match self {
            Exit::Differs => 2,
            other => other as u8,
        }
    }
}

/// What a command prints: `stdout` on standard output, `stderr` on standard error.
#[derive(Debug)]
pub struct Outcome {
    pub exit: Exit,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Outcome {
    pub fn ok(stdout: Vec<u8>, stderr: String) -> Outcome {
        Outcome { exit: Exit::Ok, stdout, stderr }
    }

    pub fn failed(exit: Exit, stderr: String) -> Outcome {
        Outcome { exit, stdout: Vec::new(), stderr }
    }
}

/// The whole of the file `path`, or of standard input when `path` is `-` (as every command that
/// reads a file takes it).
fn read(path: &Path, what: &str) -> Result<Vec<u8>, Outcome> {
    if path == Path::new(STDIN) {
        let mut text = Vec::new();
        return match std::io::Read::read_to_end(&mut std::io::stdin(), &mut text) {
            Ok(_) => Ok(text),
            Err(e) => Err(Outcome::failed(
                Exit::Unavailable,
                format!("cannot read the {what} from standard input: {e}\n"),
            )),
        };
    }
    std::fs::read(path).map_err(|e| {
        Outcome::failed(Exit::Unavailable, format!("cannot read the {what} {}: {e}\n", path.display()))
    })
}

/// The file name that means standard input.
const STDIN: &str = "-";

/// `recast check --rules FILE`: compiles the rules and lists every problem (exit 1) or says that
/// they compile (exit 0); warnings are listed either way.
pub fn check(rules: &Path, limits: &Limits) -> Outcome {
    let text = match read(rules, "rules file") {
        Ok(text) => text,
        Err(outcome) => return outcome,
    };
    match compile_json(&text, limits) {
        Ok(compiled) => {
            let mut report = String::new();
            for warning in &compiled.warnings {
                report.push_str(&format!("warning: {warning}\n"));
            }
            let targets = compiled.plan.target_count();
            report.push_str(&format!("{}: the rules compile ({targets} targets)\n", rules.display()));
            Outcome::ok(Vec::new(), report)
        }
        Err(problems) => {
            let mut report = String::new();
            for problem in &problems {
                report.push_str(&format!("error: {problem}\n"));
            }
            report.push_str(&format!("{}: {} problem(s)\n", rules.display(), problems.len()));
            Outcome::failed(Exit::Problems, report)
        }
    }
}

/// `recast check --registration FILE`: checks a whole registration body as the service does
/// before its live call (its shape, its settings, a composed route's sources, templates and graph,
/// its rules) and lists every problem at its place in the body (exit 1), or says it is valid
/// (exit 0). It makes no call: the live call is the service's.
pub fn check_registration(file: &Path, limits: &Limits) -> Outcome {
    let text = match read(file, "registration file") {
        Ok(text) => text,
        Err(outcome) => return outcome,
    };
    let value: serde_json::Value = match serde_json::from_slice(&text) {
        Ok(value) => value,
        Err(_) => {
            let why =
                json::diagnose(&text, 127).err().map_or_else(|| "not JSON".to_owned(), |e| e.to_string());
            return Outcome::failed(Exit::Problems, format!("error: {}: not JSON: {why}\n", file.display()));
        }
    };
    let mut problems = crate::route::shape::check(&value);
    let mut sources = 0;
    if problems.is_empty() {
        match serde_json::from_value::<crate::route::Registration>(value.clone()) {
            Err(e) => problems.push(crate::rules::Problem::new("", e.to_string())),
            Ok(registration) => match registration.validate_with(false, None, limits) {
                Ok(config) => sources = config.sources.len(),
                Err(found) => problems = found,
            },
        }
    }
    let mut targets = 0;
    let mut report = String::new();
    if let Some(rules) = value.get("rulesAsString").filter(|rules| !rules.is_null()) {
        match compile_json(rules.to_string().as_bytes(), limits) {
            Ok(compiled) => {
                targets = compiled.plan.target_count();
                for warning in &compiled.warnings {
                    report.push_str(&format!(
                        "warning: /rulesAsString{}: {}\n",
                        warning.location, warning.message
                    ));
                }
            }
            Err(found) => problems.extend(
                found
                    .into_iter()
                    .map(|p| crate::rules::Problem::new(format!("/rulesAsString{}", p.location), p.message)),
            ),
        }
    }
    if problems.is_empty() {
        let what = if sources > 0 { format!("{sources} sources, ") } else { String::new() };
        report
            .push_str(&format!("{}: the registration is valid ({what}{targets} targets)\n", file.display()));
        return Outcome::ok(Vec::new(), report);
    }
    for problem in &problems {
        report.push_str(&format!("error: {}: {}\n", problem.location, problem.message));
    }
    report.push_str(&format!("{}: {} problem(s)\n", file.display(), problems.len()));
    Outcome::failed(Exit::Problems, report)
}

/// `recast preview --rules FILE --input FILE [--trace]`: maps the input with the rules, as
/// `POST /v1/preview` does, and prints the same JSON.
pub fn preview(rules: &Path, input: &Path, traced: bool, limits: &Limits) -> Outcome {
    if rules == Path::new(STDIN) && input == Path::new(STDIN) {
        return Outcome::failed(
            Exit::Unavailable,
            "only one of --rules and --input can be standard input (-)\n".to_owned(),
        );
    }
    let (rules_text, mut input_text) = match (read(rules, "rules file"), read(input, "input file")) {
        (Ok(rules), Ok(input)) => (rules, input),
        (Err(outcome), _) | (_, Err(outcome)) => return outcome,
    };
    let compiled = match compile_json(&rules_text, limits) {
        Ok(compiled) => compiled,
        Err(problems) => {
            let report: String = problems.iter().map(|p| format!("error: {p}\n")).collect();
            return Outcome::failed(
                Exit::Problems,
                format!("{report}{}: the rules do not compile\n", rules.display()),
            );
        }
    };
    // A sample that is not JSON is told by line and column, from the text as written.
    if let Err(e) = json::diagnose(&input_text, limits.max_depth) {
        let why = json::place::described(&input_text, &e);
        return Outcome::failed(
            Exit::Problems,
            format!("{}: the input is not valid JSON: {why}\n", input.display()),
        );
    }
    let mapped = json::with_parsed(&mut input_text, limits.max_depth, |nodes| {
        let mut out = preview_output(compiled, nodes, 0, None, traced)?;
        out.push(b'\n');
        Ok(out)
    });
    match mapped {
        Ok(Ok(out)) => Outcome::ok(out, String::new()),
        Ok(Err((limit, bound))) => Outcome::failed(
            Exit::Problems,
            format!(
                "{}: {} would pass {bound} {} ({})\n",
                rules.display(),
                limit.what(),
                limit.unit(),
                limit.setting()
            ),
        ),
        Err(e) => Outcome::failed(
            Exit::Problems,
            format!("{}: the input is not valid JSON: {e}\n", input.display()),
        ),
    }
}

/// A `routes` command (`recast routes ...`; its doc comments are the commands' help).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RoutesCommand {
    /// Routes, newest first, one page at a time (secrets masked).
    List {
        /// Routes per page (1 to 500; the service's default is 50).
        #[arg(long)]
        limit: Option<usize>,
        /// The `nextCursor` of the previous page.
        #[arg(long)]
        cursor: Option<String>,
    },
    /// One route (secrets masked).
    Get { uuid: String },
    /// Delete a route.
    Delete { uuid: String },
    /// Drop a route's cached answers on the service at `--url` (each node has its own cache).
    Purge { uuid: String },
    /// A route's calls, errors by problem type and latency (p50, p99) on the node at `--url`.
    Stats {
        uuid: String,
        /// Over the current minute and this many whole minutes before it (1 to 5), instead of
        /// since the route was loaded.
        #[arg(long)]
        minutes: Option<usize>,
    },
    /// Print every route of a standalone node's data directory, one sealed record per line, as
    /// stored (offline: stop the node first). For `recast routes import`.
    Export {
        /// The node's data directory.
        #[arg(long, env = crate::config::DATA_DIR, default_value = crate::config::DEFAULT_DATA_DIR)]
        data_dir: std::path::PathBuf,
        /// The node's key, if it was started with one (else its key file is used).
        #[arg(long, env = crate::config::SECRET_KEY, hide_env_values = true)]
        secret_key: Option<crate::secrets::Secret>,
        /// The node's key ring, if it was started with one (instead of --secret-key).
        #[arg(long, env = crate::config::SECRET_KEYS, hide_env_values = true)]
        secret_keys: Option<crate::secrets::Secret>,
    },
    /// Store the records of `recast routes export` in a cluster's database, as they are (each
    /// gets a revision); routes the database already has are skipped. The key must be the one
    /// they were sealed with, and the database's.
    Import {
        /// The exported records; standard input when not given or `-`.
        file: Option<std::path::PathBuf>,
        /// The cluster's database.
        #[arg(long, env = crate::config::DATABASE_URL, hide_env_values = true)]
        database_url: crate::secrets::Secret,
        /// The cluster's key (RECAST_SECRET_KEY of its nodes).
        #[arg(long, env = crate::config::SECRET_KEY, hide_env_values = true)]
        secret_key: Option<crate::secrets::Secret>,
        /// The cluster's key ring (RECAST_SECRET_KEYS of its nodes), instead of --secret-key:
        /// its keys must open the exported records, and the first seals nothing here (records
        /// are stored as they are, with the ids of the keys that sealed them).
        #[arg(long, env = crate::config::SECRET_KEYS, hide_env_values = true)]
        secret_keys: Option<crate::secrets::Secret>,
    },
}

/// `recast routes export`: every record of the data directory `dir`, one per line.
pub fn export(dir: &Path, secret: Option<&crate::secrets::Secret>) -> Outcome {
    if !dir.is_dir() {
        return Outcome::failed(Exit::Unavailable, format!("{} is not a data directory\n", dir.display()));
    }
    let store = match crate::storage::Store::open(dir, secret) {
        Ok(store) => store,
        Err(e) => return Outcome::failed(Exit::Unavailable, format!("{e}\n")),
    };
    match store.position().and_then(|position| Ok(position.is_some() || store.is_loading()?)) {
        Ok(false) => {}
        Ok(true) => {
            return Outcome::failed(
                Exit::Problems,
                format!(
                    "{} is a cluster node's snapshot; its routes are in the database already\n",
                    dir.display()
                ),
            );
        }
        Err(e) => return Outcome::failed(Exit::Unavailable, format!("{e}\n")),
    }
    let mut out = Vec::new();
    let mut count = 0;
    for record in store.records() {
        match record {
            Ok(record) => {
                out.extend_from_slice(crate::storage::record_bytes(&record));
                out.push(b'\n');
                count += 1;
            }
            Err(e) => return Outcome::failed(Exit::Unavailable, format!("{e}\n")),
        }
    }
    Outcome::ok(out, format!("{count} route(s) exported\n"))
}

/// `recast routes import`: the records of `file` (or standard input) into the database.
pub async fn import(
    file: Option<&Path>,
    url: &crate::secrets::Secret,
    key: &crate::secrets::Secret,
) -> Outcome {
    let text = match read(file.unwrap_or(Path::new(STDIN)), "export file") {
        Ok(text) => text,
        Err(outcome) => return outcome,
    };
    let records: Vec<Vec<u8>> = text
        .split(|b| *b == b'\n')
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        .map(<[u8]>::to_vec)
        .collect();
    let key = match crate::secrets::Keyring::load(Some(key), Path::new("."), false) {
        Ok(key) => key,
        Err(why) => return Outcome::failed(Exit::Usage, format!("{why}\n")),
    };
    let tasks = crate::tasks::Tasks::new(Default::default());
    let database = match crate::cluster::Database::new(url, key, Duration::from_secs(10), tasks) {
        Ok(database) => database,
        Err(why) => return Outcome::failed(Exit::Usage, format!("{why}\n")),
    };
    match database.import(&records).await {
        Ok((imported, skipped)) => Outcome::ok(
            Vec::new(),
            format!("{imported} route(s) imported, {skipped} already in the database and skipped\n"),
        ),
        Err(crate::cluster::DbError::Unavailable(why)) => {
            Outcome::failed(Exit::Unavailable, format!("{why}\n"))
        }
        Err(e) => Outcome::failed(Exit::Problems, format!("nothing was imported: {e}\n")),
    }
}

/// `recast routes ...` against the service at `url` (e.g. `http://127.0.0.1:8080`), with the
/// admin token when given. Prints the service's JSON answer; an error answer's problem goes to
/// standard error with exit 1.
pub async fn routes(url: &str, token: Option<&str>, command: &RoutesCommand) -> Outcome {
    let (method, path) = match command {
        RoutesCommand::List { limit, cursor } => {
            let mut query = Vec::new();
            if let Some(limit) = limit {
                query.push(format!("limit={limit}"));
            }
            if let Some(cursor) = cursor {
                query.push(format!("cursor={}", encoded(cursor)));
            }
            let query = if query.is_empty() { String::new() } else { format!("?{}", query.join("&")) };
            (Method::GET, format!("/v1/routes{query}"))
        }
        RoutesCommand::Get { uuid } => (Method::GET, format!("/v1/routes/{}", encoded(uuid))),
        RoutesCommand::Delete { uuid } => (Method::DELETE, format!("/v1/routes/{}", encoded(uuid))),
        RoutesCommand::Purge { uuid } => (Method::DELETE, format!("/v1/routes/{}/cache", encoded(uuid))),
        RoutesCommand::Stats { uuid, minutes } => {
            let window = minutes.map(|n| format!("?minutes={n}")).unwrap_or_default();
            (Method::GET, format!("/v1/routes/{}/stats{window}", encoded(uuid)))
        }
        RoutesCommand::Export { data_dir, secret_key, secret_keys } => {
            return match one_setting(secret_key, secret_keys) {
                Ok(keys) => export(data_dir, keys),
                Err(outcome) => outcome,
            };
        }
        RoutesCommand::Import { file, database_url, secret_key, secret_keys } => {
            return match one_setting(secret_key, secret_keys) {
                Ok(Some(keys)) => import(file.as_deref(), database_url, keys).await,
                Ok(None) => Outcome::failed(
                    Exit::Usage,
                    "give the cluster's keys: RECAST_SECRET_KEYS (--secret-keys) or RECAST_SECRET_KEY (--secret-key)\n"
                        .to_owned(),
                ),
                Err(outcome) => outcome,
            };
        }
    };
    let (status, body) = match admin_call(url, token, method, &path).await {
        Ok(answer) => answer,
        Err(outcome) => return outcome,
    };
    match status {
        StatusCode::NO_CONTENT if matches!(command, RoutesCommand::Purge { .. }) => {
            Outcome::ok(Vec::new(), "purged\n".to_owned())
        }
        StatusCode::NO_CONTENT => Outcome::ok(Vec::new(), "deleted\n".to_owned()),
        _ if status.is_success() => Outcome::ok([body.as_slice(), b"\n"].concat(), String::new()),
        _ => Outcome::failed(Exit::Problems, describe_problem(status, &body)),
    }
}

/// How long `recast keys reseal` waits for the answer (the service goes on with a re-seal whose
/// caller left only to the end of its current batch).
const RESEAL_WAIT: Duration = Duration::from_secs(3600);

/// A `keys` command (`recast keys ...`; its doc comments are the commands' help).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum KeysCommand {
    /// Which key of the ring seals and how many stored routes each key sealed (`GET /v1/keys`).
    Status,
    /// Seal every stored route again with the ring's first key, online (`POST /v1/keys/reseal`).
    Reseal {
        /// Routes re-sealed per durable write (1 to 1000; the service's default is 256).
        #[arg(long)]
        batch: Option<usize>,
    },
}

/// `recast keys ...` against the service at `url`, with the admin token when given. Prints the
/// service's JSON answer; an error answer's problem goes to standard error with exit 1.
pub async fn keys(url: &str, token: Option<&str>, command: &KeysCommand) -> Outcome {
    let (method, path) = match command {
        KeysCommand::Status => (Method::GET, "/v1/keys".to_owned()),
        KeysCommand::Reseal { batch } => (
            Method::POST,
            format!("/v1/keys/reseal{}", batch.map(|n| format!("?batch={n}")).unwrap_or_default()),
        ),
    };
    match admin_call(url, token, method, &path).await {
        Ok((status, body)) if status.is_success() => {
            Outcome::ok([body.as_slice(), b"\n"].concat(), String::new())
        }
        Ok((status, body)) => Outcome::failed(Exit::Problems, describe_problem(status, &body)),
        Err(outcome) => outcome,
    }
}

/// A `consumers` command (`recast consumers ...`; its doc comments are the commands' help).
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConsumersCommand {
    /// Create a consumer (`POST /v1/consumers`).
    Add {
        name: String,
        /// Its metadata: a JSON object, which rules and templates read as `$caller.metadata`.
        #[arg(long)]
        metadata: Option<String>,
    },
    /// List the consumers, by name, with their keys' ids and prefixes.
    List,
    /// Show one consumer.
    Get { name: String },
    /// Delete a consumer and every key it holds.
    Delete { name: String },
    /// A consumer's API keys.
    Keys {
        #[command(subcommand)]
        command: ConsumerKeysCommand,
    },
}

/// `recast consumers keys ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum ConsumerKeysCommand {
    /// Issue a key; it is printed this once (only its digest is kept).
    Add {
        consumer: String,
        /// When it stops working: an RFC 3339 time, such as 2027-01-31T00:00:00Z.
        #[arg(long)]
        expires_at: Option<String>,
    },
    /// List a consumer's keys: ids, prefixes, times; never a key.
    List { consumer: String },
    /// Revoke a key: refused from now on.
    Revoke { consumer: String, id: String },
}

/// `recast consumers ...` against the service at `url`, with the admin token when given. Prints
/// the service's JSON answer; an error answer's problem goes to standard error with exit 1.
pub async fn consumers(url: &str, token: Option<&str>, command: &ConsumersCommand) -> Outcome {
    let one = |name: &str| format!("/v1/consumers/{}", encoded(name));
    let (method, path, body) = match command {
        ConsumersCommand::Add { name, metadata } => {
            let metadata = match metadata.as_deref().map(serde_json::from_str::<serde_json::Value>) {
                None => serde_json::Value::Null,
                Some(Ok(value @ serde_json::Value::Object(_))) => value,
                Some(_) => {
                    return Outcome::failed(Exit::Usage, "--metadata must be a JSON object\n".to_owned());
                }
            };
            let body = serde_json::json!({"name": name, "metadata": metadata}).to_string();
            (Method::POST, "/v1/consumers".to_owned(), Some(body))
        }
        ConsumersCommand::List => (Method::GET, "/v1/consumers?limit=1000".to_owned(), None),
        ConsumersCommand::Get { name } => (Method::GET, one(name), None),
        ConsumersCommand::Delete { name } => (Method::DELETE, one(name), None),
        ConsumersCommand::Keys { command: ConsumerKeysCommand::Add { consumer, expires_at } } => {
            let body = serde_json::json!({"expiresAt": expires_at}).to_string();
            (Method::POST, format!("{}/keys", one(consumer)), Some(body))
        }
        ConsumersCommand::Keys { command: ConsumerKeysCommand::List { consumer } } => {
            (Method::GET, format!("{}/keys", one(consumer)), None)
        }
        ConsumersCommand::Keys { command: ConsumerKeysCommand::Revoke { consumer, id } } => {
            (Method::DELETE, format!("{}/keys/{}", one(consumer), encoded(id)), None)
        }
    };
    match admin_send(url, token, method, &path, body).await {
        Ok((StatusCode::NO_CONTENT, _)) => {
            let done = if matches!(command, ConsumersCommand::Delete { .. }) { "deleted" } else { "revoked" };
            Outcome::ok(Vec::new(), format!("{done}\n"))
        }
        Ok((status, body)) if status.is_success() => {
            let note = match command {
                ConsumersCommand::Keys { command: ConsumerKeysCommand::Add { .. } } => {
                    "the key is shown this once: keep it now (recast keeps only its digest)\n".to_owned()
                }
                _ => String::new(),
            };
            Outcome::ok([body.as_slice(), b"\n"].concat(), note)
        }
        Ok((status, body)) => Outcome::failed(Exit::Problems, describe_problem(status, &body)),
        Err(outcome) => outcome,
    }
}

/// The key ring's setting of an offline command: `--secret-keys` or `--secret-key`, not both.
fn one_setting<'a>(
    key: &'a Option<crate::secrets::Secret>,
    keys: &'a Option<crate::secrets::Secret>,
) -> Result<Option<&'a crate::secrets::Secret>, Outcome> {
    match (keys, key) {
        (Some(_), Some(_)) => Err(Outcome::failed(
            Exit::Usage,
            "RECAST_SECRET_KEYS and RECAST_SECRET_KEY are both set: give the key ring alone\n".to_owned(),
        )),
        (Some(keys), None) => Ok(Some(keys)),
        (None, key) => Ok(key.as_ref()),
    }
}

/// One request to an admin endpoint of the service at `url`: its status and body, or the outcome
/// of a request that could not be made or answered.
async fn admin_call(
    url: &str,
    token: Option<&str>,
    method: Method,
    path: &str,
) -> Result<(StatusCode, Vec<u8>), Outcome> {
    admin_send(url, token, method, path, None).await
}

/// [`admin_call`] with a JSON body.
async fn admin_send(
    url: &str,
    token: Option<&str>,
    method: Method,
    path: &str,
    body: Option<String>,
) -> Result<(StatusCode, Vec<u8>), Outcome> {
    let base = url.trim_end_matches('/');
    let mut request = Request::builder().method(method).uri(format!("{base}{path}"));
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    if let Some(token) = token {
        match HeaderValue::try_from(format!("Bearer {token}")) {
            Ok(value) => request = request.header(header::AUTHORIZATION, value),
            Err(_) => {
                return Err(Outcome::failed(
                    Exit::Usage,
                    "the token holds characters a header cannot\n".to_owned(),
                ));
            }
        }
    }
    let request = request
        .body(Full::new(body.map(Bytes::from).unwrap_or_default()))
        .map_err(|e| Outcome::failed(Exit::Usage, format!("`{url}` is not a usable service URL: {e}\n")))?;
    // A re-seal answers when it is done, which takes a while for many routes.
    let within = if path.starts_with("/v1/keys/reseal") { RESEAL_WAIT } else { Duration::from_secs(30) };
    send(request, within)
        .await
        .map_err(|why| Outcome::failed(Exit::Unavailable, format!("cannot reach recast at {url}: {why}\n")))
}

/// Characters left as they are in a path segment or query value: RFC 3986's unreserved ones.
const UNRESERVED: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// A path segment or query value as typed, with anything that would change its meaning
/// percent-encoded.
fn encoded(text: &str) -> String {
    utf8_percent_encode(text, UNRESERVED).to_string()
}

/// One line for an error answer: the problem's title and detail when it is one.
fn describe_problem(status: StatusCode, body: &[u8]) -> String {
    let problem: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let field =
        |name: &str| problem.as_ref().and_then(|p| p.get(name)).and_then(|v| v.as_str()).map(str::to_owned);
    match (field("title"), field("detail")) {
        (Some(title), Some(detail)) => format!("{status}: {title}: {detail}\n"),
        (Some(title), None) => format!("{status}: {title}\n"),
        _ => format!("{status}: {}\n", String::from_utf8_lossy(body)),
    }
}

async fn send(request: Request<Full<Bytes>>, within: Duration) -> Result<(StatusCode, Vec<u8>), String> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(5)));
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(https_or_http(http));
    let exchange = async {
        let answer = client.request(request).await.map_err(|e| error_chain(&e))?;
        let status = answer.status();
        let body = answer.into_body().collect().await.map_err(|e| error_chain(&e))?.to_bytes();
        Ok((status, body.to_vec()))
    };
    tokio::time::timeout(within, exchange)
        .await
        .map_err(|_| format!("no answer within {} s", within.as_secs()))?
}
