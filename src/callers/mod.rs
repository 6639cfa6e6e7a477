//! Who may call a route (SPEC §2.4): the caller a call's credential makes ([`Caller`], what
//! `$caller` reads), a route's compiled `callers` ([`Gate`]) and the [`Door`] every call of a
//! route with one passes first, before its cache, its body and any upstream call.
//!
//! - `caller.rs`: the [`Caller`] a credential makes and the [`Refusal`] of one that fails, which
//!   every other part shares.
//! - `config.rs`: `callers` as given and stored, with its checks.
//! - `consumers.rs`: consumers, their keys (digests only) and the in-memory [`Directory`].
//! - `jwt.rs`: a bearer token read and checked (RFC 7519/7515) against one issuer.
//! - `key_sets.rs`: the issuers' key sets, one copy per URI, refreshed before they end.
//! - `verified.rs`: tokens already verified, remembered by their digest.
//! - `certificate.rs`: a connection's verified client certificate, and the caller its names make
//!   (SPEC §7).
//! - `memo.rs`: a connection's last credential and what it made, so a client repeating its key
//!   or token on a kept-alive connection is not digested again.
//! - `limit.rs`: the calls each caller may make (`limit`).
//!
//! A credential is never forwarded, logged, put in a span, a cache key or an answer: what leaves
//! this module is the [`Caller`] it made, or a [`Refusal`] in general words.

mod caller;
pub mod certificate;
pub mod config;
pub mod consumers;
pub mod jwt;
pub mod key_sets;
pub mod limit;
pub mod memo;
pub mod verified;

use std::sync::Arc;

pub use self::caller::{Caller, CallerKind, Refusal, constant, identity, matches, now_ms};
pub use self::certificate::ClientCertificate;
pub use self::config::{Algorithm, CallersConfig, IssuerConfig, LimitConfig, Named};
pub use self::consumers::{Directory, StoredConsumer, StoredKey};
pub use self::memo::Memo;
use http::HeaderMap;

/// A route's compiled `callers`.
#[derive(Debug)]
pub struct Gate {
    /// Consumer names and prefixes (`partner-*`); `*` any.
    consumers: Vec<String>,
    issuers: Vec<Arc<jwt::Issuer>>,
    /// Client certificates' names and prefixes (`app-*`); `*` any.
    certificates: Vec<String>,
    pub limit: Option<limit::CallerLimit>,
}

impl Gate {
    /// `None` for an open route.
    pub fn compile(config: Option<&CallersConfig>, route: uuid::Uuid) -> Result<Option<Gate>, String> {
        let Some(CallersConfig::Named(named)) = config else { return Ok(None) };
        let issuers = named.jwt.iter().map(|config| Arc::new(jwt::Issuer::new(config))).collect();
        let limit = match &named.limit {
            Some(config) => Some(limit::CallerLimit::compile(config, route)?),
            None => None,
        };
        Ok(Some(Gate {
            consumers: named.consumers.clone(),
            issuers,
            certificates: named.certificates.clone(),
            limit,
        }))
    }

    fn names(&self, consumer: &str) -> bool {
        matches(&self.consumers, consumer)
    }

    /// Whether it names client certificates.
    pub fn takes_certificates(&self) -> bool {
        !self.certificates.is_empty()
    }

    /// What a call without a credential is told it needs.
    fn needs(&self) -> &'static str {
        let takes_keys = !self.consumers.is_empty();
        match (takes_keys, !self.issuers.is_empty(), self.takes_certificates()) {
            (true, true, true) => {
                "this route needs an API key (X-Api-Key), a bearer token or a client certificate"
            }
            (true, true, false) => "this route needs an API key (X-Api-Key) or a bearer token",
            (true, false, true) => "this route needs an API key (X-Api-Key) or a client certificate",
            (false, true, true) => "this route needs a bearer token or a client certificate",
            (true, false, false) => "this route needs an API key (X-Api-Key)",
            (false, true, false) => "this route needs a bearer token",
            (false, false, _) => "this route needs a client certificate",
        }
    }

    /// The key-set sources its issuers read (for fetching them ahead of the first call).
    pub fn issuers(&self) -> &[Arc<jwt::Issuer>] {
        &self.issuers
    }
}

/// What a call presented.
enum Credential<'a> {
    Key(&'a [u8]),
    /// Its bytes: read as text only when it is verified (a token remembered was text).
    Token(&'a [u8]),
}

/// The parameter names of a query that carry credentials in the common APIs; a protected route
/// refuses a call that puts one in its URL (SPEC §2.4: never read from the query), since a URL
/// is logged and kept where a header is not.
const QUERY_CREDENTIALS: [&str; 5] = ["access_token", "api_key", "apikey", "api-key", "x-api-key"];

/// Whether a call's query carries what looks like a credential.
fn credential_in_query(query: &str) -> bool {
    url::form_urlencoded::parse(query.as_bytes()).any(|(name, value)| {
        QUERY_CREDENTIALS.iter().any(|c| name.eq_ignore_ascii_case(c))
            || consumers::looks_like_key(value.as_bytes())
            || jwt::looks_like_token(&value)
    })
}

/// The one credential a call presents: `X-Api-Key`, or `Authorization: Bearer`.
fn credential<'a>(headers: &'a HeaderMap) -> Result<Option<Credential<'a>>, Refusal> {
    // One pass over a call's few headers, rather than a hashed lookup of each name.
    let (mut key, mut authorization, mut given) = (None, None, 0);
    for (name, value) in headers {
        if *name == http::header::AUTHORIZATION {
            authorization = Some(value);
        } else if *name == X_API_KEY {
            key = Some(value);
        } else {
            continue;
        }
        given += 1;
    }
    if given > 1 {
        return Err(Refusal::unauthenticated("more than one credential was presented"));
    }
    if let Some(key) = key {
        return Ok(Some(Credential::Key(key.as_bytes())));
    }
    let Some(authorization) = authorization else { return Ok(None) };
    let value = authorization.as_bytes();
    let Some(token) = value
        .get(..7)
        .filter(|scheme| scheme.eq_ignore_ascii_case(b"bearer "))
        .map(|_| value[7..].trim_ascii())
    else {
        return Err(Refusal::unauthenticated("the Authorization scheme is not Bearer"));
    };
    if token.starts_with(consumers::KEY_PREFIX.as_bytes()) {
        return Ok(Some(Credential::Key(token)));
    }
    if token.is_empty() {
        return Err(Refusal::unauthenticated("the bearer token is empty"));
    }
    Ok(Some(Credential::Token(token)))
}

/// `X-Api-Key`.
pub const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// What every route's callers are checked against: the consumers' keys, the issuers' key sets,
/// the tokens verified so far and each caller's count.
pub struct Door {
    pub directory: Directory,
    pub key_sets: Arc<key_sets::KeySets>,
    pub verified: verified::Verified,
    pub limits: limit::Limits,
    pub counts: Counts,
}

/// What `/metrics` shows of the door; no label per consumer or subject.
#[derive(Default)]
pub struct Counts {
    /// Refusals by [`Refusal::reason`]: missing, invalid, forbidden, limited.
    pub refused: [std::sync::atomic::AtomicU64; 4],
    pub admitted_keys: std::sync::atomic::AtomicU64,
    pub admitted_tokens: std::sync::atomic::AtomicU64,
    pub admitted_certificates: std::sync::atomic::AtomicU64,
}

impl Counts {
    pub const REASONS: [&'static str; 4] = ["missing", "invalid", "forbidden", "limited"];

    fn refused(&self, refusal: &Refusal) {
        let i = Counts::REASONS.iter().position(|r| *r == refusal.reason()).unwrap_or(0);
        self.refused[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Door {
    /// Its part of `/metrics` (Prometheus text): refusals by reason, callers admitted by kind,
    /// key-set fetches by reason and outcome, and what it holds. No label names a consumer or a
    /// subject.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        use std::sync::atomic::Ordering::Relaxed;
        out.push_str("# HELP recast_callers_refused_total Calls of routes with `callers` refused at the door, by reason (missing: no credential; invalid: a credential that fails a check; forbidden: a caller the route does not name, or a claim condition; limited: over the route's limit).\n# TYPE recast_callers_refused_total counter\n");
        for (reason, count) in Counts::REASONS.iter().zip(&self.counts.refused) {
            let _ =
                writeln!(out, "recast_callers_refused_total{{reason=\"{reason}\"}} {}", count.load(Relaxed));
        }
        out.push_str("# HELP recast_callers_admitted_total Calls of routes with `callers` let in, by the kind of credential.\n# TYPE recast_callers_admitted_total counter\n");
        let _ = writeln!(
            out,
            "recast_callers_admitted_total{{kind=\"key\"}} {}",
            self.counts.admitted_keys.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "recast_callers_admitted_total{{kind=\"jwt\"}} {}",
            self.counts.admitted_tokens.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "recast_callers_admitted_total{{kind=\"certificate\"}} {}",
            self.counts.admitted_certificates.load(Relaxed)
        );
        out.push_str("# HELP recast_key_set_fetches_total Fetches of issuers' key sets, by reason (new, refresh, unknown_kid) and outcome.\n# TYPE recast_key_set_fetches_total counter\n");
        let counts = &self.key_sets.counts;
        for reason in key_sets::Reason::ALL {
            let (fetched, failed) =
                (counts.fetched[reason as usize].load(Relaxed), counts.failed[reason as usize].load(Relaxed));
            let _ = writeln!(
                out,
                "recast_key_set_fetches_total{{reason=\"{}\",outcome=\"ok\"}} {}",
                reason.label(),
                fetched - failed.min(fetched)
            );
            let _ = writeln!(
                out,
                "recast_key_set_fetches_total{{reason=\"{}\",outcome=\"failed\"}} {failed}",
                reason.label()
            );
        }
        let _ = writeln!(
            out,
            "# HELP recast_key_sets Issuers' key sets held.\n# TYPE recast_key_sets gauge\nrecast_key_sets {}",
            self.key_sets.held()
        );
        let _ = writeln!(
            out,
            "# HELP recast_verified_tokens Verified tokens remembered.\n# TYPE recast_verified_tokens gauge\nrecast_verified_tokens {}",
            self.verified.len()
        );
        let _ = writeln!(
            out,
            "# HELP recast_consumer_keys API keys of consumers held.\n# TYPE recast_consumer_keys gauge\nrecast_consumer_keys {}",
            self.directory.key_count()
        );
        let _ = writeln!(
            out,
            "# HELP recast_caller_limits Callers counted by routes' limits now.\n# TYPE recast_caller_limits gauge\nrecast_caller_limits {}",
            self.limits.len()
        );
    }

    pub fn new(key_sets: Arc<key_sets::KeySets>) -> Door {
        Door {
            directory: Directory::default(),
            key_sets,
            verified: verified::Verified::new(verified::DEFAULT_BYTES),
            limits: limit::Limits::default(),
            counts: Counts::default(),
        }
    }

    /// What the door decides at once for a call of a route with `gate`: a caller with a key,
    /// or with a token it verified before, and every refusal that needs no key set; a token it
    /// must verify first is [`Decision::Wait`], for [`Door::admit_waiting`]. `memo` is the
    /// connection's, when the call came on one.
    pub fn admit_now(
        &self,
        gate: &Gate,
        headers: &HeaderMap,
        query: Option<&str>,
        nodes: u32,
        memo: Option<&Memo>,
    ) -> Decision {
        let decided = match self.check_now(gate, headers, query, memo) {
            Some(decided) => decided,
            None => return Decision::Wait,
        };
        match self.finish(gate, decided, nodes) {
            Ok(caller) => Decision::Admitted(caller),
            Err(refusal) => Decision::Refused(refusal),
        }
    }

    /// The caller of a call [`Door::admit_now`] said to wait for: its token, not verified yet,
    /// checked (its key set fetched when none is held, or when it lacks the token's `kid`).
    pub async fn admit_waiting(
        &self,
        gate: &Gate,
        headers: &HeaderMap,
        nodes: u32,
        memo: Option<&Memo>,
    ) -> Result<Arc<Caller>, Refusal> {
        let decided = match credential(headers) {
            Ok(Some(Credential::Token(token))) => match std::str::from_utf8(token) {
                Ok(token) => {
                    let now = now_ms() / 1000;
                    jwt::admit(&self.key_sets, &self.verified, &gate.issuers, token, now, memo).await
                }
                Err(_) => Err(Refusal::unauthenticated("the bearer token is not text")),
            }
            .inspect(|_| {
                self.counts.admitted_tokens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }),
            // `admit_now` decides every other credential.
            _ => Err(Refusal::unauthenticated("the credential could not be read")),
        };
        self.finish(gate, decided, nodes)
    }

    /// A decided caller held to the route's limit; a refusal counted.
    fn finish(
        &self,
        gate: &Gate,
        decided: Result<Arc<Caller>, Refusal>,
        nodes: u32,
    ) -> Result<Arc<Caller>, Refusal> {
        let admitted = match decided {
            Ok(caller) => match &gate.limit {
                Some(limit) => self.limits.take(limit, &caller, nodes).map(|()| caller),
                None => Ok(caller),
            },
            Err(refusal) => Err(refusal),
        };
        if let Err(refusal) = &admitted {
            self.counts.refused(refusal);
        }
        admitted
    }

    /// The checks that need nothing fetched; `None` for a token not verified before.
    fn check_now(
        &self,
        gate: &Gate,
        headers: &HeaderMap,
        query: Option<&str>,
        memo: Option<&Memo>,
    ) -> Option<Result<Arc<Caller>, Refusal>> {
        if query.is_some_and(credential_in_query) {
            return Some(Err(Refusal::unauthenticated(
                "a credential was put in the URL's query; credentials are read only from headers",
            )));
        }
        let credential = match credential(headers) {
            Ok(credential) => credential,
            Err(refusal) => return Some(Err(refusal)),
        };
        Some(match credential {
            // A call that presents no key or token is judged by its connection's client
            // certificate, when the route names certificates.
            None => match memo.and_then(Memo::certificate).filter(|_| gate.takes_certificates()) {
                Some(certificate) if !certificate.current(now_ms() / 1000) => Err(Refusal::unauthenticated(
                    "the connection's client certificate has ended, or the authorities that verified it were replaced: connect again",
                )),
                Some(certificate) => match certificate.caller(&gate.certificates) {
                    Some(caller) => {
                        self.counts.admitted_certificates.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Ok(caller)
                    }
                    None => Err(Refusal::Forbidden(
                        "this route does not name the client certificate's subject".to_owned(),
                    )),
                },
                None => Err(Refusal::Unauthenticated { given: false, why: gate.needs().to_owned() }),
            },
            Some(Credential::Key(key)) => {
                let now_ms = now_ms();
                let entry = match memo.and_then(|memo| memo.key(key)) {
                    Some(entry) => entry,
                    // A value of another form is no key: refused without being digested.
                    None if !consumers::looks_like_key(key) => {
                        return Some(Err(Refusal::unauthenticated(
                            "the API key is not one recast issued (`rk_` and 43 characters)",
                        )));
                    }
                    None => {
                        let Some(entry) = self.directory.find(key) else {
                            return Some(Err(Refusal::unauthenticated(
                                "the API key is not known, or was revoked",
                            )));
                        };
                        if let Some(memo) = memo {
                            memo.keep_key(key, &entry);
                        }
                        entry
                    }
                };
                if entry.expires_at.is_some_and(|at| at <= now_ms) {
                    return Some(Err(Refusal::unauthenticated("the API key has expired")));
                }
                let consumer = entry.caller.consumer.as_deref().unwrap_or_default();
                if !gate.names(consumer) {
                    return Some(Err(Refusal::Forbidden(
                        "this route does not name the key's consumer".to_owned(),
                    )));
                }
                entry.used(now_ms);
                self.counts.admitted_keys.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(entry.caller.clone())
            }
            Some(Credential::Token(_)) if gate.issuers.is_empty() => {
                Err(Refusal::unauthenticated(if gate.consumers.is_empty() {
                    "this route takes client certificates, not tokens"
                } else {
                    "this route takes API keys, not tokens"
                }))
            }
            Some(Credential::Token(token)) => {
                let now = now_ms() / 1000;
                let remembered =
                    jwt::remembered(&self.key_sets, &self.verified, &gate.issuers, token, now, memo)?;
                if remembered.is_ok() {
                    self.counts.admitted_tokens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                remembered
            }
        })
    }
}

/// What [`Door::admit_now`] decided.
pub enum Decision {
    Admitted(Arc<Caller>),
    Refused(Refusal),
    /// A token to verify first: [`Door::admit_waiting`].
    Wait,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn one_credential_from_the_headers_and_none_from_the_query() {
        assert!(matches!(credential(&headers(&[("x-api-key", "rk_a")])), Ok(Some(Credential::Key(b"rk_a")))));
        assert!(matches!(
            credential(&headers(&[("authorization", "bearer rk_a")])),
            Ok(Some(Credential::Key(b"rk_a")))
        ));
        assert!(matches!(
            credential(&headers(&[("authorization", "Bearer a.b.c")])),
            Ok(Some(Credential::Token(b"a.b.c")))
        ));
        assert!(credential(&headers(&[("authorization", "Basic abc")])).is_err());
        assert!(credential(&headers(&[("x-api-key", "rk_a"), ("authorization", "Bearer a.b.c")])).is_err());
        assert!(credential(&headers(&[("x-api-key", "rk_a"), ("x-api-key", "rk_b")])).is_err());
        assert!(matches!(credential(&headers(&[])), Ok(None)));
        assert!(credential_in_query("access_token=abc"));
        assert!(credential_in_query("q=1&API_KEY=x"));
        let key = consumers::issue(0, None).key;
        assert!(credential_in_query(&format!("k={key}")));
        assert!(credential_in_query("t=eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiIxIn0.c2ln"));
        assert!(!credential_in_query("q=shoes&page=2"));
    }

    #[test]
    fn consumer_patterns_match_names_and_prefixes() {
        let gate = Gate {
            consumers: vec!["mobile-app".into(), "partner-*".into()],
            issuers: vec![],
            certificates: vec![],
            limit: None,
        };
        assert!(gate.names("mobile-app"));
        assert!(gate.names("partner-acme"));
        assert!(!gate.names("mobile-app2"));
        assert!(!gate.names("partner"));
        let any = Gate { consumers: vec!["*".into()], issuers: vec![], certificates: vec![], limit: None };
        assert!(any.names("whoever"));
    }

    #[test]
    fn callers_are_told_apart_by_kind_issuer_and_id() {
        let a = identity(CallerKind::Jwt, Some("https://a/"), "42");
        assert_ne!(a, identity(CallerKind::Jwt, Some("https://b/"), "42"));
        assert_ne!(a, identity(CallerKind::Key, Some("https://a/"), "42"));
        // Lengths separate the parts: no two splits of one text hash alike.
        assert_ne!(identity(CallerKind::Jwt, Some("ab"), "c"), identity(CallerKind::Jwt, Some("a"), "bc"));
    }
}
