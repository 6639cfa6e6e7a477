//! Client certificates as callers (SPEC §7 and 2.4): the certificate a client showed in its
//! handshake, which the listener already verified against `RECAST_TLS_CLIENT_CA`, read once per
//! connection for the names a route's `certificates` match (its SAN DNS names, or its subject's
//! CN when it has no SAN extension), and the [`Caller`] each name makes, made the first time a
//! route matches it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use x509_cert::der::oid::ObjectIdentifier;
use x509_cert::der::{Decode as _, Tag, Tagged as _};
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

use super::caller::{Caller, CallerKind, matches};

/// The subject's common name.
const CN: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");
/// The subject's alternative names.
const SUBJECT_ALT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
/// Most names of one certificate looked at (each at most 253 bytes): a certificate of thousands
/// of SAN names costs the handshake once, not every call.
pub const MAX_NAMES: usize = 64;

/// A connection's verified client certificate.
#[derive(Debug)]
pub struct ClientCertificate {
    /// Its SAN DNS names in the certificate's order, or its subject's CN without a SAN extension.
    names: Vec<String>,
    /// The subject's distinguished name (RFC 4514), for the log.
    pub subject: String,
    /// The issuer's distinguished name (RFC 4514): `$caller.issuer`.
    pub issuer: String,
    /// When it ends (seconds since the epoch).
    not_after: u64,
    /// The listener's readings of its client authorities, and the one that verified it.
    authorities: Option<(Arc<AtomicU64>, u64)>,
    /// The caller each name makes, once a route matched it.
    callers: Box<[OnceLock<Arc<Caller>>]>,
}

impl ClientCertificate {
    /// Reads a certificate (DER); `None` when it cannot be read.
    pub fn from_der(der: &[u8]) -> Option<ClientCertificate> {
        let certificate = x509_cert::Certificate::from_der(der).ok()?;
        let tbs = &certificate.tbs_certificate;
        // Its SAN DNS names when it has the extension (RFC 6125 §6.4.4): an authority's name
        // constraints bind them and not the subject's CN. The CN only when there is none.
        let mut names = Vec::new();
        let mut alternatives_given = false;
        for extension in tbs.extensions.iter().flatten().filter(|e| e.extn_id == SUBJECT_ALT_NAME) {
            alternatives_given = true;
            let Ok(alternatives) = SubjectAltName::from_der(extension.extn_value.as_bytes()) else {
                continue;
            };
            for name in alternatives.0 {
                if let GeneralName::DnsName(name) = name {
                    names.push(name.to_string());
                }
            }
        }
        for attribute in tbs.subject.0.iter().flat_map(|rdn| rdn.0.iter()).filter(|_| !alternatives_given) {
            // A name's text: UTF8String, PrintableString or IA5String (both ASCII) hold UTF-8.
            let text =
                matches!(attribute.value.tag(), Tag::Utf8String | Tag::PrintableString | Tag::Ia5String);
            if attribute.oid == CN
                && text
                && let Ok(name) = std::str::from_utf8(attribute.value.value())
            {
                names.push(name.to_owned());
            }
        }
        // A name longer than a DNS name may be is no name a route can mean.
        names.retain(|name| name.len() <= crate::callers::config::MAX_CERTIFICATE_NAME);
        names.truncate(MAX_NAMES);
        let callers = names.iter().map(|_| OnceLock::new()).collect();
        Some(ClientCertificate {
            names,
            subject: tbs.subject.to_string(),
            issuer: tbs.issuer.to_string(),
            not_after: tbs.validity.not_after.to_unix_duration().as_secs(),
            authorities: None,
            callers,
        })
    }

    /// The certificate as verified by the authorities of reading `readings` now counts.
    pub fn verified_under(mut self, readings: Arc<AtomicU64>) -> ClientCertificate {
        let reading = readings.load(Ordering::Acquire);
        self.authorities = Some((readings, reading));
        self
    }

    /// Whether it still stands at `now` (seconds since the epoch): not ended, and verified by
    /// the authorities the listener holds now. A connection outlives both.
    pub fn current(&self, now: u64) -> bool {
        now < self.not_after
            && self
                .authorities
                .as_ref()
                .is_none_or(|(readings, reading)| readings.load(Ordering::Acquire) == *reading)
    }

    /// The caller this certificate is to a route naming `patterns`: its first name that one of
    /// them matches; `None` when none does.
    pub fn caller(&self, patterns: &[String]) -> Option<Arc<Caller>> {
        let at = self.names.iter().position(|name| matches(patterns, name))?;
        let caller = self.callers[at].get_or_init(|| {
            Arc::new(Caller::new(
                CallerKind::Certificate,
                self.names[at].clone(),
                Some(self.issuer.clone()),
                None,
                None,
                None,
            ))
        });
        Some(caller.clone())
    }

    /// Its names: the SAN DNS names, or the subject's CN.
    pub fn names(&self) -> &[String] {
        &self.names
    }
}
