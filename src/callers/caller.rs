//! The caller a credential makes (`$caller`, SPEC §2.4), and why a call may not pass: what
//! every part of the door shares.

use std::time::Duration;

use serde_json::Value;

use crate::expr::{Const, Number};

/// How a caller proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallerKind {
    Key,
    Jwt,
    /// A client certificate the listener verified (SPEC §7).
    Certificate,
}

impl CallerKind {
    pub fn name(self) -> &'static str {
        match self {
            CallerKind::Key => "key",
            CallerKind::Jwt => "jwt",
            CallerKind::Certificate => "certificate",
        }
    }
}

/// A caller that passed the door: `$caller` (SPEC §2.4).
#[derive(Debug)]
pub struct Caller {
    pub kind: CallerKind,
    /// The consumer's name, the token's `sub`, or the certificate's name a route matched.
    pub id: String,
    pub issuer: Option<String>,
    pub consumer: Option<String>,
    pub metadata: Option<Value>,
    pub claims: Option<Value>,
    /// `$caller` as expressions read it, made the first time a route's rules or templates read
    /// it (most callers of most routes never are: a million keys hold none).
    constant: std::sync::OnceLock<Const>,
    /// What tells this caller apart from every other: a digest of `kind`, `issuer` and `id`
    /// (two issuers may give one `sub` to two people).
    pub identity: [u8; 32],
}

impl Caller {
    pub fn new(
        kind: CallerKind,
        id: String,
        issuer: Option<String>,
        consumer: Option<String>,
        metadata: Option<Value>,
        claims: Option<Value>,
    ) -> Caller {
        let identity = identity(kind, issuer.as_deref(), &id);
        Caller {
            kind,
            id,
            issuer,
            consumer,
            metadata,
            claims,
            constant: std::sync::OnceLock::new(),
            identity,
        }
    }

    /// `$caller` as expressions read it.
    pub fn constant(&self) -> &Const {
        self.constant.get_or_init(|| constant(&self.value()))
    }

    /// `$caller` as JSON.
    pub fn value(&self) -> Value {
        serde_json::json!({
            "kind": self.kind.name(),
            "id": self.id,
            "issuer": self.issuer,
            "consumer": self.consumer,
            "metadata": self.metadata,
            "claims": self.claims,
        })
    }

    /// A sample caller (a preview's or registration's `"caller"`): what it gives, the rest
    /// `null`. `None` when it is not an object.
    pub fn sample(given: &Value) -> Option<Caller> {
        let members = given.as_object()?;
        let text = |name: &str| members.get(name).and_then(Value::as_str).map(str::to_owned);
        let kind = match members.get("kind").and_then(Value::as_str) {
            Some("jwt") => CallerKind::Jwt,
            Some("certificate") => CallerKind::Certificate,
            _ => CallerKind::Key,
        };
        let present = |name: &str| members.get(name).filter(|v| !v.is_null()).cloned();
        let mut caller = Caller::new(
            kind,
            text("id").unwrap_or_default(),
            text("issuer"),
            text("consumer"),
            present("metadata"),
            present("claims"),
        );
        // As given: a sample may hold members of its own, and an `id` that is not a string.
        caller.constant = std::sync::OnceLock::from(constant(given));
        Some(caller)
    }
}

/// Whether `name` is one of `patterns`: a name, or a prefix ending in `*` (`*` alone: any).
pub fn matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|pattern| match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    })
}

/// The digest that tells callers apart.
pub fn identity(kind: CallerKind, issuer: Option<&str>, id: &str) -> [u8; 32] {
    use sha2::Digest as _;
    let mut context = sha2::Sha256::new();
    for part in [kind.name(), issuer.unwrap_or(""), id] {
        context.update((part.len() as u64).to_be_bytes());
        context.update(part.as_bytes());
    }
    let mut out = [0; 32];
    out.copy_from_slice(context.finalize().as_slice());
    out
}

/// A JSON value as an expression's constant.
pub fn constant(value: &Value) -> Const {
    match value {
        Value::Null => Const::Null,
        Value::Bool(b) => Const::Bool(*b),
        Value::Number(n) => Const::Number(if let Some(n) = n.as_i64() {
            Number::Int(n)
        } else if let Some(n) = n.as_u64() {
            Number::UInt(n)
        } else {
            Number::Float(n.as_f64().unwrap_or(0.0))
        }),
        Value::String(s) => Const::String(s.as_str().into()),
        Value::Array(items) => Const::List(items.iter().map(constant).collect()),
        Value::Object(members) => Const::Object(
            members.iter().map(|(name, value)| (name.as_str().into(), constant(value))).collect(),
        ),
    }
}

/// Why a call did not pass the door, in general words: never the credential, never a value of it.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// No credential, or one that fails a check (401). `given`: a credential was presented.
    Unauthenticated { given: bool, why: String },
    /// A valid caller the route does not name, or a `claims` condition that fails (403).
    Forbidden(String),
    /// Over the route's `limit` (429).
    Limited { retry_after: Duration, requests: u32, per_seconds: u32 },
}

impl Refusal {
    pub(super) fn unauthenticated(why: impl Into<String>) -> Refusal {
        Refusal::Unauthenticated { given: true, why: why.into() }
    }

    /// The reason label of `recast_callers_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated { given: false, .. } => "missing",
            Refusal::Unauthenticated { .. } => "invalid",
            Refusal::Forbidden(_) => "forbidden",
            Refusal::Limited { .. } => "limited",
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
