//! A secret sent back as it is shown: `"***"` in an update (`PUT /v1/routes/{uuid}`) keeps the
//! secret the route stores at that place, so that what `GET /v1/routes/{uuid}` answers, edited,
//! is an update that changes only what was edited.
//!
//! The places are a token (`authHeader.token`), an OAuth2 client secret
//! (`authHeader.clientSecret`) and a TLS client key (`tls.clientKey`), of the route or of a source
//! of the same name, and the `Authorization` header a route or a source without `authHeader`
//! sets itself. A stored secret stays with the upstream it was given for: it is kept only
//! while the auth type and the origin it goes to (the base URL's, and for OAuth2 the token URL's)
//! are the ones stored, so that an update cannot send it anywhere new without giving it again.

use std::collections::BTreeMap;

use serde_json::Value;

use super::config::{Auth, RouteConfig};
use super::fields::AuthHeader;
use super::registration::Registration;
use crate::json::push_pointer;
use crate::rules::Problem;
use crate::upstream::TlsSettings;

/// How a secret is shown, and sent back to keep it.
pub const MASK: &str = "***";

/// One upstream as stored: where its secrets go, and the secrets.
struct Stored<'a> {
    base_url: &'a str,
    auth: &'a Auth,
    tls: Option<&'a TlsSettings>,
    /// Its configured headers, by the member that holds them (`headers`, and for a route's own
    /// upstream `preConfiguredHeaders`).
    headers: Vec<&'a BTreeMap<String, String>>,
}

impl Registration {
    /// Puts the stored secret in place of each `"***"` of this update, or tells why one cannot
    /// be kept (located as the registration's other problems are).
    pub fn keep_secrets(&mut self, stored: &RouteConfig) -> Vec<Problem> {
        let mut problems = Vec::new();
        if let Some(original) = &mut self.original_route {
            let base_url = original.original_api.base_url.clone();
            let route = stored.sources.is_empty().then_some(Stored {
                base_url: &stored.base_url,
                auth: &stored.auth,
                tls: stored.tls.as_ref(),
                headers: vec![&stored.headers, &stored.pre_headers],
            });
            // Given at both places, it is one `authHeader` (a difference is refused later).
            for (at, given) in [
                ("/authHeader", self.auth_header.as_mut()),
                ("/originalRoute/authHeader", original.auth_header.as_mut()),
            ] {
                if let Some(given) = given {
                    keep_auth(given, at, &base_url, route.as_ref(), &mut problems);
                }
            }
            if let Some(tls) = &mut self.tls {
                keep_key(tls, "/tls", &base_url, route.as_ref(), &mut problems);
            }
            // Shown masked: a credential the route sends itself, in either member.
            let base_urls = route.as_ref().map(|s| (s.base_url, base_url.as_str()));
            let stored_headers = route.as_ref().map(|s| s.headers.clone()).unwrap_or_default();
            for (at, given, held) in [
                ("/originalRoute/headers", original.headers.as_mut(), stored_headers.first().copied()),
                (
                    "/preConfiguredHeaders",
                    self.pre_configured_headers.as_mut(),
                    stored_headers.get(1).copied(),
                ),
            ] {
                for (name, value) in given.into_iter().flatten() {
                    if !name.eq_ignore_ascii_case("authorization") || value != MASK {
                        continue;
                    }
                    let mut here = at.to_owned();
                    push_pointer(&mut here, name);
                    let secret = authorization_in(held, name);
                    if let Some(kept) = keep(&here, "Authorization header", secret, base_urls, &mut problems)
                    {
                        *value = kept;
                    }
                }
            }
        }
        if let Some(Value::Object(sources)) = &mut self.sources {
            for (name, source) in sources.iter_mut() {
                let mut at = "/sources".to_owned();
                push_pointer(&mut at, name);
                let was = stored.sources.iter().find(|s| &s.name == name).map(|s| Stored {
                    base_url: &s.base_url,
                    auth: &s.auth,
                    tls: s.tls.as_ref(),
                    headers: vec![&s.headers],
                });
                keep_in_source(source, &at, was.as_ref(), &mut problems);
            }
        }
        problems
    }
}

fn keep_in_source(source: &mut Value, at: &str, stored: Option<&Stored<'_>>, problems: &mut Vec<Problem>) {
    let Value::Object(members) = source else { return };
    let base_url = members
        .get("originalApi")
        .and_then(|api| api.get("baseUrl"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if let Some(given) = members.get_mut("authHeader")
        && given.is_object()
        && let Ok(mut auth) = serde_json::from_value::<AuthHeader>(given.clone())
    {
        let before = auth.clone();
        keep_auth(&mut auth, &format!("{at}/authHeader"), &base_url, stored, problems);
        if auth != before
            && let Ok(kept) = serde_json::to_value(&auth)
        {
            *given = kept;
        }
    }
    if let Some(tls) = members.get_mut("tls") {
        keep_key(tls, &format!("{at}/tls"), &base_url, stored, problems);
    }
    // Shown masked (`GET /v1/routes/{uuid}`): a credential the source sends itself.
    if let Some(Value::Object(headers)) = members.get_mut("headers") {
        for (name, value) in headers.iter_mut() {
            if !name.eq_ignore_ascii_case("authorization") || value.as_str() != Some(MASK) {
                continue;
            }
            let mut here = format!("{at}/headers");
            push_pointer(&mut here, name);
            let secret = authorization_in(stored.and_then(|s| s.headers.first().copied()), name);
            let base_urls = stored.map(|s| (s.base_url, base_url.as_str()));
            if let Some(kept) = keep(&here, "Authorization header", secret, base_urls, problems) {
                *value = Value::String(kept);
            }
        }
    }
}

/// The stored value of the header `name` (any case) in `headers`.
fn authorization_in<'a>(headers: Option<&'a BTreeMap<String, String>>, name: &str) -> Option<&'a str> {
    headers?.iter().find(|(stored, _)| stored.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
}

/// Keeps a masked token or client secret of `given`, an `authHeader` at `at` for an upstream at
/// `base_url`.
fn keep_auth(
    given: &mut AuthHeader,
    at: &str,
    base_url: &str,
    stored: Option<&Stored<'_>>,
    problems: &mut Vec<Problem>,
) {
    let kind = given.kind.to_ascii_lowercase();
    if given.token.as_deref() == Some(MASK) {
        let secret = stored.and_then(|s| match s.auth {
            Auth::Stored { kind: stored_kind, token: Some(token) }
                if stored_kind.name().eq_ignore_ascii_case(&kind) =>
            {
                Some(token.as_str())
            }
            _ => None,
        });
        let what = format!("{} token", given.kind);
        let base_urls = stored.map(|s| (s.base_url, base_url));
        if let Some(kept) = keep(&format!("{at}/token"), &what, secret, base_urls, problems) {
            given.token = Some(kept);
        }
    }
    if given.client_secret.as_deref() == Some(MASK) {
        let at = format!("{at}/clientSecret");
        let what = "OAuth2 client secret";
        let stored = stored.and_then(|s| match s.auth {
            Auth::OAuth2(credentials) if kind == "oauth2clientcredentials" => Some((s.base_url, credentials)),
            _ => None,
        });
        let Some((stored_base, credentials)) = stored else {
            problems.push(Problem::new(at, nothing_kept(what)));
            return;
        };
        // The secret goes to the token URL, and the tokens it brings to the base URL.
        let token_url = given.token_url.as_deref().unwrap_or_default();
        match moved(&credentials.token_url, token_url).or_else(|| moved(stored_base, base_url)) {
            Some(origins) => problems.push(Problem::new(at, moved_away(what, origins))),
            None => given.client_secret = Some(credentials.client_secret.clone()),
        }
    }
}

/// Keeps a masked `clientKey` of `tls`, the `tls` member at `at`.
fn keep_key(
    tls: &mut Value,
    at: &str,
    base_url: &str,
    stored: Option<&Stored<'_>>,
    problems: &mut Vec<Problem>,
) {
    let Some(key) = tls.get_mut("clientKey") else { return };
    if key.as_str() != Some(MASK) {
        return;
    }
    let secret = stored.and_then(|s| s.tls).and_then(|tls| tls.client_key.as_deref());
    let at = format!("{at}/clientKey");
    if let Some(kept) = keep(&at, "TLS client key", secret, stored.map(|s| (s.base_url, base_url)), problems)
    {
        *key = Value::String(kept);
    }
}

/// The stored `secret` for a mask at `at`, if there is one and its upstream (`(stored, given)`
/// base URLs) has not moved; else a problem says why not.
fn keep(
    at: &str,
    what: &str,
    secret: Option<&str>,
    base_urls: Option<(&str, &str)>,
    problems: &mut Vec<Problem>,
) -> Option<String> {
    let Some(secret) = secret else {
        problems.push(Problem::new(at, nothing_kept(what)));
        return None;
    };
    if let Some(origins) = base_urls.and_then(|(stored, given)| moved(stored, given)) {
        problems.push(Problem::new(at, moved_away(what, origins)));
        return None;
    }
    Some(secret.to_owned())
}

fn nothing_kept(what: &str) -> String {
    format!("`\"***\"` keeps a stored secret, but the route stores no {what} here: give the {what} itself")
}

fn moved_away(what: &str, (was, now): (String, String)) -> String {
    format!(
        "`\"***\"` keeps the stored {what} only while it goes to {was}; give the {what} itself to send it to {now}"
    )
}

/// The origins (scheme, host and port) of `stored` and `given` when they differ. A URL that does
/// not parse moves nothing: it is refused as the URL it is.
fn moved(stored: &str, given: &str) -> Option<(String, String)> {
    let origin = |text: &str| url::Url::parse(text.trim()).ok().map(|url| url.origin().ascii_serialization());
    let (was, now) = (origin(stored)?, origin(given)?);
    (was != now).then_some((was, now))
}

#[cfg(test)]
mod tests {
    use super::moved;

    #[test]
    fn a_secret_moves_with_the_scheme_host_or_port_and_not_with_the_path() {
        assert_eq!(moved("https://API.example.com/v1/", "https://api.example.com:443/v2/"), None);
        assert_eq!(moved("https://api.example.com/", "not a url"), None, "refused as a URL instead");
        for other in ["http://api.example.com/", "https://api.example.com:8443/", "https://api.example.org/"]
        {
            let (was, now) = moved("https://api.example.com/", other).expect(other);
            assert_eq!(was, "https://api.example.com");
            assert_eq!(now, other.trim_end_matches('/'));
        }
    }
}
