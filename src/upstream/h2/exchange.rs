//! One call over HTTP/2: the request on a stream of a leased connection, and its answer read as an
//! HTTP/1.1 one is (`wire`): the same size bound on the body as it comes and the same decoding
//! (`coding::Body`), the same reading of caching headers and `Retry-After`; the body of an answer
//! that is not 2xx is never read.

use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Version};
use http_body_util::{BodyExt, Full};

use super::Lease;
use crate::upstream::coding::{Body, Coding};
use crate::upstream::wire::{self, Failed};
use crate::upstream::{Answer, Freshness, MediaType, UpstreamRequest, error_chain, tls};

/// Headers HTTP/2 forbids (RFC 9113 §8.2.2), or that recast sets itself.
const NOT_SENT: [HeaderName; 6] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::HOST,
    header::CONTENT_LENGTH,
    header::ACCEPT_ENCODING,
];

/// Sends `request` on the leased connection and reads the whole answer, the body at most `limit`
/// bytes (decoded, when it comes in a content coding).
pub(in crate::upstream) async fn exchange(
    lease: &Lease,
    request: &UpstreamRequest,
    extra: crate::upstream::Extra<'_>,
    compression: bool,
    limit: usize,
) -> Result<Answer, Failed> {
    let mut outgoing =
        Request::builder().method(request.method.clone()).uri(request.uri.clone()).version(Version::HTTP_2);
    if let Some(headers) = outgoing.headers_mut() {
        for (name, value) in &request.headers {
            let replaced = extra.authorization.is_some() && name == header::AUTHORIZATION
                || extra.trace.is_some_and(|trace| trace.replaces(name));
            if !NOT_SENT.contains(name) && !replaced {
                headers.append(name, value.clone());
            }
        }
        if let Some(value) = extra.authorization {
            headers.insert(header::AUTHORIZATION, value.clone());
        }
        for (name, value) in extra.trace.iter().flat_map(|trace| trace.lines(&request.headers)) {
            // Read from well-formed headers, or written as hex: always a valid value.
            if let Ok(value) = HeaderValue::from_bytes(value) {
                headers.insert(name, value);
            }
        }
        let codings = if compression { "gzip, br" } else { "identity" };
        headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(codings));
    }
    let outgoing = outgoing
        .body(Full::new(request.body.clone()))
        .map_err(|e| Failed::Broken(format!("the request cannot be sent over HTTP/2: {e}")))?;
    let mut sender = lease.sender();
    let response = sender.send_request(outgoing).await.map_err(|e| sent_failure(&e))?;
    let (head, mut body) = response.into_parts();
    let mut freshness = Freshness::default();
    let mut coding = Coding::Identity;
    let mut retry_after = None;
    let mut content_type = MediaType::default();
    for (name, value) in &head.headers {
        freshness.line(name.as_str().as_bytes(), value.as_bytes());
        if name == header::CONTENT_ENCODING {
            coding = match coding {
                Coding::Identity => Coding::of(value.as_bytes()),
                earlier => Coding::Unknown(format!(
                    "{earlier}, {}",
                    String::from_utf8_lossy(value.as_bytes().trim_ascii())
                )),
            };
        } else if name == header::RETRY_AFTER {
            retry_after = wire::retry_after_of(value.as_bytes());
        } else if name == header::CONTENT_TYPE {
            content_type = MediaType::of(value.as_bytes());
        }
    }
    let status = head.status;
    let headers = (extra.keep_headers && status.is_success()).then(|| {
        super::super::wire::joined_headers(
            head.headers.iter().map(|(name, value)| (name.as_str(), value.as_bytes())),
        )
    });
    if !status.is_success() {
        // Never read: dropping it resets the stream.
        let certificate_asked = lease.certificate_asked();
        return Ok(Answer {
            status,
            body: Vec::new(),
            freshness,
            retry_after,
            certificate_asked,
            content_type,
            http2: true,
            headers: None,
            span: None,
        });
    }
    let mut taken = Body::new(&coding, true, limit)?;
    while let Some(frame) = body.frame().await {
        // The upstream has answered: whatever breaks now, it may have acted on the request.
        let frame = frame.map_err(|e| {
            let why = error_chain(&e);
            if tls::is_tls_failure(&e) { Failed::Tls(why) } else { Failed::Broken(why) }
        })?;
        let Ok(data) = frame.into_data() else { continue };
        taken.take_within(&data, limit)?;
    }
    let body = taken.finish()?;
    Ok(Answer {
        status,
        body,
        freshness,
        retry_after,
        certificate_asked: lease.certificate_asked(),
        content_type,
        http2: true,
        headers,
        span: None,
    })
}

/// How an HTTP/2 exchange that failed before the answer's head is reported. A stream the
/// upstream refused (`REFUSED_STREAM`, RFC 9113 §8.7), or a request the connection dropped before
/// sending it, was never processed ([`Failed::Unsent`]: sent again on another connection whatever
/// its method). TLS refusing is [`Failed::Tls`]. Anything else (a `GOAWAY`, a connection error, a
/// reset) may have come after the upstream took the request: only an idempotent request is sent
/// again ([`Failed::Stale`]).
fn sent_failure(error: &hyper::Error) -> Failed {
    let why = error_chain(error);
    let h2 = std::error::Error::source(error).and_then(|e| e.downcast_ref::<::h2::Error>());
    let refused =
        h2.and_then(::h2::Error::reason).is_some_and(|reason| reason == ::h2::Reason::REFUSED_STREAM);
    if refused || error.is_canceled() {
        Failed::Unsent(why)
    } else if tls::is_tls_failure(error) {
        Failed::Tls(why)
    } else {
        Failed::Stale(why)
    }
}
