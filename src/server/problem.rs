//! The errors an HTTP answer can carry, and the one place where each becomes a status code and an
//! RFC 9457 `application/problem+json` body (SPEC §4). Handlers return [`ApiError`]; they never
//! pick a status for an error themselves.

use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body_util::Full;

use crate::json::{JsonError, write};
use crate::rules::Problem;

/// Base of every problem `type` URI.
pub const TYPE_BASE: &str = "https://recast.dev/problems/";

/// Most rule problems listed in one answer; the rest are counted in `detail`.
const MAX_LISTED: usize = 200;

/// Everything that can go wrong while answering a request, by where it came from.
#[derive(Debug)]
pub enum ApiError {
    /// The client's body is not JSON (or nests deeper than allowed).
    InvalidJson(JsonError),
    /// The client's body is JSON but not the expected shape.
    InvalidRequest(String),
    /// The rules do not compile; every problem is listed.
    InvalidRules(Vec<Problem>),
    /// The client's body is larger than `RECAST_MAX_REQUEST_BYTES`.
    BodyTooLarge {
        limit: usize,
    },
    /// The client's body could not be read (the connection broke).
    BodyUnreadable,
    NotFound,
    MethodNotAllowed {
        allow: &'static str,
    },
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidJson(_)
            | ApiError::InvalidRequest(_)
            | ApiError::InvalidRules(_)
            | ApiError::BodyUnreadable => StatusCode::BAD_REQUEST,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotFound => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The last segment of the problem `type` URI.
    pub fn slug(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "invalid-json",
            ApiError::InvalidRequest(_) => "invalid-request",
            ApiError::InvalidRules(_) => "invalid-rules",
            ApiError::BodyTooLarge { .. } => "body-too-large",
            ApiError::BodyUnreadable => "body-unreadable",
            ApiError::NotFound => "not-found",
            ApiError::MethodNotAllowed { .. } => "method-not-allowed",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            ApiError::InvalidJson(_) => "The request body is not valid JSON",
            ApiError::InvalidRequest(_) => "The request body is not what this endpoint takes",
            ApiError::InvalidRules(_) => "The mapping rules are invalid",
            ApiError::BodyTooLarge { .. } => "The request body is too large",
            ApiError::BodyUnreadable => "The request body could not be read",
            ApiError::NotFound => "Nothing is here",
            ApiError::MethodNotAllowed { .. } => "Method not allowed",
        }
    }

    fn detail(&self) -> String {
        match self {
            ApiError::InvalidJson(JsonError::TooDeep { limit }) => {
                format!("the body nests deeper than {limit} levels (RECAST_MAX_DEPTH)")
            }
            ApiError::InvalidJson(e) => e.to_string(),
            ApiError::InvalidRequest(why) => why.clone(),
            ApiError::InvalidRules(problems) if problems.len() > MAX_LISTED => {
                format!("{} problems; the first {MAX_LISTED} are listed in `errors`", problems.len())
            }
            ApiError::InvalidRules(problems) => match problems.len() {
                1 => "1 problem; see `errors`".to_owned(),
                n => format!("{n} problems; see `errors`"),
            },
            ApiError::BodyTooLarge { limit } => {
                format!("the limit is {limit} bytes (RECAST_MAX_REQUEST_BYTES)")
            }
            ApiError::BodyUnreadable => "the connection broke while the body was sent".to_owned(),
            ApiError::NotFound => "no endpoint or route at this path".to_owned(),
            ApiError::MethodNotAllowed { allow } => format!("this path answers {allow}"),
        }
    }

    /// The full answer: status, headers and problem body. `instance` is the request path.
    pub fn to_response(&self, instance: &str) -> http::Response<Full<Bytes>> {
        let status = self.status();
        let mut body = Vec::with_capacity(256);
        body.extend_from_slice(b"{\"type\":");
        write::string(&mut body, &format!("{TYPE_BASE}{}", self.slug()));
        body.extend_from_slice(b",\"title\":");
        write::string(&mut body, self.title());
        body.extend_from_slice(b",\"status\":");
        write::u64(&mut body, u64::from(status.as_u16()));
        body.extend_from_slice(b",\"detail\":");
        write::string(&mut body, &self.detail());
        body.extend_from_slice(b",\"instance\":");
        write::string(&mut body, instance);
        if let ApiError::InvalidRules(problems) = self {
            body.extend_from_slice(b",\"errors\":");
            write_problems(&mut body, &problems[..problems.len().min(MAX_LISTED)]);
        }
        body.push(b'}');
        let mut response = http::Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let ApiError::MethodNotAllowed { allow } = self {
            headers.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        response
    }
}

/// Writes `[{"location": ..., "message": ...}, ...]`.
pub fn write_problems(out: &mut Vec<u8>, problems: &[Problem]) {
    out.push(b'[');
    for (n, p) in problems.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"location\":");
        write::string(out, &p.location);
        out.extend_from_slice(b",\"message\":");
        write::string(out, &p.message);
        out.push(b'}');
    }
    out.push(b']');
}
