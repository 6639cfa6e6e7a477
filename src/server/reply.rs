//! What the handlers share: JSON answers, bounded reading of request bodies, `Server-Timing`
//! values and the time. The router and every handler import from here; nothing here imports a
//! handler.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Full};

use super::connection::RequestBody;
use super::{ApiError, Response, State};
use crate::http1::{self, RESERVE_LIMIT};
use crate::json::PADDING;

/// A JSON answer.
pub fn json(status: StatusCode, body: impl Into<Bytes>) -> Response {
    let mut response = http::Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Reads a request body of at most `RECAST_MAX_REQUEST_BYTES`; larger bodies are refused before
/// they are read when `Content-Length` says so, else as soon as the limit is passed. The whole
/// body must arrive within `RECAST_HEADER_TIMEOUT_MS` (408 otherwise), so a client that drips it
/// cannot hold its place for long.
pub(super) async fn read_body(
    state: &State,
    headers: &HeaderMap,
    body: RequestBody,
) -> Result<Vec<u8>, ApiError> {
    let within = Duration::from_millis(state.config.header_timeout_ms);
    let limit = state.config.max_request_bytes;
    match tokio::time::timeout(within, read_limited(headers, body, limit)).await {
        Err(_) => Err(ApiError::BodyTimeout),
        Ok(read) => read.map_err(|e| match e {
            BodyError::TooLarge => ApiError::BodyTooLarge { limit },
            BodyError::Broken => ApiError::BodyUnreadable,
        }),
    }
}

/// Why a body was not read whole.
#[derive(Debug)]
enum BodyError {
    /// Larger than the limit, by its `Content-Length` or by what arrived.
    TooLarge,
    /// The connection broke.
    Broken,
}

/// Reads a body of at most `limit` bytes into a buffer with room for the JSON parser's padding. A
/// larger `Content-Length` is refused before reading; a declared length is reserved only up to
/// [`RESERVE_LIMIT`], so bodies that never come cannot make recast hold memory, and the rest
/// grows as it arrives, never past the limit and the padding.
async fn read_limited(
    headers: &HeaderMap,
    mut body: RequestBody,
    limit: usize,
) -> Result<Vec<u8>, BodyError> {
    let declared = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge);
    }
    let reserve = declared.map_or(16 * 1024, |n| (n as usize).min(RESERVE_LIMIT));
    let mut buf = Vec::with_capacity(reserve.min(limit) + PADDING);
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.map_err(|_| BodyError::Broken)?.into_data() {
            if buf.len() + data.len() > limit {
                return Err(BodyError::TooLarge);
            }
            http1::reserve_within(&mut buf, data.len() + PADDING, limit + PADDING);
            buf.extend_from_slice(&data);
        }
    }
    Ok(buf)
}

/// A route version's entity tag (RFC 9110 §8.8.3): its revision, which only the store gives, as
/// it writes the change, and which every change of any route moves forward (`GET
/// /v1/routes/{uuid}` answers it as `ETag`). Two versions never share one, whatever their clocks.
pub(super) fn etag(route: &crate::table::Entry) -> String {
    format!("\"{}\"", route.revision())
}

/// `If-Match` (RFC 9110 §13.1.1) against the route as it is now: a change that names another
/// version is refused with 412 (strong comparison: a weak tag never matches; `*` matches any
/// route there is). Without the header, any version is changed.
pub(super) fn if_match(headers: &HeaderMap, route: &crate::table::Entry) -> Result<(), ApiError> {
    let mut given = headers.get_all(header::IF_MATCH).iter().peekable();
    if given.peek().is_none() {
        return Ok(());
    }
    let now = etag(route);
    let mut tags = given.flat_map(|value| value.to_str().unwrap_or_default().split(','));
    if tags.any(|tag| tag.trim() == "*" || tag.trim() == now) {
        return Ok(());
    }
    Err(ApiError::PreconditionFailed(format!(
        "the route is at version {now} now (`ETag` of GET /v1/routes/{}); read it again, and change that version",
        route.uuid()
    )))
}

/// The time now, in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A `Server-Timing` header value: `name;dur=milliseconds` per entry, to the microsecond.
pub(crate) fn timing(entries: &[(&str, Duration)]) -> HeaderValue {
    let mut text = Vec::with_capacity(entries.len() * 24);
    let mut digits = itoa::Buffer::new();
    for (i, (name, elapsed)) in entries.iter().enumerate() {
        if i > 0 {
            text.extend_from_slice(b", ");
        }
        let micros = elapsed.as_micros();
        text.extend_from_slice(name.as_bytes());
        text.extend_from_slice(b";dur=");
        text.extend_from_slice(digits.format(micros / 1000).as_bytes());
        let fraction = (micros % 1000) as u16;
        text.extend_from_slice(&[
            b'.',
            b'0' + (fraction / 100) as u8,
            b'0' + (fraction / 10 % 10) as u8,
            b'0' + (fraction % 10) as u8,
        ]);
    }
    HeaderValue::from_bytes(&text).unwrap_or(HeaderValue::from_static("total;dur=0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_timing_writes_milliseconds_to_the_microsecond() {
        let header =
            timing(&[("upstream", Duration::from_micros(1_234_567)), ("map", Duration::from_nanos(5_900))]);
        assert_eq!(header, "upstream;dur=1234.567, map;dur=0.005");
        assert_eq!(timing(&[("map", Duration::ZERO)]), "map;dur=0.000");
    }
}
