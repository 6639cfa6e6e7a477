//! What a source of a composed call came to: its value in the document, how each of its calls
//! ended (for `_sources`), and why it failed, with the problem a required failure answers.

use std::sync::Arc;
use std::time::Duration;

use crate::json::ondemand::Indexed;
use crate::metrics::SourceFailureKind;
use crate::route::composition::Source;
use crate::route::render::RequestError;
use crate::server::problem::{ApiError, UpstreamFailure};

/// A source's value in the document: answers checked and indexed as they came.
#[derive(Clone)]
pub(super) enum Value {
    Null,
    One(Arc<Indexed>),
    List(Vec<Option<Arc<Indexed>>>),
}

/// How one call of a source ended, for `_sources`.
#[derive(Clone, Copy)]
pub(super) struct Ended {
    pub(super) status: Option<u16>,
    pub(super) outcome: &'static str,
    /// A failure other than an answer's status: its kind (`Recast-Partial`'s `status=`).
    pub(super) kind: Option<&'static str>,
    /// A paged source's pages (`_sources.<name>.pages`).
    pub(super) paged: Paged,
}

/// A source that is done.
#[derive(Clone)]
pub(super) struct Done {
    pub(super) value: Value,
    /// One per call; one for a source not called.
    pub(super) ended: Vec<Ended>,
    pub(super) list: bool,
    pub(super) failure: Option<Failure>,
    /// How many `forEach` elements failed (an optional source's).
    pub(super) failed_elements: usize,
    pub(super) took: Duration,
    pub(super) calls: usize,
    /// A `forEach` source whose value was not a list: that value's type (no call was made).
    pub(super) not_a_list: Option<&'static str>,
    /// The `forEach` element whose failure is `failure` (its index), for the problem.
    pub(super) element: Option<usize>,
    /// A paged source's pages fetched, and how many of its requests `"onMaxPages": "stop"`
    /// ended (each request sent counted once).
    pub(super) pages: usize,
    pub(super) stopped: usize,
}

/// Why a source failed.
#[derive(Debug, Clone)]
pub(super) enum Failure {
    Upstream(UpstreamFailure),
    Template(RequestError),
    /// A source it waits for failed.
    Dependency(String),
    /// `forEach` gave more elements than `maxCalls`.
    TooManyElements {
        given: usize,
        max: usize,
        location: String,
        only_request: bool,
    },
}

impl Failure {
    /// The kind `recast_source_failures_total` counts it by.
    pub(super) fn kind(&self) -> SourceFailureKind {
        match self {
            Failure::Upstream(failure) => SourceFailureKind::Upstream(failure.kind()),
            Failure::Template(_) => SourceFailureKind::Template,
            Failure::Dependency(_) => SourceFailureKind::Dependency,
            Failure::TooManyElements { .. } => SourceFailureKind::TooManyElements,
        }
    }

    /// `Recast-Partial`'s `status=`: the upstream's status, or the kind of failure.
    pub(super) fn partial_status(&self) -> String {
        match self {
            Failure::Upstream(UpstreamFailure::Status(status, _)) => status.as_u16().to_string(),
            Failure::Upstream(failure) => failure.kind().label().to_owned(),
            Failure::Template(RequestError::AuthRequired) => "auth-required".to_owned(),
            Failure::Template(_) => "template".to_owned(),
            Failure::Dependency(_) => "dependency".to_owned(),
            Failure::TooManyElements { .. } => "too-many-elements".to_owned(),
        }
    }

    pub(super) fn is_timeout(&self) -> bool {
        matches!(self, Failure::Upstream(UpstreamFailure::Timeout))
    }

    /// A bound of the whole call (`RECAST_MAX_COMPOSED_BYTES`, `RECAST_MAX_SOURCE_CALLS`):
    /// it ends the call, optional source or not.
    pub(super) fn is_call_bound(&self) -> bool {
        matches!(
            self,
            Failure::Upstream(
                UpstreamFailure::ComposedTooLarge { .. }
                    | UpstreamFailure::TooManyCalls { .. }
                    | UpstreamFailure::Buffered { .. }
            )
        )
    }

    /// The problem a required source's failure answers with: a route's own upstream's as SPEC
    /// §2.2 says, a composed route's source's with its name (§2.3).
    pub(super) fn to_error(&self, source: &Source, element: Option<usize>, validating: bool) -> ApiError {
        let error = match self {
            Failure::Upstream(failure) => ApiError::Upstream { failure: failure.clone(), validating },
            Failure::Template(RequestError::AuthRequired) => ApiError::AuthRequired,
            Failure::Template(RequestError::Template { location, why, only_request }) => {
                ApiError::Template { location: location.clone(), why: why.clone(), caller: *only_request }
            }
            // A live call's answer lacks what a template reads: the registration's own mistake
            // (most often a misspelt name), told at the template with the name probably meant.
            Failure::Template(RequestError::Missing { location, why, only_request: false }) => {
                ApiError::InvalidBody(vec![crate::rules::Problem::new(location.clone(), why.clone())])
            }
            Failure::Template(RequestError::Missing { location, why, only_request: true }) => {
                ApiError::Template { location: location.clone(), why: why.clone(), caller: true }
            }
            Failure::Dependency(dependency) => ApiError::Upstream {
                failure: UpstreamFailure::Unreachable(format!(
                    "it waits for the source `{dependency}`, which failed"
                )),
                validating,
            },
            Failure::TooManyElements { given, max, location, only_request } => ApiError::Template {
                location: location.clone(),
                why: format!(
                    "it gives {given} elements, more than `maxCalls` ({max}); the list is never cut short"
                ),
                caller: *only_request,
            },
        };
        ApiError::Source { name: source.name.clone(), element, error: Box::new(error) }
    }
}

impl Done {
    pub(super) fn skipped() -> Done {
        Done {
            value: Value::Null,
            ended: vec![Ended { status: None, outcome: "skipped", kind: None, paged: Paged::default() }],
            list: false,
            failure: None,
            failed_elements: 0,
            took: Duration::ZERO,
            calls: 0,
            not_a_list: None,
            element: None,
            pages: 0,
            stopped: 0,
        }
    }

    /// A `forEach` source whose value was a `kind`, not a list: no call, an empty list as its
    /// value (as `each` takes it), `outcome: "not-a-list"`.
    pub(super) fn not_a_list(kind: &'static str) -> Done {
        Done {
            value: Value::List(Vec::new()),
            ended: vec![Ended { status: None, outcome: "not-a-list", kind: None, paged: Paged::default() }],
            not_a_list: Some(kind),
            ..Done::skipped()
        }
    }

    pub(super) fn failed(failure: Failure) -> Done {
        let outcome = if failure.is_timeout() { "timeout" } else { "failed" };
        Done {
            value: Value::Null,
            ended: vec![Ended { status: None, outcome, kind: None, paged: Paged::default() }],
            list: false,
            failure: Some(failure),
            failed_elements: 0,
            took: Duration::ZERO,
            calls: 0,
            not_a_list: None,
            element: None,
            pages: 0,
            stopped: 0,
        }
    }
}

/// How one request of a source ended: its status and its body, indexed ([`Value::One`]), or its
/// status (when it answered) and why it failed; with the pages it followed, for a paged source.
pub(super) type CallResult = Result<(u16, Value, Paged), (Option<u16>, UpstreamFailure, Paged)>;

/// The pages one request of a paged source fetched (SPEC §2.3 "Pages"); none for another.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::server) struct Paged {
    /// Pages fetched (answered 2xx).
    pub pages: usize,
    /// `"onMaxPages": "stop"` kept the pages fetched when there were more.
    pub stopped: bool,
    /// Whether the request was paged at all.
    pub paged: bool,
}
