//! `Cache-Status` (RFC 9211): what the cache did for one call, rendered in one place.

use http::HeaderValue;

/// What the cache did for a call of a route with `cache`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    /// Answered from a fresh entry, with `ttl` seconds of freshness left.
    Hit { ttl: i64 },
    /// Answered from an entry `ttl` (negative) seconds past its freshness, while one refresh runs.
    Stale { ttl: i64 },
    /// Went upstream, or waited for a concurrent call that did (`collapsed`); `stored` is the
    /// seconds the answer is kept fresh for, when it was kept.
    Miss { stored: Option<u64>, collapsed: bool },
    /// The cache is off (`RECAST_CACHE_BYTES=0`).
    Off,
}

impl CacheStatus {
    /// The `recast.cache` attribute of a call's span.
    pub fn label(self) -> &'static str {
        match self {
            CacheStatus::Hit { .. } => "hit",
            CacheStatus::Stale { .. } => "stale",
            CacheStatus::Miss { .. } => "miss",
            CacheStatus::Off => "bypass",
        }
    }

    /// The header value, under recast's name as the cache.
    pub fn header(self) -> HeaderValue {
        let text = match self {
            CacheStatus::Hit { ttl } => format!("recast; hit; ttl={ttl}"),
            CacheStatus::Stale { ttl } => format!("recast; fwd=stale; ttl={ttl}"),
            CacheStatus::Miss { stored, collapsed } => {
                let mut text = String::from("recast; fwd=miss");
                if let Some(ttl) = stored {
                    text.push_str(&format!("; stored; ttl={ttl}"));
                }
                if collapsed {
                    text.push_str("; collapsed");
                }
                text
            }
            CacheStatus::Off => "recast; fwd=bypass; detail=cache-off".to_owned(),
        };
        HeaderValue::try_from(text).expect("a Cache-Status is visible ASCII")
    }
}

#[cfg(test)]
mod tests {
    use super::CacheStatus;

    #[test]
    fn each_status_renders_as_rfc_9211_says() {
        let cases = [
            (CacheStatus::Hit { ttl: 42 }, "recast; hit; ttl=42"),
            (CacheStatus::Stale { ttl: -5 }, "recast; fwd=stale; ttl=-5"),
            (CacheStatus::Miss { stored: Some(60), collapsed: false }, "recast; fwd=miss; stored; ttl=60"),
            (CacheStatus::Miss { stored: None, collapsed: false }, "recast; fwd=miss"),
            (
                CacheStatus::Miss { stored: Some(1), collapsed: true },
                "recast; fwd=miss; stored; ttl=1; collapsed",
            ),
            (CacheStatus::Miss { stored: None, collapsed: true }, "recast; fwd=miss; collapsed"),
            (CacheStatus::Off, "recast; fwd=bypass; detail=cache-off"),
        ];
        for (status, text) in cases {
            assert_eq!(status.header(), text);
        }
    }
}
