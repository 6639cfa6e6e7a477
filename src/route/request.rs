//! The upstream request of one call (SPEC §2.2): the parts that are fixed per route, built once
//! when the route is compiled, and what a call adds from the client's request.

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Method, Uri};

use std::sync::Arc;

use super::composition::{Composition, RouteTemplates, RouteTexts, SourceError, request_context};
use super::registration::{BaseUrl, UpstreamPath};
use super::template::{Context, Scratch};
use super::{Auth, AuthKind, Route, RouteConfig, Target};
use crate::json;
use crate::rules::Limits;
use crate::upstream::{RouteTls, TokenRequest, UpstreamRequest};

/// The fixed parts of every upstream request of a route.
#[derive(Debug)]
pub(super) struct Upstream {
    method: Method,
    /// `scheme://authority/path` of the upstream URL.
    prefix: String,
    /// Configured query pairs with their precedence applied: path query, then
    /// `originalRoute.queries`, then `preConfiguredQueries`.
    query: Vec<(String, String)>,
    /// The URL of a call that brings no query: the prefix and the configured query, built once.
    uri: Uri,
    headers: HeaderMap,
    body: Option<Bytes>,
    /// The token request of the route's OAuth2 client credentials.
    oauth: Option<Arc<TokenRequest>>,
    /// The route's `tls`, read.
    tls: Option<Arc<RouteTls>>,
    /// A route whose members hold templates over `request` (SPEC §2.3): they are rendered per
    /// call into the parts above, which then hold the members' text with each template as its
    /// expression's text (unused).
    templates: Option<Templated>,
}

/// What rendering a route's templates needs.
#[derive(Debug)]
struct Templated {
    templates: RouteTemplates,
    /// The members the parts are built from, as stored (their templates unrendered): the
    /// route's configuration without what building them does not read (its rules, sources and
    /// credentials), so that a call copies only these.
    members: RouteConfig,
    forward: Vec<HeaderName>,
    limits: Limits,
}

/// What a call takes from the client's request.
#[derive(Debug, Default)]
pub struct FromClient<'a> {
    pub query: Option<&'a str>,
    pub headers: Option<&'a HeaderMap>,
    pub body: Bytes,
}

/// Why a call cannot be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// A runtime-auth route called without `X-Mapped-Auth`.
    AuthRequired,
    /// The stored configuration no longer makes a request (reported like broken rules).
    Broken(String),
    /// A template over the caller's request failed (where, and why: a type, never a value);
    /// or the caller's body, which templates read, is not JSON.
    Template { location: String, why: String },
}

pub const MAPPED_AUTH: HeaderName = HeaderName::from_static("x-mapped-auth");

impl Route {
    /// The token request of the route's OAuth2 client credentials, if it has them.
    pub fn token_request(&self) -> Option<&Arc<TokenRequest>> {
        self.single()?.oauth.as_ref()
    }

    fn single(&self) -> Option<&Upstream> {
        match &self.upstream {
            Ok(Target::Single(upstream, _)) => Some(upstream),
            _ => None,
        }
    }

    /// The route's `tls`, read, if it has one.
    pub fn tls(&self) -> Option<&RouteTls> {
        self.single()?.tls.as_deref()
    }

    /// Builds the upstream request of one call (SPEC §2.2).
    pub fn upstream_request(&self, client: &FromClient<'_>) -> Result<UpstreamRequest, CallError> {
        let upstream = match &self.upstream {
            Ok(Target::Single(upstream, _)) => upstream,
            Ok(Target::Composed(_)) => {
                return Err(CallError::Broken("a composed route has no single upstream".into()));
            }
            Err(why) => return Err(CallError::Broken(why.clone())),
        };
        let rendered;
        let upstream = match &upstream.templates {
            None => upstream,
            Some(templated) => {
                rendered = render(templated, client)?;
                &rendered
            }
        };
        let mut headers = upstream.headers.clone();
        if let Some(from_client) = client.headers {
            for name in [header::ACCEPT, header::ACCEPT_LANGUAGE] {
                if !headers.contains_key(&name)
                    && let Some(value) = from_client.get(&name)
                {
                    headers.insert(name, value.clone());
                }
            }
        }
        let mapped = client.headers.and_then(|h| h.get(&MAPPED_AUTH));
        let authorization = match &self.config.auth {
            Auth::Stored { kind, token: Some(token) } => Some(match kind {
                AuthKind::Bearer | AuthKind::Basic => format!("{} {token}", kind.name()),
                AuthKind::None => token.clone(),
            }),
            // The client's token is added as each attempt is sent (`crate::upstream`).
            Auth::Stored { token: None, .. } | Auth::OAuth2(_) => None,
            Auth::Runtime => match mapped {
                Some(value) => Some(value.to_str().map_err(|_| CallError::AuthRequired)?.to_owned()),
                None => return Err(CallError::AuthRequired),
            },
            Auth::None => mapped.and_then(|v| v.to_str().ok()).map(str::to_owned),
        };
        if let Some(value) = authorization {
            let mut value = HeaderValue::from_str(&value).map_err(|_| CallError::AuthRequired)?;
            // Kept out of HTTP/2 header compression's tables, and shown as `Sensitive` by `Debug`.
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }

        let mut body = Bytes::new();
        if matches!(upstream.method, Method::POST | Method::PUT | Method::PATCH) {
            // A configured Content-Type header wins over both.
            if let Some(configured) = &upstream.body {
                body = configured.clone();
                headers.entry(header::CONTENT_TYPE).or_insert(HeaderValue::from_static("application/json"));
            } else if !client.body.is_empty() {
                body = client.body.clone();
                if let Some(kind) = client.headers.and_then(|h| h.get(header::CONTENT_TYPE)) {
                    headers.entry(header::CONTENT_TYPE).or_insert_with(|| kind.clone());
                }
            }
        }

        let uri = match client.query.filter(|query| !query.is_empty()) {
            None => upstream.uri.clone(),
            Some(query) => {
                upstream_uri(&upstream.prefix, query, &upstream.query).map_err(CallError::Broken)?
            }
        };
        Ok(UpstreamRequest { method: upstream.method.clone(), uri, headers, body })
    }
}

/// `prefix` with the query of a call: the client's pairs, except those the route configures,
/// then the configured ones.
fn upstream_uri(prefix: &str, client_query: &str, configured: &[(String, String)]) -> Result<Uri, String> {
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    let is_configured = |name: &str| configured.iter().any(|(n, _)| n == name);
    for (name, value) in url::form_urlencoded::parse(client_query.as_bytes()) {
        if !is_configured(&name) {
            query.append_pair(&name, &value);
        }
    }
    for (name, value) in configured {
        query.append_pair(name, value);
    }
    let query = query.finish();
    let uri = if query.is_empty() { prefix.to_owned() } else { format!("{prefix}?{query}") };
    Uri::try_from(uri).map_err(|e| format!("the upstream URL is invalid: {e}"))
}

/// The parts of one call of a route with templates: each templated member rendered over the
/// caller's request, then built as a stored route's are.
fn render(templated: &Templated, client: &FromClient<'_>) -> Result<Upstream, CallError> {
    let empty = HeaderMap::new();
    let headers = client.headers.unwrap_or(&empty);
    let limits = &templated.limits;
    let request = request_context(client.query, headers, &templated.forward, &client.body, limits.max_depth)
        .map_err(|e| CallError::Template {
            location: "(request body)".to_owned(),
            why: format!("the body is not JSON: {e}"),
        })?;
    // The context: `{"request": ...}`.
    let mut text = Vec::with_capacity(request.len() + 16);
    text.extend_from_slice(b"{\"request\":");
    text.extend_from_slice(&request);
    text.push(b'}');
    let mut config = templated.members.clone();
    let t = &templated.templates;
    let rendered = json::with_parsed(&mut text, limits.max_depth, |doc| -> Result<(), SourceError> {
        let scratch = Scratch::new(limits.max_expr_bytes, limits.max_mapping_steps);
        let arena = scratch.arena();
        let context = Context { doc, item: None, arena: &arena };
        if let Some(path) = &t.path {
            config.upstream_path = path.render(&context, true)?;
        }
        for (map, slots) in [(&mut config.queries, &t.queries), (&mut config.pre_queries, &t.pre_queries)] {
            for (name, slot) in slots {
                map.insert(name.clone(), slot.render(&context, false)?);
            }
        }
        for (map, slots) in [(&mut config.headers, &t.headers), (&mut config.pre_headers, &t.pre_headers)] {
            for (name, slot) in slots {
                map.insert(name.clone(), slot.render_header(&context)?);
            }
        }
        if let Some(body) = &t.body {
            config.body = Some(body.render(&context)?);
        }
        if let Some(body) = &t.pre_body {
            config.pre_body = Some(body.render(&context)?);
        }
        Ok(())
    });
    match rendered {
        Ok(Ok(())) => {}
        Ok(Err(SourceError::Template { location, why, .. })) => {
            return Err(CallError::Template { location, why });
        }
        Ok(Err(SourceError::AuthRequired)) => return Err(CallError::AuthRequired),
        Err(e) => return Err(CallError::Template { location: "(request)".to_owned(), why: e.to_string() }),
    }
    // The route was sound when stored: what the rendered values make of it is the caller's.
    Upstream::parts(&config).map_err(|why| CallError::Template { location: "/originalRoute".to_owned(), why })
}

impl Upstream {
    /// The route's schedule: its own upstream as the one source, with its credentials and TLS.
    pub(super) fn schedule(&self, config: &RouteConfig, route: uuid::Uuid) -> Composition {
        Composition::own(config, route, self.oauth.clone(), self.tls.clone())
    }

    pub(super) fn new(config: &RouteConfig, limits: &Limits) -> Result<Upstream, String> {
        let templates = if config.templates {
            let texts = RouteTexts {
                path: &config.upstream_path,
                queries: &config.queries,
                pre_queries: &config.pre_queries,
                headers: &config.headers,
                pre_headers: &config.pre_headers,
                body: config.body.as_deref(),
                pre_body: config.pre_body.as_deref(),
            };
            let templates = RouteTemplates::compile(&texts, limits).map_err(|problems| {
                format!(
                    "its templates no longer compile: {}",
                    problems.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; ")
                )
            })?;
            (!templates.is_empty()).then_some(templates)
        } else {
            None
        };
        let oauth = match &config.auth {
            Auth::OAuth2(credentials) => Some(Arc::new(TokenRequest::new(credentials)?)),
            _ => None,
        };
        let tls = match &config.tls {
            Some(settings) => Some(Arc::new(
                RouteTls::new(settings)
                    .map_err(|(member, why)| format!("its tls.{member} is unusable: {why}"))?,
            )),
            None => None,
        };
        let Some(templates) = templates else {
            return Ok(Upstream { oauth, tls, ..Upstream::parts(config)? });
        };
        // The parts are made per call; the base URL is checked once here (it has no templates).
        BaseUrl::parse(&config.base_url)?;
        let forward =
            config.forward_headers.iter().filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok()).collect();
        let mut skeleton = config.clone();
        skeleton.upstream_path = String::new();
        skeleton.queries.clear();
        skeleton.pre_queries.clear();
        skeleton.headers.clear();
        skeleton.pre_headers.clear();
        let mut upstream = Upstream::parts(&skeleton)?;
        upstream.oauth = oauth;
        upstream.tls = tls;
        let members = RouteConfig {
            rules: String::new(),
            sources: Vec::new(),
            auth: Auth::None,
            tls: None,
            ..config.clone()
        };
        upstream.templates = Some(Templated { templates, members, forward, limits: *limits });
        Ok(upstream)
    }

    /// The parts of the requests of `config` that do not change from call to call, without
    /// its OAuth2 token request and `tls` (which [`Upstream::new`] reads once per route).
    fn parts(config: &RouteConfig) -> Result<Upstream, String> {
        let base = BaseUrl::parse(&config.base_url)?.0;
        let path = UpstreamPath::parse(&config.upstream_path)?;
        let mut prefix = format!("{}://{}", base.scheme(), base.host_str().unwrap_or_default());
        if let Some(port) = base.port() {
            prefix.push_str(&format!(":{port}"));
        }
        let base_path = base.path().trim_end_matches('/');
        prefix.push_str(base_path);
        if !path.path.is_empty() || base_path.is_empty() {
            prefix.push('/');
            prefix.push_str(&path.path);
        }
        // The joined URL must stay on the base URL's origin and below its path.
        let joined = url::Url::parse(&prefix).map_err(|e| format!("the upstream URL is invalid: {e}"))?;
        if joined.origin() != base.origin() || !joined.path().starts_with(base_path) {
            return Err("the upstream path leaves the base URL".into());
        }

        let mut query: Vec<(String, String)> = Vec::new();
        let mut set = |name: &str, value: &str| {
            query.retain(|(n, _)| n != name);
            query.push((name.to_owned(), value.to_owned()));
        };
        for (name, value) in &path.query {
            set(name, value);
        }
        for (name, value) in config.queries.iter().chain(&config.pre_queries) {
            set(name, value);
        }

        let mut headers = HeaderMap::new();
        for (name, value) in config.headers.iter().chain(&config.pre_headers) {
            let name =
                HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("header `{name}`: {e}"))?;
            let value = HeaderValue::from_str(value).map_err(|e| format!("header `{name}`: {e}"))?;
            headers.insert(name, value);
        }
        let body = config.pre_body.as_ref().or(config.body.as_ref()).map(|text| Bytes::from(text.clone()));
        let method =
            config.upstream_method.parse().map_err(|_| "the upstream method is invalid".to_owned())?;
        let uri = upstream_uri(&prefix, "", &query)?;
        Ok(Upstream { method, prefix, query, uri, headers, body, oauth: None, tls: None, templates: None })
    }
}
