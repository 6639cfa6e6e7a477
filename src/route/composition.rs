//! A composed route compiled (SPEC §2.3): its sources in an order where each comes after those
//! it waits for, their templates, `when` and `forEach` compiled, the graph checked, and what one
//! call of a source sends ([`Source::request`]). Pure: the server runs the schedule.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Uri};
use uuid::Uuid;

use super::registration::{BaseUrl, UpstreamPath};
use super::sources::{MAX_SOURCES, SourceConfig};
use super::template::{Context, RenderError, Template, as_is, encode_segment, scalar_text};
use super::{Auth, AuthKind};
use crate::expr::{self, Doc as View, Patterns, Program, Val};
use crate::json::ondemand::Wants;
use crate::json::{self, Node, push_pointer};
use crate::rules::{Limits, Problem};
use crate::upstream::{
    BreakerScope, RateLimitSettings, RetrySettings, RouteTls, TokenRequest, UpstreamRequest,
};

/// The name of a route's own upstream as a source (`Server-Timing`'s `upstream`).
pub const OWN: &str = "upstream";

/// A composition ready to run: a composed route's sources, or a route's own upstream alone.
#[derive(Debug)]
pub struct Composition {
    /// The sources, each after every source it waits for.
    pub sources: Vec<Source>,
    /// The caller's headers `request.headers` holds (lower-case names).
    pub forward_headers: Vec<HeaderName>,
    /// Whether a source sends the caller's `X-Mapped-Auth` (a runtime-auth route).
    pub runtime_auth: bool,
    /// The sources' indexes in name order: the order of the document's members.
    pub by_name: Vec<usize>,
    /// Whether a source's templates, `when` or `forEach` read `request`.
    pub reads_request: bool,
}

/// One source, compiled.
#[derive(Debug)]
pub struct Source {
    pub name: String,
    /// The sources it waits for directly (indexes into [`Composition::sources`]).
    pub after: Vec<usize>,
    /// The sources its expressions read (in its `after` closure).
    pub reads: Vec<usize>,
    pub when: Option<Expression>,
    pub for_each: Option<Expression>,
    /// What its expressions read of its context (`request` and the sources in `reads`): the
    /// context is read for this, not whole.
    pub context: Wants,
    /// How its request is made.
    pub call: Call,
    pub auth: Auth,
    pub oauth: Option<Arc<TokenRequest>>,
    pub tls: Option<Arc<RouteTls>>,
    pub retry: Option<RetrySettings>,
    pub rate_limit: Option<RateLimitSettings>,
    pub h2c: bool,
    pub max_calls: usize,
    pub concurrency: usize,
    pub optional: bool,
    pub timeout: Option<Duration>,
    /// Who its rate limit is kept for: the route and this source (the route alone for a
    /// route's own upstream).
    pub key: Uuid,
    /// The route whose own breaker counts its calls (`"breaker": {"scope": "route"}`, for a
    /// route's own upstream); `None`: its origin's.
    pub breaker: Option<Uuid>,
}

/// How a source's request is made.
#[derive(Debug)]
pub enum Call {
    /// Rendered from its templates over its context ([`Source::request`]).
    Rendered(Box<Rendered>),
    /// The route's own request, `originalRoute`'s (SPEC §2.2): built from the caller's request
    /// before the call ([`crate::route::Route::upstream_request`]), since a cache key is made of
    /// it; the source's answer is the whole document the rules map.
    Own,
}

/// A source's request as its templates make it.
#[derive(Debug)]
pub struct Rendered {
    method: Method,
    /// `scheme://authority` and the base URL's path, with a `/` after it.
    prefix: String,
    path: Option<Slot>,
    /// The path's own query pairs, then `queries`.
    query: Vec<(String, Slot)>,
    headers: Vec<(HeaderName, Slot)>,
    body: Option<BodyTemplate>,
}

/// An expression over the context, with where it is in the registration.
#[derive(Debug)]
pub struct Expression {
    pub program: Program,
    pub location: String,
    /// Whether it reads only `request` (its failure is then the caller's: 400).
    pub only_request: bool,
}

/// A template with where it is in the registration.
#[derive(Debug)]
struct Slot {
    template: Template,
    location: String,
    only_request: bool,
}

/// A body with templates in its strings.
#[derive(Debug)]
enum BodyTemplate {
    /// JSON text without templates.
    Raw(String),
    /// A string that is one template: its value, of any type.
    Whole(Slot),
    /// A string with templates in it.
    Text(Slot),
    List(Vec<BodyTemplate>),
    Object(Vec<(String, BodyTemplate)>),
}

/// Why a source's request could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceError {
    /// A template, `when` or `forEach` failed: where, why (naming a type, never a value), and
    /// whether it read only `request`.
    Template { location: String, why: String, only_request: bool },
    /// A `Runtime` source called without `X-Mapped-Auth`.
    AuthRequired,
}

/// Headers a source may not set: framing, hop-by-hop, the caller's credential.
const RESERVED: [&str; 13] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "x-mapped-auth",
    "accept-encoding",
];

/// Why a path with a `%` that starts no escape is refused.
const LONE_PERCENT: &str = "a `%` in `path` must start an escape (`%` and two hex digits): before a template, a value could finish it";

/// The longest rendered header value.
pub const MAX_HEADER_VALUE: usize = 8 << 10;

impl Composition {
    /// The schedule of a route with `originalRoute`: one source, the route's own upstream, whose
    /// request the route builds (SPEC §2.2) and whose answer is the document the rules map.
    pub fn own(
        config: &super::RouteConfig,
        route: Uuid,
        oauth: Option<Arc<TokenRequest>>,
        tls: Option<Arc<RouteTls>>,
    ) -> Composition {
        let source = Source {
            name: OWN.to_owned(),
            after: Vec::new(),
            reads: Vec::new(),
            when: None,
            for_each: None,
            context: crate::plan::wants_of([]),
            call: Call::Own,
            // Its credentials are in the request the route builds, and in `oauth`.
            auth: Auth::None,
            oauth,
            tls,
            retry: config.retry.clone(),
            rate_limit: config.rate_limit.clone(),
            h2c: config.http2_prior_knowledge,
            max_calls: 1,
            concurrency: 1,
            optional: false,
            timeout: None,
            key: route,
            breaker: (config.breaker == BreakerScope::Route).then_some(route),
        };
        Composition {
            sources: vec![source],
            forward_headers: Vec::new(),
            runtime_auth: false,
            by_name: vec![0],
            reads_request: false,
        }
    }

    /// Whether this is a route's own upstream alone ([`Composition::own`]), not sources.
    pub fn is_own(&self) -> bool {
        matches!(self.sources.as_slice(), [Source { call: Call::Own, .. }])
    }

    /// Compiles stored sources, or every problem with its location (`/sources/<name>/...`).
    pub fn compile(
        configs: &[SourceConfig],
        forward_headers: &[String],
        route: Uuid,
        limits: &Limits,
    ) -> Result<Composition, Vec<Problem>> {
        let mut problems = Vec::new();
        let names: Vec<&str> = configs.iter().map(|c| c.name.as_str()).collect();
        let at = |name: &str| {
            let mut at = "/sources".to_owned();
            push_pointer(&mut at, name);
            at
        };
        // Direct waits by index; unknown names are problems.
        let mut waits: Vec<Vec<usize>> = Vec::new();
        for config in configs {
            let mut direct = Vec::new();
            for (i, name) in config.after.iter().enumerate() {
                match names.iter().position(|n| n == name) {
                    Some(j) if !direct.contains(&j) => direct.push(j),
                    Some(_) => {}
                    None => problems.push(Problem::new(
                        format!("{}/after/{i}", at(&config.name)),
                        crate::suggest::unknown("source", name, &names),
                    )),
                }
            }
            waits.push(direct);
        }
        let order = match order(&waits) {
            Ok(order) => order,
            Err(cycle) => {
                let path: Vec<&str> = cycle.iter().map(|&i| names[i]).collect();
                problems.push(Problem::new(
                    format!("{}/after", at(names[cycle[0]])),
                    format!("the sources wait for each other in a cycle: {}", path.join(" → ")),
                ));
                return Err(problems);
            }
        };
        if configs.len() > MAX_SOURCES {
            problems
                .push(Problem::new("/sources", format!("a composition has at most {MAX_SOURCES} sources")));
        }
        // Each source's closure: those it waits for directly or through theirs.
        let mut closure: Vec<Vec<usize>> = vec![Vec::new(); configs.len()];
        for &i in &order {
            let mut mine: Vec<usize> = Vec::new();
            for &j in &waits[i] {
                mine.push(j);
                mine.extend(closure[j].iter().copied());
            }
            mine.sort_unstable();
            mine.dedup();
            closure[i] = mine;
        }
        let mut worst: u64 = 0;
        let mut patterns = Patterns::default();
        let mut compiled: Vec<Option<Source>> = (0..configs.len()).map(|_| None).collect();
        for &i in &order {
            let config = &configs[i];
            let calls = if config.for_each.is_some() { u64::from(config.max_calls) } else { 1 };
            let attempts = 1 + config.retry.as_ref().map_or(0, |r| u64::from(r.attempts));
            worst += calls * attempts;
            let mut compiler = SourceCompiler {
                at: at(&config.name),
                names: &names,
                closure: &closure[i],
                reads: Vec::new(),
                item: config.for_each.is_some(),
                item_only_request: true,
                max_depth: limits.max_depth,
                patterns: &mut patterns,
                problems: &mut problems,
            };
            if let Some(source) = compiler.source(config, waits[i].clone(), route) {
                compiled[i] = Some(source);
            }
        }
        if worst > limits.max_source_calls as u64 {
            problems.push(Problem::new(
                "/sources",
                format!(
                    "at worst one call of this composition sends {worst} requests (one per source, `maxCalls` per `forEach` source, each with its retries), more than {} (RECAST_MAX_SOURCE_CALLS)",
                    limits.max_source_calls
                ),
            ));
        }
        let mut forward = Vec::new();
        for name in forward_headers {
            match HeaderName::from_bytes(name.as_bytes()) {
                Ok(header) => forward.push(header),
                Err(_) => {
                    problems.push(Problem::new("/forwardHeaders", format!("`{name}` is not a header name")))
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        // Indexes move to the schedule's order.
        let position: Vec<usize> = {
            let mut position = vec![0; configs.len()];
            for (at, &i) in order.iter().enumerate() {
                position[i] = at;
            }
            position
        };
        let mut sources: Vec<Source> = Vec::with_capacity(configs.len());
        for &i in &order {
            let Some(mut source) = compiled[i].take() else { continue };
            for index in source.after.iter_mut().chain(source.reads.iter_mut()) {
                *index = position[*index];
            }
            sources.push(source);
        }
        let runtime_auth = sources.iter().any(|s| matches!(s.auth, Auth::Runtime));
        let mut by_name: Vec<usize> = (0..sources.len()).collect();
        by_name.sort_by(|&a, &b| sources[a].name.cmp(&sources[b].name));
        let reads_request = sources.iter().any(|s| s.context.reads_member("request"));
        Ok(Composition { sources, forward_headers: forward, runtime_auth, by_name, reads_request })
    }

    /// The index of the source named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.sources.iter().position(|s| s.name == name)
    }
}

/// An order of the sources in which each comes after those it waits for, or a cycle (its
/// sources, the first repeated at its end).
fn order(waits: &[Vec<usize>]) -> Result<Vec<usize>, Vec<usize>> {
    // 0: not seen, 1: on the path, 2: done.
    let mut state = vec![0u8; waits.len()];
    let mut order = Vec::with_capacity(waits.len());
    let mut path = Vec::new();
    fn visit(
        i: usize,
        waits: &[Vec<usize>],
        state: &mut [u8],
        order: &mut Vec<usize>,
        path: &mut Vec<usize>,
    ) -> Result<(), Vec<usize>> {
        match state[i] {
            2 => return Ok(()),
            1 => {
                let from = path.iter().position(|&p| p == i).unwrap_or(0);
                let mut cycle = path[from..].to_vec();
                cycle.push(i);
                return Err(cycle);
            }
            _ => {}
        }
        state[i] = 1;
        path.push(i);
        for &j in &waits[i] {
            visit(j, waits, state, order, path)?;
        }
        path.pop();
        state[i] = 2;
        order.push(i);
        Ok(())
    }
    for i in 0..waits.len() {
        visit(i, waits, &mut state, &mut order, &mut path)?;
    }
    Ok(order)
}

/// What compiling one source needs.
struct SourceCompiler<'c> {
    at: String,
    names: &'c [&'c str],
    closure: &'c [usize],
    /// The sources read so far.
    reads: Vec<usize>,
    item: bool,
    /// Whether the `forEach` expression reads only `request`.
    item_only_request: bool,
    max_depth: usize,
    patterns: &'c mut Patterns,
    problems: &'c mut Vec<Problem>,
}

impl SourceCompiler<'_> {
    fn source(&mut self, config: &SourceConfig, after: Vec<usize>, route: Uuid) -> Option<Source> {
        let before = self.problems.len();
        let when = config.when.as_ref().and_then(|text| self.expression(text, "when", false));
        let for_each = config.for_each.as_ref().and_then(|text| self.expression(text, "forEach", false));
        self.item_only_request = for_each.as_ref().is_none_or(|e| e.only_request);
        let (prefix, path, path_query) = self.path(config);
        let mut query: Vec<(String, Slot)> = Vec::new();
        for (name, value) in path_query {
            query.push((name, self.literal(value)));
        }
        for (name, value) in &config.queries {
            let mut location = format!("{}/queries", self.at);
            push_pointer(&mut location, name);
            if let Some(slot) = self.slot(value, location) {
                query.retain(|(n, _)| n != name);
                query.push((name.clone(), slot));
            }
        }
        let mut headers = Vec::new();
        for (name, value) in &config.headers {
            let mut location = format!("{}/headers", self.at);
            push_pointer(&mut location, name);
            let header = match HeaderName::from_bytes(name.as_bytes()) {
                Ok(header) => header,
                Err(_) => {
                    self.problems.push(Problem::new(location, "not a valid header name"));
                    continue;
                }
            };
            let reserved = RESERVED.contains(&header.as_str()) || header.as_str().starts_with("proxy-");
            if reserved {
                self.problems.push(Problem::new(location, format!("`{name}` cannot be configured")));
                continue;
            }
            if header == header::AUTHORIZATION && !matches!(config.auth, Auth::None) {
                self.problems.push(Problem::new(
                    location,
                    "`Authorization` cannot be configured beside an `authHeader`",
                ));
                continue;
            }
            if let Some(slot) = self.slot(value, location) {
                if let Some(text) = slot.template.literal()
                    && HeaderValue::from_str(text).is_err()
                {
                    self.problems.push(Problem::new(
                        slot.location.clone(),
                        "not a valid header value (control characters such as CR or LF)",
                    ));
                }
                headers.push((header, slot));
            }
        }
        let body = config.body.as_ref().and_then(|text| self.body(text));
        let oauth = match &config.auth {
            Auth::OAuth2(credentials) => match TokenRequest::new(credentials) {
                Ok(request) => Some(Arc::new(request)),
                Err(why) => {
                    self.problems.push(Problem::new(format!("{}/authHeader/tokenUrl", self.at), why));
                    None
                }
            },
            _ => None,
        };
        let tls = match &config.tls {
            Some(settings) => match RouteTls::new(settings) {
                Ok(tls) => Some(Arc::new(tls)),
                Err((member, why)) => {
                    self.problems.push(Problem::new(format!("{}/tls/{member}", self.at), why));
                    None
                }
            },
            None => None,
        };
        let method = match config.method.parse::<Method>() {
            Ok(method) => method,
            Err(_) => {
                self.problems.push(Problem::new(format!("{}/method", self.at), "not a method"));
                Method::GET
            }
        };
        if self.problems.len() != before {
            return None;
        }
        let mut reads = std::mem::take(&mut self.reads);
        reads.sort_unstable();
        reads.dedup();
        let mut programs: Vec<&Program> = Vec::new();
        programs.extend(when.iter().chain(&for_each).map(|e| &e.program));
        for slot in path.iter().chain(query.iter().map(|(_, s)| s)).chain(headers.iter().map(|(_, s)| s)) {
            programs.extend(slot.template.programs());
        }
        if let Some(body) = &body {
            body.programs(&mut programs);
        }
        let context = crate::plan::wants_of(programs);
        Some(Source {
            name: config.name.clone(),
            after,
            reads,
            when,
            for_each,
            context,
            call: Call::Rendered(Box::new(Rendered { method, prefix, path, query, headers, body })),
            auth: config.auth.clone(),
            oauth,
            tls,
            retry: config.retry.clone(),
            rate_limit: config.rate_limit.clone(),
            h2c: config.http2_prior_knowledge,
            max_calls: config.max_calls as usize,
            concurrency: config.concurrency.max(1) as usize,
            optional: config.optional,
            timeout: config.timeout_ms.map(Duration::from_millis),
            key: source_key(route, &config.name),
            breaker: None,
        })
    }

    /// Checks the names `program` reads against what its source may read; records the sources
    /// it reads. Returns whether it reads only `request`.
    fn check_names(&mut self, program: &Program, location: &str) -> bool {
        let names = match program.context_names() {
            Ok(names) => names,
            Err(why) => {
                self.problems.push(Problem::new(location, format!("the expression {why}")));
                return false;
            }
        };
        let mut only_request = true;
        for name in names {
            if name == "request" {
                continue;
            }
            only_request = false;
            match self.names.iter().position(|n| *n == name) {
                Some(i) if self.closure.contains(&i) => self.reads.push(i),
                Some(_) if self.at.ends_with(&format!("/{name}")) => self.problems.push(Problem::new(
                    location,
                    format!(
                        "reads `{name}`, this source's own value, which does not exist before it is called"
                    ),
                )),
                Some(_) => self.problems.push(Problem::new(
                    location,
                    format!(
                        "reads `{name}`, which this source does not wait for: add \"{name}\" to its `after`"
                    ),
                )),
                None => {
                    let mut known: Vec<&str> = self.names.to_vec();
                    known.push("request");
                    self.problems.push(Problem::new(
                        location,
                        format!(
                            "reads `{name}`, which is neither `request` nor a source of this composition{}",
                            crate::suggest::closest(name, known.iter().copied())
                                .map(|c| format!("; did you mean `{c}`?"))
                                .unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        only_request
    }

    fn expression(&mut self, text: &str, member: &str, item: bool) -> Option<Expression> {
        let location = format!("{}/{member}", self.at);
        let bound: &[&str] = if item { &[super::template::ITEM] } else { &[] };
        match expr::compile_bound(text, self.max_depth, self.patterns, bound) {
            Ok(program) => {
                let only_request = self.check_names(&program, &location);
                Some(Expression { program, location, only_request })
            }
            Err(errors) => {
                for error in errors {
                    self.problems.push(Problem::new(
                        &location,
                        format!("at character {}: {}", error.char_offset(text) + 1, error.message),
                    ));
                }
                None
            }
        }
    }

    fn slot(&mut self, text: &str, location: String) -> Option<Slot> {
        match Template::compile(text, self.item, self.max_depth, self.patterns) {
            Ok(template) => {
                // `$item` is a value of the `forEach` expression: of `request` only when it is.
                let mut only_request = !text.contains("$item") || self.item_only_request;
                for program in template.programs() {
                    only_request &= self.check_names(program, &location);
                }
                Some(Slot { template, location, only_request })
            }
            Err(error) => {
                let at = text.get(..error.at).map_or(0, |s| s.chars().count());
                self.problems
                    .push(Problem::new(location, format!("at character {}: {}", at + 1, error.message)));
                None
            }
        }
    }

    fn literal(&mut self, text: String) -> Slot {
        let template = Template::literal_text(text);
        Slot { template, location: format!("{}/path", self.at), only_request: true }
    }

    /// The prefix of every URL of the source, its path template, and the path's literal query.
    fn path(&mut self, config: &SourceConfig) -> (String, Option<Slot>, Vec<(String, String)>) {
        let location = format!("{}/path", self.at);
        let base = match BaseUrl::parse(&config.base_url) {
            Ok(base) => base.0,
            Err(why) => {
                self.problems.push(Problem::new(format!("{}/originalApi/baseUrl", self.at), why));
                return (String::new(), None, Vec::new());
            }
        };
        let mut prefix = format!("{}://{}", base.scheme(), base.host_str().unwrap_or_default());
        if let Some(port) = base.port() {
            prefix.push_str(&format!(":{port}"));
        }
        prefix.push_str(base.path().trim_end_matches('/'));
        prefix.push('/');
        let Some(slot) = self.slot(&config.path, location.clone()) else {
            return (prefix, None, Vec::new());
        };
        // The path's shape is checked with each template as one plain segment character; a
        // template after `?` or `#` would write into the query or fragment.
        let (skeleton, template_after_query) = slot.template.skeleton();
        if template_after_query {
            self.problems.push(Problem::new(
                &location,
                "a template after `?` or `#` in `path` would write into the query; put it in `queries`",
            ));
            return (prefix, None, Vec::new());
        }
        if !slot.template.escapes_complete() {
            self.problems.push(Problem::new(&location, LONE_PERCENT));
            return (prefix, None, Vec::new());
        }
        match UpstreamPath::parse(&skeleton) {
            Err(why) => {
                self.problems.push(Problem::new(&location, why));
                (prefix, None, Vec::new())
            }
            Ok(parsed) => {
                // The template without the literal query and leading slashes.
                let slot = Slot { template: slot.template.without_query(), ..slot };
                (prefix, Some(slot), parsed.query)
            }
        }
    }

    fn body(&mut self, text: &str) -> Option<BodyTemplate> {
        let location = format!("{}/body", self.at);
        self.body_located(text, location)
    }

    fn body_located(&mut self, text: &str, location: String) -> Option<BodyTemplate> {
        let mut buffer = text.as_bytes().to_vec();
        let parsed = json::with_parsed(&mut buffer, self.max_depth, |doc| {
            let mut scratch = Vec::new();
            self.body_at(doc, 0, &mut location.clone(), &mut scratch)
        });
        match parsed {
            Ok(body) => body,
            Err(e) => {
                self.problems.push(Problem::new(location, format!("not JSON: {e}")));
                None
            }
        }
    }

    fn body_at(
        &mut self,
        nodes: &json::Doc<'_, '_>,
        i: usize,
        at: &mut String,
        scratch: &mut Vec<u8>,
    ) -> Option<BodyTemplate> {
        Some(match nodes[i] {
            Node::String(s) if s.contains("{{") => {
                let slot = self.slot(s, at.clone())?;
                if slot.template.whole().is_some() {
                    BodyTemplate::Whole(slot)
                } else {
                    BodyTemplate::Text(slot)
                }
            }
            Node::Object { .. } => {
                let mut members = Vec::new();
                for (name, value) in json::members(nodes, i).into_iter().flatten() {
                    let len = at.len();
                    push_pointer(at, name);
                    let member = self.body_at(nodes, value, at, scratch);
                    at.truncate(len);
                    members.push((name.to_owned(), member?));
                }
                BodyTemplate::Object(members)
            }
            Node::Array { .. } => {
                let mut items = Vec::new();
                let mut next = i + 1;
                let end = json::skip(nodes, i);
                let mut n = 0;
                while next < end {
                    let len = at.len();
                    at.push_str(&format!("/{n}"));
                    let item = self.body_at(nodes, next, at, scratch);
                    at.truncate(len);
                    items.push(item?);
                    next = json::skip(nodes, next);
                    n += 1;
                }
                BodyTemplate::List(items)
            }
            _ => {
                scratch.clear();
                json::write::value(scratch, nodes, i);
                BodyTemplate::Raw(String::from_utf8_lossy(scratch).into_owned())
            }
        })
    }
}

/// `request` of a context: `{"query": {...}, "headers": {...}, "body": <JSON or null>}`: each
/// query parameter's text (a list of them when it repeats), the caller's headers named in
/// `forward` (lower-case names), and the body when it is JSON (an error when it is not).
pub fn request_context(
    query: Option<&str>,
    headers: &HeaderMap,
    forward: &[HeaderName],
    body: &[u8],
    max_depth: usize,
) -> Result<Vec<u8>, json::JsonError> {
    let mut pairs: serde_json::Map<String, serde_json::Value> = serde_json::Map::new();
    for (name, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let value = serde_json::Value::String(value.into_owned());
        match pairs.get_mut(name.as_ref()) {
            None => {
                pairs.insert(name.into_owned(), value);
            }
            Some(serde_json::Value::Array(values)) => values.push(value),
            Some(first) => {
                let first = first.take();
                pairs.insert(name.into_owned(), serde_json::Value::Array(vec![first, value]));
            }
        }
    }
    let mut kept = serde_json::Map::new();
    for name in forward {
        if let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) {
            kept.insert(name.as_str().to_owned(), serde_json::Value::String(value.to_owned()));
        }
    }
    check_body(body, max_depth)?;
    let mut text = Vec::with_capacity(64 + body.len());
    text.extend_from_slice(b"{\"query\":");
    text.extend_from_slice(serde_json::Value::Object(pairs).to_string().as_bytes());
    text.extend_from_slice(b",\"headers\":");
    text.extend_from_slice(serde_json::Value::Object(kept).to_string().as_bytes());
    text.extend_from_slice(b",\"body\":");
    if body.iter().all(u8::is_ascii_whitespace) {
        text.extend_from_slice(b"null");
    } else {
        text.extend_from_slice(body);
    }
    text.push(b'}');
    Ok(text)
}

/// Checks the caller's body as `request.body` holds it: nothing (`null`), or JSON nested at
/// most `max_depth` levels below the document's root (it is two levels down).
pub fn check_body(body: &[u8], max_depth: usize) -> Result<(), json::JsonError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    json::diagnose(body, max_depth.saturating_sub(2))
}

/// The templates of a route with `originalRoute` (SPEC §2.3: over `request` alone), each by the
/// member it renders; a member without `{{` is not here and is sent as written.
#[derive(Debug, Default)]
pub struct RouteTemplates {
    pub path: Option<RouteSlot>,
    pub queries: Vec<(String, RouteSlot)>,
    pub pre_queries: Vec<(String, RouteSlot)>,
    pub headers: Vec<(String, RouteSlot)>,
    pub pre_headers: Vec<(String, RouteSlot)>,
    pub body: Option<RouteBody>,
    pub pre_body: Option<RouteBody>,
}

/// A template of a route's text member.
#[derive(Debug)]
pub struct RouteSlot(Slot);

/// A template of a route's body.
#[derive(Debug)]
pub struct RouteBody(BodyTemplate);

/// What a route's templates are compiled from: its members as given, with their locations.
pub struct RouteTexts<'a> {
    pub path: &'a str,
    pub queries: &'a std::collections::BTreeMap<String, String>,
    pub pre_queries: &'a std::collections::BTreeMap<String, String>,
    pub headers: &'a std::collections::BTreeMap<String, String>,
    pub pre_headers: &'a std::collections::BTreeMap<String, String>,
    pub body: Option<&'a str>,
    pub pre_body: Option<&'a str>,
}

impl RouteTemplates {
    /// Compiles the members of a route with `originalRoute` that hold `{{`; their expressions
    /// may read `request` only. Every problem is located in the registration.
    pub fn compile(texts: &RouteTexts<'_>, limits: &Limits) -> Result<RouteTemplates, Vec<Problem>> {
        let mut problems = Vec::new();
        let mut patterns = Patterns::default();
        let mut compiler = SourceCompiler {
            at: "/originalRoute".to_owned(),
            names: &[],
            closure: &[],
            reads: Vec::new(),
            item: false,
            item_only_request: true,
            max_depth: limits.max_depth,
            patterns: &mut patterns,
            problems: &mut problems,
        };
        let mut templates = RouteTemplates::default();
        if texts.path.contains("{{")
            && let Some(slot) = compiler.slot(texts.path, "/originalRoute/path".to_owned())
        {
            let (skeleton, after_query) = slot.template.skeleton();
            if after_query {
                compiler.problems.push(Problem::new(
                    "/originalRoute/path",
                    "a template after `?` or `#` in `path` would write into the query; put it in `queries`",
                ));
            } else if !slot.template.escapes_complete() {
                compiler.problems.push(Problem::new("/originalRoute/path", LONE_PERCENT));
            } else if let Err(why) = UpstreamPath::parse(&skeleton) {
                compiler.problems.push(Problem::new("/originalRoute/path", why));
            } else {
                templates.path = Some(RouteSlot(slot));
            }
        }
        let mut texts_of = |map: &std::collections::BTreeMap<String, String>,
                            at: &str,
                            into: &mut Vec<(String, RouteSlot)>| {
            for (name, value) in map.iter().filter(|(_, v)| v.contains("{{")) {
                let mut location = at.to_owned();
                push_pointer(&mut location, name);
                if let Some(slot) = compiler.slot(value, location) {
                    into.push((name.clone(), RouteSlot(slot)));
                }
            }
        };
        texts_of(texts.queries, "/originalRoute/queries", &mut templates.queries);
        texts_of(texts.pre_queries, "/preConfiguredQueries", &mut templates.pre_queries);
        texts_of(texts.headers, "/originalRoute/headers", &mut templates.headers);
        texts_of(texts.pre_headers, "/preConfiguredHeaders", &mut templates.pre_headers);
        if let Some(body) = texts.body.filter(|b| b.contains("{{")) {
            templates.body = compiler.body_located(body, "/originalRoute/body".to_owned()).map(RouteBody);
        }
        if let Some(body) = texts.pre_body.filter(|b| b.contains("{{")) {
            templates.pre_body = compiler.body_located(body, "/preConfiguredBody".to_owned()).map(RouteBody);
        }
        if problems.is_empty() { Ok(templates) } else { Err(problems) }
    }

    pub fn is_empty(&self) -> bool {
        self.path.is_none()
            && self.queries.is_empty()
            && self.pre_queries.is_empty()
            && self.headers.is_empty()
            && self.pre_headers.is_empty()
            && self.body.is_none()
            && self.pre_body.is_none()
    }
}

impl RouteSlot {
    /// The text rendered for a path (each value one segment, percent-encoded), or `None` for a
    /// query or header value (as it is; a header value is checked to be one line).
    pub fn render<'d>(&'d self, context: &Context<'d, '_>, path: bool) -> Result<String, SourceError> {
        let slot = &self.0;
        let mut out = String::new();
        if path {
            let mut ranges = Vec::new();
            slot.template
                .render_tracked(context, encode_segment, &mut out, &mut ranges)
                .map_err(|e| failure(&slot.location, true, e))?;
            let text = out.split('?').next().unwrap_or_default().to_owned();
            check_segments(&text, &ranges, 0).map_err(|why| SourceError::Template {
                location: slot.location.clone(),
                why,
                only_request: true,
            })?;
        } else {
            slot.template.render(context, as_is, &mut out).map_err(|e| failure(&slot.location, true, e))?;
        }
        Ok(out)
    }

    /// [`RouteSlot::render`] of a header value: one line of visible ASCII, at most 8 KiB.
    pub fn render_header<'d>(&'d self, context: &Context<'d, '_>) -> Result<String, SourceError> {
        let value = self.render(context, false)?;
        let bad = |why: &str| SourceError::Template {
            location: self.0.location.clone(),
            why: why.to_owned(),
            only_request: true,
        };
        if value.len() > MAX_HEADER_VALUE {
            return Err(bad("the rendered header value is longer than 8 KiB"));
        }
        if !value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
            return Err(bad(
                "the rendered header value holds a character other than visible ASCII, space or tab",
            ));
        }
        Ok(value)
    }
}

impl RouteBody {
    pub fn render<'d>(&'d self, context: &Context<'d, '_>) -> Result<String, SourceError> {
        let mut out = Vec::new();
        self.0.write(context, &mut out)?;
        String::from_utf8(out).map_err(|_| SourceError::Template {
            location: "/originalRoute/body".to_owned(),
            why: "the rendered body is not UTF-8".to_owned(),
            only_request: true,
        })
    }
}

/// The identity a source's rate limit and breaker are kept under: the route's uuid mixed with
/// the source's name (FNV-1a), the same on every node and after every restart.
fn source_key(route: Uuid, name: &str) -> Uuid {
    let mut hash: u128 = 0x6c62272e07bb014262b821756295c58d;
    for &b in name.as_bytes() {
        hash ^= u128::from(b);
        hash = hash.wrapping_mul(0x0000000001000000000000000000013B);
    }
    Uuid::from_u128(route.as_u128() ^ hash)
}

/// The caller's request as sources see it, and the credential a `Runtime` source sends.
pub struct Caller<'a> {
    pub mapped_auth: Option<&'a HeaderValue>,
}

impl Source {
    /// Whether `when` lets the source be called (true without a `when`).
    pub fn wanted<'d>(&'d self, context: &Context<'d, '_>) -> Result<bool, SourceError> {
        let Some(when) = &self.when else { return Ok(true) };
        let value = context.eval(&when.program).map_err(|e| failure(&when.location, when.only_request, e))?;
        Ok(value.truthy(context.doc))
    }

    /// The elements a `forEach` source is called for, as `each` takes a value (SPEC §1.6): a
    /// list's elements, an object alone, nothing for anything else.
    pub fn elements<'d>(&'d self, context: &Context<'d, '_>) -> Result<Vec<Val<'d>>, SourceError> {
        let Some(for_each) = &self.for_each else { return Ok(Vec::new()) };
        let value = context
            .eval(&for_each.program)
            .map_err(|e| failure(&for_each.location, for_each.only_request, e))?;
        let view = context.view();
        Ok(match value.kind() {
            expr::Kind::Array => view.items(value).into_iter().flatten().collect(),
            expr::Kind::Object => vec![value],
            _ => Vec::new(),
        })
    }

    /// Where `forEach` is, for the problem of a list longer than `maxCalls`.
    pub fn for_each_location(&self) -> &str {
        self.for_each.as_ref().map_or("", |e| e.location.as_str())
    }

    /// The request of one call of the source over `context` (with its `$item` set for a
    /// `forEach` source).
    pub fn request<'d>(
        &'d self,
        context: &Context<'d, '_>,
        caller: &Caller<'_>,
    ) -> Result<UpstreamRequest, SourceError> {
        let Call::Rendered(rendered) = &self.call else {
            // A route's own request is built before the call, never here.
            return Err(SourceError::Template {
                location: String::new(),
                why: "the route's own request is not rendered from templates".to_owned(),
                only_request: false,
            });
        };
        let mut target = rendered.prefix.clone();
        if let Some(path) = &rendered.path {
            let start = target.len();
            let mut ranges = Vec::new();
            path.template
                .render_tracked(context, encode_segment, &mut target, &mut ranges)
                .map_err(|e| failure(&path.location, path.only_request, e))?;
            check_segments(&target[start..], &ranges, start).map_err(|why| SourceError::Template {
                location: path.location.clone(),
                why,
                only_request: path.only_request,
            })?;
        }
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        let mut any = false;
        for (name, slot) in &rendered.query {
            any = true;
            // A template that is one expression whose value is a list repeats the parameter.
            if let Some(program) = slot.template.whole() {
                let value =
                    context.eval(program).map_err(|e| failure(&slot.location, slot.only_request, e))?;
                if value.kind() == expr::Kind::Array {
                    for item in context.view().items(value).into_iter().flatten() {
                        scalar_text(item, &mut |text: &str| {
                            query.append_pair(name, text);
                        })
                        .map_err(|e| failure(&slot.location, slot.only_request, e))?;
                    }
                    continue;
                }
                scalar_text(value, &mut |text: &str| {
                    query.append_pair(name, text);
                })
                .map_err(|e| failure(&slot.location, slot.only_request, e))?;
                continue;
            }
            let mut value = String::new();
            slot.template
                .render(context, as_is, &mut value)
                .map_err(|e| failure(&slot.location, slot.only_request, e))?;
            query.append_pair(name, &value);
        }
        let query = query.finish();
        if any && !query.is_empty() {
            target.push('?');
            target.push_str(&query);
        }
        let uri = Uri::try_from(target.as_str()).map_err(|_| SourceError::Template {
            location: rendered.path.as_ref().map_or_else(String::new, |p| p.location.clone()),
            why: "the rendered URL is not one".to_owned(),
            only_request: false,
        })?;
        let mut headers = HeaderMap::new();
        for (name, slot) in &rendered.headers {
            let mut value = String::new();
            slot.template
                .render(context, as_is, &mut value)
                .map_err(|e| failure(&slot.location, slot.only_request, e))?;
            let bad = |why: &str| SourceError::Template {
                location: slot.location.clone(),
                why: why.to_owned(),
                only_request: slot.only_request,
            };
            if value.len() > MAX_HEADER_VALUE {
                return Err(bad("the rendered header value is longer than 8 KiB"));
            }
            if !value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
                return Err(bad(
                    "the rendered header value holds a character other than visible ASCII, space or tab",
                ));
            }
            let value =
                HeaderValue::from_str(&value).map_err(|_| bad("the rendered header value is not one"))?;
            headers.append(name.clone(), value);
        }
        let authorization = match &self.auth {
            Auth::Stored { kind, token: Some(token) } => Some(match kind {
                AuthKind::Bearer | AuthKind::Basic => format!("{} {token}", kind.name()),
                AuthKind::None => token.clone(),
            }),
            Auth::Runtime => match caller.mapped_auth.and_then(|v| v.to_str().ok()) {
                Some(value) => Some(value.to_owned()),
                None => return Err(SourceError::AuthRequired),
            },
            Auth::Stored { token: None, .. } | Auth::OAuth2(_) | Auth::None => None,
        };
        if let Some(value) = authorization {
            let mut value = HeaderValue::from_str(&value).map_err(|_| SourceError::AuthRequired)?;
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
        let mut body = Bytes::new();
        if let Some(template) = &rendered.body {
            let mut out = Vec::new();
            template.write(context, &mut out)?;
            body = out.into();
            headers.entry(header::CONTENT_TYPE).or_insert(HeaderValue::from_static("application/json"));
        }
        Ok(UpstreamRequest { method: rendered.method.clone(), uri, headers, body })
    }
}

fn failure(location: &str, only_request: bool, error: RenderError) -> SourceError {
    SourceError::Template { location: location.to_owned(), why: error.to_string(), only_request }
}

/// Checks the segments of a rendered path that hold a value: none may be empty, `.` or `..`
/// once decoded. `ranges` are the values' places in the whole target, `start` where the path
/// begins in it.
fn check_segments(path: &str, ranges: &[(usize, usize)], start: usize) -> Result<(), String> {
    let mut from = 0;
    for segment in path.split('/') {
        let (begin, end) = (start + from, start + from + segment.len());
        from += segment.len() + 1;
        if !ranges.iter().any(|&(a, b)| a >= begin && b <= end) {
            continue;
        }
        let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
        if decoded.is_empty() || decoded == "." || decoded == ".." {
            return Err(format!(
                "a path segment with a template renders {}, which would not stay one segment",
                if decoded.is_empty() { "empty" } else { "as `.` or `..`" }
            ));
        }
        // Sent encoded, `..%2Fadmin` is one segment; an upstream that decodes `%2F` before it
        // resolves a path would read `../admin`: refused as well.
        if decoded.split(['/', '\\']).any(|part| part == "." || part == "..") {
            return Err(
                "a path segment with a template renders `.` or `..` between slashes once decoded, which an upstream could take as a step up"
                    .to_owned(),
            );
        }
    }
    Ok(())
}

impl BodyTemplate {
    /// Its expressions, into `out`.
    fn programs<'t>(&'t self, out: &mut Vec<&'t Program>) {
        match self {
            BodyTemplate::Raw(_) => {}
            BodyTemplate::Whole(slot) | BodyTemplate::Text(slot) => out.extend(slot.template.programs()),
            BodyTemplate::List(items) => items.iter().for_each(|item| item.programs(out)),
            BodyTemplate::Object(members) => members.iter().for_each(|(_, item)| item.programs(out)),
        }
    }

    fn write<'d>(&'d self, context: &Context<'d, '_>, out: &mut Vec<u8>) -> Result<(), SourceError> {
        match self {
            BodyTemplate::Raw(text) => out.extend_from_slice(text.as_bytes()),
            BodyTemplate::Whole(slot) => {
                let program = slot.template.whole().expect("a whole template has one expression");
                let value =
                    context.eval(program).map_err(|e| failure(&slot.location, slot.only_request, e))?;
                View { nodes: context.doc }.write(out, value);
            }
            BodyTemplate::Text(slot) => {
                let mut text = String::new();
                slot.template
                    .render(context, as_is, &mut text)
                    .map_err(|e| failure(&slot.location, slot.only_request, e))?;
                json::write::string(out, &text);
            }
            BodyTemplate::List(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write(context, out)?;
                }
                out.push(b']');
            }
            BodyTemplate::Object(members) => {
                out.push(b'{');
                for (i, (name, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    json::write::string(out, name);
                    out.push(b':');
                    value.write(context, out)?;
                }
                out.push(b'}');
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::sources::{self, SourceConfig};
    use crate::route::template::Scratch;
    use serde_json::json;

    fn configs(given: serde_json::Value) -> Vec<SourceConfig> {
        let mut problems = Vec::new();
        let configs = sources::validate(&given, 64, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        configs
    }

    fn compiled(given: serde_json::Value) -> Result<Composition, Vec<Problem>> {
        Composition::compile(&configs(given), &[], Uuid::nil(), &Limits::default())
    }

    #[test]
    fn a_composition_knows_whether_a_source_reads_the_caller_s_request() {
        let base = json!({"baseUrl": "http://h/"});
        let reads = |b: serde_json::Value| {
            let mut sources = json!({"a": {"originalApi": base, "path": "a"}});
            sources["b"] = b;
            compiled(sources).expect("compiles").reads_request
        };
        assert!(!reads(json!({"originalApi": base, "path": "b/{{a.id}}", "after": ["a"]})));
        assert!(reads(json!({"originalApi": base, "path": "b/{{request.query.id}}"})));
        assert!(reads(json!({"originalApi": base, "path": "b", "headers": {"X": "{{request.headers.x}}"}})));
        assert!(reads(json!({"originalApi": base, "path": "b", "when": "request.body"})));
        assert!(reads(json!({"originalApi": base, "path": "b/{{length(request.query)}}"})));
        assert!(reads(json!({"originalApi": base, "path": "b/{{$item}}", "forEach": "request.query.id"})));
        assert!(!reads(json!({"originalApi": base, "path": "b", "body": {"k": "v"}})));
        assert!(reads(
            json!({"originalApi": base, "path": "b", "method": "POST", "body": {"k": "{{request.body.k}}"}})
        ));
    }

    fn located(problems: &[Problem]) -> Vec<String> {
        problems.iter().map(|p| format!("{}: {}", p.location, p.message)).collect()
    }

    /// The request `source` makes over `context` (a JSON object), with `$item` its `__item`.
    fn request(
        composition: &Composition,
        source: &str,
        context: serde_json::Value,
    ) -> Result<UpstreamRequest, SourceError> {
        let source = &composition.sources[composition.index_of(source).unwrap()];
        let mut text = context.to_string().into_bytes();
        json::with_parsed(&mut text, 64, |doc| {
            let scratch = Scratch::new(1 << 20, 1 << 20);
            let arena = scratch.arena();
            let item = View { nodes: doc }.field(Val::from_tape(doc, 0), "__item");
            let context = Context { doc, item: Some(item), arena: &arena };
            source.request(&context, &Caller { mapped_auth: None })
        })
        .unwrap()
    }

    /// A source's context read for what its expressions read (`Source::context`) renders the
    /// same request as the context read whole, and holds less of it.
    #[test]
    fn a_context_read_for_what_its_expressions_read_renders_as_the_whole_one() {
        use crate::json::ondemand::{Indexed, Part, with_parts};
        let composition = compiled(json!({
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a"},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "method": "POST", "path": "b/{{a.items[1].id}}/{{a.items[-1].id}}",
                  "queries": {"q": "{{request.query.q}}", "t": "{{a.tags[0]}}"},
                  "headers": {"X-N": "n{{a.n}}", "X-O": "{{a.\"odd name\"}}"},
                  "body": {"whole": "{{a.obj}}", "text": "x {{a.n}}"},
                  "when": "a.ok", "after": ["a"]},
            "c": {"originalApi": {"baseUrl": "http://h/"}, "path": "c/{{join(',', a.tags)}}", "when": "a.ok", "after": ["a"]},
        }))
        .unwrap();
        let request =
            Indexed::new(br#"{"query":{"q":"s p","other":"1"},"headers":{},"body":null}"#.to_vec(), 63)
                .unwrap();
        let a = Indexed::new(
            br#"{"skip":{"deep":[1,2,3]},"items":[{"id":"x"},{"id":"y\u00e9","more":[1]},{"id":7}],"tags":["t","u"],"n":1.5,
                "obj":{"k":[true,null]},"odd name":"\"q\"","ok":true,"tail":"z"}"#
                .to_vec(),
            62,
        )
        .unwrap();
        let parts = [Part::One(&request), Part::One(&a)];
        let render = |b: &Source, wants| {
            with_parts(&["request", "a"], &parts, wants, 64, |doc| {
                let scratch = Scratch::new(1 << 20, 1 << 20);
                let arena = scratch.arena();
                let context = Context { doc, item: None, arena: &arena };
                assert_eq!(b.wanted(&context), Ok(true));
                let request = b.request(&context, &Caller { mapped_auth: None }).unwrap();
                (
                    format!("{} {} {:?} {:?}", request.method, request.uri, request.headers, request.body),
                    doc.len(),
                )
            })
            .unwrap()
        };
        let b = &composition.sources[composition.index_of("b").unwrap()];
        let (whole, all) = render(b, None);
        let (read, kept) = render(b, Some(&b.context));
        assert_eq!(read, whole);
        assert!(whole.contains("/b/y%C3%A9/7?q=s+p&t=t"), "{whole}");
        // Not read: `skip` (7 nodes), `items[1].more` (3), `tail` (2), and of `request` the
        // query's `other`, `headers` and `body` (2 each).
        assert_eq!(all - kept, 18, "{kept} of {all} nodes");
        // An expression that is not a plain path reads the members it names whole.
        let c = &composition.sources[composition.index_of("c").unwrap()];
        let (whole, _) = render(c, None);
        let (read, kept) = render(c, Some(&c.context));
        assert_eq!(read, whole);
        assert!(whole.contains("/c/t%2Cu"), "{whole}");
        assert!(kept < all && kept > all / 2, "{kept} of {all} nodes");
    }

    #[test]
    fn sources_are_ordered_after_what_they_wait_for() {
        let composition = compiled(json!({
            "c": {"originalApi": {"baseUrl": "http://h/"}, "path": "c", "after": ["b"]},
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a"},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "path": "b/{{a.id}}", "after": ["a"]},
        }))
        .unwrap();
        let names: Vec<&str> = composition.sources.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(composition.sources[2].after, [1]);
        assert_eq!(composition.sources[1].reads, [0]);
        assert_eq!(composition.by_name, [0, 1, 2]);
    }

    #[test]
    fn cycles_unknown_names_and_reads_outside_the_closure_are_located() {
        let cycle = compiled(json!({
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a", "after": ["c"]},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "path": "b", "after": ["a"]},
            "c": {"originalApi": {"baseUrl": "http://h/"}, "path": "c", "after": ["b"]},
        }))
        .unwrap_err();
        assert_eq!(
            located(&cycle),
            ["/sources/a/after: the sources wait for each other in a cycle: a → c → b → a"]
        );
        let problems = compiled(json!({
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a"},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "path": "b/{{a.id}}", "when": "b.x", "after": ["a", "x"]},
            "e": {"originalApi": {"baseUrl": "http://h/"}, "path": "e/{{a.id}}"},
            "c": {"originalApi": {"baseUrl": "http://h/"}, "path": "c", "after": ["b"], "queries": {"q": "{{a.id}}"}},
            "d": {"originalApi": {"baseUrl": "http://h/"}, "path": "d", "forEach": "keys(@)"},
        }))
        .unwrap_err();
        let found = located(&problems).join("\n");
        for expected in [
            "/sources/b/after/1: unknown source `x`",
            "/sources/b/when: reads `b`, this source's own value",
            "/sources/e/path: reads `a`, which this source does not wait for: add \"a\" to its `after`",
            "/sources/d/forEach: the expression reads the whole context",
        ] {
            assert!(found.contains(expected), "{expected}\n in\n{found}");
        }
        // `c` waits for `a` through `b`: it may read it.
        assert!(!found.contains("/sources/c/"), "{found}");
    }

    #[test]
    fn the_worst_case_of_calls_is_bounded_at_registration() {
        let given = json!({
            "a": {"originalApi": {"baseUrl": "http://h/"}, "path": "a"},
            "b": {"originalApi": {"baseUrl": "http://h/"}, "path": "b/{{$item}}", "after": ["a"], "forEach": "a.ids", "maxCalls": 20,
                  "retry": {"attempts": 2, "on": [503]}},
        });
        let limits = Limits { max_source_calls: 60, ..Limits::default() };
        let problems = Composition::compile(&configs(given.clone()), &[], Uuid::nil(), &limits).unwrap_err();
        assert!(located(&problems)[0].contains("sends 61 requests"), "{problems:?}");
        let limits = Limits { max_source_calls: 61, ..Limits::default() };
        assert!(Composition::compile(&configs(given), &[], Uuid::nil(), &limits).is_ok());
    }

    #[test]
    fn a_request_is_rendered_inside_its_base_url() {
        let composition = compiled(json!({
            "a": {"originalApi": {"baseUrl": "https://api.example/v2/"}, "path": "/users/{{request.query.id}}/x?fixed=1",
                  "queries": {"n": "{{request.query.n}}", "fixed": "2"},
                  "headers": {"X-Id": "id {{request.query.id}}"},
                  "method": "PUT",
                  "body": {"whole": "{{request.body}}", "text": "id={{request.query.id}}"},
                  "authHeader": {"type": "Bearer", "token": "t"}},
        }))
        .unwrap();
        let context = json!({"request": {"query": {"id": "7/a b", "n": ["1", "2"]}, "body": {"k": [1, null]}}, "__item": null});
        let rendered = request(&composition, "a", context).unwrap();
        assert_eq!(rendered.uri.to_string(), "https://api.example/v2/users/7%2Fa%20b/x?fixed=2&n=1&n=2");
        assert_eq!(rendered.method, Method::PUT);
        assert_eq!(rendered.headers["x-id"], "id 7/a b");
        assert_eq!(rendered.headers["authorization"], "Bearer t");
        // (The body's members in name order: registration reads it so.)
        assert_eq!(&rendered.body[..], br#"{"text":"id=7/a b","whole":{"k":[1,null]}}"#);
        assert_eq!(rendered.headers["content-type"], "application/json");
        // What cannot stay where it is written fails the source, naming the place and the type.
        let fails = |query: serde_json::Value| {
            let context = json!({"request": {"query": query, "body": null}, "__item": null});
            match request(&composition, "a", context) {
                Err(SourceError::Template { location, why, only_request }) => {
                    assert!(only_request);
                    format!("{location}: {why}")
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            fails(json!({"id": "..", "n": "1"})),
            "/sources/a/path: a path segment with a template renders as `.` or `..`, which would not stay one segment"
        );
        assert_eq!(
            fails(json!({"id": "", "n": "1"})),
            "/sources/a/path: a path segment with a template renders empty, which would not stay one segment"
        );
        assert_eq!(
            fails(json!({"n": "1"})),
            "/sources/a/path: its value is null, which cannot be written as text here"
        );
        assert_eq!(
            fails(json!({"id": {"a": 1}, "n": "1"})),
            "/sources/a/path: its value is an object, which cannot be written as text here"
        );
        assert_eq!(
            fails(json!({"id": "a\nHost: evil", "n": "1"})),
            "/sources/a/headers/X-Id: the rendered header value holds a character other than visible ASCII, space or tab"
        );
        assert!(!fails(json!({"id": "1", "n": [[1]]})).contains("1]"), "a value is never shown");
    }
}
