//! `POST /v1/mapping` and `PUT /v1/routes/{uuid}` (SPEC §2.1): validate a registration, make one
//! live call exactly as a route call would, and store the route only if that call maps.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, StatusCode, header};
use uuid::Uuid;

use super::compose::{self, Purpose};
use super::problem::{UpstreamFailure, write_problems};
use super::reply::{etag, if_match, json, now_ms, read_body};
use super::single;
use super::{ApiError, Request, Response, State};
use crate::exec;
use crate::json::{self, JsonError, write};
use crate::logging::logged;
use crate::metrics::Metrics;
use crate::metrics::RulesSource;
use crate::route::{
    CallError, FromClient, MAPPED_AUTH, Registration, Route, RouteConfig, SampleRequest, StoredSample, shape,
};
use crate::rules::{Limits, Problem, compile_json};
use crate::table::Entry;
use crate::upstream::UpstreamError;

pub(super) async fn register(state: &State, request: Request) -> Result<Response, ApiError> {
    state.loaded()?;
    let (parts, body) = request.into_parts();
    let body = read_body(state, &parts.headers, body).await?;
    let (mut route, sample) = compiled(state, body, &parts.headers, None).await?;
    // A name or a uuid held already is told before the live call, and checked again as the
    // route is stored.
    held_elsewhere(state, &route, true)?;
    let live = live_call(state, &route, &parts.headers, &sample, Purpose::Validate).await?;
    // Under the write lock: two registrations of one name or one given uuid store one route.
    let _writing = state.writes.lock().await;
    held_elsewhere(state, &route, true)?;
    route.revision = state.stored(state.store.create(route.to_stored()).await)?;
    let route = Arc::new(route);
    state.table.apply_shared(Entry::Route(route.clone()));
    logged!(tracing::Level::INFO, uuid = %route.uuid, path = %route.config.path, "route registered");
    let mut response = registered(StatusCode::CREATED, &route, &live);
    if let Ok(location) = HeaderValue::try_from(route.public_path()) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

pub(super) async fn update(state: &State, request: Request, uuid: Uuid) -> Result<Response, ApiError> {
    state.loaded()?;
    let (parts, body) = request.into_parts();
    let entry = state.table.get(&uuid).ok_or(ApiError::NotFound)?;
    if_match(&parts.headers, &entry)?;
    // A route the key ring cannot open takes DELETE only: its configuration, path included, is
    // unknown, and whatever an update stored would replace it.
    let existing = match entry {
        Entry::Route(route) => route,
        Entry::Locked(locked) => return Err(super::management::locked_refusal(&locked)),
    };
    let mut dry_run = false;
    for (name, value) in url::form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
        dry_run = match (&*name, &*value) {
            ("dryRun", "true") => true,
            ("dryRun", "false") => false,
            // Anything else is refused: a dry run misread would be a real update.
            ("dryRun", _) => {
                return Err(ApiError::InvalidQuery("`dryRun` must be `true` or `false`".to_owned()));
            }
            _ => dry_run,
        };
    }
    let body = read_body(state, &parts.headers, body).await?;
    let (mut route, sample) = compiled(state, body, &parts.headers, Some(existing.clone())).await?;
    held_elsewhere(state, &route, false)?;
    if dry_run {
        return dry_run_answer(state, existing, route).await;
    }
    // The route's answer counts go on across the change.
    route.statuses = existing.statuses.clone();
    route.stats = existing.stats.clone();
    // Validated like a registration; until it passes, the old route keeps serving.
    let live = live_call(state, &route, &parts.headers, &sample, Purpose::Validate).await?;
    let _writing = state.writes.lock().await;
    let now = state.table.get(&uuid).ok_or(ApiError::NotFound)?;
    // Another change may have landed during the live call: `If-Match` names the version it edits.
    if_match(&parts.headers, &now)?;
    if let Entry::Locked(locked) = &now {
        return Err(super::management::locked_refusal(locked));
    }
    held_elsewhere(state, &route, false)?;
    // Later than the version it replaces, whatever the clock says.
    route.updated_at = now_ms().max(now.updated_at() + 1);
    // The store gives the version its revision as it writes it (the `ETag`). In cluster mode the
    // database takes it only if it still holds the version this update began from: two nodes
    // updating at once get one 200 and one 409, never two overwrites.
    route.revision = state.stored(state.store.replace(route.to_stored(), existing.revision).await)?;
    let route = Arc::new(route);
    state.table.apply_shared(Entry::Route(route.clone()));
    state.cache.drop_route(uuid);
    logged!(tracing::Level::INFO, uuid = %uuid, "route updated");
    let mut response = registered(StatusCode::OK, &route, &live);
    // The version it made, for the next change's `If-Match`.
    if let Ok(tag) = HeaderValue::try_from(etag(&Entry::Route(route))) {
        response.headers_mut().insert(header::ETAG, tag);
    }
    Ok(response)
}

/// `POST /v1/routes/{uuid}/try`: makes the route's upstream calls as a registration's live call
/// does, as called by its stored `sampleRequest` (nothing is stored, cached or counted as a call
/// of the route), and answers `{"upstream", "output", "trace", "warnings"}` (and `"pages"`, the
/// pages each paged source fetched, when one pages): the document the
/// rules map (the upstream's as it came; a composed route's, each source's value with `request`
/// and `_sources`), and what the route's rules make of it, traced as `POST
/// /v1/preview?trace=true` traces. It calls the upstreams for real, with the route's methods and
/// credentials.
pub(super) async fn try_route(state: &State, request: Request, uuid: Uuid) -> Result<Response, ApiError> {
    state.loaded()?;
    let route = match state.table.get(&uuid).ok_or(ApiError::NotFound)? {
        Entry::Route(route) => route,
        Entry::Locked(locked) => return Err(super::management::locked_refusal(&locked)),
    };
    if let Some(why) = route.broken() {
        return Err(ApiError::RouteUnavailable(why));
    }
    let (parts, body) = request.into_parts();
    // As its live calls are made: with the route's own sample request, or the one this try
    // gives (`{"sampleRequest": {...}}`, used once, not stored).
    let body = read_body(state, &parts.headers, body).await?;
    let sample = match tried_sample(&body)? {
        Some(given) => given,
        None => route.config.sample_request.clone().unwrap_or_default(),
    };
    let live = live_call(state, &route, &parts.headers, &sample, Purpose::Try).await?;
    logged!(tracing::Level::INFO, uuid = %uuid, "route tried");
    let mut out = Vec::with_capacity(live.preview.len() * 2 + 64);
    out.push(b'{');
    if !live.pages.is_empty() {
        // The pages each paged source (or `originalRoute`) fetched: `{"orders": 3}`.
        out.extend_from_slice(b"\"pages\":{");
        for (i, (name, pages)) in live.pages.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            json::write::string(&mut out, name);
            out.push(b':');
            json::write::u64(&mut out, *pages as u64);
        }
        out.extend_from_slice(b"},");
    }
    out.extend_from_slice(b"\"upstream\":");
    let traced = match (live.document, &route.rules) {
        (Some(mut document), Ok(compiled)) => {
            out.extend_from_slice(&document);
            // A composed route's document holds each answer two levels down.
            json::with_parsed(&mut document, state.config.max_depth + 2, |nodes| {
                super::preview::preview_output(compiled.clone(), nodes, 0, None, true)
            })
            .ok()
            .and_then(Result::ok)
        }
        _ => {
            out.extend_from_slice(b"null");
            None
        }
    };
    match traced {
        // `{"output": …, "trace": …, "warnings": …}`, its members after `upstream`.
        Some(traced) if traced.first() == Some(&b'{') => {
            out.push(b',');
            out.extend_from_slice(&traced[1..]);
        }
        _ => {
            out.extend_from_slice(b",\"output\":");
            out.extend_from_slice(&live.preview);
            out.extend_from_slice(b",\"trace\":[],\"warnings\":[]}");
        }
    }
    Ok(json(StatusCode::OK, out))
}

/// A registration's, an update's or a try's body read as JSON; what is not is told in words and
/// by place (the reader's only other refusal is depth).
pub(super) fn admin_json(body: &[u8]) -> Result<serde_json::Value, ApiError> {
    serde_json::from_slice(body).map_err(|_| {
        let error = json::diagnose(body, REGISTRATION_DEPTH)
            .err()
            .unwrap_or(JsonError::TooDeep { limit: REGISTRATION_DEPTH });
        ApiError::bad_body(body, &error, |limit| format!("the body nests deeper than {limit} levels"))
    })
}

/// The body of `POST /v1/routes/{uuid}/try`: none, or `{"sampleRequest": {...}}`.
fn tried_sample(body: &[u8]) -> Result<Option<StoredSample>, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Tried {
        #[serde(default)]
        sample_request: Option<SampleRequest>,
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let problems = shape::check_try(&admin_json(body)?);
    if !problems.is_empty() {
        return Err(ApiError::InvalidBody(problems));
    }
    let tried: Tried = serde_json::from_slice(body)
        .map_err(|e| ApiError::InvalidBody(vec![Problem::new("", e.to_string())]))?;
    Ok(tried.sample_request.map(SampleRequest::stored))
}

/// Deepest a registration body may nest (the reader's own bound: it refuses 128 levels).
const REGISTRATION_DEPTH: usize = 127;

/// Where a registration's rules are in its body: their problems are located from there.
const RULES_MEMBER: &str = "/rulesAsString";

/// The route a registration (or an update of `existing`) makes, and the sample request of its
/// live call: its body read, checked and compiled off the async workers, within the budget of
/// one compile ([`State::compile`]).
async fn compiled(
    state: &State,
    body: Vec<u8>,
    headers: &HeaderMap,
    existing: Option<Arc<Route>>,
) -> Result<(Route, StoredSample), ApiError> {
    let limits = state.config.limits();
    let metrics = state.metrics.clone();
    let runtime_auth = headers.contains_key(&MAPPED_AUTH);
    let callers_required = state.config.callers_required;
    state
        .compile(move || {
            let stored = existing.as_ref().map(|route| &route.config);
            let (config, sample, given) = validated(&limits, &metrics, &body, runtime_auth, stored)?;
            // RECAST_CALLERS_REQUIRED: who may call is said, or the route is not made.
            if callers_required && config.callers.is_none() {
                return Err(ApiError::InvalidBody(vec![Problem::new(
                    "/callers",
                    "RECAST_CALLERS_REQUIRED: say who may call this route (`consumers`, `jwt`), or \"callers\": \"open\" for anyone who knows its address",
                )]));
            }
            let route = match &existing {
                Some(existing) if given.is_some_and(|given| given != existing.uuid) => {
                    return Err(ApiError::InvalidBody(vec![Problem::new(
                        "/uuid",
                        format!("the uuid of a route cannot change (this one is {})", existing.uuid),
                    )]));
                }
                Some(existing) => {
                    Route::new(existing.uuid, existing.created_at, existing.updated_at, config, &limits)
                }
                None => {
                    let now = now_ms();
                    Route::new(given.unwrap_or_else(Uuid::new_v4), now, now, config, &limits)
                }
            };
            Ok((route, sample))
        })
        .await?
}

/// Reads and checks a registration body: its configuration and the sample request of its live
/// call, or every problem of the body (its shape, its settings and its rules) at its location.
/// An update passes the route as stored: its path stays, and a secret sent back masked keeps
/// the stored one.
fn validated(
    limits: &Limits,
    metrics: &Metrics,
    body: &[u8],
    runtime_auth: bool,
    stored: Option<&RouteConfig>,
) -> Result<(RouteConfig, StoredSample, Option<Uuid>), ApiError> {
    let mut problems = shape::check(&admin_json(body)?);
    if problems.is_empty() {
        let mut registration: Registration = serde_json::from_slice(body)
            .map_err(|e| ApiError::InvalidBody(vec![Problem::new("", e.to_string())]))?;
        // Given, it is stored with the route (an empty one clears it); an update that gives none
        // keeps the stored one.
        let sample = match registration.sample_request.take() {
            Some(given) => Some(given.stored()).filter(|sample| *sample != StoredSample::default()),
            None => stored.and_then(|stored| stored.sample_request.clone()),
        };
        // `caller` (SPEC §2.4) likewise: `{}` or `null` clears it.
        let caller = match &registration.caller {
            Some(given) => Some(given.get().to_owned()).filter(|text| {
                serde_json::from_str::<serde_json::Value>(text)
                    .is_ok_and(|value| value.as_object().is_some_and(|members| !members.is_empty()))
            }),
            None => stored.and_then(|stored| stored.caller.clone()),
        };
        // A mask that keeps nothing is told at its place; whatever validation says of the same
        // place (a `"***"` that is no PEM key) is not told twice.
        let given = registration.given_uuid().ok().flatten();
        let masks = stored.map(|stored| registration.keep_secrets(stored)).unwrap_or_default();
        let told = |p: &Problem| {
            masks.iter().any(|mask| {
                p.location
                    .strip_prefix(&mask.location)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            })
        };
        match registration.validate_with(runtime_auth, stored.map(|stored| stored.path.as_str()), limits) {
            // The rules are compiled with the route (`Route::new`), and their problems told then.
            // What `GET` could not show back is refused: a view saved back would lose it.
            Ok(mut config) if masks.is_empty() => {
                config.sample_request = sample;
                config.caller = caller;
                // SPEC §2.5: an update that gives no `name` or `owner` keeps the stored ones.
                if let Some(stored) = stored {
                    config.name = config.name.take().or_else(|| stored.name.clone());
                    config.owner = config.owner.take().or_else(|| stored.owner.clone());
                }
                let unshowable = config.unshowable();
                if unshowable.is_empty() {
                    let sample = config.sample_request.clone().unwrap_or_default();
                    return Ok((config, sample, given));
                }
                problems = unshowable;
            }
            Ok(_) => problems = masks,
            Err(found) => {
                problems = masks.iter().cloned().chain(found.into_iter().filter(|p| !told(p))).collect()
            }
        }
    }
    // The rules are compiled here too, so that all problems come in one answer, each located
    // in the body (from the text as sent: the order of its members and any name given twice
    // matter).
    #[derive(serde::Deserialize)]
    struct RulesOnly<'a> {
        #[serde(rename = "rulesAsString", borrow, default)]
        rules: Option<&'a serde_json::value::RawValue>,
    }
    let rules = serde_json::from_slice::<RulesOnly<'_>>(body).ok().and_then(|r| r.rules);
    if let Some(rules) = rules.filter(|rules| rules.get() != "null")
        && let Err(found) = compile_json(rules.get().as_bytes(), limits)
    {
        metrics.compile_failure(RulesSource::Registration);
        problems.extend(in_registration(&found));
    }
    Err(ApiError::InvalidBody(problems))
}

/// 409 when another route holds the route's `name`, or, for a `new` route, a route holds its
/// uuid (SPEC §2.5). In a cluster, as this node's table has them.
fn held_elsewhere(state: &State, route: &Route, new: bool) -> Result<(), ApiError> {
    if new && state.table.get(&route.uuid).is_some() {
        return Err(ApiError::Conflict(format!("a route holds the uuid {} already", route.uuid)));
    }
    let Some(name) = &route.config.name else { return Ok(()) };
    let mut holder = None;
    state.table.for_each(|entry| {
        if entry.uuid() != route.uuid
            && entry.route().is_some_and(|other| other.config.name.as_ref() == Some(name))
        {
            holder = Some(entry.uuid());
        }
    });
    match holder {
        Some(holder) => Err(ApiError::Conflict(format!("route {holder} holds the name `{name}` already"))),
        None => Ok(()),
    }
}

/// The answer to `PUT /v1/routes/{uuid}?dryRun=true` (SPEC §2.5): what the update would change,
/// as JSON pointers into the registration, with the `ETag` of the version it was compared with
/// (for the update's `If-Match`). Nothing is called and nothing stored.
async fn dry_run_answer(state: &State, existing: Arc<Route>, route: Route) -> Result<Response, ApiError> {
    if let Err(problems) = &route.rules {
        return Err(ApiError::InvalidRules(in_registration(problems).collect()));
    }
    // Off the async workers, as the compile that made `route` was.
    let before = existing.clone();
    let changes = state.compile(move || super::management::compared(&before, &route)).await??;
    // A dry run tells whether a secret given equals the one held: each is logged, as changes are.
    logged!(tracing::Level::INFO, uuid = %existing.uuid, changes = changes.len(), "route update compared (dry run)");
    let mut body = Vec::with_capacity(64 + changes.iter().map(|c| c.len() + 3).sum::<usize>());
    body.extend_from_slice(b"{\"uuid\":");
    write::string(&mut body, &existing.uuid.to_string());
    body.extend_from_slice(if changes.is_empty() { b",\"changed\":false" } else { b",\"changed\":true" });
    body.extend_from_slice(b",\"changes\":[");
    for (i, change) in changes.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        write::string(&mut body, change);
    }
    body.extend_from_slice(b"]}");
    let mut response = json(StatusCode::OK, body);
    if let Ok(tag) = HeaderValue::try_from(etag(&Entry::Route(existing))) {
        response.headers_mut().insert(header::ETAG, tag);
    }
    Ok(response)
}

/// Problems or warnings of a registration's rules, located in the registration.
fn in_registration(found: &[Problem]) -> impl Iterator<Item = Problem> + '_ {
    found.iter().map(|p| Problem::new(format!("{RULES_MEMBER}{}", p.location), p.message.clone()))
}

/// Checks that the route compiles and makes its live call; returns the mapped output and the
/// warnings of its trace (and for [`Purpose::Try`], a composed route's document, to show).
async fn live_call(
    state: &State,
    route: &Route,
    headers: &HeaderMap,
    sample: &StoredSample,
    purpose: Purpose,
) -> Result<Live, ApiError> {
    if let Err(problems) = &route.rules {
        state.metrics.compile_failure(RulesSource::Registration);
        return Err(ApiError::InvalidRules(in_registration(problems).collect()));
    }
    // SPEC §2.1 step 1: every upstream's address, and every token URL, against the outbound
    // policy, before any call.
    check_upstreams(state, route).await?;
    // As called by the request `sampleRequest` describes: its query, and its body as JSON; and
    // by the caller `caller` describes (SPEC §2.4).
    let who = route.sample_caller();
    let query = sample.query_string();
    let body = sample.body_bytes();
    let mut headers = headers.clone();
    if !body.is_empty() {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    if let Some(composition) = route.composition() {
        let read = compose::caller_request(composition, Some(&query), &headers, body)?;
        let composed = compose::run(state, route, composition, read, who.as_ref(), purpose)
            .await
            .map_err(|failed| failed.error)?;
        // An optional source that failed is a warning, located at the source.
        let sample_warnings = composed
            .reports
            .iter()
            .filter_map(|report| {
                let entry = report.failed.as_ref()?;
                let mut at = "/sources".to_owned();
                json::push_pointer(&mut at, &report.name);
                Some(Problem::new(
                    at,
                    format!("this optional source failed in the live call ({entry}): its value was null"),
                ))
            })
            .collect();
        let mut sample_warnings: Vec<Problem> = sample_warnings;
        // A `forEach` over what is not a list made no call: most often a path that misses.
        sample_warnings.extend(composed.reports.iter().filter_map(|report| {
            let kind = report.not_a_list?;
            let mut at = "/sources".to_owned();
            json::push_pointer(&mut at, &report.name);
            at.push_str("/forEach");
            // A boolean, a number, a string or null: a list and an object have elements.
            let gave = if kind == "null" { "null".to_owned() } else { format!("a {kind}") };
            Some(Problem::new(
                at,
                format!(
                    "in the live call it gave {gave}, not a list: this source made no call (`_sources` says `not-a-list`)"
                ),
            ))
        }));
        sample_warnings.extend(unsent_bodies(route));
        sample_warnings.extend(open_with_credentials(route));
        sample_warnings.extend(listener_warnings(state, route));
        let pages = composed.reports.iter().filter_map(|r| Some((r.name.clone(), r.pages?))).collect();
        return Ok(Live {
            preview: composed.body,
            rules_warnings: composed.warnings,
            sample_warnings,
            sources: composed.reports,
            document: composed.document,
            pages,
        });
    }
    let Some(own) = route.single() else {
        return Err(ApiError::InvalidRequest(route.broken().unwrap_or_default()));
    };
    let client = FromClient {
        query: Some(&query),
        headers: Some(&headers),
        body,
        caller: route.caller_value(who.as_ref()),
    };
    let request = route.upstream_request(&client).map_err(|e| match e {
        CallError::AuthRequired => ApiError::AuthRequired,
        CallError::Broken(why) => ApiError::InvalidRequest(why),
        CallError::Template { location, why } => ApiError::Template { location, why, caller: true },
    })?;
    let called = single::run(state, route, &own.calls, request, who.as_ref(), true).await?;
    let rules_warnings = called
        .document
        .clone()
        .map(|document| live_warnings(route, document, who.as_ref(), state.config.max_depth))
        .unwrap_or_default();
    Ok(Live {
        preview: called.body,
        rules_warnings,
        sample_warnings: unsent_sample(route, sample)
            .into_iter()
            .chain(open_with_credentials(route))
            .chain(listener_warnings(state, route))
            .collect(),
        sources: Vec::new(),
        document: called.document,
        pages: called.paged.map(|paged| ("originalRoute".to_owned(), paged.pages)).into_iter().collect(),
    })
}

/// Every upstream a route calls (its own, or each source), and every token URL, checked against
/// the outbound policy before the live call makes its first request (SPEC §2.1): a composed
/// registration never calls an earlier source, with its credentials, when a later one is
/// refused. A source's refusal names it. A token URL whose name does not resolve is left to the
/// live call, which answers that no token came.
async fn check_upstreams(state: &State, route: &Route) -> Result<(), ApiError> {
    for upstream in route.upstreams() {
        let refused = |failure: UpstreamFailure| {
            state.metrics.upstream_error(failure.kind());
            let error = ApiError::Upstream { failure, validating: true };
            match upstream.source {
                Some(name) => {
                    ApiError::Source { name: name.to_owned(), element: None, error: Box::new(error) }
                }
                None => error,
            }
        };
        if let Err(refusal) = state.client.check_policy(&upstream.request.origin()).await {
            return Err(refused(UpstreamFailure::from(refusal)));
        }
        if let Some(token) = &upstream.calls.oauth
            && let Err(UpstreamError::NotAllowed(refusal)) = state.client.check_policy(token.uri()).await
        {
            return Err(refused(UpstreamFailure::NotAllowed(format!("the token URL: {refusal}"))));
        }
    }
    // The issuers' key sets (SPEC §2.4) are fetched under the same policy: one it refuses is
    // told now, not at the first call; the others are fetched ahead of it.
    for (i, issuer) in route.gate().map(|gate| gate.issuers()).unwrap_or_default().iter().enumerate() {
        let url = match &issuer.source {
            crate::callers::key_sets::Source::Jwks(uri) => uri.clone(),
            crate::callers::key_sets::Source::Discovery(issuer) => {
                format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'))
            }
        };
        if let Ok(uri) = url.parse::<http::Uri>()
            && let Err(UpstreamError::NotAllowed(refusal)) = state.client.check_policy(&uri).await
        {
            let failure =
                UpstreamFailure::NotAllowed(format!("the key set of callers.jwt[{i}] ({url}): {refusal}"));
            state.metrics.upstream_error(failure.kind());
            return Err(ApiError::Upstream { failure, validating: true });
        }
        state.door.key_sets.prefetch(&issuer.source);
    }
    Ok(())
}

/// What a registration's live call gave: the mapped answer, the warnings of its trace (located
/// in the rules), and those of its sample request (located in the registration).
struct Live {
    preview: Vec<u8>,
    rules_warnings: Vec<Problem>,
    sample_warnings: Vec<Problem>,
    /// A composed route's sources: what each did in the live call.
    sources: Vec<compose::Report>,
    /// A route's own upstream's answer, as it came.
    document: Option<Vec<u8>>,
    /// The pages each paged source (or `originalRoute`) fetched (SPEC §2.3 "Pages").
    pages: Vec<(String, usize)>,
}

/// A warning for a route open to anyone (no `callers`, not said `"open"`) whose calls spend a
/// stored credential (SPEC §2.4): whoever learns its address spends it.
fn open_with_credentials(route: &Route) -> Option<Problem> {
    if route.config.callers.is_some() {
        return None;
    }
    let place = route.config.stored_credential()?;
    Some(Problem::new(
        "/callers",
        format!(
            "anyone who learns this route's address calls it with the credential at {place}: name its `callers`, or say \"callers\": \"open\" if that is meant"
        ),
    ))
}

/// The warnings of a route with `callers` this listener cannot serve as they mean (SPEC §7): on
/// plain HTTP on an address other hosts reach, its callers' keys and tokens cross the network
/// readable; naming `certificates` where no client certificate is asked for, nobody is one.
fn listener_warnings(state: &State, route: &Route) -> Vec<Problem> {
    let Some(gate) = route.gate() else { return Vec::new() };
    let https = state.tls.is_some();
    let mut warnings = Vec::new();
    if super::tls::in_the_clear(state.config.listen.ip(), https) {
        warnings.push(Problem::new(
            "/callers",
            "credentials cross the network in the clear unless a proxy in front terminates TLS: this listener serves plain HTTP on an address other hosts reach (set RECAST_TLS_CERT and RECAST_TLS_KEY to serve HTTPS)",
        ));
    }
    if gate.takes_certificates() && state.config.tls_client_ca.is_none() {
        warnings.push(Problem::new(
            "/callers/certificates",
            "this node asks no caller for a client certificate (RECAST_TLS_CLIENT_CA is not set), so no call passes as a certificate here",
        ));
    }
    warnings
}

/// A warning when `sampleRequest` has a body the live call did not send: the upstream is called
/// with a method that carries none, or the route sends a body of its own (as it will on every
/// call).
fn unsent_sample(route: &Route, sample: &StoredSample) -> Vec<Problem> {
    let mut warnings = unsent_bodies(route);
    if sample.body_bytes().is_empty() {
        return warnings;
    }
    let method = route.config.upstream_method.as_str();
    let why = if !matches!(method, "POST" | "PUT" | "PATCH") {
        format!("the upstream is called with {method}, which carries no body (POST, PUT and PATCH do)")
    } else if route.config.pre_body.is_some() || route.config.body.is_some() {
        "the route's own body (`preConfiguredBody` or `originalRoute.body`) is sent instead, on every call"
            .to_owned()
    } else {
        return warnings;
    };
    warnings.push(Problem::new("/sampleRequest/body", format!("not sent by the live call: {why}")));
    warnings
}

/// A warning for each configured body that no call sends: its upstream's method carries none
/// (a body goes with POST, PUT and PATCH, for a route's own upstream and for a source alike).
fn unsent_bodies(route: &Route) -> Vec<Problem> {
    let mut warnings = Vec::new();
    for upstream in route.upstreams().iter().filter(|u| u.request.drops_body()) {
        let method = upstream.request.method();
        let at = match upstream.source {
            Some(name) => {
                let mut at = "/sources".to_owned();
                json::push_pointer(&mut at, name);
                format!("{at}/body")
            }
            None if route.config.pre_body.is_some() => "/preConfiguredBody".to_owned(),
            None => "/originalRoute/body".to_owned(),
        };
        warnings.push(Problem::new(
            at,
            format!("never sent: the upstream is called with {method}, which carries no body (POST, PUT and PATCH do)"),
        ));
    }
    warnings
}

/// The warnings a traced run of the live call's answer gives (SPEC §1.8: expressions that failed;
/// names no element has, with the one probably meant), and one when the rules map nothing of it:
/// a route whose every target is null or left out is most likely reading the wrong names.
fn live_warnings(
    route: &Route,
    mut document: Vec<u8>,
    caller: Option<&crate::callers::Caller>,
    max_depth: usize,
) -> Vec<Problem> {
    let Ok(compiled) = &route.rules else { return Vec::new() };
    let plan = &compiled.plan;
    let traced = json::with_parsed(&mut document, max_depth, |doc| {
        let mut out = Vec::new();
        let trace = exec::execute_traced_as(plan, doc, 0, route.caller_value(caller), &mut out);
        (trace, out)
    });
    let Ok((trace, out)) = traced else { return Vec::new() };
    if trace.outcome.limit.is_some() {
        return Vec::new();
    }
    let mut warnings = trace.notes;
    if !plan.targets.is_empty() && (!trace.wrote || out == b"{}" || out == b"[]") {
        warnings.push(Problem::new(
            "",
            "the live call's answer maps to nothing: every target is null or left out, so the rules may not fit this upstream's answer (see `preview`)",
        ));
    }
    warnings
}

/// The answer to a registration or update: `{"uuid", "path", "method", "preview", "warnings"}`.
fn registered(status: StatusCode, route: &Route, live: &Live) -> Response {
    let preview = &live.preview;
    let mut body = Vec::with_capacity(preview.len() + 256);
    body.extend_from_slice(b"{\"uuid\":");
    write::string(&mut body, &route.uuid.to_string());
    body.extend_from_slice(b",\"path\":");
    write::string(&mut body, &route.public_path());
    body.extend_from_slice(b",\"method\":");
    write::string(&mut body, route.method.as_str());
    body.extend_from_slice(b",\"preview\":");
    body.extend_from_slice(preview);
    body.extend_from_slice(b",\"warnings\":");
    // Located in the registration, as its problems are: the rules' under `rulesAsString`.
    let compiled = route.rules.as_ref().map(|c| c.warnings.as_slice()).unwrap_or_default();
    let warnings: Vec<Problem> = in_registration(compiled)
        .chain(in_registration(&live.rules_warnings))
        .chain(live.sample_warnings.iter().cloned())
        .collect();
    write_problems(&mut body, &warnings);
    if !live.sources.is_empty() {
        // A composed route: `{"<name>": {"status", "ms", "calls"}}` (SPEC §2.3).
        body.extend_from_slice(b",\"sources\":{");
        for (i, report) in live.sources.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            write::string(&mut body, &report.name);
            body.extend_from_slice(b":{\"status\":");
            match report.status {
                Some(status) => write::u64(&mut body, u64::from(status)),
                None => body.extend_from_slice(b"null"),
            }
            body.extend_from_slice(b",\"ms\":");
            write::u64(&mut body, report.took.as_millis() as u64);
            body.extend_from_slice(b",\"calls\":");
            write::u64(&mut body, report.calls as u64);
            if let Some(pages) = report.pages {
                body.extend_from_slice(b",\"pages\":");
                write::u64(&mut body, pages as u64);
            }
            body.push(b'}');
        }
        body.push(b'}');
    }
    if route.revision != 0 {
        // Cluster mode: the revision of the database change that stored it.
        body.extend_from_slice(b",\"revision\":");
        write::u64(&mut body, route.revision);
    }
    body.push(b'}');
    json(status, body)
}
