//! A route's `callers` (SPEC §2.4) as a registration gives it and as it is stored: which
//! consumers and which token issuers may call the route, and the limit each caller is held to.
//! Data only, with its checks: every problem at its location, with the name probably meant.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::rules::Problem;
use crate::suggest;

/// Who may call a route. Stored and shown as given: `"open"`, or the object.
#[derive(Debug, Clone, PartialEq)]
pub enum CallersConfig {
    /// `"callers": "open"`: anyone who knows the address, said on purpose (for
    /// `RECAST_CALLERS_REQUIRED`).
    Open,
    /// The callers named.
    Named(Named),
}

impl Serialize for CallersConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            CallersConfig::Open => serializer.serialize_str("open"),
            CallersConfig::Named(named) => named.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for CallersConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::String(open) if open == "open" => Ok(CallersConfig::Open),
            other => Named::deserialize(other).map(CallersConfig::Named).map_err(serde::de::Error::custom),
        }
    }
}

/// The members of a `callers` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Named {
    /// Consumer names, a trailing `*` matching a prefix (`"*"`: any consumer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jwt: Vec<IssuerConfig>,
    /// Names a client certificate's subject CN or a SAN DNS name may have, a trailing `*`
    /// matching a prefix (`"*"`: any certificate the listener's client CA signed; SPEC §7).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificates: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<LimitConfig>,
}

/// One issuer whose tokens are taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IssuerConfig {
    pub issuer: String,
    pub audiences: Vec<String>,
    /// Where its key set is; `None`: from its OpenID discovery document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_uri: Option<String>,
    pub algorithms: Vec<Algorithm>,
    /// Conditions on claims: a claim's name and the value it must be (or hold).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub claims: BTreeMap<String, Value>,
    pub leeway_seconds: u64,
}

/// `limit`: at most `requests` calls per `per_seconds` seconds for each caller, told apart by `by`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LimitConfig {
    pub requests: u32,
    pub per_seconds: u32,
    /// An expression over `$caller` whose value tells callers apart; `None`: `kind`, `issuer`
    /// and `id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// The signature algorithms a token may use (RFC 7518). `none` and the `HS*` family are never
/// taken: a key set holds public keys, and a shared secret would be one every route shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Algorithm {
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    EdDSA,
}

impl Algorithm {
    pub const ALL: [Algorithm; 9] = [
        Algorithm::RS256,
        Algorithm::RS384,
        Algorithm::RS512,
        Algorithm::PS256,
        Algorithm::PS384,
        Algorithm::PS512,
        Algorithm::ES256,
        Algorithm::ES384,
        Algorithm::EdDSA,
    ];

    /// Taken when an issuer names none (SPEC §2.4).
    pub const DEFAULT: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::RS256 => "RS256",
            Algorithm::RS384 => "RS384",
            Algorithm::RS512 => "RS512",
            Algorithm::PS256 => "PS256",
            Algorithm::PS384 => "PS384",
            Algorithm::PS512 => "PS512",
            Algorithm::ES256 => "ES256",
            Algorithm::ES384 => "ES384",
            Algorithm::EdDSA => "EdDSA",
        }
    }

    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// Most issuers one route takes tokens of.
pub const MAX_ISSUERS: usize = 8;
/// Most consumer names or prefixes one route lists.
pub const MAX_CONSUMERS: usize = 256;
/// Most claim conditions of one issuer.
pub const MAX_CLAIMS: usize = 16;
/// Most certificate names or prefixes one route lists.
pub const MAX_CERTIFICATES: usize = 256;
/// The longest certificate name or prefix (a DNS name's bound).
pub const MAX_CERTIFICATE_NAME: usize = 253;
/// The longest leeway for `exp`, `nbf` and `iat`.
pub const MAX_LEEWAY_SECONDS: u64 = 600;
/// The leeway when an issuer gives none.
pub const DEFAULT_LEEWAY_SECONDS: u64 = 30;
/// The longest window of a limit: a day.
pub const MAX_LIMIT_WINDOW: u32 = 86_400;

const MEMBERS: [&str; 4] = ["consumers", "jwt", "certificates", "limit"];
const ISSUER_MEMBERS: [&str; 6] = ["issuer", "audiences", "jwksUri", "algorithms", "claims", "leewaySeconds"];
const LIMIT_MEMBERS: [&str; 3] = ["requests", "perSeconds", "by"];

/// Whether `name` may name a consumer: 1 to 64 letters, digits, `.`, `_` and `-`, starting with
/// a letter or digit (it stands in a URL path and in a route's list, where `*` is a pattern).
pub fn consumer_name_ok(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Whether `pattern` may name client certificates: a subject CN or DNS name of 1 to 253 printable
/// characters (spaces inside, none at either end), with `*` only as its last character, or `"*"`.
pub fn certificate_pattern_ok(pattern: &str) -> bool {
    let stem = pattern.strip_suffix('*').unwrap_or(pattern);
    pattern == "*"
        || (!stem.is_empty()
            && pattern.len() <= MAX_CERTIFICATE_NAME
            && stem.trim() == stem
            && stem.chars().all(|c| !c.is_control() && c != '*'))
}

/// What a registration's `callers` says, every problem at `/callers/...`; `None` when it is
/// absent or `null`.
pub fn callers(given: Option<&Value>, problems: &mut Vec<Problem>) -> Option<CallersConfig> {
    let members = match given? {
        Value::Null => return None,
        Value::String(open) if open == "open" => return Some(CallersConfig::Open),
        Value::Object(members) => members,
        _ => {
            problems.push(Problem::new(
                "/callers",
                "must be an object naming `consumers`, `jwt` issuers, `certificates` and a `limit`, or \"open\"",
            ));
            return None;
        }
    };
    let mut named = Named::default();
    for name in members.keys().filter(|name| !MEMBERS.contains(&name.as_str())) {
        problems.push(Problem::new(format!("/callers/{name}"), suggest::unknown("member", name, &MEMBERS)));
    }
    named.consumers = patterns(
        members.get("consumers"),
        "consumers",
        MAX_CONSUMERS,
        |pattern| {
            let stem = pattern.strip_suffix('*').unwrap_or(pattern);
            pattern == "*" || consumer_name_ok(stem) || (pattern.ends_with('*') && stem.is_empty())
        },
        "must be a consumer's name (letters, digits, `.`, `_`, `-`), a prefix ending in `*`, or \"*\"",
        "must be a list of consumer names",
        problems,
    );
    match members.get("jwt") {
        None | Some(Value::Null) => {}
        Some(Value::Array(issuers)) if issuers.len() > MAX_ISSUERS => problems.push(Problem::new(
            "/callers/jwt",
            format!("at most {MAX_ISSUERS} issuers; this lists {}", issuers.len()),
        )),
        Some(Value::Array(issuers)) => {
            for (i, issuer) in issuers.iter().enumerate() {
                if let Some(issuer) = issuer_config(issuer, &format!("/callers/jwt/{i}"), problems) {
                    named.jwt.push(issuer);
                }
            }
        }
        Some(_) => problems.push(Problem::new("/callers/jwt", "must be a list of issuers")),
    }
    named.certificates = patterns(
        members.get("certificates"),
        "certificates",
        MAX_CERTIFICATES,
        certificate_pattern_ok,
        &format!(
            "must be a client certificate's SAN DNS name or subject CN (1 to {MAX_CERTIFICATE_NAME} printable characters), a prefix ending in `*`, or \"*\""
        ),
        "must be a list of client certificate names",
        problems,
    );
    match members.get("limit") {
        None | Some(Value::Null) => {}
        Some(limit) => named.limit = limit_config(limit, problems),
    }
    let lists =
        |name: &str| members.get(name).is_some_and(|list| list.as_array().is_some_and(|l| !l.is_empty()));
    if !lists("consumers") && !lists("jwt") && !lists("certificates") {
        problems.push(Problem::new(
            "/callers",
            "names no caller: give `consumers`, `jwt` issuers or `certificates` (or \"open\" for a route anyone may call)",
        ));
    }
    Some(CallersConfig::Named(named))
}

/// A list of names and prefixes at `/callers/{member}`: at most `most`, each one `ok` takes, every
/// other told at its place with `why`.
fn patterns(
    given: Option<&Value>,
    member: &str,
    most: usize,
    ok: impl Fn(&str) -> bool,
    why: &str,
    not_a_list: &str,
    problems: &mut Vec<Problem>,
) -> Vec<String> {
    let names = match given {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Array(names)) => names,
        Some(_) => {
            problems.push(Problem::new(format!("/callers/{member}"), not_a_list));
            return Vec::new();
        }
    };
    if names.len() > most {
        problems.push(Problem::new(
            format!("/callers/{member}"),
            format!("at most {most} names or prefixes; this lists {}", names.len()),
        ));
        return Vec::new();
    }
    let mut taken = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        match name.as_str().filter(|pattern| ok(pattern)) {
            Some(pattern) => taken.push(pattern.to_owned()),
            None => problems.push(Problem::new(format!("/callers/{member}/{i}"), why)),
        }
    }
    taken
}

/// Compiles a `limit`'s `by`: an expression with `$caller` bound.
pub fn compile_by(text: &str) -> Result<crate::expr::Program, String> {
    crate::expr::compile_bound(text, 64, &mut Default::default(), &["caller"])
        .map_err(|errors| errors.iter().map(|e| e.message.clone()).collect::<Vec<_>>().join("; "))
}

fn url_ok(text: &str) -> bool {
    url::Url::parse(text).is_ok_and(|url| {
        matches!(url.scheme(), "http" | "https") && url.host().is_some() && url.username().is_empty()
    })
}

fn issuer_config(given: &Value, at: &str, problems: &mut Vec<Problem>) -> Option<IssuerConfig> {
    let Value::Object(members) = given else {
        problems.push(Problem::new(at, "must be an object with `issuer` and `audiences`"));
        return None;
    };
    let before = problems.len();
    for name in members.keys().filter(|name| !ISSUER_MEMBERS.contains(&name.as_str())) {
        problems
            .push(Problem::new(format!("{at}/{name}"), suggest::unknown("member", name, &ISSUER_MEMBERS)));
    }
    let issuer = match members.get("issuer") {
        Some(Value::String(issuer)) if url_ok(issuer) => issuer.clone(),
        Some(_) => {
            problems
                .push(Problem::new(format!("{at}/issuer"), "must be the issuer's URL (`iss` of its tokens)"));
            String::new()
        }
        None => {
            problems.push(Problem::new(format!("{at}/issuer"), "missing required member `issuer`"));
            String::new()
        }
    };
    let mut audiences = Vec::new();
    match members.get("audiences") {
        Some(Value::Array(given)) if !given.is_empty() && given.len() <= 16 => {
            for (i, audience) in given.iter().enumerate() {
                match audience {
                    Value::String(audience) if !audience.is_empty() => audiences.push(audience.clone()),
                    _ => problems
                        .push(Problem::new(format!("{at}/audiences/{i}"), "must be a non-empty string")),
                }
            }
        }
        None => problems.push(Problem::new(
            format!("{at}/audiences"),
            "missing required member `audiences`: a token meant for another API must not pass",
        )),
        Some(_) => problems.push(Problem::new(
            format!("{at}/audiences"),
            "must be a list of 1 to 16 audiences (`aud` values a token may hold)",
        )),
    }
    let jwks_uri = match members.get("jwksUri") {
        None | Some(Value::Null) => None,
        Some(Value::String(uri)) if url_ok(uri) => Some(uri.clone()),
        Some(_) => {
            problems.push(Problem::new(format!("{at}/jwksUri"), "must be an http or https URL"));
            None
        }
    };
    let algorithms = match members.get("algorithms") {
        None | Some(Value::Null) => Algorithm::DEFAULT.to_vec(),
        Some(Value::Array(names)) if !names.is_empty() => {
            let mut algorithms = Vec::new();
            for (i, name) in names.iter().enumerate() {
                let text = name.as_str().unwrap_or_default();
                match Algorithm::from_name(text) {
                    Some(algorithm) if !algorithms.contains(&algorithm) => algorithms.push(algorithm),
                    Some(_) => {}
                    None if text.eq_ignore_ascii_case("none") || text.to_ascii_uppercase().starts_with("HS") => {
                        problems.push(Problem::new(
                            format!("{at}/algorithms/{i}"),
                            format!("`{text}` is never taken: a token must be signed with the issuer's private key"),
                        ))
                    }
                    None => problems.push(Problem::new(
                        format!("{at}/algorithms/{i}"),
                        suggest::unknown(
                            "algorithm",
                            text,
                            &Algorithm::ALL.map(Algorithm::name),
                        ),
                    )),
                }
            }
            algorithms
        }
        Some(_) => {
            problems.push(Problem::new(format!("{at}/algorithms"), "must be a non-empty list of algorithms"));
            Vec::new()
        }
    };
    let mut claims = BTreeMap::new();
    match members.get("claims") {
        None | Some(Value::Null) => {}
        Some(Value::Object(given)) if given.len() <= MAX_CLAIMS => {
            for (name, value) in given {
                match value {
                    Value::String(_) | Value::Number(_) | Value::Bool(_) => {
                        claims.insert(name.clone(), value.clone());
                    }
                    _ => problems.push(Problem::new(
                        format!("{at}/claims/{name}"),
                        "must be a string, a number or a boolean: the value the claim must be or hold",
                    )),
                }
            }
        }
        Some(_) => problems.push(Problem::new(
            format!("{at}/claims"),
            format!("must be an object of at most {MAX_CLAIMS} conditions, a claim's name and its value"),
        )),
    }
    let leeway_seconds = match members.get("leewaySeconds") {
        None | Some(Value::Null) => DEFAULT_LEEWAY_SECONDS,
        Some(value) => match value.as_u64() {
            Some(seconds) if seconds <= MAX_LEEWAY_SECONDS => seconds,
            _ => {
                problems.push(Problem::new(
                    format!("{at}/leewaySeconds"),
                    format!("must be a whole number of seconds from 0 to {MAX_LEEWAY_SECONDS}"),
                ));
                0
            }
        },
    };
    (problems.len() == before).then_some(IssuerConfig {
        issuer,
        audiences,
        jwks_uri,
        algorithms,
        claims,
        leeway_seconds,
    })
}

fn limit_config(given: &Value, problems: &mut Vec<Problem>) -> Option<LimitConfig> {
    let Value::Object(members) = given else {
        problems
            .push(Problem::new("/callers/limit", "must be an object: {\"requests\": N, \"perSeconds\": S}"));
        return None;
    };
    let before = problems.len();
    for name in members.keys().filter(|name| !LIMIT_MEMBERS.contains(&name.as_str())) {
        problems.push(Problem::new(
            format!("/callers/limit/{name}"),
            suggest::unknown("member", name, &LIMIT_MEMBERS),
        ));
    }
    let mut whole = |name: &str, max: u32| match members.get(name).map(Value::as_u64) {
        Some(Some(n)) if n >= 1 && n <= u64::from(max) => n as u32,
        None => {
            problems.push(Problem::new(
                format!("/callers/limit/{name}"),
                format!("missing required member `{name}`"),
            ));
            1
        }
        Some(_) => {
            problems.push(Problem::new(
                format!("/callers/limit/{name}"),
                format!("must be a whole number from 1 to {max}"),
            ));
            1
        }
    };
    let requests = whole("requests", 1_000_000);
    let per_seconds = whole("perSeconds", MAX_LIMIT_WINDOW);
    let by = match members.get("by") {
        None | Some(Value::Null) => None,
        Some(Value::String(expression)) => match compile_by(expression) {
            Ok(_) => Some(expression.clone()),
            Err(why) => {
                problems.push(Problem::new("/callers/limit/by", format!("does not compile: {why}")));
                None
            }
        },
        Some(_) => {
            problems.push(Problem::new(
                "/callers/limit/by",
                "must be an expression over `$caller`, such as \"$caller.claims.tenant\"",
            ));
            None
        }
    };
    (problems.len() == before).then_some(LimitConfig { requests, per_seconds, by })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems_of(given: Value) -> Vec<String> {
        let mut problems = Vec::new();
        callers(Some(&given), &mut problems);
        problems.iter().map(|p| format!("{}: {}", p.location, p.message)).collect()
    }

    #[test]
    fn a_full_callers_object_is_read_as_given() {
        let given = serde_json::json!({
            "consumers": ["mobile-app", "partner-*"],
            "jwt": [{"issuer": "https://id.example.com/", "audiences": ["orders-api"],
                     "jwksUri": "https://id.example.com/keys", "algorithms": ["RS256", "ES256"],
                     "claims": {"scope": "orders:read"}, "leewaySeconds": 30}],
            "limit": {"requests": 600, "perSeconds": 60}
        });
        let mut problems = Vec::new();
        let Some(CallersConfig::Named(named)) = callers(Some(&given), &mut problems) else { panic!() };
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(named.consumers, ["mobile-app", "partner-*"]);
        assert_eq!(named.jwt[0].algorithms, [Algorithm::RS256, Algorithm::ES256]);
        assert_eq!(named.limit, Some(LimitConfig { requests: 600, per_seconds: 60, by: None }));
        // Stored and read back unchanged.
        let stored = serde_json::to_string(&CallersConfig::Named(named.clone())).unwrap();
        assert_eq!(serde_json::from_str::<CallersConfig>(&stored).unwrap(), CallersConfig::Named(named));
    }

    #[test]
    fn none_hs_and_unknown_algorithms_are_refused_where_they_stand() {
        let problems = problems_of(serde_json::json!({"jwt": [{
            "issuer": "https://id.example.com/", "audiences": ["a"],
            "algorithms": ["none", "HS256", "RS265"]}]}));
        assert!(
            problems[0].starts_with("/callers/jwt/0/algorithms/0: `none` is never taken"),
            "{problems:?}"
        );
        assert!(
            problems[1].starts_with("/callers/jwt/0/algorithms/1: `HS256` is never taken"),
            "{problems:?}"
        );
        assert!(problems[2].contains("did you mean `RS256`?"), "{problems:?}");
    }

    #[test]
    fn an_issuer_needs_audiences_and_callers_need_somebody() {
        let problems = problems_of(serde_json::json!({"jwt": [{"issuer": "https://id.example.com/"}]}));
        assert!(problems.iter().any(|p| p.starts_with("/callers/jwt/0/audiences: missing")), "{problems:?}");
        let problems = problems_of(serde_json::json!({"limit": {"requests": 1, "perSeconds": 1}}));
        assert!(problems.iter().any(|p| p.starts_with("/callers: names no caller")), "{problems:?}");
        let problems = problems_of(serde_json::json!({"consumer": ["a"]}));
        assert!(problems[0].contains("did you mean `consumers`?"), "{problems:?}");
        let problems = problems_of(serde_json::json!({"consumers": ["a b", "ok", "pre*", "*"]}));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("/callers/consumers/0:"), "{problems:?}");
    }

    #[test]
    fn certificate_names_are_printable_names_or_prefixes() {
        let given = serde_json::json!({"certificates": ["app-*", "App iOS", "*", "api.example.com"]});
        let mut problems = Vec::new();
        let Some(CallersConfig::Named(named)) = callers(Some(&given), &mut problems) else { panic!() };
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(named.certificates, ["app-*", "App iOS", "*", "api.example.com"]);
        let problems = problems_of(
            serde_json::json!({"certificates": ["", " app", "a*b", "**", "tab\t", 7, &"x".repeat(254)]}),
        );
        let at: Vec<&str> = problems.iter().map(|p| p.split(':').next().unwrap()).collect();
        assert_eq!(
            at,
            (0..7).map(|i| format!("/callers/certificates/{i}")).collect::<Vec<_>>(),
            "{problems:?}"
        );
        // A route naming certificates alone names somebody.
        assert!(problems_of(serde_json::json!({"certificates": ["app-*"]})).is_empty());
        let problems = problems_of(serde_json::json!({"certificates": []}));
        assert!(problems.iter().any(|p| p.starts_with("/callers: names no caller")), "{problems:?}");
    }

    #[test]
    fn consumer_names_are_what_a_path_and_a_pattern_can_hold() {
        assert!(consumer_name_ok("mobile-app.v2_x"));
        for bad in ["", "-a", "a/b", "a*", "a b", &"x".repeat(65)] {
            assert!(!consumer_name_ok(bad), "{bad:?}");
        }
    }
}
