//! The SERVER span of each request (OpenTelemetry's HTTP server conventions): its trace taken
//! from the caller's `traceparent` or begun here, its scope set while the request is served (the
//! upstream calls made for it are its children), its attributes from the request and the
//! answer, and what a route call adds (the route, the cache, the call it took its answer from).

use std::cell::RefCell;
use std::net::IpAddr;
use std::pin::pin;

use http::{HeaderMap, Method, header};
use uuid::Uuid;

use super::{Response, State};
use crate::telemetry::{self, Attribute, Kind, Recorder, Scope, Span, keys};
use crate::trace_context::TraceParent;

/// What a request's span is made of, read before it is served.
pub(super) struct Inbound<'a> {
    pub method: &'a Method,
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    /// The request's `:authority` (HTTP/2, where no `Host` header comes).
    pub authority: Option<&'a str>,
    pub peer: Option<IpAddr>,
    /// `network.protocol.version`: 1.0, 1.1 or 2.
    pub version: &'static Attribute,
    /// The route template the path matched (`/v1/{uuid}/{path}`), never the path itself.
    pub route: Option<&'static Template>,
}

/// What a route call tells its request's span ([`note_call`]).
#[derive(Debug, Clone)]
pub(super) struct CallFacts {
    pub route: Uuid,
    /// `hit`, `miss`, `stale` or `bypass`, for a route with `cache`.
    pub cache: Option<&'static str>,
    /// The span of the call whose upstream answer this one took (a coalesced miss).
    pub link: Option<TraceParent>,
    /// Who called, on a route with `callers`.
    pub caller: Option<std::sync::Arc<crate::callers::Caller>>,
}

thread_local! {
    /// The SERVER span of the request being polled on this thread, while its trace is
    /// recorded: where what a route call learns is written as it is learnt.
    static SERVING: RefCell<Option<Span>> = const { RefCell::new(None) };
}

/// Adds a route call's facts to the SERVER span of the request being polled on this thread,
/// when it is recorded.
pub(super) fn note_call(facts: CallFacts) {
    let _ = SERVING.try_with(|serving| {
        if let Some(span) = serving.borrow_mut().as_mut() {
            let mut id = uuid::Uuid::encode_buffer();
            span.set(&keys::ROUTE_ID, &*facts.route.hyphenated().encode_lower(&mut id));
            if let Some(cache) = facts.cache {
                span.set(&keys::CACHE, cache);
            }
            if let Some(link) = facts.link {
                span.link(link);
            }
            if let Some(caller) = &facts.caller {
                span.set(&keys::CALLER_KIND, caller.kind.name());
                if let Some(consumer) = &caller.consumer {
                    span.set(&keys::CALLER_CONSUMER, consumer.as_str());
                }
                if let Some(issuer) = &caller.issuer {
                    span.set(&keys::CALLER_ISSUER, issuer.as_str());
                }
            }
        }
    });
}

/// A request's scope and, when its trace is recorded, its SERVER span begun now.
pub(super) fn begin<'a>(state: &'a State, inbound: &Inbound<'_>) -> (Scope, Option<(Span, &'a Recorder)>) {
    let (scope, parent) = state.tracer.serve(inbound.headers);
    let recorder = state.tracer.recorder().filter(|_| scope.recording);
    let span = recorder.map(|recorder| {
        let (method, method_attribute) = keys::method(inbound.method);
        let name: std::borrow::Cow<'static, str> = match (method, inbound.route) {
            // A GET's name is written with its template.
            ("GET", Some(route)) => route.get.into(),
            ("_OTHER", Some(route)) => format!("HTTP {}", route.path).into(),
            ("_OTHER", None) => "HTTP".into(),
            (method, Some(route)) => format!("{method} {}", route.path).into(),
            (method, None) => method.into(),
        };
        let mut span = Span::start(scope.span, scope.state(), parent, Kind::Server, &name);
        span.put(method_attribute);
        if method == "_OTHER" {
            span.set(&keys::METHOD_ORIGINAL, telemetry::cut(inbound.method.as_str(), MAX_HOST));
        }
        span.set(&keys::URL_PATH, telemetry::cut(inbound.path, telemetry::MAX_URL));
        span.put(if state.tls.is_some() { &keys::SCHEME_HTTPS } else { &keys::SCHEME_HTTP });
        if let Some(route) = inbound.route {
            span.put(&route.attribute);
        }
        let host = inbound.headers.get(header::HOST).and_then(|h| h.to_str().ok()).or(inbound.authority);
        if let Some((host, port)) = host.and_then(host_port) {
            span.set(&keys::SERVER_ADDRESS, telemetry::cut(host, MAX_HOST));
            if let Some(port) = port {
                span.set(&keys::SERVER_PORT, port);
            }
        }
        if let Some(peer) = inbound.peer {
            let mut text = [0u8; 48];
            span.set(&keys::CLIENT_ADDRESS, address(peer, &mut text));
        }
        if let Some(agent) = inbound.headers.get(header::USER_AGENT).and_then(|a| a.to_str().ok()) {
            // No more characters than bytes: only a long one is counted.
            let end = match agent.len() <= MAX_USER_AGENT {
                true => agent.len(),
                false => agent.char_indices().nth(MAX_USER_AGENT).map_or(agent.len(), |(at, _)| at),
            };
            span.set(&keys::USER_AGENT, &agent[..end]);
        }
        span.put(inbound.version);
        (span, &**recorder)
    });
    (scope, span)
}

/// `ip` as text, written into `buffer`: an IPv4 address by hand (a formatter's machinery costs
/// ten times as much on every call), an IPv6 address by its `Display`.
fn address(ip: IpAddr, buffer: &mut [u8; 48]) -> &str {
    let len = match ip {
        IpAddr::V4(v4) => {
            let mut len = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buffer[len] = b'.';
                    len += 1;
                }
                let mut digits = itoa::Buffer::new();
                let digits = digits.format(octet).as_bytes();
                buffer[len..len + digits.len()].copy_from_slice(digits);
                len += digits.len();
            }
            len
        }
        IpAddr::V6(v6) => {
            let mut cursor = std::io::Cursor::new(&mut buffer[..]);
            let _ = std::io::Write::write_fmt(&mut cursor, format_args!("{v6}"));
            cursor.position() as usize
        }
    };
    std::str::from_utf8(&buffer[..len]).unwrap_or_default()
}

/// The longest `server.address` taken from a `Host` header, and `http.request.method_original`,
/// in bytes.
const MAX_HOST: usize = 256;

/// The longest `user_agent.original` kept, in characters.
const MAX_USER_AGENT: usize = 256;

/// Serves a request in its scope, then ends its span with the answer. While the request is
/// polled its span is in [`SERVING`]. A request dropped before its answer (its client went
/// away) still ends its span, marked `recast.abandoned`, so that the spans of its upstream calls
/// keep their parent.
pub(super) async fn serve(
    scope: Scope,
    span: Option<(Span, &Recorder)>,
    respond: impl Future<Output = Response>,
) -> Response {
    let Some((span, recorder)) = span else { return telemetry::within(scope, respond).await };
    let mut pending = Pending { span: Some(span), recorder };
    let mut respond = pin!(respond);
    let serving = std::future::poll_fn(|cx| {
        let swap = Swap { previous: SERVING.replace(pending.span.take()), into: &mut pending.span };
        let poll = respond.as_mut().poll(cx);
        drop(swap);
        poll
    });
    let mut response = telemetry::within(scope, serving).await;
    if let Some(mut span) = pending.span.take() {
        finish(&mut span, &mut response);
        span.end(pending.recorder);
    }
    response
}

/// Puts back what [`SERVING`] held before a poll, and moves the span back out, also when the
/// poll panics.
struct Swap<'a> {
    previous: Option<Span>,
    into: &'a mut Option<Span>,
}

impl Drop for Swap<'_> {
    fn drop(&mut self) {
        *self.into = SERVING.replace(self.previous.take());
    }
}

/// A request's span until its answer.
struct Pending<'a> {
    span: Option<Span>,
    recorder: &'a Recorder,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(mut span) = self.span.take() {
            span.set(&keys::ABANDONED, true);
            span.end(self.recorder);
        }
    }
}

/// The attributes an answer gives its span; Error for a 5xx.
fn finish(span: &mut Span, response: &mut Response) {
    let status = response.status().as_u16();
    span.set(&keys::STATUS_CODE, i64::from(status));
    let problem = response.extensions_mut().remove::<super::problem::ProblemType>();
    if status >= 500 {
        let kind = problem.map_or_else(|| status.to_string(), |p| p.0.to_owned());
        span.set(&keys::ERROR_TYPE, &kind);
        span.fail(&kind);
    }
}

/// The host and port of a `Host` header (`[::1]:8080`, `example.com`).
fn host_port(value: &str) -> Option<(&str, Option<i64>)> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if let Some(rest) = value.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':').and_then(|p| p.parse::<u16>().ok()).map(i64::from);
        return Some((host, port));
    }
    match value.rsplit_once(':') {
        Some((host, port)) => Some((host, port.parse::<u16>().ok().map(i64::from))),
        None => Some((value, None)),
    }
}

/// A route template, for `http.route`, and what a span is given from it.
pub(super) struct Template {
    pub path: &'static str,
    /// The name of a GET's span.
    get: &'static str,
    /// Its `http.route`, written.
    attribute: Attribute,
}

macro_rules! template {
    ($path:literal) => {
        Template { path: $path, get: concat!("GET ", $path), attribute: Attribute::text("http.route", $path) }
    };
}

/// The template of a route call's path.
pub(super) static CALL: Template = template!("/v1/{uuid}/{path}");
static PREVIEW: Template = template!("/v1/preview");
static MAPPING: Template = template!("/v1/mapping");
static ROUTES: Template = template!("/v1/routes");
static ROUTE: Template = template!("/v1/routes/{uuid}");
static ROUTE_CACHE: Template = template!("/v1/routes/{uuid}/cache");
static ROUTE_STATS: Template = template!("/v1/routes/{uuid}/stats");
static ROUTE_TRY: Template = template!("/v1/routes/{uuid}/try");
static KEYS: Template = template!("/v1/keys");
static KEYS_RESEAL: Template = template!("/v1/keys/reseal");
static HEALTHZ: Template = template!("/healthz");
static READYZ: Template = template!("/readyz");
static METRICS: Template = template!("/metrics");
static OPENAPI: Template = template!("/openapi.json");
static FILE: Template = template!("/{file}");

/// The route template of a path's segments (as the router splits them), for `http.route`.
pub(super) fn route_template(segments: &[&str], playground: bool) -> Option<&'static Template> {
    Some(match segments {
        ["v1", "preview"] => &PREVIEW,
        ["v1", "mapping"] => &MAPPING,
        ["v1", "routes"] => &ROUTES,
        ["v1", "routes", rest] if rest.ends_with("/cache") => &ROUTE_CACHE,
        ["v1", "routes", rest] if rest.ends_with("/stats") => &ROUTE_STATS,
        ["v1", "routes", rest] if rest.ends_with("/try") => &ROUTE_TRY,
        ["v1", "routes", _] => &ROUTE,
        ["v1", "keys"] => &KEYS,
        ["v1", "keys", "reseal"] => &KEYS_RESEAL,
        ["v1", _, _] => &CALL,
        ["healthz"] => &HEALTHZ,
        ["readyz"] => &READYZ,
        ["metrics"] => &METRICS,
        ["openapi.json"] => &OPENAPI,
        [_] if playground => &FILE,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_headers_and_route_templates() {
        let mut buffer = [0u8; 48];
        assert_eq!(address("192.168.0.17".parse().unwrap(), &mut buffer), "192.168.0.17");
        assert_eq!(address("0.0.0.0".parse().unwrap(), &mut buffer), "0.0.0.0");
        assert_eq!(address("255.255.255.255".parse().unwrap(), &mut buffer), "255.255.255.255");
        assert_eq!(address("2001:db8::ff00:42:8329".parse().unwrap(), &mut buffer), "2001:db8::ff00:42:8329");
        let widest = "1111:2222:3333:4444:5555:6666:7777:8888";
        assert_eq!(address(widest.parse().unwrap(), &mut buffer), widest);
        assert_eq!(host_port("example.com:8080"), Some(("example.com", Some(8080))));
        assert_eq!(host_port("example.com"), Some(("example.com", None)));
        assert_eq!(host_port("[::1]:9"), Some(("::1", Some(9))));
        assert_eq!(host_port(""), None);
        let path = |segments: &[&str]| route_template(segments, false).map(|t| t.path);
        assert_eq!(path(&["v1", "0f1c", "a/b/c"]), Some("/v1/{uuid}/{path}"));
        assert_eq!(path(&["v1", "routes", "x/cache"]), Some("/v1/routes/{uuid}/cache"));
        assert_eq!(path(&["v1", "routes", "x/stats"]), Some("/v1/routes/{uuid}/stats"));
        assert_eq!(path(&["v1", "keys", "reseal"]), Some("/v1/keys/reseal"));
        assert_eq!(path(&["v1", "routes", "x/try"]), Some("/v1/routes/{uuid}/try"));
        assert_eq!(path(&["nothing", "here"]), None);
        assert_eq!(CALL.get, "GET /v1/{uuid}/{path}");
        assert_eq!(
            route_template(&["index.html"], true).map(|t| t.attribute.bytes()),
            Some(Attribute::text("http.route", "/{file}").bytes())
        );
    }
}
