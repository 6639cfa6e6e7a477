//! The trace of one upstream attempt: a span id for it under the call's span (the parent its
//! `traceparent` names to the upstream, whether or not spans are recorded), and, when they are,
//! its CLIENT span with the HTTP client attributes of OpenTelemetry's conventions.

use std::sync::Arc;

use super::answer::AnsweredSpan;
use super::{Answer, Propagated, Target, UpstreamClient, UpstreamError};
use crate::telemetry::{self, Kind, Recorder, Span, keys};

/// An attempt's trace, ended with its outcome ([`Attempt::end`]); one dropped before (the call
/// was abandoned) records its span without an error status.
pub(super) struct Attempt {
    pub(super) propagated: Option<Propagated>,
    span: Option<(Span, Arc<Recorder>)>,
}

impl Attempt {
    /// The trace of an attempt of `target`, the `resend`th time its request is sent again, under
    /// the span being polled on this thread (none outside a request).
    pub(super) fn begin(client: &UpstreamClient, target: &Target<'_>, resend: u32) -> Attempt {
        telemetry::with_current(|scope| {
            let Some(scope) = scope else { return Attempt { propagated: None, span: None } };
            let context = scope.span.child(telemetry::span_id());
            // A token fetch is shared by every caller of its credentials: it carries none's
            // `tracestate` or `baggage`.
            let carried = if target.token { None } else { scope.carried.clone() };
            let propagated = Some(Propagated { traceparent: context.text(), carried });
            let span = client.spans.as_ref().filter(|_| scope.recording).map(|recorder| {
                let request = target.request;
                let (method, method_attribute) = keys::method(&request.method);
                let mut span =
                    Span::start(context, scope.state(), Some(scope.span.parent_id), Kind::Client, method);
                span.put(method_attribute);
                let (host, port) = host_and_port(target.origin);
                span.set(&keys::SERVER_ADDRESS, host);
                span.set(&keys::SERVER_PORT, port);
                telemetry::with_url_full(&request.uri, |url| span.set(&keys::URL_FULL, url));
                if resend > 0 {
                    span.set(&keys::RESEND_COUNT, i64::from(resend));
                }
                if let Some(source) = target.source {
                    span.set(&keys::SOURCE, source);
                }
                if target.token {
                    span.set(&keys::TOKEN_REQUEST, true);
                }
                (span, Arc::clone(recorder))
            });
            Attempt { propagated, span }
        })
    }

    /// Ends the attempt's span with its outcome: the status and protocol of an answer, the kind
    /// of a failure; Error for a 4xx or 5xx answer and for every failure. A 2xx answer takes its
    /// span along, ended now, recorded when its reader is done with it ([`AnsweredSpan`]).
    pub(super) fn end(mut self, outcome: &mut Result<Answer, UpstreamError>) {
        let Some((mut span, recorder)) = self.span.take() else { return };
        match outcome {
            Ok(answer) => {
                let status = answer.status.as_u16();
                span.set(&keys::STATUS_CODE, i64::from(status));
                span.put(if answer.http2 { &keys::PROTOCOL_2 } else { &keys::PROTOCOL_1_1 });
                if status >= 400 {
                    let mut digits = itoa::Buffer::new();
                    let text = digits.format(status);
                    span.set(&keys::ERROR_TYPE, text);
                    span.fail(text);
                } else if answer.status.is_success() {
                    answer.span = Some(AnsweredSpan::new(span, recorder));
                    return;
                }
            }
            Err(error) => {
                let kind = error_type(error);
                span.set(&keys::ERROR_TYPE, kind);
                span.fail(&error.to_string());
            }
        }
        span.end(&recorder);
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        // The caller went away (or the call's deadline ended it from outside): recorded as it
        // stands, not as an error of the upstream's.
        if let Some((mut span, recorder)) = self.span.take() {
            span.set(&keys::ABANDONED, true);
            span.end(&recorder);
        }
    }
}

/// The host and port of an origin (`scheme://host:port`, the port always written: see
/// `super::origin`), an IPv6 host without its brackets.
fn host_and_port(origin: &str) -> (&str, i64) {
    let authority = origin.split_once(':').map_or(origin, |(_, rest)| rest.trim_start_matches('/'));
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, ""));
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    (host, port.parse::<u16>().map_or(0, i64::from))
}

/// The `error.type` of a failure: a short name per kind, the same set `/metrics` counts by.
pub(crate) fn error_type(error: &UpstreamError) -> &'static str {
    match error {
        UpstreamError::Connect(_) => "connect_failed",
        UpstreamError::Tls(_) => "tls_failed",
        UpstreamError::Broken(_) => "connection_broken",
        UpstreamError::Timeout => "timeout",
        UpstreamError::TooLarge { .. } => "too_large",
        UpstreamError::Coding(_) => "bad_encoding",
        UpstreamError::NotAllowed(_) => "not_allowed",
        UpstreamError::Unavailable { .. } => "breaker_open",
        UpstreamError::RateLimited { .. } => "rate_limited",
        UpstreamError::Auth(_) => "auth_failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origins_host_and_port() {
        for (uri, host, port) in [
            ("http://API.example/v1", "api.example", 80),
            ("https://api.example:8443/x?y", "api.example", 8443),
            ("http://[::1]:9/", "::1", 9),
            ("https://[2001:db8::1]/", "2001:db8::1", 443),
        ] {
            let origin = super::super::origin(&uri.parse().unwrap());
            assert_eq!(host_and_port(&origin), (host, port), "{uri}");
        }
    }
}
