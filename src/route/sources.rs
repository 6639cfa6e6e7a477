//! `sources` of a composed route (SPEC §2.3) as stored ([`SourceConfig`]), and their validation
//! from a registration's body: the shape of each source, with every problem at its location
//! (`/sources/orders/queries/customer`). The templates, expressions and the graph are checked
//! when they are compiled ([`super::composition`]), with the same locations.

use std::collections::BTreeMap;

use serde_json::Value;

use super::config::{Auth, SourceConfig};
use super::fields::{
    AuthHeader, BaseUrl, auth, method_of, rate_limit_settings, retry_settings, tls_settings,
};
use crate::json::push_pointer;
use crate::rules::Problem;
use crate::suggest;

/// At most this many sources in one composition.
pub const MAX_SOURCES: usize = 16;
/// `concurrency`'s bound.
pub const MAX_CONCURRENCY: u32 = 32;
/// `maxCalls`' default.
pub const DEFAULT_MAX_CALLS: u32 = 32;
/// `concurrency`'s default.
pub const DEFAULT_CONCURRENCY: u32 = 8;
/// The longest `timeoutMs`: an hour (the call's own deadline bounds it anyway).
const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// The members a source takes.
const MEMBERS: [&str; 19] = [
    "originalApi",
    "path",
    "method",
    "headers",
    "queries",
    "body",
    "authHeader",
    "tls",
    "retry",
    "rateLimit",
    "http2",
    "after",
    "when",
    "forEach",
    "maxCalls",
    "concurrency",
    "optional",
    "timeoutMs",
    "paginate",
];

/// Whether `name` is a source name: `[a-z][a-z0-9_]{0,31}`, not `request`.
pub fn is_source_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=32).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes.iter().all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && name != "request"
}

/// Reads `sources` into the sources to store, in the order given, or every problem of their
/// shape. `max_calls` is `RECAST_MAX_SOURCE_CALLS`.
pub fn validate(given: &Value, max_calls: u32, problems: &mut Vec<Problem>) -> Vec<SourceConfig> {
    let Value::Object(members) = given else {
        problems.push(Problem::new(
            "/sources",
            "must be an object of named sources, such as {\"user\": {\"originalApi\": {\"baseUrl\": \"https://...\"}, \"path\": \"users/1\"}}",
        ));
        return Vec::new();
    };
    if members.is_empty() {
        problems.push(Problem::new("/sources", "a composition needs at least one source"));
    }
    if members.len() > MAX_SOURCES {
        problems.push(Problem::new(
            "/sources",
            format!("a composition has at most {MAX_SOURCES} sources; this one has {}", members.len()),
        ));
    }
    let mut sources = Vec::new();
    for (name, source) in members {
        let mut at = "/sources".to_owned();
        push_pointer(&mut at, name);
        if !is_source_name(name) {
            problems.push(Problem::new(
                &at,
                if name == "request" {
                    "`request` is the caller's request in templates and expressions; name the source otherwise".to_owned()
                } else {
                    "a source's name is a lower-case letter, then up to 31 lower-case letters, digits or `_`".to_owned()
                },
            ));
        }
        if let Some(source) = one(name, source, &at, max_calls, problems) {
            sources.push(source);
        }
    }
    sources
}

/// One source, or `None` when it is not an object.
fn one(
    name: &str,
    given: &Value,
    at: &str,
    max_calls: u32,
    problems: &mut Vec<Problem>,
) -> Option<SourceConfig> {
    let Value::Object(members) = given else {
        problems.push(Problem::new(at, "a source must be an object"));
        return None;
    };
    for member in members.keys().filter(|m| !MEMBERS.contains(&m.as_str())) {
        let mut location = at.to_owned();
        push_pointer(&mut location, member);
        problems.push(Problem::new(location, suggest::unknown("member", member, &MEMBERS)));
    }
    let here = |member: &str| format!("{at}/{member}");
    let text = |member: &str, problems: &mut Vec<Problem>| -> Option<String> {
        match members.get(member) {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.clone()),
            Some(_) => {
                problems.push(Problem::new(here(member), "must be a string"));
                None
            }
        }
    };
    let base_url = match members.get("originalApi") {
        Some(Value::Object(api)) => match api.get("baseUrl") {
            Some(Value::String(url)) => {
                let url = url.trim().to_owned();
                if let Err(why) = BaseUrl::parse(&url) {
                    problems.push(Problem::new(format!("{at}/originalApi/baseUrl"), why));
                }
                for member in api.keys().filter(|m| *m != "baseUrl") {
                    problems.push(Problem::new(
                        format!("{at}/originalApi/{member}"),
                        "unknown member; `originalApi` takes `baseUrl`",
                    ));
                }
                url
            }
            _ => {
                problems.push(Problem::new(
                    format!("{at}/originalApi/baseUrl"),
                    "missing required member (a string)",
                ));
                String::new()
            }
        },
        _ => {
            problems.push(Problem::new(
                here("originalApi"),
                "missing required member: {\"baseUrl\": \"https://...\"}",
            ));
            String::new()
        }
    };
    let path = match members.get("path") {
        Some(Value::String(path)) => path.clone(),
        _ => {
            problems.push(Problem::new(here("path"), "missing required member (a string; it may be empty)"));
            String::new()
        }
    };
    let method = method_of(text("method", problems).as_deref(), &here("method"), problems);
    let map = |member: &str, problems: &mut Vec<Problem>| -> BTreeMap<String, String> {
        match members.get(member) {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(pairs)) => {
                let mut map = BTreeMap::new();
                for (key, value) in pairs {
                    match value {
                        Value::String(text) => {
                            map.insert(key.clone(), text.clone());
                        }
                        _ => {
                            let mut location = here(member);
                            push_pointer(&mut location, key);
                            problems.push(Problem::new(location, "must be a string"));
                        }
                    }
                }
                map
            }
            Some(_) => {
                problems.push(Problem::new(here(member), "must be an object of strings"));
                BTreeMap::new()
            }
        }
    };
    let headers = map("headers", problems);
    let queries = map("queries", problems);
    let body = match members.get("body") {
        None | Some(Value::Null) => None,
        Some(value) => Some(value.to_string()),
    };
    let auth = match members.get("authHeader") {
        None | Some(Value::Null) => Auth::None,
        Some(value) => match serde_json::from_value::<AuthHeader>(value.clone()) {
            Ok(given) => auth(&given, &here("authHeader"), problems),
            Err(_) => {
                problems.push(Problem::new(
                    here("authHeader"),
                    "must be an object with a `type` (Bearer, Basic, None, Runtime or OAuth2ClientCredentials) and its members",
                ));
                Auth::None
            }
        },
    };
    // The upstream settings are checked as a route's, their problems moved under the source.
    let mut settings = Vec::new();
    let retry = retry_settings(members.get("retry"), &method, &mut settings);
    let rate_limit = rate_limit_settings(members.get("rateLimit"), &mut settings);
    let tls = tls_settings(members.get("tls"), &base_url, &mut settings);
    let http2_prior_knowledge = match members.get("http2") {
        None | Some(Value::Null) => false,
        Some(Value::String(mode)) if mode == "prior-knowledge" => {
            if !base_url.to_ascii_lowercase().starts_with("http://") {
                settings.push(Problem::new("/http2", "\"prior-knowledge\" is for an http upstream"));
            }
            true
        }
        Some(_) => {
            settings.push(Problem::new("/http2", "must be \"prior-knowledge\", or null"));
            false
        }
    };
    for mut problem in settings {
        problem.location = format!("{at}{}", problem.location);
        problems.push(problem);
    }
    let after = match members.get("after") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(names)) => names
            .iter()
            .enumerate()
            .filter_map(|(i, name)| match name {
                Value::String(name) => Some(name.clone()),
                _ => {
                    problems.push(Problem::new(format!("{at}/after/{i}"), "must be a source's name"));
                    None
                }
            })
            .collect(),
        Some(_) => {
            problems.push(Problem::new(here("after"), "must be a list of source names, such as [\"user\"]"));
            Vec::new()
        }
    };
    let when = text("when", problems);
    let for_each = text("forEach", problems);
    let number = |member: &str, default: u32, max: u32, problems: &mut Vec<Problem>| -> u32 {
        match members.get(member) {
            None | Some(Value::Null) => default,
            Some(value) => match value.as_u64() {
                Some(n) if (1..=u64::from(max)).contains(&n) => n as u32,
                _ => {
                    problems
                        .push(Problem::new(here(member), format!("must be a whole number from 1 to {max}")));
                    default.min(max)
                }
            },
        }
    };
    let max_calls = number("maxCalls", DEFAULT_MAX_CALLS.min(max_calls.max(1)), max_calls.max(1), problems);
    let concurrency = number("concurrency", DEFAULT_CONCURRENCY, MAX_CONCURRENCY, problems);
    for member in ["maxCalls", "concurrency"] {
        if members.get(member).is_some_and(|v| !v.is_null()) && for_each.is_none() {
            problems.push(Problem::new(here(member), format!("`{member}` is for a source with `forEach`")));
        }
    }
    let optional = match members.get("optional") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            problems.push(Problem::new(here("optional"), "must be true or false"));
            false
        }
    };
    let timeout_ms = match members.get("timeoutMs") {
        None | Some(Value::Null) => None,
        Some(value) => match value.as_u64() {
            Some(n) if (1..=MAX_TIMEOUT_MS).contains(&n) => Some(n),
            _ => {
                problems.push(Problem::new(
                    here("timeoutMs"),
                    format!("must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}"),
                ));
                None
            }
        },
    };
    let paginate = super::paginate::validate(members.get("paginate"), &here("paginate"), problems);
    Some(SourceConfig {
        name: name.to_owned(),
        base_url,
        path,
        method,
        headers,
        queries,
        body,
        auth,
        retry,
        rate_limit,
        tls,
        http2_prior_knowledge,
        after,
        when,
        for_each,
        max_calls,
        concurrency,
        optional,
        timeout_ms,
        paginate,
    })
}

/// The most headers `forwardHeaders` may name (a caller's request carries at most
/// `RECAST_MAX_HEADERS` anyway).
const MAX_FORWARDED: usize = 64;

/// `forwardHeaders`: header names (lower-cased) whose values the caller's request brings into
/// `request.headers`. Credentials and cookies are not among them: `X-Mapped-Auth` goes only to
/// `Runtime` sources, and the others are the caller's own.
pub fn forward_headers(given: Option<&Value>, problems: &mut Vec<Problem>) -> Vec<String> {
    const REFUSED: [&str; 6] =
        ["authorization", "x-mapped-auth", "x-api-key", "cookie", "proxy-authorization", "host"];
    match given {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(names)) if names.len() > MAX_FORWARDED => {
            problems.push(Problem::new(
                "/forwardHeaders",
                format!("at most {MAX_FORWARDED} headers are forwarded; this lists {}", names.len()),
            ));
            Vec::new()
        }
        Some(Value::Array(names)) => {
            let mut headers = Vec::new();
            for (i, name) in names.iter().enumerate() {
                let at = format!("/forwardHeaders/{i}");
                match name.as_str().map(|n| http::HeaderName::from_bytes(n.as_bytes())) {
                    Some(Ok(header)) if REFUSED.contains(&header.as_str()) => problems.push(Problem::new(
                        at,
                        format!(
                            "`{}` is not forwarded: credentials reach a source only through its `authHeader`",
                            header.as_str()
                        ),
                    )),
                    Some(Ok(header)) => {
                        if !headers.iter().any(|h| h == header.as_str()) {
                            headers.push(header.as_str().to_owned());
                        }
                    }
                    _ => problems.push(Problem::new(at, "must be a header name")),
                }
            }
            headers
        }
        Some(_) => {
            problems.push(Problem::new(
                "/forwardHeaders",
                "must be a list of header names, such as [\"Accept-Language\"]",
            ));
            Vec::new()
        }
    }
}
