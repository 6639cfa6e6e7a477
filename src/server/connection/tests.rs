//! The driver's deadlines on a paused clock, and what `Framed` hands hyper.

use futures_util::FutureExt as _;

use super::framed::Phase;
use super::*;

/// A connection that ends when told to close gracefully, or never (`stubborn`), and says
/// when it was told.
struct Fake {
    told: Arc<std::sync::Mutex<Option<Instant>>>,
    stubborn: bool,
}

impl Future for Fake {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        let told = self.told.lock().unwrap().is_some();
        if told && !self.stubborn { Poll::Ready(()) } else { Poll::Pending }
    }
}

impl Graceful for Fake {
    fn graceful_shutdown(self: Pin<&mut Self>) {
        self.told.lock().unwrap().get_or_insert_with(Instant::now);
    }
}

const TIMEOUTS: Timeouts = Timeouts { idle: Duration::from_secs(60), head: Duration::from_secs(10) };

/// Drives a fake connection in the background; returns when it was told to close (shared)
/// and the driver's task.
fn driven(
    activity: &Arc<Activity>,
    stubborn: bool,
) -> (Arc<std::sync::Mutex<Option<Instant>>>, tokio::task::JoinHandle<Option<()>>) {
    let told = Arc::new(std::sync::Mutex::new(None));
    let fake = Fake { told: told.clone(), stubborn };
    (told, tokio::spawn(drive(fake, activity.clone(), TIMEOUTS).map(|driven| driven.output)))
}

/// Seconds from `start` to when the connection was told to close, to the millisecond.
fn told_after(told: &std::sync::Mutex<Option<Instant>>, start: Instant) -> Option<f64> {
    told.lock().unwrap().map(|at| (at - start).as_millis() as f64 / 1000.0)
}

#[tokio::test(start_paused = true)]
async fn a_quiet_connection_closes_at_the_idle_timeout_and_a_begun_head_at_the_head_timeout() {
    let start = Instant::now();
    let quiet = Activity::new();
    let (told, task) = driven(&quiet, false);
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(told_after(&told, start), None, "quiet for 59 s, within the idle timeout");
    assert_eq!(task.await.unwrap(), Some(()));
    // Due at 60 s; times are kept in whole milliseconds, so a millisecond late at most.
    let at = told_after(&told, start).unwrap();
    assert!((60.0..=60.001).contains(&at), "closed at {at} s");

    let start = Instant::now();
    let slow = Activity::new();
    let (told, task) = driven(&slow, false);
    tokio::time::sleep(Duration::from_secs(5)).await;
    slow.read();
    assert_eq!(task.await.unwrap(), Some(()));
    let at = told_after(&told, start).unwrap();
    assert!((15.0..=15.001).contains(&at), "a head begun at 5 s closed at {at} s");
}

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_holds_the_connection_open_and_its_end_restarts_the_idle_time() {
    let start = Instant::now();
    let activity = Activity::new();
    let (told, task) = driven(&activity, false);
    let busy = activity.busy();
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(told_after(&told, start), None, "served for 300 s, and still open");
    drop(busy);
    assert_eq!(task.await.unwrap(), Some(()));
    let at = told_after(&told, start).unwrap();
    assert!((360.0..=360.001).contains(&at), "idle from 300 s, closed at {at} s");
}

#[tokio::test(start_paused = true)]
async fn bytes_read_once_the_body_is_in_start_the_next_heads_time_but_body_bytes_do_not() {
    let start = Instant::now();
    let activity = Activity::new();
    let (told, task) = driven(&activity, false);
    let busy = activity.busy();
    // The body, read over 20 s: not a head.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        activity.read();
    }
    activity.body_read();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // 21 s: the client pipelines the start of its next request while this one is served.
    activity.read();
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert_eq!(told_after(&told, start), None, "nothing is closed while a request is served");
    drop(busy);
    assert_eq!(task.await.unwrap(), Some(()));
    // The head was due at 31 s, while the request was served: the connection closes at the
    // driver's next look after the request ends (it looks at least every head timeout).
    let at = told_after(&told, start).unwrap();
    assert!((50.0..=60.001).contains(&at), "closed at {at} s, not at the idle timeout (110 s)");
}

#[tokio::test(start_paused = true)]
async fn a_stop_closes_at_once_and_leaves_a_connection_serving_a_request_to_the_grace_period() {
    let open = Arc::new(Open::default());
    let start = Instant::now();
    let activity = Activity::new();
    let _registered = open.register(&activity);
    let (told, task) = driven(&activity, true);
    let busy = activity.busy();
    tokio::time::sleep(Duration::from_secs(1)).await;
    open.stop();
    tokio::task::yield_now().await;
    assert_eq!(told_after(&told, start), Some(1.0), "told at the stop");
    // Serving a request, it does not finish, and the driver leaves it to the service's grace
    // period (`server::run`), which gives requests in flight their time before it cuts them.
    let mut task = task;
    let waited = tokio::time::timeout(Duration::from_secs(3600), &mut task).await;
    assert!(waited.is_err(), "still driven an hour after the stop");
    drop(busy);
    task.abort();

    // One serving no request (idle, or its client sent part of a head and waits) is dropped
    // right after the stop: no work has begun for it.
    let stopped = Instant::now();
    let half = Activity::new();
    half.read();
    let (told, task) = driven(&half, true);
    let _registered = open.register(&half);
    assert_eq!(task.await.unwrap(), None, "dropped, not finished");
    assert!(told_after(&told, stopped).is_some());
    assert_eq!(stopped.elapsed(), STOPPING_HEAD, "dropped {STOPPING_HEAD:?} after the stop");

    // One with nothing begun (idle, or writing its last answer) is left to close by itself, as
    // an idle one does at once.
    let quiet = Activity::new();
    let (_, task) = driven(&quiet, true);
    let _registered = open.register(&quiet);
    let mut task = task;
    assert!(tokio::time::timeout(Duration::from_secs(3600), &mut task).await.is_err(), "left alone");
    task.abort();

    // A connection that opens after the stop is told at once.
    let late = Activity::new();
    let _registered = open.register(&late);
    let (told, task) = driven(&late, false);
    assert_eq!(task.await.unwrap(), Some(()));
    assert!(told_after(&told, Instant::now()).is_some());
}

/// A client stream that yields one of its chunks per read, then waits forever.
struct Chunks(std::collections::VecDeque<&'static [u8]>);

impl AsyncRead for Chunks {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.0.pop_front() {
            Some(chunk) => {
                buf.put_slice(chunk);
                Poll::Ready(Ok(()))
            }
            None => Poll::Pending,
        }
    }
}

impl tokio::io::AsyncWrite for Chunks {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A framed stream after the lane read `lane_read`, and its connection's activity.
fn framing(lane_read: &[u8], chunks: &[&'static [u8]]) -> (Framed<Chunks>, Arc<Activity>) {
    let activity = Activity::new();
    (Framed::new(Chunks(chunks.iter().copied().collect()), lane_read, activity.clone()), activity)
}

/// What one read of hyper's gets: its bytes, or `None` when it would wait.
fn hyper_reads(framed: &mut Framed<Chunks>) -> Option<String> {
    let mut space = [0u8; 64 * 1024];
    let mut buf = ReadBuf::new(&mut space);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match Pin::new(framed).poll_read(&mut cx, &mut buf) {
        Poll::Ready(read) => {
            read.unwrap();
            Some(String::from_utf8_lossy(buf.filled()).into_owned())
        }
        Poll::Pending => None,
    }
}

/// Seconds from the connection's start to its deadline, once no request is in flight.
fn deadline_after(activity: &Activity, start: Instant) -> f64 {
    (activity.deadline(TIMEOUTS).expect("idle").0 - start).as_millis() as f64 / 1000.0
}

const GET_A: &str = "GET /a HTTP/1.1\r\nhost: t\r\n\r\n";

#[tokio::test(start_paused = true)]
async fn a_head_read_together_with_the_request_before_it_starts_its_timeout_then() {
    let start = Instant::now();
    let (mut framed, activity) = framing(b"", &[b"GET /a HTTP/1.1\r\nhost: t\r\n\r\nGET /b HT"]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some(GET_A), "only the first head");
    // hyper takes the request, which has no body, and serves it for 30 s.
    let busy = activity.busy();
    activity.told_body_length(Some(0));
    tokio::time::sleep(Duration::from_secs(30)).await;
    drop(busy);
    assert_eq!(deadline_after(&activity, start), 11.0, "the next head's time ran from its read at 1 s");
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("GET /b HT"));
    assert_eq!(hyper_reads(&mut framed), None);
}

#[tokio::test(start_paused = true)]
async fn a_body_is_handed_to_its_declared_end_and_bytes_after_it_begin_the_next_head() {
    let start = Instant::now();
    let head = "POST /p HTTP/1.1\r\ncontent-length: 5\r\n\r\n";
    let (mut framed, activity) = framing(head.as_bytes(), &[b"hel", b"lo\r\nGET /n"]);
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some(head), "the lane's bytes first");
    let busy = activity.busy();
    activity.told_body_length(Some(5));
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("hel"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The end of the body and the start of the next request come in one read, at 2 s.
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("lo"));
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(busy);
    assert_eq!(deadline_after(&activity, start), 12.0);
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("\r\nGET /n"));
}

#[tokio::test(start_paused = true)]
async fn a_body_that_ends_exactly_leaves_the_connection_idle() {
    let start = Instant::now();
    let (mut framed, activity) = framing(b"", &[b"PUT /p HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}"]);
    assert!(hyper_reads(&mut framed).unwrap().ends_with("\r\n\r\n"));
    let busy = activity.busy();
    activity.told_body_length(Some(2));
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("{}"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    drop(busy);
    assert_eq!(deadline_after(&activity, start), 63.0, "idle from the request's end");
    assert_eq!(hyper_reads(&mut framed), None);
}

#[tokio::test]
async fn empty_lines_before_a_request_line_and_bare_line_feeds_are_read_as_hyper_reads_them() {
    let (mut framed, _) = framing(b"", &[b"\r\n\nGET / HTTP/1.1\nhost: t\n\nGET"]);
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("\r\n\nGET / HTTP/1.1\nhost: t\n\n"));
    let (mut framed, _) = framing(b"", &[b"GET / HTTP/1.1\r\nhost: t\r", b"\n\r\nGET"]);
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("GET / HTTP/1.1\r\nhost: t\r"));
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("\n\r\n"), "a blank line across reads");
}

#[tokio::test]
async fn a_chunked_body_or_a_head_hyper_did_not_take_turns_the_framing_off() {
    let chunked = "POST /p HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n";
    let (mut framed, activity) =
        framing(b"", &[b"POST /p HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\nGET"]);
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some(chunked));
    let _busy = activity.busy();
    activity.told_body_length(None);
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("2\r\n{}\r\n0\r\n\r\nGET"), "all of it");
    assert_eq!(framed.phase, Phase::Through);

    // hyper reads on without taking the head it was handed (here: no service call at all).
    let (mut framed, _) = framing(b"", &[b"GET / HTTP/1.1\r\n\r\nrest", b"more"]);
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("GET / HTTP/1.1\r\n\r\n"));
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("rest"));
    assert_eq!(hyper_reads(&mut framed).as_deref(), Some("more"));
    assert_eq!(framed.phase, Phase::Through);
}
