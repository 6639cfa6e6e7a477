//! What a composed call reads of the caller's request: written as a request that is never sent
//! (its digest the cache key's), and read back as `request` of the sources' contexts.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;

use crate::json::{self, ondemand::Indexed};
use crate::route::MAPPED_AUTH;
use crate::route::composition::Composition;
use crate::route::context::{check_body, request_context};
use crate::server::problem::ApiError;
use crate::upstream::UpstreamRequest;

/// The caller's request as a composed route reads it.
pub(super) struct CallerRequest<'a> {
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
    pub body: Bytes,
}

impl<'a> CallerRequest<'a> {
    /// The caller's request as [`caller_request`] wrote it.
    pub fn of(request: &'a UpstreamRequest) -> CallerRequest<'a> {
        CallerRequest { query: request.uri.query(), headers: &request.headers, body: request.body.clone() }
    }
}

/// What a composed route's call reads of the caller's request, written as a request that is
/// never sent: its digest is the cache key's (SPEC §2.3: the whole query, normalised; the
/// forwarded headers; `X-Mapped-Auth` when a source is `Runtime`; the body), and
/// [`CallerRequest::of`] reads it back. A runtime-auth route called without `X-Mapped-Auth`
/// answers 401 here, before anything is made.
pub(in crate::server) fn caller_request(
    composition: &Composition,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<UpstreamRequest, ApiError> {
    let mapped_auth = headers.get(&MAPPED_AUTH);
    if composition.runtime_auth && mapped_auth.is_none() {
        return Err(ApiError::AuthRequired);
    }
    // The query's pairs by name (a name's values keep their order): `a=1&b=2` and `b=2&a=1`
    // read the same.
    let mut pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect();
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut normalised = url::form_urlencoded::Serializer::new(String::from("http://composed.invalid/?"));
    normalised.extend_pairs(&pairs);
    let uri = normalised.finish();
    let uri = http::Uri::try_from(uri.trim_end_matches('?'))
        .map_err(|_| ApiError::InvalidQuery("the query cannot be read".to_owned()))?;
    let mut kept = HeaderMap::new();
    for name in &composition.forward_headers {
        for value in headers.get_all(name) {
            kept.append(name.clone(), value.clone());
        }
    }
    if composition.runtime_auth
        && let Some(value) = mapped_auth
    {
        let mut value = value.clone();
        value.set_sensitive(true);
        kept.insert(MAPPED_AUTH, value);
    }
    Ok(UpstreamRequest { method: http::Method::GET, uri, headers: kept, body })
}

/// `request` of the context (`crate::route::composition::request_context`), indexed, when
/// something reads it (`read`); a body that is not JSON answers 400 either way.
pub(super) fn request_document(
    composition: &Composition,
    caller: &CallerRequest<'_>,
    read: bool,
    max_depth: usize,
) -> Result<Option<Arc<Indexed>>, ApiError> {
    let refused = |e: &json::JsonError| {
        ApiError::bad_body(&caller.body, e, |limit| format!("the body nests deeper than {limit} levels"))
    };
    if !read {
        return check_body(&caller.body, max_depth).map(|()| None).map_err(|e| refused(&e));
    }
    let text =
        request_context(caller.query, caller.headers, &composition.forward_headers, &caller.body, max_depth)
            .map_err(|e| refused(&e))?;
    // The document puts it one level down; its body was checked two levels down.
    Indexed::new(text, max_depth.saturating_sub(1)).map(|text| Some(Arc::new(text))).map_err(|e| refused(&e))
}
