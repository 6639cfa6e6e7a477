//! Log lines name the request they were written for: a line logged while a request is served is
//! written inside a `request` span holding its id (`request{id=…}:` in text, `"span":{"id":…}` in
//! JSON). The span is made only for a line that is written: while a request is served
//! ([`within`]), its id is kept in a thread-local, and [`logged!`] opens the span from it
//! around the one event. A request that logs nothing costs two swaps of that thread-local per poll
//! instead of a span's creation, formatting and bookkeeping.

use std::cell::RefCell;
use std::future::Future;
use std::pin::pin;

use http::HeaderValue;

/// The ids of a request's trace and of its span, which its log lines carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceIds {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
}

impl TraceIds {
    /// Both ids as lowercase hex.
    pub fn text(&self) -> ([u8; 32], [u8; 16]) {
        let (mut trace, mut span) = ([0u8; 32], [0u8; 16]);
        crate::hex::write_bytes(&mut trace, &self.trace_id);
        crate::hex::write_bytes(&mut span, &self.span_id);
        (trace, span)
    }
}

/// The request being served: its id, and its trace's ids.
struct Served {
    id: HeaderValue,
    trace: Option<TraceIds>,
}

thread_local! {
    /// The request being polled on this thread, if any.
    static CURRENT: RefCell<Option<Served>> = const { RefCell::new(None) };
}

/// Runs `future` as the request `id` of the trace `trace`: every [`logged!`] line written while
/// it is polled names both. Returns the id with the output.
pub async fn within<T>(
    id: HeaderValue,
    trace: Option<TraceIds>,
    future: impl Future<Output = T>,
) -> (HeaderValue, T) {
    let mut future = pin!(future);
    let mut id = Some(Served { id, trace });
    let output = std::future::poll_fn(|cx| {
        // The id is moved in for the poll and back out after it, also if the poll panics.
        let current = Current { previous: CURRENT.replace(id.take()), into: &mut id };
        let poll = future.as_mut().poll(cx);
        drop(current);
        poll
    })
    .await;
    let id = id.unwrap_or_else(|| unreachable!("the id is moved back after every poll"));
    (id.id, output)
}

/// Puts back what the thread-local held before a poll, and moves the request's id back out.
struct Current<'a> {
    previous: Option<Served>,
    into: &'a mut Option<Served>,
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        *self.into = CURRENT.replace(self.previous.take());
    }
}

/// Calls `f` with the text of the id of the request being served on this thread, and its trace's
/// ids, if any.
pub fn with_request_id<T>(f: impl FnOnce(&str, Option<&TraceIds>) -> T) -> Option<T> {
    CURRENT.with_borrow(|served| served.as_ref().map(|s| f(s.id.to_str().unwrap_or("-"), s.trace.as_ref())))
}

/// The `request` span of the request being served on this thread, if any, with the ids of its
/// trace and of the span being served (`trace_id`, `span_id`), so a line leads to its trace. Its
/// target is the module that asks for it, so a filter that lets that module's lines through lets
/// the span through too. The span is at the error level, so it is there whatever level
/// `RECAST_LOG` lets through: a warning under `RECAST_LOG=warn` still names its request.
macro_rules! request_span {
    () => {
        $crate::logging::with_request_id(|id, trace| match trace.map(|trace| trace.text()) {
            Some((trace, span)) => tracing::error_span!(
                target: module_path!(),
                "request",
                id = %id,
                trace_id = %std::str::from_utf8(&trace).unwrap_or_default(),
                span_id = %std::str::from_utf8(&span).unwrap_or_default()
            ),
            None => tracing::error_span!(target: module_path!(), "request", id = %id),
        })
    };
}
pub(crate) use request_span;

/// `tracing::event!` inside the `request` span of the request being served, if any; the span is
/// made only when the event is enabled.
macro_rules! logged {
    ($level:expr, $($event:tt)+) => {
        if tracing::enabled!($level) {
            let _span = $crate::logging::request_span!().map(tracing::Span::entered);
            tracing::event!($level, $($event)+);
        }
    };
}
pub(crate) use logged;

/// What a panic said, when it said it with text.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_owned(),
        (_, Some(text)) => text.clone(),
        _ => "(no message)".to_owned(),
    }
}

/// An error and its causes, on one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() -> Option<HeaderValue> {
        CURRENT.with_borrow(|served| served.as_ref().map(|s| s.id.clone()))
    }

    #[test]
    fn the_id_is_there_while_the_request_is_polled_and_only_then() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let (id, seen) = runtime.block_on(within(HeaderValue::from_static("outer"), None, async {
            let outer = current();
            // Nested (a request served inside another's poll): the inner id, then the outer again.
            let (_, inner) = within(HeaderValue::from_static("inner"), None, async {
                tokio::task::yield_now().await;
                current()
            })
            .await;
            tokio::task::yield_now().await;
            (outer, inner, current())
        }));
        assert_eq!(id, "outer", "the id comes back");
        assert_eq!(seen.0.as_ref().map(HeaderValue::as_bytes), Some(&b"outer"[..]));
        assert_eq!(seen.1.as_ref().map(HeaderValue::as_bytes), Some(&b"inner"[..]));
        assert_eq!(seen.2.as_ref().map(HeaderValue::as_bytes), Some(&b"outer"[..]));
        assert_eq!(current(), None, "nothing is left behind");
        assert!(with_request_id(|id, _| id.to_owned()).is_none());
    }

    #[test]
    fn a_panicking_poll_leaves_no_id_behind() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(within(HeaderValue::from_static("doomed"), None, async {
                panic!("in the handler")
            }))
        }));
        assert!(panicked.is_err());
        assert_eq!(current(), None);
    }
}
