//! The HTTP server's life: it opens the store, loads the stored routes ([`load`]), accepts
//! connections and hands each to a worker, where the lane ([`lane`]) or hyper serves it and the
//! router ([`router`]) answers each request; on shutdown it drains and closes the store.

mod admission;
mod call;
mod compose;
mod conduct;
mod connection;
mod consumers;
mod fetched;
mod h2;
mod keys;
mod lane;
mod load;
mod management;
mod map;
mod mapping;
mod playground;
mod preview;
pub mod problem;
mod reply;
mod router;
mod routes_file;
mod single;
mod state;
mod sync;
pub mod tls;
mod traced;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU8;
use std::time::Duration;

use hyper_util::rt::TokioTimer;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use self::admission::{AdminToken, InFlight};
use self::connection::{Activity, Open};

use crate::cache::AnswerCache;
use crate::cluster::{ClusterStore, Database};
use crate::config::{Config, DEFAULT_MAX_HEADERS};
use crate::metrics::{Metrics, PanicSite};
use crate::policy::{Lookup, OutboundPolicy, SystemLookup};
use crate::storage::{StorageError, Store};
use crate::store::{LocalStore, RouteStore};
use crate::table::RouteTable;
use crate::tasks::Tasks;
use crate::upstream::UpstreamClient;
use crate::workers::Workers;
pub use conduct::{CONTROL_BURST, CONTROL_PER_SECOND};
pub use preview::preview_output;
pub use problem::ApiError;
pub use router::OPENAPI;
pub use state::{Lifecycle, REQUEST_ID, Response, SERVER_TIMING, State};
use state::{Request, RequestIds};

/// Why the service could not run.
#[derive(Debug)]
pub enum RunError {
    Storage(StorageError),
    Io(std::io::Error),
    /// Settings that recast refuses to run with.
    Config(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Storage(e) => e.fmt(f),
            RunError::Io(e) => e.fmt(f),
            RunError::Config(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for RunError {}

/// Serves HTTP on `listener` until `shutdown` completes: opens the store in the configured data
/// directory, answers health checks at once, loads and compiles every stored route (`Idle`), then
/// serves everything (`Running`). On shutdown it stops accepting, lets requests in flight finish
/// within the grace period, closes the store and returns.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let outbound = Outbound {
        policy: Arc::new(OutboundPolicy::new(&config.upstream_allow)),
        lookup: Arc::new(SystemLookup),
    };
    run_with(listener, config, outbound, shutdown).await
}

/// Where upstream calls may go and how names are resolved.
pub struct Outbound {
    pub policy: Arc<OutboundPolicy>,
    pub lookup: Arc<dyn Lookup>,
}

/// [`run`] with the outbound policy and resolver given (harnesses that must stay on loopback).
pub async fn run_with(
    listener: TcpListener,
    config: Config,
    outbound: Outbound,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let listen = listener.local_addr().map_err(RunError::Io)?;
    config.check_exposure(listen).map_err(RunError::Config)?;
    // Read before anything is opened: a CA bundle that cannot be used stops the start.
    let extra_roots = match &config.upstream_ca_file {
        Some(path) => crate::upstream::read_ca_file(path).map_err(RunError::Config)?,
        None => Vec::new(),
    };
    // HTTPS (SPEC §7): a certificate or key that cannot be served stops the start.
    let listener_tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => {
            let client_ca = config.tls_client_ca.as_deref();
            Some(Arc::new(tls::ListenerTls::new(cert, key, client_ca).map_err(RunError::Config)?))
        }
        (None, None) if config.tls_client_ca.is_some() => {
            return Err(RunError::Config(
                "RECAST_TLS_CLIENT_CA needs RECAST_TLS_CERT and RECAST_TLS_KEY: client certificates are asked for in a TLS handshake".to_owned(),
            ));
        }
        (None, None) => None,
        _ => {
            return Err(RunError::Config(
                "RECAST_TLS_CERT and RECAST_TLS_KEY go together: set both, or neither".to_owned(),
            ));
        }
    };
    let keys = config.keys().map_err(RunError::Config)?.cloned();
    if config.database_url.is_some() && keys.is_none() {
        return Err(RunError::Config(
            "RECAST_DATABASE_URL is set but RECAST_SECRET_KEYS (or RECAST_SECRET_KEY) is not: every \
             node of a cluster must unseal every route, so each needs the same keys (`recast new-key` \
             prints one)"
                .to_owned(),
        ));
    }
    // Traces: settings recast cannot follow stop the start, as any other setting's would.
    let traces = config.traces().map_err(RunError::Config)?;
    let propagate_baggage = config.propagate_baggage;
    let exporter = match traces.export.clone() {
        Some(settings) => {
            let tls = crate::upstream::collector_config(settings.certificate.as_deref())
                .map_err(RunError::Config)?;
            Some(crate::telemetry::export::Exporter::new(settings, tls))
        }
        None => None,
    };
    let metrics = Arc::new(Metrics::default());
    let tasks = Tasks::new(metrics.clone());
    // A node from a routes file (SPEC §2.5) opens no data directory and stores nothing.
    let from_file = match &config.routes_file {
        Some(_) if config.database_url.is_some() => {
            return Err(RunError::Config(
                "RECAST_ROUTES_FILE and RECAST_DATABASE_URL go apart: a node serves a routes file or a cluster's database, not both (apply the file to the cluster with `recast config apply`)".to_owned(),
            ));
        }
        Some(path) => {
            Some((Arc::new(routes_file::FileStore::new().map_err(RunError::Config)?), path.clone()))
        }
        None => None,
    };
    let local = match from_file {
        Some(_) => None,
        None => {
            let dir = config.data_dir.clone();
            let secret = keys.clone();
            let local = tasks
                .blocking(PanicSite::Loading, move || Store::open_holding_compactions(&dir, secret.as_ref()))
                .await
                .map_err(|panic| RunError::Io(std::io::Error::other(panic.to_string())))?
                .map_err(RunError::Storage)?;
            Some(Arc::new(local))
        }
    };
    let position =
        local.as_ref().map(|local| local.position()).transpose().map_err(RunError::Storage)?.flatten();
    // A new cluster node that stopped while writing its first load: no position, some records.
    let loading = local
        .as_ref()
        .map(|local| local.is_loading())
        .transpose()
        .map_err(RunError::Storage)?
        .unwrap_or(false);
    let dir_of = |local: &Option<Arc<Store>>| {
        local.as_ref().map(|local| local.dir().display().to_string()).unwrap_or_default()
    };
    let database = match &config.database_url {
        None if position.is_some() || loading => {
            return Err(RunError::Config(format!(
                "the data directory {} holds a cluster node's snapshot; start it with RECAST_DATABASE_URL, \
                 or give this standalone node another RECAST_DATA_DIR",
                dir_of(&local)
            )));
        }
        None => None,
        Some(_)
            if position.is_none()
                && !loading
                && local
                    .as_ref()
                    .map(|local| local.has_routes())
                    .transpose()
                    .map_err(RunError::Storage)?
                    == Some(true) =>
        {
            return Err(RunError::Config(format!(
                "the data directory {} holds the routes of a standalone node; move them into the \
                 database with `recast routes export` and `recast routes import`, and give this \
                 cluster node another RECAST_DATA_DIR",
                dir_of(&local)
            )));
        }
        Some(url) => {
            let key = crate::secrets::Keyring::load(keys.as_ref(), &config.data_dir, false)
                .map_err(RunError::Config)?;
            let timeout = Duration::from_millis(config.database_timeout_ms);
            Some(Arc::new(Database::new(url, key, timeout, tasks.clone()).map_err(RunError::Config)?))
        }
    };
    let store: Arc<dyn RouteStore> = match (&database, &local, &from_file) {
        (Some(database), _, _) => Arc::new(ClusterStore::new(database.clone())),
        (None, Some(local), _) => Arc::new(LocalStore::new(local.clone(), tasks.clone())),
        (None, None, Some((file_store, _))) => file_store.clone(),
        (None, None, None) => return Err(RunError::Config("no route store".to_owned())),
    };
    if let (Some(database), Some(local)) = (&database, &local) {
        // A wrong key or a newer schema stops the start here when the database answers; when it
        // does not, the node serves its snapshot and the follower checks once it does.
        let prepared = database.prepare_now().await;
        // A snapshot sealed under another ring (the cluster's key was rotated while this node
        // was away): served only once the database says this ring is the cluster's.
        if local.key_check_unverified() {
            match &prepared {
                Ok(()) => {
                    local.adopt_key_check().map_err(RunError::Storage)?;
                    tracing::info!(
                        "this node's snapshot was sealed under another key ring; the database's check opens with this one, which the snapshot now follows"
                    );
                }
                Err(crate::cluster::DbError::Fatal(_)) => {}
                Err(e) => {
                    return Err(RunError::Config(format!(
                        "no key of this node's ring opens its snapshot's key check, and the route database \
                         cannot be reached to check the ring against the cluster's ({e}); start it once the \
                         database answers"
                    )));
                }
            }
        }
        match prepared {
            Ok(()) => {}
            Err(crate::cluster::DbError::Fatal(why)) => return Err(RunError::Config(why)),
            Err(e) => tracing::warn!(
                error = %e,
                snapshot = position.map(|p| p.revision),
                "the route database cannot be reached at start; serving this node's snapshot until it can"
            ),
        }
    }
    // The client's own tasks run on this runtime, which accepts connections and runs the
    // background work: a worker busy with a mapping holds up none of them.
    let client = UpstreamClient::new(config.upstream(), outbound.policy, outbound.lookup)
        .with_tasks(tasks.clone(), tokio::runtime::Handle::current())
        .with_extra_roots(&extra_roots)
        .map_err(RunError::Config)?
        .with_recorder(exporter.as_ref().map(|(_, recorder)| recorder.clone()));
    // The exporter's task runs on this runtime, away from the workers; it is told to flush and
    // stop once the connections are done.
    let recorder = exporter.as_ref().map(|(_, recorder)| recorder.clone());
    let exporting = exporter.map(|(exporter, _)| {
        if let Some(export) = &traces.export {
            tracing::info!(collector = %export.endpoint, sampler = ?traces.sampler, "traces are exported over OTLP/HTTP");
        }
        let (flush, task) = exporter.run();
        (flush, tasks.spawn(PanicSite::Background, task))
    });
    if let Some(path) = &config.upstream_ca_file {
        tracing::info!(certificates = extra_roots.len(), file = %path.display(), "upstreams may also be certified by the authorities of RECAST_UPSTREAM_CA_FILE");
    }
    let key_sets = Arc::new(crate::callers::key_sets::KeySets::new(client.clone(), tasks.clone()));
    let state = Arc::new_cyclic(|me| State {
        door: Arc::new(crate::callers::Door::new(key_sets)),
        tls: listener_tls.clone(),
        cache: Arc::new(AnswerCache::new(config.cache_bytes)),
        me: me.clone(),
        client,
        admin: config.admin_token.as_ref().map(AdminToken::new),
        in_flight: InFlight::new(config.max_inflight),
        buffered: admission::Buffered::new(config.max_buffered_bytes),
        metrics,
        tasks: tasks.clone(),
        config,
        lifecycle: AtomicU8::new(Lifecycle::Idle as u8),
        request_ids: RequestIds::new(),
        store,
        table: if database.is_some() { RouteTable::cluster() } else { RouteTable::standalone() },
        writes: Arc::new(tokio::sync::Mutex::new(())),
        resealing: tokio::sync::Mutex::new(()),
        compilers: Arc::new(tokio::sync::Semaphore::new(crate::config::cores())),
        tracer: crate::telemetry::Tracer::new(traces.sampler, recorder).with_baggage(propagate_baggage),
    });
    match (&local, &from_file) {
        (Some(local), _) => {
            tracing::info!(state = ?Lifecycle::Idle, data = %local.dir().display(), "lifecycle");
            tracing::info!(key = %local.key_origin(), "stored routes are sealed with the secret key from");
            if local.migrated > 0 {
                tracing::info!(routes = local.migrated, "stored routes sealed with the secret key");
            }
        }
        (None, Some((_, path))) => {
            tracing::info!(state = ?Lifecycle::Idle, file = %path.display(), "lifecycle: a node from a routes file, its admin API read-only, nothing stored");
        }
        (None, None) => {}
    }
    if database.is_some() {
        tracing::info!(
            snapshot = ?position,
            "cluster mode: routes are shared through the database; this node serves its snapshot and follows the database's changes"
        );
    }
    // Said before the loader starts, so these lines come before the `Running` one.
    tracing::info!(address = %listen, https = listener_tls.is_some(), h2c = state.config.h2c && listener_tls.is_none(), json_kernel = crate::json::simd::Choice::detected().name(), "listening");
    // The certificate and key read again on SIGHUP and when they change.
    let watching_tls = listener_tls.map(|tls| tasks.spawn(PanicSite::Background, tls.watch()));
    if state.admin.is_none() && state.config.routes_file.is_some() {
        tracing::warn!(
            "RECAST_ADMIN_TOKEN is not set: anyone who can reach {listen} can read the routes of the file (secrets masked)"
        );
    } else if state.admin.is_none() {
        tracing::warn!(
            "RECAST_ADMIN_TOKEN is not set: anyone who can reach {listen} can register and change routes"
        );
    }
    tracing::info!(upstream_allow = %state.config.upstream_allow, "outbound policy: public addresses, plus");
    // Cluster mode: the node says it is alive before it serves, so its rate limits start at its
    // share, and keeps saying so; it leaves when it stops.
    let membership = match &database {
        Some(database) => {
            let membership = sync::Membership {
                database: database.clone(),
                node: uuid::Uuid::new_v4(),
                every: Duration::from_millis(state.config.heartbeat_ms),
                alive: (Duration::from_millis(state.config.heartbeat_ms) * 3)
                    .max(Duration::from_millis(state.config.heartbeat_ms + state.config.database_timeout_ms)),
                client: state.client.clone(),
            };
            membership.beat(&mut false).await;
            let (database, node) = (membership.database.clone(), membership.node);
            Some((tasks.spawn(PanicSite::Background, membership.keep()), database, node))
        }
        None => None,
    };
    // Cluster mode: the follower starts once the snapshot is loaded, and says why the node must
    // stop if it ever must.
    let (stop_node, mut must_stop) = tokio::sync::mpsc::channel::<String>(1);
    tasks.spawn(PanicSite::Background, state.client.sweeper());
    let loader = {
        let (state, local, from_file) = (state.clone(), local.clone(), from_file.clone());
        let runtime = tokio::runtime::Handle::current();
        tasks.spawn(PanicSite::Loading, async move {
            // A node from a file: loaded, and loaded again, by its own task.
            let local = match (local, from_file) {
                (Some(local), _) => local,
                (None, Some((file_store, path))) => {
                    let tasks = state.tasks.clone();
                    return Some(tasks.spawn_on(
                        &runtime,
                        PanicSite::Loading,
                        routes_file::serve(state, file_store, path),
                    ));
                }
                (None, None) => return None,
            };
            let (loaded, from) = (state.clone(), local.clone());
            // A panic here is a bug: the service stays `Idle`, not ready, rather than serve with
            // routes missing.
            if state
                .tasks
                .blocking(PanicSite::Loading, move || load::load_routes(&loaded, &from))
                .await
                .is_err()
            {
                tracing::error!("recast stays not ready: loading the stored routes failed");
                return None;
            }
            // Cluster mode: consumers follow the database; the node waits for their first
            // reading (or its failure: then it serves the copy it kept) before it serves.
            if let Some(database) = &database {
                let (first, read) = tokio::sync::oneshot::channel();
                let following = sync::follow_consumers(state.clone(), database.clone(), local.clone(), first);
                state.tasks.spawn_on(&runtime, PanicSite::Follower, following);
                let wait = Duration::from_millis(state.config.database_timeout_ms);
                drop(tokio::time::timeout(wait, read).await);
            }
            // A new cluster node (no snapshot) serves once the follower has loaded the database's
            // routes, and merges its table files once it has written them all into its store.
            if database.is_none() || position.is_some() {
                // Table files left to merge are merged from now on, in the background.
                load::resume_compactions(&local);
                // Unless a shutdown came first: then the state stays `Stopped`.
                state.advance(Lifecycle::Idle, Lifecycle::Running);
            }
            let database = database?;
            let tasks = state.tasks.clone();
            Some(tasks.spawn_on(&runtime, PanicSite::Follower, async move {
                let mut position = position;
                loop {
                    let following = sync::follow(state.clone(), database.clone(), local.clone(), position);
                    match state.tasks.guard(PanicSite::Follower, following).await {
                        Ok(why) => break drop(stop_node.send(why).await),
                        // A bug, logged and counted: the follower starts over from the snapshot.
                        Err(_) => {
                            database.status.set_up(false);
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            position = local.position().unwrap_or(position);
                        }
                    }
                }
            }))
        })
    };

    let mut http = hyper::server::conn::http1::Builder::new();
    // A client that closes its sending side while its request is served has gone away (as
    // the lane sees it too): hyper drops the request, which frees its in-flight place.
    http.timer(TokioTimer::new())
        .half_close(false)
        .max_header_size(state.config.max_header_bytes)
        // `connection::drive` times heads itself, apart from idle waits for the next request.
        .header_read_timeout(None);
    // hyper keeps up to 100 headers on the stack; more means a heap allocation per request.
    if state.config.max_headers != DEFAULT_MAX_HEADERS {
        http.max_headers(state.config.max_headers);
    }
    let http =
        Arc::new(lane::Builders { http1: http, http2: h2::builder(&state.config), h2c: state.config.h2c });
    let timeouts = connection::Timeouts {
        idle: Duration::from_millis(state.config.idle_timeout_ms),
        head: Duration::from_millis(state.config.header_timeout_ms),
    };
    let open = Arc::new(Open::default());
    let workers = Workers::start(state.config.workers()).map_err(RunError::Io)?;
    let mut connections = JoinSet::new();
    let mut fatal = None;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    // Taken off this runtime's event loop, to join the loop of the worker it goes to.
                    let stream = match stream.into_std() {
                        Ok(stream) => stream,
                        Err(e) => {
                            tracing::warn!(error = %e, "accepted connection dropped");
                            continue;
                        }
                    };
                    let activity = Activity::new();
                    let registered = open.register(&activity);
                    let (worker, placed) = workers.place();
                    let state = state.clone();
                    let http = http.clone();
                    // A panic outside any request is a bug (one in a request is answered 500
                    // there): the guard closes the connection, logs and counts it.
                    let serve = async move {
                        let _registered = registered;
                        let _placed = placed;
                        let stream = match tokio::net::TcpStream::from_std(stream) {
                            Ok(stream) => stream,
                            Err(e) => return tracing::warn!(error = %e, "accepted connection dropped"),
                        };
                        let peer = Some(peer.ip());
                        let driven = match &state.tls {
                            None => {
                                let stream = connection::ActivityStream::new(stream, activity.clone());
                                let client = router::Client::new(peer, crate::callers::Memo::default());
                                let connection = lane::Lane::new(state.clone(), stream, activity.clone(), http, client);
                                connection::drive(connection, activity, timeouts).await
                            }
                            // The handshake has the head's time to end.
                            Some(tls) => match tls.accept(stream, timeouts.head).await {
                                Err(_) => return,
                                Ok(tls::Accepted { stream, protocol: tls::Protocol::Http2, certificate }) => {
                                    let client = router::Client::new(peer, crate::callers::Memo::new(certificate));
                                    let connection = h2::connection(state.clone(), stream, activity.clone(), &http.http2, client);
                                    connection::drive(connection, activity, timeouts).await.map(|ended| ended.map_err(Into::into))
                                }
                                Ok(tls::Accepted { stream, protocol: tls::Protocol::Http1, certificate }) => {
                                    let stream = connection::ActivityStream::new(stream, activity.clone());
                                    let client = router::Client::new(peer, crate::callers::Memo::new(certificate));
                                    let connection = lane::Lane::new(state.clone(), stream, activity.clone(), http, client);
                                    connection::drive(connection, activity, timeouts).await
                                }
                            },
                        };
                        if let Some(timeout) = driven.timed_out {
                            state.metrics.timed_out(timeout);
                        }
                        match driven.output {
                            Some(Err(e)) => tracing::debug!(error = %e, "connection ended with an error"),
                            None => tracing::debug!("connection dropped after its deadline"),
                            Some(Ok(())) => {}
                        }
                    };
                    connections.spawn_on(tasks.guard(PanicSite::Connection, serve), worker);
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait a moment instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // Reap finished connection tasks so the set does not grow. A panic that escaped
            // the guard (one in a drop after it) is still a bug to count.
            Some(joined) = connections.join_next(), if !connections.is_empty() => {
                if joined.is_err_and(|e| e.is_panic()) {
                    state.metrics.panicked(PanicSite::Connection);
                    tracing::error!("a connection task panicked outside its guard");
                }
            }
            () = &mut shutdown => break,
            Some(why) = must_stop.recv() => {
                tracing::error!(error = %why, "stopping: this node cannot follow the route database");
                fatal = Some(why);
                break;
            }
        }
    }
    drop(listener);
    if let Some(watching) = watching_tls {
        watching.abort();
    }
    state.enter(Lifecycle::Stopped);
    let grace = state.config.shutdown_grace();
    // Everything below ends by then: what is still running at the end of the grace period (a
    // request, a mapping that does not yield, blocking work) is not waited for, and the process
    // exits without it.
    let stop_by = tokio::time::Instant::now() + grace;
    open.stop();
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout_at(stop_by, drained).await.is_err() {
        tracing::warn!(open = connections.len(), ?grace, "grace period over; closing what is left");
    }
    // A task is aborted where it next waits; one that is busy on its worker is left behind.
    if tokio::time::timeout_at(stop_by, connections.shutdown()).await.is_err() {
        tracing::warn!(
            open = connections.len(),
            "connections still busy at the end of the grace period are left behind"
        );
    }
    if let Some((heartbeat, database, node)) = membership {
        // Stopped and waited for, so no beat of it comes after the row is deleted.
        heartbeat.abort();
        let _ = heartbeat.await;
        match tokio::time::timeout_at(
            stop_by.max(tokio::time::Instant::now() + LEAVING),
            database.leave(node),
        )
        .await
        {
            Ok(Ok(())) => tracing::info!("left the cluster's nodes alive"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not say in the route database that this node stops; the others take its share once its heartbeat is old")
            }
            Err(_) => tracing::warn!(
                "the route database did not answer in time; the others take this node's share once its heartbeat is old"
            ),
        }
    }
    // Store writes begun by a request finish before the store is closed; blocking work that
    // outlasts the grace period (a name lookup that hangs) is not waited for.
    if tokio::time::timeout_at(stop_by, tasks.blocking(PanicSite::Background, move || workers.stop()))
        .await
        .is_err()
    {
        tracing::warn!(?grace, "work begun by requests is still running; not waiting for it");
    }
    match tokio::time::timeout_at(stop_by, loader).await {
        Err(_) => {
            // The loader holds the state; the store closes when it finishes (or the process exits).
            tracing::warn!("stopped while routes were still loading");
            flush_traces(exporting, stop_by).await;
            return fatal.map_or(Ok(()), |why| Err(RunError::Config(why)));
        }
        Ok(Ok(Ok(Some(follower)))) => {
            follower.abort();
            let _ = follower.await;
        }
        Ok(_) => {}
    }
    // Blocking work begun before the stop (a new node's snapshot, written after it became
    // ready; a store write whose caller went away) ends before the store is closed and the
    // process exits: the storage library may crash when the process exits under it.
    if !tasks.blocking_ended(stop_by.max(tokio::time::Instant::now() + LEAVING)).await {
        tracing::warn!("blocking work was still running when the grace period ended; not waiting for it");
    }
    // The store is closed here (its memory table written out, the storage library's background
    // work stopped), whatever background task still holds a reference to it, so that what the
    // log says is done is done, and the process's exit waits for nothing of it (it waited, after
    // the log said the store was closed, for the close that came when the last reference went
    // with the runtime). Done off this thread and waited for within the grace period: what the
    // store acknowledged is in its synced log either way.
    let closing = tokio::task::spawn_blocking(move || {
        let began = std::time::Instant::now();
        if let Some(local) = &local {
            local.close();
        }
        drop(state);
        drop(local);
        began.elapsed()
    });
    match tokio::time::timeout_at(stop_by.max(tokio::time::Instant::now() + LEAVING), closing).await {
        Ok(took) => {
            let took_ms = took.map(|t| t.as_millis() as u64).unwrap_or_default();
            tracing::info!(took_ms, "stopped; storage closed")
        }
        Err(_) => tracing::warn!(
            "stopped while the store was still closing; what it acknowledged is in its synced log"
        ),
    }
    flush_traces(exporting, stop_by).await;
    fatal.map_or(Ok(()), |why| Err(RunError::Config(why)))
}

/// Exports the spans still queued, last: after the store is closed, so that a collector that is
/// slow or down takes no time from anything that keeps routes safe. Within the grace period (at
/// least [`LEAVING`]); what is left then is dropped and counted.
async fn flush_traces(
    exporting: Option<(
        crate::telemetry::export::Flush,
        tokio::task::JoinHandle<Result<(), crate::tasks::Panicked>>,
    )>,
    stop_by: tokio::time::Instant,
) {
    let Some((flush, mut task)) = exporting else { return };
    flush.stop();
    let until = stop_by.max(tokio::time::Instant::now() + LEAVING);
    if tokio::time::timeout_at(until, &mut task).await.is_err() {
        task.abort();
        let lost = flush.abandon();
        tracing::warn!(
            spans = lost,
            "the trace collector did not take the last spans within the grace period"
        );
    }
}

/// How long a stopping cluster node waits for the database to take its row off, and a stopping
/// node for its store to close, when the grace period has less left.
const LEAVING: Duration = Duration::from_millis(500);
