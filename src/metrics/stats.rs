//! A route's health (`GET /v1/routes/{uuid}/stats`): its calls, its error answers by problem
//! type, and its latency, since the route was loaded and over the last few minutes.
//!
//! Bounded per route whatever the traffic: counts in fixed arrays (a count per problem type, a
//! histogram of fixed buckets), for the whole time and for each of the last [`MINUTES`] minutes
//! in a ring of minute slots. Nothing is kept per call. A route never called holds one pointer;
//! its first call allocates the rest ([`RouteStats::size`], about 2.5 KiB). Recording a call is a
//! few relaxed increments and no lock; a minute's slot is cleared by the first call of that
//! minute.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Kinds of error answers counted: one per problem type (`server::problem::SLUGS`).
pub const ERROR_KINDS: usize = 40;

/// Whole minutes a window can cover, besides the current one.
pub const MINUTES: usize = 5;

/// Latency buckets: `[0, 32 µs)`, then two per power of two up to `[50 s, 67 s)`, which also
/// holds anything longer.
const BUCKETS: usize = 43;

/// The latency below which everything is in the first bucket, in microseconds.
const FLOOR_MICROS: u64 = 32;

/// Minute slots: the current minute and the [`MINUTES`] before it.
const SLOTS: usize = MINUTES + 1;

/// A slot being cleared for a new minute.
const CLEARING: u64 = u64::MAX;

/// The health counters of one route, handed on to the route's next version by an update.
#[derive(Debug)]
pub struct RouteStats {
    /// When counting began: when the route was loaded or registered in this process.
    since: SystemTime,
    /// Allocated by the first call.
    counts: OnceLock<Box<Counts>>,
}

#[derive(Debug)]
struct Counts {
    total: Tally<AtomicU64>,
    minutes: [Minute; SLOTS],
}

#[derive(Debug, Default)]
struct Minute {
    /// Which minute (since [`epoch`]) the slot counts, plus one; 0 for none yet.
    minute: AtomicU64,
    tally: Tally<AtomicU32>,
}

/// Calls, error answers by kind, and latency buckets.
#[derive(Debug)]
struct Tally<A> {
    calls: A,
    errors: [A; ERROR_KINDS],
    latency: [A; BUCKETS],
}

/// A counter of a tally: 64 bits for the whole time, 32 for a minute (a route would need more
/// than 71 million calls a second to pass it).
trait Counter: Default {
    fn add(&self);
    fn get(&self) -> u64;
    fn clear(&self);
}

impl Counter for AtomicU64 {
    #[inline]
    fn add(&self) {
        self.fetch_add(1, Ordering::Relaxed);
    }
    fn get(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
    fn clear(&self) {
        self.store(0, Ordering::Relaxed);
    }
}

impl Counter for AtomicU32 {
    #[inline]
    fn add(&self) {
        self.fetch_add(1, Ordering::Relaxed);
    }
    fn get(&self) -> u64 {
        u64::from(self.load(Ordering::Relaxed))
    }
    fn clear(&self) {
        self.store(0, Ordering::Relaxed);
    }
}

impl<A: Counter> Default for Tally<A> {
    fn default() -> Tally<A> {
        Tally {
            calls: A::default(),
            errors: std::array::from_fn(|_| A::default()),
            latency: std::array::from_fn(|_| A::default()),
        }
    }
}

impl<A: Counter> Tally<A> {
    #[inline]
    fn record(&self, error: Option<usize>, latency: Option<usize>) {
        self.calls.add();
        if let Some(count) = error.and_then(|kind| self.errors.get(kind)) {
            count.add();
        }
        if let Some(count) = latency.and_then(|bucket| self.latency.get(bucket)) {
            count.add();
        }
    }

    fn clear(&self) {
        self.calls.clear();
        self.errors.iter().chain(&self.latency).for_each(Counter::clear);
    }

    fn add_to(&self, summary: &mut Summary) {
        summary.calls += self.calls.get();
        for (sum, count) in summary.errors.iter_mut().zip(&self.errors) {
            *sum += count.get();
        }
        for (sum, count) in summary.latency.iter_mut().zip(&self.latency) {
            *sum += count.get();
        }
    }
}

/// What [`RouteStats::summary`] reads: sums over the time asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// When the counts begin.
    pub since: SystemTime,
    pub calls: u64,
    /// Error answers, by kind (the index of their problem type).
    pub errors: [u64; ERROR_KINDS],
    latency: [u64; BUCKETS],
}

impl Summary {
    fn empty(since: SystemTime) -> Summary {
        Summary { since, calls: 0, errors: [0; ERROR_KINDS], latency: [0; BUCKETS] }
    }

    /// Calls whose latency was measured (those that went upstream or to the cache).
    pub fn timed(&self) -> u64 {
        self.latency.iter().sum()
    }

    /// The latency below which `q` (0 < q ≤ 1) of the timed calls were answered, interpolated
    /// within its bucket; `None` when no call was timed.
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        let timed = self.timed();
        if timed == 0 {
            return None;
        }
        let rank = (q * timed as f64).ceil().clamp(1.0, timed as f64);
        let mut below = 0.0;
        for (bucket, &count) in self.latency.iter().enumerate() {
            let count = count as f64;
            if count > 0.0 && below + count >= rank {
                let (low, high) = bounds(bucket);
                // The calls of a bucket taken as spread evenly over it, each at the middle of its share.
                let within = (rank - below - 0.5) / count;
                let micros = low as f64 + within * (high - low) as f64;
                return Some(Duration::from_nanos((micros * 1000.0) as u64));
            }
            below += count;
        }
        None
    }
}

impl Default for RouteStats {
    fn default() -> RouteStats {
        RouteStats { since: SystemTime::now(), counts: OnceLock::new() }
    }
}

impl RouteStats {
    /// Counts one answer: an error answer's kind, and how long the call took when it went
    /// upstream or to the cache.
    pub fn record(&self, error: Option<usize>, latency: Option<Duration>) {
        self.record_at(minute_now(), error, latency);
    }

    fn record_at(&self, minute: u64, error: Option<usize>, latency: Option<Duration>) {
        let counts = self
            .counts
            .get_or_init(|| Box::new(Counts { total: Tally::default(), minutes: Default::default() }));
        let bucket = latency.map(bucket);
        counts.total.record(error, bucket);
        let slot = &counts.minutes[(minute % SLOTS as u64) as usize];
        let tag = minute + 1;
        let mut seen = slot.minute.load(Ordering::Acquire);
        if seen != tag {
            // The slot still holds an older minute: the first call of this minute clears it. A
            // call meanwhile waits for the clearing (a few dozen stores); one that would wait
            // long (the clearing thread descheduled) counts in the total only.
            if seen != CLEARING
                && seen < tag
                && slot.minute.compare_exchange(seen, CLEARING, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                slot.tally.clear();
                slot.minute.store(tag, Ordering::Release);
                seen = tag;
            } else {
                for _ in 0..1000 {
                    seen = slot.minute.load(Ordering::Acquire);
                    if seen != CLEARING {
                        break;
                    }
                    std::hint::spin_loop();
                }
            }
            if seen != tag {
                return;
            }
        }
        slot.tally.record(error, bucket);
    }

    /// The counts since the route was loaded (`minutes` `None`), or over the current minute and
    /// the `minutes` whole minutes before it (at most [`MINUTES`]).
    pub fn summary(&self, minutes: Option<usize>) -> Summary {
        self.summary_at(minute_now(), minutes)
    }

    fn summary_at(&self, now: u64, minutes: Option<usize>) -> Summary {
        let Some(minutes) = minutes else {
            let mut summary = Summary::empty(self.since);
            if let Some(counts) = self.counts.get() {
                counts.total.add_to(&mut summary);
            }
            return summary;
        };
        let minutes = minutes.min(MINUTES) as u64;
        let first = now.saturating_sub(minutes);
        let since = (minute_start(first)).max(self.since);
        let mut summary = Summary::empty(since);
        if let Some(counts) = self.counts.get() {
            for slot in &counts.minutes {
                let tag = slot.minute.load(Ordering::Acquire);
                if tag != CLEARING && tag > first && tag <= now + 1 {
                    // Read into a copy, kept only if the slot still counts the same minute: one
                    // cleared meanwhile for a newer minute is left out.
                    let mut read = summary.clone();
                    slot.tally.add_to(&mut read);
                    if slot.minute.load(Ordering::Acquire) == tag {
                        summary = read;
                    }
                }
            }
        }
        summary
    }

    /// The memory a route's counts take once it has been called, in bytes.
    pub fn size() -> usize {
        size_of::<RouteStats>() + size_of::<Counts>()
    }
}

/// The bucket of a latency.
fn bucket(latency: Duration) -> usize {
    let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    if micros < FLOOR_MICROS {
        return 0;
    }
    let octave = 63 - u64::from(micros.leading_zeros());
    let half = (micros >> (octave - 1)) & 1;
    let index = 1 + (octave - FLOOR_MICROS.trailing_zeros() as u64) * 2 + half;
    (index as usize).min(BUCKETS - 1)
}

/// The microseconds a bucket covers, `[low, high)`.
fn bounds(bucket: usize) -> (u64, u64) {
    if bucket == 0 {
        return (0, FLOOR_MICROS);
    }
    let octave = FLOOR_MICROS.trailing_zeros() as u64 + (bucket as u64 - 1) / 2;
    let half = (bucket as u64 - 1) % 2;
    let low = (1 << octave) + half * (1 << (octave - 1));
    (low, low + (1 << (octave - 1)))
}

/// The process's own clock for minute slots: monotonic, so a change of the wall clock neither
/// clears nor revives a slot.
fn epoch() -> (Instant, SystemTime) {
    static EPOCH: OnceLock<(Instant, SystemTime)> = OnceLock::new();
    *EPOCH.get_or_init(|| (Instant::now(), SystemTime::now()))
}

/// The current minute since [`epoch`].
fn minute_now() -> u64 {
    epoch().0.elapsed().as_secs() / 60
}

/// When a minute since [`epoch`] began, on the wall clock.
fn minute_start(minute: u64) -> SystemTime {
    epoch().1 + Duration::from_secs(minute * 60)
}

/// Milliseconds since the Unix epoch, as answers give times (`createdAt`).
pub fn unix_millis(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_latency_in_order_and_their_bounds_hold_it() {
        let mut last = 0;
        for micros in (0..2_000u64).chain((1..60).map(|s| s * 1_000_000)).chain([u64::MAX / 1000]) {
            let index = bucket(Duration::from_micros(micros));
            assert!(index >= last, "{micros} µs went back to bucket {index}");
            assert!(index < BUCKETS);
            let (low, high) = bounds(index);
            if index < BUCKETS - 1 {
                assert!(low <= micros && micros < high, "{micros} µs in bucket {index} [{low}, {high})");
            } else {
                assert!(micros >= low, "{micros} µs below the last bucket");
            }
            last = index;
        }
        assert_eq!(bounds(1), (32, 48));
        assert_eq!(bounds(2), (48, 64));
        assert_eq!(bounds(3), (64, 96));
        assert_eq!(bounds(BUCKETS - 1), (50_331_648, 67_108_864));
        // Adjacent buckets meet.
        for index in 1..BUCKETS {
            assert_eq!(bounds(index - 1).1, bounds(index).0);
        }
    }

    #[test]
    fn percentiles_fall_within_a_bucket_of_the_true_value() {
        let stats = RouteStats::default();
        // 1..=1000 ms, one call each.
        for ms in 1..=1000u64 {
            stats.record_at(7, None, Some(Duration::from_millis(ms)));
        }
        let summary = stats.summary_at(7, None);
        assert_eq!(summary.calls, 1000);
        assert_eq!(summary.timed(), 1000);
        let p50 = summary.percentile(0.5).unwrap().as_secs_f64() * 1000.0;
        let p99 = summary.percentile(0.99).unwrap().as_secs_f64() * 1000.0;
        // A bucket is at most half its low bound wide; calls spread evenly over it put the
        // percentiles much closer than that.
        assert!((p50 - 500.0).abs() < 500.0 / 3.0, "p50 {p50}");
        assert!((p99 - 990.0).abs() < 990.0 / 3.0, "p99 {p99}");
        assert!(p50 < p99);
        assert_eq!(RouteStats::default().summary(None).percentile(0.5), None);
        // One call: the middle of its bucket.
        let one = RouteStats::default();
        one.record_at(0, None, Some(Duration::from_micros(100)));
        let p = one.summary_at(0, None).percentile(0.99).unwrap().as_micros();
        assert_eq!(p, 112);
    }

    #[test]
    fn errors_are_counted_by_kind_and_calls_without_latency_are_not_timed() {
        let stats = RouteStats::default();
        stats.record_at(3, Some(4), None);
        stats.record_at(3, Some(4), Some(Duration::from_millis(2)));
        stats.record_at(3, Some(ERROR_KINDS - 1), None);
        stats.record_at(3, None, Some(Duration::from_millis(1)));
        // A kind out of range is a call, not a panic.
        stats.record_at(3, Some(ERROR_KINDS), None);
        let summary = stats.summary_at(3, Some(0));
        assert_eq!(summary.calls, 5);
        assert_eq!(summary.errors[4], 2);
        assert_eq!(summary.errors[ERROR_KINDS - 1], 1);
        assert_eq!(summary.errors.iter().sum::<u64>(), 3);
        assert_eq!(summary.timed(), 2);
    }

    #[test]
    fn windows_count_only_their_minutes_and_old_slots_are_cleared() {
        let stats = RouteStats::default();
        for minute in 0..20u64 {
            // Minute m has m + 1 calls.
            for _ in 0..=minute {
                stats.record_at(minute, None, None);
            }
        }
        let total: u64 = (1..=20).sum();
        assert_eq!(stats.summary_at(19, None).calls, total);
        // The current minute alone, then with whole minutes before it.
        assert_eq!(stats.summary_at(19, Some(0)).calls, 20);
        assert_eq!(stats.summary_at(19, Some(1)).calls, 20 + 19);
        assert_eq!(stats.summary_at(19, Some(MINUTES)).calls, (15..=20).sum::<u64>());
        // More than the ring holds is the ring.
        assert_eq!(stats.summary_at(19, Some(60)).calls, (15..=20).sum::<u64>());
        // Later, with no calls since: the old minutes have left the window.
        assert_eq!(stats.summary_at(22, Some(MINUTES)).calls, (18..=20).sum::<u64>());
        assert_eq!(stats.summary_at(40, Some(MINUTES)).calls, 0);
        // A slot reused for a new minute starts from zero.
        stats.record_at(40, None, None);
        assert_eq!(stats.summary_at(40, Some(0)).calls, 1);
        assert_eq!(stats.summary_at(40, Some(MINUTES)).calls, 1);
    }

    #[test]
    fn concurrent_calls_are_all_counted_across_a_minute_boundary() {
        let stats = std::sync::Arc::new(RouteStats::default());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let stats = stats.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000u64 {
                        stats.record_at(100 + i / 10_000, Some(1), Some(Duration::from_micros(i)));
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let total = stats.summary_at(101, None);
        assert_eq!(total.calls, 80_000);
        assert_eq!(total.errors[1], 80_000);
        assert_eq!(total.timed(), 80_000);
        // Each minute's calls, unless a thread waited past its bound on a clearing (which counts
        // in the total only): never more.
        let last = stats.summary_at(101, Some(0)).calls;
        let both = stats.summary_at(101, Some(1)).calls;
        assert!(last <= 40_000 && both <= 80_000, "{last} {both}");
        assert!(both >= 79_000, "{both} of 80000 counted in their minutes");
    }

    #[test]
    fn a_called_route_holds_a_few_kilobytes() {
        let size = RouteStats::size();
        assert!((2_048..3_072).contains(&size), "{size} bytes");
    }
}
