//! Route management (SPEC §2): `GET /v1/routes` (newest first, paginated), `GET` and `DELETE`
//! `/v1/routes/{uuid}`. Secrets are never shown: a stored token reads `"***"`.

use std::collections::BTreeMap;

use http::StatusCode;
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use super::reply::json;
use super::{ApiError, Response, State};
use crate::logging::logged;
use crate::route::{Auth, CacheSettings, LockedRoute, MASK, Route};
use crate::storage::Cursor;
use crate::table::Entry;
use crate::upstream::BreakerScope;

/// Routes per page when `limit` is not given, and the most a page may hold.
const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 500;

/// Routes a filtered listing reads at most per request: past it, the page ends early with a
/// `nextCursor` that goes on from there.
const MAX_SCANNED: usize = 5000;

/// What a listing keeps: routes whose path, and whose upstream host (or a source's), hold the
/// given texts, in any case.
#[derive(Default)]
struct Filter {
    path: Option<String>,
    host: Option<String>,
    /// SPEC §2.5: the route's `owner`, exactly.
    owner: Option<String>,
    /// SPEC §2.5: the route's `name`, exactly.
    name: Option<String>,
}

impl Filter {
    fn is_empty(&self) -> bool {
        self.path.is_none() && self.host.is_none() && self.owner.is_none() && self.name.is_none()
    }

    fn keeps(&self, entry: &Entry) -> bool {
        // A locked route's path and upstream are unknown: it matches no filter.
        let Entry::Route(route) = entry else { return self.is_empty() };
        let holds = |text: &str, part: &str| text.to_ascii_lowercase().contains(part);
        let host = |base: &str| url::Url::parse(base).ok().and_then(|u| u.host_str().map(str::to_owned));
        let exactly = |wanted: &Option<String>, has: &Option<String>| {
            wanted.as_deref().is_none_or(|wanted| has.as_deref() == Some(wanted))
        };
        exactly(&self.owner, &route.config.owner)
            && exactly(&self.name, &route.config.name)
            && self.path.as_deref().is_none_or(|part| holds(&route.config.path, part))
            && self.host.as_deref().is_none_or(|part| {
                std::iter::once(route.config.base_url.as_str())
                    .chain(route.config.sources.iter().map(|source| source.base_url.as_str()))
                    .filter_map(host)
                    .any(|host| holds(&host, part))
            })
    }
}

pub(super) async fn list(state: &State, query: Option<&str>) -> Result<Response, ApiError> {
    state.loaded()?;
    let (mut limit, mut cursor) = (DEFAULT_LIMIT, None);
    let mut filter = Filter::default();
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        match &*name {
            "limit" => {
                limit = value.parse().ok().filter(|n| (1..=MAX_LIMIT).contains(n)).ok_or_else(|| {
                    ApiError::InvalidQuery(format!("`limit` must be a number from 1 to {MAX_LIMIT}"))
                })?
            }
            "cursor" => {
                cursor = Some(Cursor::parse(&value).ok_or_else(|| {
                    ApiError::InvalidQuery("`cursor` must be a `nextCursor` of an earlier page".to_owned())
                })?)
            }
            "path" | "host" | "owner" | "name" if value.len() > 256 => {
                return Err(ApiError::InvalidQuery(format!("`{name}` may hold at most 256 bytes")));
            }
            "path" if !value.is_empty() => filter.path = Some(value.to_ascii_lowercase()),
            "host" if !value.is_empty() => filter.host = Some(value.to_ascii_lowercase()),
            "owner" if !value.is_empty() => filter.owner = Some(value.into_owned()),
            "name" if !value.is_empty() => filter.name = Some(value.into_owned()),
            _ => {}
        }
    }
    let limits = state.config.limits();
    let route_of = |stored: crate::storage::StoredRoute| {
        state.table.get(&stored.uuid).or_else(|| Route::from_stored(stored, &limits).ok().map(Entry::from))
    };
    let (routes, next) = if let Some(name) = &filter.name {
        // Names are unique: the table answers at once, however many routes there are.
        let mut named = None;
        state.table.for_each(|entry| {
            if entry.route().is_some_and(|route| route.config.name.as_ref() == Some(name))
                && filter.keeps(entry)
            {
                named = Some(entry.clone());
            }
        });
        (named.into_iter().collect(), None)
    } else if filter.is_empty() {
        let page = state.stored(state.store.page(limit, cursor).await)?;
        (page.stored.into_iter().filter_map(route_of).collect::<Vec<_>>(), page.next)
    } else {
        // Pages read until `limit` routes are kept, the routes end, or `MAX_SCANNED` were read.
        let (mut kept, mut scanned) = (Vec::new(), 0);
        let next = 'pages: loop {
            let page = state.stored(state.store.page(MAX_LIMIT, cursor.take()).await)?;
            let (count, more) = (page.stored.len(), page.next.is_some());
            for (i, stored) in page.stored.into_iter().enumerate() {
                scanned += 1;
                let at = Cursor::after(stored.created_at, stored.uuid);
                if let Some(route) = route_of(stored).filter(|entry| filter.keeps(entry)) {
                    kept.push(route);
                }
                if kept.len() == limit || scanned >= MAX_SCANNED {
                    // The next page goes on after this route, unless it was the last.
                    break 'pages (i + 1 < count || more).then_some(at);
                }
            }
            match page.next.as_deref().and_then(Cursor::parse) {
                Some(after) => cursor = Some(after),
                None => break None,
            }
        };
        (kept, next)
    };
    let views = routes.iter().map(|entry| View::of(entry, Shown::Masked)).collect::<Result<Vec<_>, _>>()?;
    let body = serde_json::to_vec(&Listing { routes: views, next_cursor: next.as_deref() })
        .map_err(|e| ApiError::Storage(e.to_string()))?;
    Ok(json(StatusCode::OK, body))
}

pub(super) fn show(state: &State, uuid: Uuid) -> Result<Response, ApiError> {
    state.loaded()?;
    let route = state.table.get(&uuid).ok_or(ApiError::NotFound)?;
    let body = serde_json::to_vec(&View::of(&route, Shown::Masked)?)
        .map_err(|e| ApiError::Storage(e.to_string()))?;
    let mut response = json(StatusCode::OK, body);
    if let Ok(tag) = http::HeaderValue::try_from(super::reply::etag(&route)) {
        response.headers_mut().insert(http::header::ETAG, tag);
    }
    Ok(response)
}

pub(super) async fn delete(
    state: &State,
    uuid: Uuid,
    headers: &http::HeaderMap,
) -> Result<Response, ApiError> {
    state.loaded()?;
    let _writing = state.writes.lock().await;
    // With `If-Match`, only the version it names is deleted: checked here against this node's
    // copy, and by the store as it deletes (in a cluster, the database may hold a newer one).
    let mut version = None;
    if headers.contains_key(http::header::IF_MATCH) {
        let route = state.table.get(&uuid).ok_or(ApiError::NotFound)?;
        super::reply::if_match(headers, &route)?;
        version = Some(route.revision());
    }
    // The store decides whether there is such a route (in a cluster, it may be there before this
    // node has it). Gone from the store first: once the answer says so, no restart brings it back.
    let revision = state.stored(state.store.delete(uuid, version).await)?;
    state.table.delete(uuid, revision);
    state.cache.drop_route(uuid);
    logged!(tracing::Level::INFO, %uuid, "route deleted");
    let mut response = json(StatusCode::NO_CONTENT, "");
    response.headers_mut().remove(http::header::CONTENT_TYPE);
    Ok(response)
}

/// `DELETE /v1/routes/{uuid}/cache`: drops the route's cached answers on this node, and keeps
/// the upstream calls under way from storing theirs; the next call goes upstream.
pub(super) fn purge(state: &State, uuid: Uuid) -> Result<Response, ApiError> {
    state.loaded()?;
    match state.table.get(&uuid).ok_or(ApiError::NotFound)? {
        Entry::Route(_) => {}
        Entry::Locked(locked) => return Err(locked_refusal(&locked)),
    }
    state.cache.drop_route(uuid);
    logged!(tracing::Level::INFO, %uuid, "cached answers purged");
    let mut response = json(StatusCode::NO_CONTENT, "");
    response.headers_mut().remove(http::header::CONTENT_TYPE);
    Ok(response)
}

/// `GET /v1/routes/{uuid}/stats[?minutes=N]`: the route's calls, error answers by problem type
/// and latency on this node, since it was loaded or over the last `N` minutes (1 to
/// `RouteStats`'s window).
pub(super) fn stats(state: &State, uuid: Uuid, query: Option<&str>) -> Result<Response, ApiError> {
    state.loaded()?;
    let mut minutes = None;
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if name == "minutes" {
            let most = crate::metrics::STATS_MINUTES;
            minutes = Some(value.parse().ok().filter(|n| (1..=most).contains(n)).ok_or_else(|| {
                ApiError::InvalidQuery(format!("`minutes` must be a number from 1 to {most}"))
            })?);
        }
    }
    // `N` minutes: the current minute and the whole ones before it, at least `N` minutes back.
    let summary = match state.table.get(&uuid).ok_or(ApiError::NotFound)? {
        Entry::Route(route) => route.stats.summary(minutes),
        // Its calls are answered before any route serves them: it has none of its own.
        Entry::Locked(_) => crate::metrics::RouteStats::default().summary(minutes),
    };
    let errors: BTreeMap<&str, u64> = super::problem::SLUGS
        .iter()
        .zip(summary.errors)
        .filter(|&(_, count)| count > 0)
        .map(|(slug, count)| (*slug, count))
        .collect();
    // Milliseconds to the microsecond.
    let ms = |q| summary.percentile(q).map(|took| (took.as_micros() as f64) / 1000.0);
    let view = StatsView {
        uuid,
        since: crate::metrics::unix_millis(summary.since),
        minutes,
        calls: summary.calls,
        errors,
        timed_calls: summary.timed(),
        latency_ms: LatencyView { p50: ms(0.5), p99: ms(0.99) },
    };
    let body = serde_json::to_vec(&view).map_err(|e| ApiError::Storage(e.to_string()))?;
    Ok(json(StatusCode::OK, body))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatsView<'a> {
    uuid: Uuid,
    since: u64,
    minutes: Option<usize>,
    calls: u64,
    errors: BTreeMap<&'a str, u64>,
    timed_calls: u64,
    latency_ms: LatencyView,
}

#[derive(Serialize)]
struct LatencyView {
    p50: Option<f64>,
    p99: Option<f64>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Listing<'a> {
    routes: Vec<View<'a>>,
    next_cursor: Option<&'a str>,
}

/// The answer to a change of a route the key ring cannot open: 409, it takes `DELETE` only.
pub(super) fn locked_refusal(locked: &LockedRoute) -> ApiError {
    ApiError::Conflict(format!(
        "route {} cannot be read ({}); until its key is given back it takes DELETE only",
        locked.uuid, locked.why
    ))
}

/// A table entry as management shows it.
#[derive(Serialize)]
#[serde(untagged)]
enum View<'a> {
    Route(Box<RouteView<'a>>),
    Locked(LockedView<'a>),
}

/// How a view shows a route's secrets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Shown {
    /// As `"***"`: every view that leaves the service.
    Masked,
    /// As they are: only for [`compared`], which answers where two views differ, never what
    /// they hold.
    Compared,
}

impl<'a> View<'a> {
    fn of(entry: &'a Entry, shown: Shown) -> Result<View<'a>, ApiError> {
        Ok(match entry {
            Entry::Route(route) => View::Route(Box::new(RouteView::of(route, shown)?)),
            Entry::Locked(locked) => View::Locked(LockedView {
                uuid: locked.uuid,
                status: "locked",
                problem: &locked.why,
                created_at: locked.created_at,
                updated_at: locked.updated_at,
                revision: (locked.revision != 0).then_some(locked.revision),
            }),
        })
    }
}

/// A stored route the key ring cannot open: what is known of it without the key.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct LockedView<'a> {
    uuid: Uuid,
    /// `locked`.
    status: &'static str,
    problem: &'a str,
    created_at: u64,
    updated_at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    revision: Option<u64>,
}

/// A route as management shows it: its registration as given (rules and bodies as the client
/// wrote them, so their member order is kept), the token masked, and whether it serves.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct RouteView<'a> {
    uuid: Uuid,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a str>,
    path: String,
    method: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    original_route: Option<OriginalRouteView<'a>>,
    /// A composed route's sources (SPEC §2.3), secrets masked as a route's are.
    #[serde(skip_serializing_if = "Option::is_none")]
    sources: Option<BTreeMap<&'a str, SourceView<'a>>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    forward_headers: &'a [String],
    pre_configured_queries: &'a BTreeMap<String, String>,
    pre_configured_headers: BTreeMap<&'a str, &'a str>,
    pre_configured_body: Option<Box<RawValue>>,
    auth_header: Option<AuthHeaderView<'a>>,
    auth: &'static str,
    rules_as_string: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cache: Option<&'a CacheSettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: Option<&'a crate::upstream::RetrySettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limit: Option<&'a crate::upstream::RateLimitSettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<TlsView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http2: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    breaker: Option<BreakerView>,
    /// The caller's request its live calls are made as: a sample, shown as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    sample_request: Option<SampleView<'a>>,
    /// Who may call the route (SPEC §2.4): `"open"` when nobody is named.
    callers: CallersView<'a>,
    /// The `$caller` its live calls are made as: a sample, shown as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    caller: Option<Box<RawValue>>,
    created_at: u64,
    updated_at: u64,
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
    /// Cluster mode: the revision of the database change this node holds the route at.
    #[serde(skip_serializing_if = "Option::is_none")]
    revision: Option<u64>,
}

/// A route's `callers` as shown: as given, or `"open"` for a route that names none.
#[derive(Serialize)]
#[serde(untagged)]
enum CallersView<'a> {
    Given(&'a crate::callers::CallersConfig),
    Open(&'static str),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OriginalRouteView<'a> {
    original_api: BaseUrlView<'a>,
    path: &'a str,
    method: &'a str,
    /// An `Authorization` header the route sets itself is a credential: masked.
    headers: BTreeMap<&'a str, &'a str>,
    queries: &'a BTreeMap<String, String>,
    body: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    paginate: Option<&'a crate::route::config::PaginateConfig>,
}

/// One source of a composed route, as given, its secrets masked.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SourceView<'a> {
    original_api: BaseUrlView<'a>,
    path: &'a str,
    method: &'a str,
    /// An `Authorization` header a source sets itself is a credential: masked.
    headers: BTreeMap<&'a str, &'a str>,
    queries: &'a BTreeMap<String, String>,
    body: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    auth_header: Option<AuthHeaderView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: Option<&'a crate::upstream::RetrySettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limit: Option<&'a crate::upstream::RateLimitSettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<TlsView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http2: Option<&'static str>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    after: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    when: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    for_each: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_calls: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    concurrency: Option<u32>,
    optional: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    paginate: Option<&'a crate::route::config::PaginateConfig>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct BaseUrlView<'a> {
    base_url: &'a str,
}

/// A route's `sampleRequest`: its query, and its body as given.
#[derive(Serialize)]
struct SampleView<'a> {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    query: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Box<RawValue>>,
}

/// A route's `breaker`, when it has one of its own.
#[derive(Serialize)]
struct BreakerView {
    scope: BreakerScope,
}

/// A route's `tls`: its certificates as given, its key masked.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TlsView<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    ca: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_cert: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_key: Option<&'a str>,
}

/// A stored `authHeader`, its secrets masked: a token, or OAuth2 client credentials (whose
/// tokens are never shown).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct AuthHeaderView<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<Option<&'a str>>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    oauth2: Option<OAuth2View<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct OAuth2View<'a> {
    token_url: &'a str,
    client_id: &'a str,
    client_secret: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    audience: Option<&'a str>,
    client_auth: &'static str,
}

/// A secret as `shown` says.
fn secret(text: &str, shown: Shown) -> &str {
    match shown {
        Shown::Masked => MASK,
        Shown::Compared => text,
    }
}

/// Configured headers as shown: an `Authorization` header is a credential, masked.
fn masked(headers: &BTreeMap<String, String>, shown: Shown) -> BTreeMap<&str, &str> {
    headers
        .iter()
        .map(|(name, value)| {
            let credential = name.eq_ignore_ascii_case("authorization");
            (name.as_str(), if credential { secret(value, shown) } else { value.as_str() })
        })
        .collect()
}

/// A stored auth as shown: its `authHeader` with secrets masked, and the route's auth mode.
fn auth_view(auth: &Auth, shown: Shown) -> (Option<AuthHeaderView<'_>>, &'static str) {
    match auth {
        Auth::Stored { kind, token } => {
            let token = Some(token.as_deref().map(|token| secret(token, shown)));
            (Some(AuthHeaderView { kind: kind.name(), token, oauth2: None }), "stored")
        }
        Auth::OAuth2(credentials) => {
            let oauth2 = OAuth2View {
                token_url: &credentials.token_url,
                client_id: &credentials.client_id,
                client_secret: secret(&credentials.client_secret, shown),
                scope: credentials.scope.as_deref(),
                audience: credentials.audience.as_deref(),
                client_auth: credentials.client_auth.name(),
            };
            let kind = "OAuth2ClientCredentials";
            (Some(AuthHeaderView { kind, token: None, oauth2: Some(oauth2) }), "stored")
        }
        Auth::Runtime => (None, "runtime"),
        Auth::None => (None, "none"),
    }
}

fn tls_view(tls: &crate::upstream::TlsSettings, shown: Shown) -> TlsView<'_> {
    TlsView {
        ca: tls.ca.as_deref(),
        client_cert: tls.client_cert.as_deref(),
        client_key: tls.client_key.as_deref().map(|key| secret(key, shown)),
    }
}

impl<'a> RouteView<'a> {
    /// The view of `route`, or a failure when a stored member cannot be read back (never shown
    /// as `null`: saving such a view would store `null`). Registration refuses what could not be.
    fn of(route: &'a Route, shown: Shown) -> Result<RouteView<'a>, ApiError> {
        let c = &route.config;
        let unreadable = |member: &str, why: String| {
            ApiError::Storage(format!("the stored {member} of route {} cannot be shown: {why}", route.uuid))
        };
        let raw = |member: &str, text: &Option<String>| -> Result<Option<Box<RawValue>>, ApiError> {
            text.as_deref()
                .map(|text| crate::route::shown(text).map_err(|why| unreadable(member, why)))
                .transpose()
        };
        let (auth_header, auth) = auth_view(&c.auth, shown);
        let problem = route.broken();
        let original_route = match c.sources.is_empty() {
            true => Some(OriginalRouteView {
                original_api: BaseUrlView { base_url: &c.base_url },
                path: &c.upstream_path,
                method: &c.upstream_method,
                headers: masked(&c.headers, shown),
                queries: &c.queries,
                body: raw("originalRoute.body", &c.body)?,
                paginate: c.paginate.as_ref(),
            }),
            false => None,
        };
        let mut sources = BTreeMap::new();
        for source in &c.sources {
            let view = SourceView {
                original_api: BaseUrlView { base_url: &source.base_url },
                path: &source.path,
                method: &source.method,
                headers: masked(&source.headers, shown),
                queries: &source.queries,
                body: raw("body of a source", &source.body)?,
                auth_header: match &source.auth {
                    Auth::Runtime => Some(AuthHeaderView { kind: "Runtime", token: None, oauth2: None }),
                    auth => auth_view(auth, shown).0,
                },
                retry: source.retry.as_ref(),
                rate_limit: source.rate_limit.as_ref(),
                tls: source.tls.as_ref().map(|tls| tls_view(tls, shown)),
                http2: source.http2_prior_knowledge.then_some("prior-knowledge"),
                after: &source.after,
                when: source.when.as_deref(),
                for_each: source.for_each.as_deref(),
                max_calls: source.for_each.as_ref().map(|_| source.max_calls),
                concurrency: source.for_each.as_ref().map(|_| source.concurrency),
                optional: source.optional,
                timeout_ms: source.timeout_ms,
                paginate: source.paginate.as_ref(),
            };
            sources.insert(source.name.as_str(), view);
        }
        Ok(RouteView {
            uuid: route.uuid,
            name: c.name.as_deref(),
            owner: c.owner.as_deref(),
            path: route.public_path(),
            method: &c.method,
            original_route,
            sources: (!sources.is_empty()).then_some(sources),
            forward_headers: &c.forward_headers,
            pre_configured_queries: &c.pre_queries,
            pre_configured_headers: masked(&c.pre_headers, shown),
            pre_configured_body: raw("preConfiguredBody", &c.pre_body)?,
            auth_header,
            auth,
            rules_as_string: Some(
                crate::route::shown(&c.rules).map_err(|why| unreadable("rulesAsString", why))?,
            ),
            cache: c.cache.as_ref(),
            retry: c.retry.as_ref(),
            rate_limit: c.rate_limit.as_ref(),
            http2: c.http2_prior_knowledge.then_some("prior-knowledge"),
            breaker: (!c.breaker.is_origin()).then_some(BreakerView { scope: c.breaker }),
            tls: c.tls.as_ref().map(|tls| tls_view(tls, shown)),
            sample_request: match &c.sample_request {
                Some(sample) => {
                    Some(SampleView { query: &sample.query, body: raw("sampleRequest.body", &sample.body)? })
                }
                None => None,
            },
            callers: match &c.callers {
                Some(callers) => CallersView::Given(callers),
                None => CallersView::Open("open"),
            },
            caller: raw("caller", &c.caller)?,
            created_at: route.created_at,
            updated_at: route.updated_at,
            status: if problem.is_some() { "unavailable" } else { "ok" },
            problem,
            revision: (route.revision != 0).then_some(route.revision),
        })
    }
}

/// Where the route `after` would differ from `before`, as JSON pointers into a registration
/// (`PUT /v1/routes/{uuid}?dryRun=true`, SPEC §2.5). Secrets are compared as they are held, and
/// only the pointer of one that differs is told; what is the service's own (times, status,
/// revision) is not compared.
pub(super) fn compared(before: &Route, after: &Route) -> Result<Vec<String>, ApiError> {
    let text = |route| {
        serde_json::to_string(&RouteView::of(route, Shown::Compared)?)
            .map_err(|e| ApiError::Storage(e.to_string()))
    };
    const OWN: &[&str] = &["uuid", "path", "createdAt", "updatedAt", "status", "problem", "revision"];
    crate::json::diff::differences(&text(before)?, &text(after)?, OWN).map_err(ApiError::Storage)
}
