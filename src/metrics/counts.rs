//! The instruments: answers counted by status, and histograms of durations.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

/// Answers by status code, for one route or one endpoint.
///
/// A few distinct codes are counted exactly (an endpoint or a route answers only a handful of
/// them); when more than [`STATUS_SLOTS`] codes have been seen, the rest are counted under
/// `status="other"` rather than growing per route.
#[derive(Debug, Default)]
pub struct StatusCounts {
    codes: [AtomicU16; STATUS_SLOTS],
    counts: [AtomicU64; STATUS_SLOTS],
    other: AtomicU64,
}

/// Distinct status codes counted exactly per route or endpoint.
pub const STATUS_SLOTS: usize = 8;

impl StatusCounts {
    /// Counts one answer with `status`.
    #[inline]
    pub fn record(&self, status: u16) {
        self.add(status, 1);
    }

    /// Adds what `other` counted (`RECAST_METRICS_ROUTE_LABEL=none` sums every route's).
    pub fn merge(&self, other: &StatusCounts) {
        let (seen, rest) = other.snapshot();
        for (status, count) in seen {
            self.add(status, count);
        }
        self.other.fetch_add(rest, Ordering::Relaxed);
    }

    /// Counts `n` answers with `status`.
    #[inline]
    fn add(&self, status: u16, n: u64) {
        for (code, count) in self.codes.iter().zip(&self.counts) {
            let mut seen = code.load(Ordering::Relaxed);
            if seen == 0 {
                // A free slot: claim it, unless another thread just did (maybe for this code).
                seen = match code.compare_exchange(0, status, Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => status,
                    Err(now) => now,
                };
            }
            if seen == status {
                count.fetch_add(n, Ordering::Relaxed);
                return;
            }
        }
        self.other.fetch_add(n, Ordering::Relaxed);
    }

    /// Whether nothing was counted yet (the first slot is claimed by the first answer).
    pub fn is_empty(&self) -> bool {
        self.codes[0].load(Ordering::Relaxed) == 0
    }

    /// `(status, count)` of every code seen, in slot order, and the count of the rest.
    pub fn snapshot(&self) -> (Vec<(u16, u64)>, u64) {
        let seen = self
            .codes
            .iter()
            .zip(&self.counts)
            .map(|(code, count)| (code.load(Ordering::Relaxed), count.load(Ordering::Relaxed)))
            .filter(|&(code, count)| code != 0 && count > 0)
            .collect();
        (seen, self.other.load(Ordering::Relaxed))
    }

    /// Writes one `name{label="value",status="…"} count` line per status seen.
    pub(super) fn write(&self, out: &mut String, name: &str, label: &str, value: &str) {
        let (seen, other) = self.snapshot();
        for (status, count) in seen {
            let _ = writeln!(out, "{name}{{{label}=\"{value}\",status=\"{status}\"}} {count}");
        }
        if other > 0 {
            let _ = writeln!(out, "{name}{{{label}=\"{value}\",status=\"other\"}} {other}");
        }
    }
}

/// A histogram of durations with fixed bucket bounds, in seconds as Prometheus wants them.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in nanoseconds, ascending.
    bounds: &'static [u64],
    /// Observations per bucket (not cumulative); the last one is `+Inf`.
    buckets: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Histogram {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn observe(&self, elapsed: Duration) {
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let bucket = self.bounds.partition_point(|&bound| bound < ns);
        if let Some(count) = self.buckets.get(bucket) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    pub(super) fn write(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.buckets.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            match self.bounds.get(i) {
                Some(&bound) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{}\"}} {cumulative}", seconds(bound));
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let _ = writeln!(out, "{name}_sum {}", seconds(self.sum_ns.load(Ordering::Relaxed)));
        let _ = writeln!(out, "{name}_count {cumulative}");
    }
}

/// Nanoseconds as seconds in plain decimal (no exponent), trailing zeros trimmed.
pub(super) fn seconds(ns: u64) -> String {
    let text = format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000);
    let trimmed = text.trim_end_matches('0');
    trimmed.strip_suffix('.').unwrap_or(trimmed).to_owned()
}

/// Bounds of the upstream latency histogram: 0.5 ms to 30 s.
pub(super) const UPSTREAM_BOUNDS: &[u64] = &[
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
    30_000_000_000,
];

/// Bounds of the mapping latency histogram: 1 µs to 100 ms (parse and execute of one answer).
pub(super) const MAPPING_BOUNDS: &[u64] = &[
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    100_000_000,
];
