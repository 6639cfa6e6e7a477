//! The Prometheus text exposition of the metrics (`GET /metrics`, format 0.0.4).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    Endpoint, Gauges, Http2Closed, Metrics, PanicSite, RulesSource, StatusCounts, Timeout, UpstreamErrorKind,
};
use super::{FetchReason, KeptCounts, LimiterCounts, OriginBreaker, OriginRetries, TokenCounts};

/// What the upstream client counts per origin, limit or token endpoint, for [`Metrics::render`].
#[derive(Debug, Default, Clone, Copy)]
pub struct OutboundCounts<'a> {
    pub breakers: &'a [OriginBreaker],
    pub retries: &'a [OriginRetries],
    pub limits: &'a [LimiterCounts],
    pub tokens: &'a [TokenCounts],
    pub kept: KeptCounts,
    /// What became of recorded spans, when traces are exported.
    pub spans: Option<&'a crate::metrics::SpanCounts>,
}

impl Metrics {
    /// The Prometheus text exposition (format 0.0.4) of everything, with the counts of each
    /// route given by `routes` as `(uuid, counts)`.
    pub fn render<'a>(
        &self,
        gauges: Gauges,
        routes: impl IntoIterator<Item = (String, &'a StatusCounts)>,
        outbound: OutboundCounts<'_>,
    ) -> String {
        let OutboundCounts { breakers, retries, limits, tokens, kept, spans } = outbound;
        let mut out = String::with_capacity(4096);
        let requests = "recast_requests_total";
        out.push_str(
            "# HELP recast_requests_total Answers by route (a route's uuid, all_routes, or the endpoint) and status.\n",
        );
        let _ = writeln!(out, "# TYPE {requests} counter");
        for endpoint in Endpoint::ALL {
            self.endpoints[endpoint as usize].write(&mut out, requests, "route", endpoint.label());
        }
        for (uuid, counts) in routes {
            counts.write(&mut out, requests, "route", &uuid);
        }
        self.upstream.write(
            &mut out,
            "recast_upstream_duration_seconds",
            "Time from sending an upstream request to having its whole answer, route calls and live calls.",
        );
        self.mapping.write(
            &mut out,
            "recast_mapping_duration_seconds",
            "Time to parse an upstream answer and map it by the route's rules.",
        );
        out.push_str("# HELP recast_upstream_errors_total Upstream exchanges that failed, by kind.\n");
        out.push_str("# TYPE recast_upstream_errors_total counter\n");
        for kind in UpstreamErrorKind::ALL {
            let count = self.upstream_errors[kind as usize].load(Ordering::Relaxed);
            let _ = writeln!(out, "recast_upstream_errors_total{{kind=\"{}\"}} {count}", kind.label());
        }
        out.push_str(
            "# HELP recast_source_failures_total Sources of composed routes that failed, by kind and by whether the source was required.\n",
        );
        out.push_str("# TYPE recast_source_failures_total counter\n");
        for (kind, optional, count) in self.composed.failures() {
            let required = if optional { "false" } else { "true" };
            let _ = writeln!(
                out,
                "recast_source_failures_total{{kind=\"{}\",required=\"{required}\"}} {count}",
                kind.label()
            );
        }
        out.push_str(
            "# HELP recast_rule_compile_failures_total Rules documents that did not compile, by where they came from.\n",
        );
        out.push_str("# TYPE recast_rule_compile_failures_total counter\n");
        for source in RulesSource::ALL {
            let count = self.compile_failures[source as usize].load(Ordering::Relaxed);
            let _ =
                writeln!(out, "recast_rule_compile_failures_total{{source=\"{}\"}} {count}", source.label());
        }
        out.push_str("# HELP recast_panics_total Panics caught while serving, by where; each is a bug and is logged.\n");
        out.push_str("# TYPE recast_panics_total counter\n");
        for site in PanicSite::ALL {
            let count = self.panics[site as usize].load(Ordering::Relaxed);
            let _ = writeln!(out, "recast_panics_total{{site=\"{}\"}} {count}", site.label());
        }
        out.push_str(
            "# HELP recast_connections_timed_out_total Client connections closed by a timeout: idle (no request began) or head (a head begun was not whole in time).\n",
        );
        out.push_str("# TYPE recast_connections_timed_out_total counter\n");
        for timeout in Timeout::ALL {
            let count = self.timeouts[timeout as usize].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "recast_connections_timed_out_total{{timeout=\"{}\"}} {count}",
                timeout.label()
            );
        }
        out.push_str(
            "# HELP recast_http2_connections_closed_total HTTP/2 connections recast closed with GOAWAY for their client's conduct: flood (control frames faster than allowed) or stalled (answers waiting, none taken within RECAST_HEADER_TIMEOUT_MS).\n# TYPE recast_http2_connections_closed_total counter\n",
        );
        for why in Http2Closed::ALL {
            let count = self.http2_closed[why as usize].load(Ordering::Relaxed);
            let _ =
                writeln!(out, "recast_http2_connections_closed_total{{reason=\"{}\"}} {count}", why.label());
        }
        let gauge = |out: &mut String, name: &str, help: &str, value: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
        let cache = &self.cache;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let counters = [
            (
                "recast_cache_hits_total",
                "Route calls answered from a fresh cached answer.",
                load(&cache.hits),
            ),
            (
                "recast_cache_misses_total",
                "Route calls of cached routes that went upstream for their answer.",
                load(&cache.misses),
            ),
            (
                "recast_cache_stale_total",
                "Route calls answered at once from a stale cached answer while it was refreshed.",
                load(&cache.stale),
            ),
            (
                "recast_cache_coalesced_total",
                "Route calls that waited for a concurrent call's upstream call instead of making their own.",
                load(&cache.coalesced),
            ),
            (
                "recast_expression_errors_total",
                "Rule expressions that failed while mapping upstream answers (route calls and registrations' live calls); each one's value was missing.",
                load(&self.expression_errors),
            ),
            (
                "recast_composed_calls_total",
                "Calls of composed routes that ran their sources (registrations' live calls included).",
                load(&self.composed.calls),
            ),
            (
                "recast_composed_partial_total",
                "Calls of composed routes answered with Recast-Partial: an optional source failed.",
                load(&self.composed.partial),
            ),
            (
                "recast_source_not_a_list_total",
                "forEach sources of composed routes whose value was not a list (nor an object), so no call was made (registrations' live calls included).",
                load(&self.composed.not_a_list),
            ),
            (
                "recast_cache_evictions_total",
                "Cached answers dropped to stay within RECAST_CACHE_BYTES, or refused as too large for it.",
                gauges.cache.evictions,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        }
        gauge(&mut out, "recast_cache_entries", "Answers the cache holds.", gauges.cache.entries);
        let _ = writeln!(
            out,
            "# HELP recast_cache_bytes Bytes the cache holds (answers, keys and bookkeeping), at most RECAST_CACHE_BYTES.\n# TYPE recast_cache_bytes gauge\nrecast_cache_bytes {}",
            gauges.cache.bytes
        );
        gauge(&mut out, "recast_routes_loaded", "Routes in the route table.", gauges.routes_loaded);
        gauge(
            &mut out,
            "recast_routes_broken",
            "Loaded routes that cannot serve calls (they answer 503).",
            gauges.routes_broken,
        );
        gauge(
            &mut out,
            "recast_in_flight_requests",
            "Requests being served, this one included.",
            gauges.in_flight,
        );
        gauge(
            &mut out,
            "recast_lifecycle_state",
            "0 while loading routes, 1 while running, 2 while stopping.",
            usize::from(gauges.lifecycle),
        );
        if let Some(store) = &gauges.store {
            gauge(
                &mut out,
                "recast_store_up",
                "1 while the route database answers this node, 0 while it does not.",
                usize::from(store.up),
            );
            let _ = writeln!(
                out,
                "# HELP recast_store_revision The last revision of the route database this node applied.\n# TYPE recast_store_revision gauge\nrecast_store_revision {}",
                store.revision
            );
            gauge(
                &mut out,
                "recast_cluster_nodes",
                "The nodes alive in the cluster as this node last heard (itself included): each takes this share of every outbound rate limit.",
                store.nodes as usize,
            );
            let _ = writeln!(
                out,
                "# HELP recast_store_sync_lag_seconds Time since this node last knew it had every change of the route database.\n# TYPE recast_store_sync_lag_seconds gauge\nrecast_store_sync_lag_seconds {:.3}",
                store.lag_seconds
            );
        }
        write_breakers(&mut out, breakers);
        write_retries(&mut out, retries);
        out.push_str(
            "# HELP recast_upstream_rate_limited_total Calls a rate limit (route:<uuid> or origin:<origin>) answered 429 without an outbound call.\n# TYPE recast_upstream_rate_limited_total counter\n",
        );
        for limit in limits {
            let _ = writeln!(
                out,
                "recast_upstream_rate_limited_total{{limit=\"{}\"}} {}",
                label(&limit.limit),
                limit.refused
            );
        }
        write_tokens(&mut out, tokens);
        write_spans(&mut out, spans);
        out.push_str(
            "# HELP recast_upstream_kept What the upstream client keeps per key now, by kind; what no call used for ten minutes and holds nothing worth keeping is let go.\n# TYPE recast_upstream_kept gauge\n",
        );
        for (kind, count) in kept.labelled() {
            let _ = writeln!(out, "recast_upstream_kept{{kind=\"{kind}\"}} {count}");
        }
        let _ = writeln!(
            out,
            "# HELP recast_build_info The running version.\n# TYPE recast_build_info gauge\nrecast_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        out
    }
}

/// A series of every origin's breaker: name, type, help, and its value of one breaker.
type BreakerSeries = (&'static str, &'static str, &'static str, fn(&OriginBreaker) -> u64);

/// The breaker of each upstream origin called so far: its state, its refusals, its openings.
fn write_breakers(out: &mut String, breakers: &[OriginBreaker]) {
    let series: [BreakerSeries; 3] = [
        (
            "recast_upstream_breaker_state",
            "gauge",
            "The circuit breaker of each upstream origin: 0 closed, 1 open (calls refused), 2 half-open (one call probes).",
            |b| b.state as u64,
        ),
        (
            "recast_upstream_breaker_rejections_total",
            "counter",
            "Calls refused by an upstream origin's open breaker, without an outbound call.",
            |b| b.rejected,
        ),
        (
            "recast_upstream_breaker_opened_total",
            "counter",
            "Times an upstream origin's breaker opened (after failures in a row, or a failed probe).",
            |b| b.opened,
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for breaker in breakers {
            let _ = match breaker.route {
                None => writeln!(out, "{name}{{origin=\"{}\"}} {}", label(&breaker.origin), value(breaker)),
                Some(route) => writeln!(
                    out,
                    "{name}{{origin=\"{}\",route=\"{route}\"}} {}",
                    label(&breaker.origin),
                    value(breaker)
                ),
            };
        }
    }
}

/// The retries of each upstream origin called by routes with `retry`: sent, and refused by the
/// origin's budget.
fn write_retries(out: &mut String, retries: &[OriginRetries]) {
    type Series = (&'static str, &'static str, fn(&OriginRetries) -> u64);
    let series: [Series; 2] = [
        (
            "recast_upstream_retries_total",
            "Upstream calls sent again by a route's `retry`, by origin.",
            |r| r.retries,
        ),
        (
            "recast_upstream_retries_over_budget_total",
            "Retries not sent because the origin's retry budget (20% of its calls, beyond a reserve of 10) was spent.",
            |r| r.over_budget,
        ),
    ];
    for (name, help, value) in series {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        for origin in retries {
            let _ = writeln!(out, "{name}{{origin=\"{}\"}} {}", label(&origin.origin), value(origin));
        }
    }
}

/// The token fetches of each OAuth2 token endpoint, by why they were made and how they ended.
fn write_tokens(out: &mut String, tokens: &[TokenCounts]) {
    out.push_str(
        "# HELP recast_upstream_token_fetches_total Access tokens asked of an OAuth2 token endpoint, by origin, reason (new, renewal, rejected: after an upstream's 401) and outcome.\n# TYPE recast_upstream_token_fetches_total counter\n",
    );
    for endpoint in tokens {
        for reason in FetchReason::ALL {
            for (outcome, n) in ["ok", "failed"].into_iter().zip(endpoint.fetched[reason as usize]) {
                let _ = writeln!(
                    out,
                    "recast_upstream_token_fetches_total{{origin=\"{}\",reason=\"{}\",outcome=\"{outcome}\"}} {n}",
                    label(&endpoint.origin),
                    reason.label()
                );
            }
        }
    }
}

/// `text` as a label value: backslash, quote and line feed escaped.
fn label(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// What became of recorded spans (zero while traces are not exported).
fn write_spans(out: &mut String, spans: Option<&crate::metrics::SpanCounts>) {
    let read = |count: Option<&std::sync::atomic::AtomicU64>| count.map_or(0, |c| c.load(Ordering::Relaxed));
    out.push_str(
        "# HELP recast_trace_spans_total Spans recorded for export, by what became of them: exported, dropped because the queue was full, or dropped with an export the collector did not take.\n# TYPE recast_trace_spans_total counter\n",
    );
    for (outcome, count) in [
        ("exported", read(spans.map(|s| &s.exported))),
        ("dropped_queue_full", read(spans.map(|s| &s.dropped_full))),
        ("dropped_export_failed", read(spans.map(|s| &s.dropped_failed))),
    ] {
        let _ = writeln!(out, "recast_trace_spans_total{{outcome=\"{outcome}\"}} {count}");
    }
    out.push_str("# HELP recast_trace_exports_total Exports of spans to the collector, by outcome.\n# TYPE recast_trace_exports_total counter\n");
    for (outcome, count) in
        [("ok", read(spans.map(|s| &s.exports_ok))), ("failed", read(spans.map(|s| &s.exports_failed)))]
    {
        let _ = writeln!(out, "recast_trace_exports_total{{outcome=\"{outcome}\"}} {count}");
    }
}
