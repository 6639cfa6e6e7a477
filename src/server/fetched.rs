//! What one upstream call and its mapping come to, as the call that made them and every call
//! that waited on the same cache flight answer.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};

use super::problem::ApiError;
use crate::trace_context::TraceParent;
use crate::upstream::Freshness;

/// The outcome of one upstream call and its mapping, as the call that made it and every call
/// that waited for it answer.
#[derive(Debug, Clone)]
pub(super) struct Outcome {
    pub(super) mapped: Result<MappedAnswer, ApiError>,
    pub(super) upstream: Duration,
    pub(super) map: Duration,
    /// A composed route: each source (`src.<name>`) and how long it took, for `Server-Timing`.
    pub(super) sources: Vec<(String, Duration)>,
    /// The span the upstream calls were made under: a flight's, for the calls that wait on it.
    pub(super) traced: Option<TraceParent>,
}

/// A mapped 2xx answer.
#[derive(Debug, Clone)]
pub(super) struct MappedAnswer {
    pub(super) status: StatusCode,
    pub(super) body: Bytes,
    pub(super) freshness: Freshness,
    /// The seconds it was kept fresh for, when it was.
    pub(super) stored: Option<u64>,
    /// A composed answer with optional sources that failed: its `Recast-Partial` (such an
    /// answer is never kept).
    pub(super) partial: Option<HeaderValue>,
}
