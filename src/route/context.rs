//! `request` as templates, `when` and `forEach` read it (SPEC §2.3): what a call's context holds
//! of the caller's request. Pure: the server builds it once per call.

use http::HeaderMap;
use http::header::HeaderName;

use crate::json;

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
