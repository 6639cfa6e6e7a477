//! The one request builder (SPEC §2.2, §2.3). A route's own upstream (`originalRoute` with the
//! `preConfigured…` members) and each source of a composed route are compiled from their
//! [`Members`] into a [`RequestTemplate`], checked once with every problem at its place in the
//! registration; each call renders it over its context into the `UpstreamRequest` it sends.
//!
//! One list of the headers nobody configures ([`reserved_header`]), one check of a path and of
//! each segment a value renders ([`check_segments`]), one rule for bodies (sent with the methods
//! that carry one), one for query values (a list repeats the parameter), and every configured
//! header value and credential marked sensitive (kept out of HTTP/2's header tables and `Debug`).
//! Template values never choose where a request goes: scheme, host and port are the base URL's.
//! Pure: no IO.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Uri};

use super::config::{Auth, AuthKind};
use super::fields::{BaseUrl, UpstreamPath};
use super::template::{Context, RenderError, Template, as_is, encode_segment, scalar_text};
use crate::expr::{self, Doc as View, Patterns, Program};
use crate::json::{self, Node, push_pointer};
use crate::rules::Problem;
use crate::upstream::UpstreamRequest;

/// The longest rendered header value.
pub const MAX_HEADER_VALUE: usize = 8 << 10;

/// What a request is compiled from: the members of `originalRoute` (with the `preConfigured…`
/// ones) or of a source, each with its location in the registration.
pub struct Members<'a> {
    pub base_url: &'a str,
    pub base_url_at: String,
    pub method: &'a str,
    pub method_at: String,
    pub path: &'a str,
    pub path_at: String,
    /// In the order they apply: a later value of a name wins.
    pub queries: Vec<(&'a str, &'a str, String)>,
    /// In the order they apply: a later value of a name wins.
    pub headers: Vec<(&'a str, &'a str, String)>,
    /// The bodies given, in the order they apply: the last is sent (every one is checked).
    pub bodies: Vec<(&'a str, String)>,
    pub auth: &'a Auth,
    /// Where `authHeader` is, for its problems.
    pub auth_at: String,
    /// Whether `{{ }}` in the members are templates; a route stored before templates existed
    /// sends its text as written.
    pub templates: bool,
    /// Whether the caller's query, `Accept` and `Accept-Language`, body and `X-Mapped-Auth` pass
    /// as SPEC §2.2 says: a route's own upstream. A source takes nothing of the caller's request
    /// but through its templates (and a `Runtime` source its `X-Mapped-Auth`).
    pub caller_passes: bool,
}

/// A request compiled: rendered per call by [`RequestTemplate::render`].
#[derive(Debug)]
pub struct RequestTemplate {
    method: Method,
    /// `scheme://authority` and the base URL's path, without a `/` at its end.
    prefix: String,
    /// The base URL as given, which a request with an empty path goes to.
    base: String,
    /// The path below the base URL, without the leading `/` and its literal query.
    path: Slot,
    /// The path's literal query pairs, then the configured queries, one per name.
    query: Vec<(String, Slot)>,
    headers: Vec<(HeaderName, Slot)>,
    body: Option<BodyTemplate>,
    credential: Credential,
    caller_passes: bool,
    /// Whether a body is sent (the method carries one).
    sends_body: bool,
    /// The parts of a request with no expression in it, built once.
    fixed: Option<Fixed>,
    /// Whether an expression reads the context (`request` or a source).
    reads: bool,
}

/// What a request without expressions sends on every call, made at compile time.
#[derive(Debug)]
struct Fixed {
    /// The URL without its query.
    target: String,
    /// The URL without a caller's query.
    uri: Uri,
    /// The configured query, for a call that brings one of its own.
    query: Vec<(String, String)>,
    headers: HeaderMap,
    body: Option<Bytes>,
}

/// How a request's `Authorization` is written.
#[derive(Debug)]
enum Credential {
    /// None (an OAuth2 token is written by the upstream client as each attempt is sent).
    None,
    /// A stored token, as `Authorization` sends it.
    Stored(HeaderValue),
    /// The caller's `X-Mapped-Auth`, which the call must bring (`Runtime`).
    Runtime,
    /// The caller's `X-Mapped-Auth` when it brings one (a route's own upstream without
    /// `authHeader`), unless the route configures `Authorization` itself.
    Caller,
}

/// A template with where it is in the registration.
#[derive(Debug)]
pub(super) struct Slot {
    template: Template,
    location: String,
    /// Whether it reads only `request` (its failure is then the caller's: 400).
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

/// What a call brings of the caller's request.
#[derive(Debug, Default, Clone, Copy)]
pub struct CallerParts<'a> {
    pub query: Option<&'a str>,
    pub headers: Option<&'a HeaderMap>,
    pub body: Option<&'a Bytes>,
    pub mapped_auth: Option<&'a HeaderValue>,
}

/// Why a request could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// A template failed: where, why (naming a type, never a value), and whether it read only
    /// `request`.
    Template { location: String, why: String, only_request: bool },
    /// A template's value was null because a member its expression reads is missing: where,
    /// which member and the closest name there is (an admin's live call only).
    Missing { location: String, why: String, only_request: bool },
    /// A call of a `Runtime` request without `X-Mapped-Auth`.
    AuthRequired,
}

/// Why a path with a `%` that starts no escape is refused.
const LONE_PERCENT: &str = "a `%` in `path` must start an escape (`%` and two hex digits): before a template, a value could finish it";

/// Checks a header value, configured or rendered, as one rule: one line of visible ASCII, space
/// or tab, at most [`MAX_HEADER_VALUE`] bytes.
fn header_text(value: &str) -> Result<(), &'static str> {
    if value.len() > MAX_HEADER_VALUE {
        return Err("header value is longer than 8 KiB");
    }
    if !value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
        return Err("header value holds a character other than visible ASCII, space or tab");
    }
    Ok(())
}

/// Why `name` may not be configured, if it may not: framing and hop-by-hop headers, `Host`,
/// `Proxy-*`, the codings recast decodes, the caller's credential, and `Authorization` beside
/// an `authHeader`. The one list for a route's own upstream and for sources.
pub fn reserved_header(name: &HeaderName, auth: &Auth) -> Option<String> {
    const FRAMING: [&str; 9] = [
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "expect",
    ];
    let name = name.as_str();
    if FRAMING.contains(&name) || name.starts_with("proxy-") {
        return Some(format!(
            "`{name}` cannot be configured: recast writes the request's framing and hop-by-hop headers"
        ));
    }
    match name {
        "accept-encoding" => Some(
            "`accept-encoding` cannot be configured: recast asks for the codings it decodes (gzip, br)"
                .to_owned(),
        ),
        "x-mapped-auth" => Some(
            "`x-mapped-auth` cannot be configured: it is the caller's credential (use `authHeader`)"
                .to_owned(),
        ),
        "authorization" if !matches!(auth, Auth::None) => {
            Some("`Authorization` cannot be configured beside an `authHeader`".to_owned())
        }
        _ => None,
    }
}

/// Compiles requests, templates and expressions over a context, collecting every problem: what
/// names an expression may read (`request`, and for a source the sources it waits for), and
/// the patterns compiled so far.
pub(super) struct Compiler<'c> {
    /// The names of the composition's sources (none for a route's own upstream).
    pub names: &'c [&'c str],
    /// Those of `names` the request being compiled may read (its source's `after` closure).
    pub closure: &'c [usize],
    /// The sources read so far (indexes into `names`).
    pub reads: Vec<usize>,
    /// Where the request's source is (`/sources/<name>`), for reads of its own value.
    pub at: String,
    /// Whether `$item` is bound (a `forEach` source).
    pub item: bool,
    /// Whether the `forEach` expression reads only `request`.
    pub item_only_request: bool,
    pub max_depth: usize,
    pub patterns: &'c mut Patterns,
    pub problems: &'c mut Vec<Problem>,
}

/// An expression over the context, with where it is in the registration.
#[derive(Debug)]
pub struct Expression {
    pub program: Program,
    pub location: String,
    /// Whether it reads only `request` (its failure is then the caller's: 400).
    pub only_request: bool,
}

impl Compiler<'_> {
    /// Compiles `members` into a request, or `None` with its problems added.
    pub fn request(&mut self, members: &Members<'_>) -> Option<RequestTemplate> {
        let before = self.problems.len();
        let method = match members.method.parse::<Method>() {
            Ok(method) => method,
            Err(_) => {
                self.problems.push(Problem::new(&members.method_at, "not a method"));
                Method::GET
            }
        };
        let base = match BaseUrl::parse(members.base_url.trim()) {
            Ok(base) => Some(base.0),
            Err(why) => {
                self.problems.push(Problem::new(&members.base_url_at, why));
                None
            }
        };
        let path = self.path(members);
        let mut query: Vec<(String, Slot)> = Vec::new();
        if let Some((_, pairs)) = &path {
            for (name, value) in pairs {
                let slot = Slot {
                    template: Template::literal_text(value.clone()),
                    location: members.path_at.clone(),
                    only_request: true,
                };
                query.push((name.clone(), slot));
            }
        }
        for (name, value, location) in &members.queries {
            if let Some(slot) = self.text(value, location.clone(), members.templates) {
                query.push(((*name).to_owned(), slot));
            }
        }
        let query = last_of_each(query, |(name, _)| name.clone());
        let mut headers: Vec<(HeaderName, Slot)> = Vec::new();
        for (name, value, location) in &members.headers {
            let header = match HeaderName::from_bytes(name.as_bytes()) {
                Ok(header) => header,
                Err(_) => {
                    self.problems.push(Problem::new(location, "not a valid header name"));
                    continue;
                }
            };
            if let Some(why) = reserved_header(&header, members.auth) {
                self.problems.push(Problem::new(location, why));
                continue;
            }
            let Some(slot) = self.text(value, location.clone(), members.templates) else { continue };
            if let Some(text) = slot.template.literal()
                && let Err(why) = header_text(text)
            {
                self.problems.push(Problem::new(location, why));
                continue;
            }
            headers.push((header, slot));
        }
        let headers = last_of_each(headers, |(name, _)| name.clone());
        let mut body = None;
        for (text, location) in &members.bodies {
            body = self.body(text, location.clone(), members.templates);
        }
        let credential = match members.auth {
            Auth::Stored { kind, token: Some(token) } => {
                let text = match kind {
                    AuthKind::Bearer | AuthKind::Basic => format!("{} {token}", kind.name()),
                    AuthKind::None => token.clone(),
                };
                match HeaderValue::from_str(&text) {
                    Ok(mut value) => {
                        value.set_sensitive(true);
                        Credential::Stored(value)
                    }
                    Err(_) => {
                        self.problems.push(Problem::new(
                            format!("{}/token", members.auth_at),
                            "the token holds characters a header value cannot (control characters such as CR or LF)",
                        ));
                        Credential::None
                    }
                }
            }
            Auth::Stored { token: None, .. } | Auth::OAuth2(_) => Credential::None,
            Auth::Runtime => Credential::Runtime,
            Auth::None if members.caller_passes => Credential::Caller,
            Auth::None => Credential::None,
        };
        if self.problems.len() != before {
            return None;
        }
        let (Some(base), Some((path, _))) = (base, path) else { return None };
        let mut prefix = format!("{}://{}", base.scheme(), base.host_str().unwrap_or_default());
        if let Some(port) = base.port() {
            prefix.push_str(&format!(":{port}"));
        }
        prefix.push_str(base.path().trim_end_matches('/'));
        let sends_body = matches!(method, Method::POST | Method::PUT | Method::PATCH);
        let mut request = RequestTemplate {
            method,
            prefix,
            base: base.to_string(),
            path,
            query,
            headers,
            body,
            credential,
            caller_passes: members.caller_passes,
            sends_body,
            fixed: None,
            reads: false,
        };
        let reads = request.programs().next().is_some();
        request.reads = reads;
        if !request.reads {
            request.fixed = request.fixed();
        }
        Some(request)
    }

    /// Checks the names `program` reads against what its request may read; records the sources
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
                None if self.names.is_empty() => self.problems.push(Problem::new(
                    location,
                    format!(
                        "reads `{name}`: a route's own upstream's templates read `request` alone{}",
                        crate::suggest::closest(name, ["request"])
                            .map(|c| format!("; did you mean `{c}`?"))
                            .unwrap_or_default()
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

    /// Compiles the expression `text` at `location` (`when`, `forEach`).
    pub fn expression(&mut self, text: &str, location: String, item: bool) -> Option<Expression> {
        let bound = super::template::bound(item);
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

    /// A member's text: a template, or as written (`templates` false).
    fn text(&mut self, text: &str, location: String, templates: bool) -> Option<Slot> {
        if !templates {
            return Some(Slot {
                template: Template::literal_text(text.to_owned()),
                location,
                only_request: true,
            });
        }
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

    /// The path's template (without its leading `/` and literal query) and the literal query's
    /// pairs. Its shape is checked with each template as one plain segment character: it stays
    /// below the base URL, and a template after `?` or `#` would write into the query.
    fn path(&mut self, members: &Members<'_>) -> Option<(Slot, Vec<(String, String)>)> {
        let location = &members.path_at;
        let slot = self.text(members.path, location.clone(), members.templates)?;
        let (skeleton, template_after_query) = slot.template.skeleton();
        if template_after_query {
            self.problems.push(Problem::new(
                location,
                "a template after `?` or `#` in `path` would write into the query; put it in `queries`",
            ));
            return None;
        }
        if slot.template.programs().next().is_some() && !slot.template.escapes_complete() {
            self.problems.push(Problem::new(location, LONE_PERCENT));
            return None;
        }
        match UpstreamPath::parse(&skeleton) {
            Err(why) => {
                self.problems.push(Problem::new(location, why));
                None
            }
            Ok(parsed) => Some((Slot { template: slot.template.without_query(), ..slot }, parsed.query)),
        }
    }

    /// A body: JSON text whose strings may hold templates.
    fn body(&mut self, text: &str, location: String, templates: bool) -> Option<BodyTemplate> {
        if !templates || !text.contains("{{") {
            // Checked as JSON still: it is sent as it is.
            let mut buffer = text.as_bytes().to_vec();
            return match json::with_parsed(&mut buffer, self.max_depth, |_| ()) {
                Ok(()) => Some(BodyTemplate::Raw(text.to_owned())),
                Err(e) => {
                    self.problems.push(Problem::new(location, format!("not JSON: {e}")));
                    None
                }
            };
        }
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
                let slot = self.text(s, at.clone(), true)?;
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
                json::value(scratch, nodes, i);
                BodyTemplate::Raw(String::from_utf8_lossy(scratch).into_owned())
            }
        })
    }
}

/// The last of each key in `items`, in the order of those last ones (a later value of a name
/// replaces an earlier one, and takes its place at the end).
fn last_of_each<T, K: std::hash::Hash + Eq>(items: Vec<T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let mut last: HashMap<K, usize> = HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        last.insert(key(item), i);
    }
    items
        .into_iter()
        .enumerate()
        .filter(|(i, item)| last.get(&key(item)) == Some(i))
        .map(|(_, item)| item)
        .collect()
}

impl RequestTemplate {
    /// The request of one call: rendered over `context` (which only a request whose
    /// expressions read something needs), with what the caller brings.
    pub fn render<'d>(
        &'d self,
        context: Option<&Context<'d, '_>>,
        caller: &CallerParts<'_>,
    ) -> Result<UpstreamRequest, RequestError> {
        let (uri, mut headers, body) = match (&self.fixed, context) {
            (Some(fixed), _) => {
                let uri = match caller.query.filter(|q| self.caller_passes && !q.is_empty()) {
                    None => fixed.uri.clone(),
                    Some(query) => {
                        let configured: Vec<(&str, &str)> =
                            fixed.query.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                        self.uri(&fixed.target, Some(query), &configured)?
                    }
                };
                (uri, fixed.headers.clone(), fixed.body.clone())
            }
            (None, Some(context)) => self.rendered(context, caller)?,
            (None, None) => {
                return Err(RequestError::Template {
                    location: self.path.location.clone(),
                    why: "the request reads a context it was not given".to_owned(),
                    only_request: false,
                });
            }
        };
        if self.caller_passes
            && let Some(from) = caller.headers
        {
            for name in [header::ACCEPT, header::ACCEPT_LANGUAGE] {
                if !headers.contains_key(&name)
                    && let Some(value) = from.get(&name)
                {
                    headers.insert(name, value.clone());
                }
            }
        }
        let authorization = match &self.credential {
            Credential::None => None,
            Credential::Stored(value) => Some(value.clone()),
            Credential::Runtime => Some(caller.mapped_auth.ok_or(RequestError::AuthRequired)?.clone()),
            Credential::Caller if headers.contains_key(header::AUTHORIZATION) => None,
            Credential::Caller => caller.mapped_auth.cloned(),
        };
        if let Some(mut value) = authorization {
            // Kept out of HTTP/2 header compression's tables, and shown as `Sensitive` by `Debug`.
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
        let mut sent = Bytes::new();
        if self.sends_body {
            match body {
                Some(body) => {
                    sent = body;
                    headers
                        .entry(header::CONTENT_TYPE)
                        .or_insert(HeaderValue::from_static("application/json"));
                }
                None if self.caller_passes => {
                    if let Some(body) = caller.body.filter(|b| !b.is_empty()) {
                        sent = body.clone();
                        if let Some(kind) = caller.headers.and_then(|h| h.get(header::CONTENT_TYPE)) {
                            headers.entry(header::CONTENT_TYPE).or_insert_with(|| kind.clone());
                        }
                    }
                }
                None => {}
            }
        }
        Ok(UpstreamRequest { method: self.method.clone(), uri, headers, body: sent })
    }

    /// The URL, headers and body of a call whose expressions read `context`.
    fn rendered<'d>(
        &'d self,
        context: &Context<'d, '_>,
        caller: &CallerParts<'_>,
    ) -> Result<(Uri, HeaderMap, Option<Bytes>), RequestError> {
        let mut path = String::new();
        let mut ranges = Vec::new();
        let slot = &self.path;
        slot.template
            .render_tracked(context, encode_segment, &mut path, &mut ranges)
            .map_err(|e| slot.failure(e))?;
        check_segments(&path, &ranges).map_err(|why| slot.fails(why))?;
        let target = self.target(&path);
        let mut pairs: Vec<(&str, String)> = Vec::with_capacity(self.query.len());
        for (name, slot) in &self.query {
            // A template that is one expression whose value is a list repeats the parameter.
            if let Some(program) = slot.template.whole() {
                let value = context.eval(program).map_err(|e| slot.failure(e))?;
                if value.kind() == expr::Kind::Array {
                    for item in context.view().items(value).into_iter().flatten() {
                        scalar_text(item, &mut |text: &str| pairs.push((name, text.to_owned())))
                            .map_err(|e| slot.failure(e))?;
                    }
                } else {
                    context
                        .scalar(program, value, &mut |text: &str| pairs.push((name, text.to_owned())))
                        .map_err(|e| slot.failure(e))?;
                }
                continue;
            }
            let mut value = String::new();
            slot.template.render(context, as_is, &mut value).map_err(|e| slot.failure(e))?;
            pairs.push((name, value));
        }
        let configured: Vec<(&str, &str)> = pairs.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let query = caller.query.filter(|_| self.caller_passes);
        let uri = self.uri(&target, query, &configured)?;
        let mut headers = HeaderMap::with_capacity(self.headers.len() + 4);
        for (name, slot) in &self.headers {
            let mut value = String::new();
            slot.template.render(context, as_is, &mut value).map_err(|e| slot.failure(e))?;
            header_text(&value).map_err(|why| slot.fails(format!("the rendered {why}")))?;
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| slot.fails("the rendered header value is not one".to_owned()))?;
            value.set_sensitive(true);
            headers.append(name.clone(), value);
        }
        let body = match &self.body {
            Some(template) if self.sends_body => {
                let mut out = Vec::new();
                template.write(context, &mut out)?;
                Some(Bytes::from(out))
            }
            _ => None,
        };
        Ok((uri, headers, body))
    }

    /// The URL without its query: the base URL as given for an empty path, else the prefix and
    /// the path.
    fn target(&self, path: &str) -> String {
        if path.is_empty() { self.base.clone() } else { format!("{}/{path}", self.prefix) }
    }

    /// `target` with the caller's query pairs (but those the request configures), then the
    /// configured ones.
    fn uri(
        &self,
        target: &str,
        caller: Option<&str>,
        configured: &[(&str, &str)],
    ) -> Result<Uri, RequestError> {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        if let Some(given) = caller.filter(|q| !q.is_empty()) {
            let names: HashSet<&str> = configured.iter().map(|(name, _)| *name).collect();
            for (name, value) in url::form_urlencoded::parse(given.as_bytes()) {
                if !names.contains(name.as_ref()) {
                    query.append_pair(&name, &value);
                }
            }
        }
        for (name, value) in configured {
            query.append_pair(name, value);
        }
        let query = query.finish();
        let text = if query.is_empty() { target.to_owned() } else { format!("{target}?{query}") };
        Uri::try_from(text).map_err(|_| self.path.fails("the rendered URL is not one".to_owned()))
    }

    /// The parts of a request without expressions, built once.
    fn fixed(&self) -> Option<Fixed> {
        let path = self.path.template.literal().unwrap_or_default();
        let target = self.target(path);
        let query: Vec<(String, String)> = self
            .query
            .iter()
            .map(|(name, slot)| (name.clone(), slot.template.literal().unwrap_or_default().to_owned()))
            .collect();
        let configured: Vec<(&str, &str)> = query.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        let uri = self.uri(&target, None, &configured).ok()?;
        let mut headers = HeaderMap::with_capacity(self.headers.len() + 4);
        for (name, slot) in &self.headers {
            let mut value = HeaderValue::from_str(slot.template.literal().unwrap_or_default()).ok()?;
            value.set_sensitive(true);
            headers.append(name.clone(), value);
        }
        let body = match &self.body {
            Some(BodyTemplate::Raw(text)) if self.sends_body => Some(Bytes::from(text.clone())),
            _ => None,
        };
        Some(Fixed { target, uri, query, headers, body })
    }

    /// Every expression the request's templates hold.
    pub fn programs(&self) -> impl Iterator<Item = &Program> {
        let mut programs: Vec<&Program> = Vec::new();
        programs.extend(self.path.template.programs());
        for (_, slot) in &self.query {
            programs.extend(slot.template.programs());
        }
        for (_, slot) in &self.headers {
            programs.extend(slot.template.programs());
        }
        if let Some(body) = &self.body {
            body.programs(&mut programs);
        }
        programs.into_iter()
    }

    /// Whether its expressions read anything: a call must then render it over a context.
    pub fn reads(&self) -> bool {
        self.reads
    }

    /// Whether it sends the caller's `X-Mapped-Auth` (a `Runtime` request), which a call must
    /// bring.
    pub fn runtime_auth(&self) -> bool {
        matches!(self.credential, Credential::Runtime)
    }

    /// The URL every request of it goes to the origin of: scheme, host and port are never
    /// templated (for the outbound policy's check before any call).
    pub fn origin(&self) -> Uri {
        Uri::try_from(format!("{}/", self.prefix)).unwrap_or_else(|_| Uri::from_static("http://invalid./"))
    }

    /// The method its requests are sent with.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Whether it has a body that its method does not send (a `GET` with `body`).
    pub fn drops_body(&self) -> bool {
        self.body.is_some() && !self.sends_body
    }
}

impl Slot {
    fn failure(&self, error: RenderError) -> RequestError {
        match error {
            RenderError::Missing(_) => RequestError::Missing {
                location: self.location.clone(),
                why: error.to_string(),
                only_request: self.only_request,
            },
            _ => self.fails(error.to_string()),
        }
    }

    fn fails(&self, why: String) -> RequestError {
        RequestError::Template { location: self.location.clone(), why, only_request: self.only_request }
    }
}

/// Checks the segments of a rendered path that hold a value (`ranges`, their places in it): none
/// may be empty, `.` or `..` once decoded, nor hold `.` or `..` between slashes once decoded.
pub(super) fn check_segments(path: &str, ranges: &[(usize, usize)]) -> Result<(), String> {
    // The values come in the order they were written: one pass over both.
    let mut values = ranges.iter().peekable();
    let mut from = 0;
    for segment in path.split('/') {
        let (begin, end) = (from, from + segment.len());
        from += segment.len() + 1;
        let mut holds = false;
        while let Some(&&(a, b)) = values.peek() {
            if a > end {
                break;
            }
            holds |= a >= begin && b <= end;
            values.next();
        }
        if !holds {
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

    fn write<'d>(&'d self, context: &Context<'d, '_>, out: &mut Vec<u8>) -> Result<(), RequestError> {
        match self {
            BodyTemplate::Raw(text) => out.extend_from_slice(text.as_bytes()),
            BodyTemplate::Whole(slot) => {
                let program = slot.template.whole().expect("a whole template has one expression");
                let value = context.eval(program).map_err(|e| slot.failure(e))?;
                View { nodes: context.doc }.write(out, value);
            }
            BodyTemplate::Text(slot) => {
                let mut text = String::new();
                slot.template.render(context, as_is, &mut text).map_err(|e| slot.failure(e))?;
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
