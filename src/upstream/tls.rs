//! TLS to upstreams beyond the public web's roots (`docs/upstreams.md`): a bundle of certificate
//! authorities trusted for every upstream (`RECAST_UPSTREAM_CA_FILE`), and per route a private CA
//! trusted for that route's upstream only and a client certificate it presents (`"tls"`).
//!
//! Each distinct route `tls` has a connector of its own ([`Connectors`]), and its connections are
//! pooled apart ([`RouteTls::id`] is part of the pool's key): a connection that presented one
//! route's certificate never carries another route's request.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, SignatureScheme};
use serde::{Deserialize, Serialize};

/// A route's `tls` member, as stored (sealed with the rest of the route).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsSettings {
    /// PEM certificates of the authorities trusted for this upstream, besides the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    /// The PEM certificate chain presented to the upstream, leaf first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<String>,
    /// Its PEM private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<String>,
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca.as_ref().map(|_| "(PEM)"))
            .field("client_cert", &self.client_cert.as_ref().map(|_| "(PEM)"))
            .field("client_key", &self.client_key.as_ref().map(|_| "***"))
            .finish()
    }
}

/// A route's `tls`, read: what its connections trust and present.
pub struct RouteTls {
    /// Tells its connector and its pooled connections from those of other settings (never 0,
    /// which is the connections without a route `tls`).
    id: u64,
    ca: Vec<CertificateDer<'static>>,
    identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

impl fmt::Debug for RouteTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RouteTls({:016x})", self.id)
    }
}

/// Which member of `tls` is wrong, and why.
pub type TlsProblem = (&'static str, String);

impl RouteTls {
    /// Reads and checks `settings`: every PEM block is one recast can use, the certificate and
    /// key come together and belong together.
    pub fn new(settings: &TlsSettings) -> Result<RouteTls, TlsProblem> {
        let ca = match &settings.ca {
            None => Vec::new(),
            Some(pem) => {
                let ca = certificates(pem).map_err(|why| ("ca", why))?;
                let mut roots = RootCertStore::empty();
                for (n, certificate) in ca.iter().enumerate() {
                    roots.add(certificate.clone()).map_err(|e| {
                        ("ca", format!("certificate {} is not one a CA can be trusted by: {e}", n + 1))
                    })?;
                }
                ca
            }
        };
        let identity = match (&settings.client_cert, &settings.client_key) {
            (None, None) => None,
            (Some(_), None) => return Err(("clientKey", "a clientCert needs its clientKey".to_owned())),
            (None, Some(_)) => return Err(("clientCert", "a clientKey needs its clientCert".to_owned())),
            (Some(chain), Some(key)) => {
                let chain = certificates(chain).map_err(|why| ("clientCert", why))?;
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|_| {
                    ("clientKey", "not a PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC)".to_owned())
                })?;
                Some((chain, key))
            }
        };
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        for certificate in &ca {
            digest.update(&(certificate.len() as u64).to_be_bytes());
            digest.update(certificate);
        }
        digest.update(b"|");
        if let Some((chain, key)) = &identity {
            for certificate in chain {
                digest.update(&(certificate.len() as u64).to_be_bytes());
                digest.update(certificate);
            }
            digest.update(key.secret_der());
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest.finish().as_ref()[..8]);
        let tls = RouteTls { id: u64::from_be_bytes(id).max(1), ca, identity };
        // The key must be one rustls signs with, and the certificate's.
        tls.client_config(&RootCertStore::empty()).map_err(|why| ("clientKey", why))?;
        Ok(tls)
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// The TLS configuration of this route's connections: `roots` and its own CA trusted, its
    /// certificate presented.
    pub fn client_config(&self, roots: &RootCertStore) -> Result<ClientConfig, String> {
        let mut roots = roots.clone();
        for certificate in &self.ca {
            roots.add(certificate.clone()).map_err(|e| e.to_string())?;
        }
        let builder = builder().with_root_certificates(roots);
        let presented = match &self.identity {
            None => None,
            Some((chain, key)) => {
                let certified =
                    CertifiedKey::from_der(chain.clone(), key.clone_key(), builder.crypto_provider())
                        .map_err(|e| {
                            format!("the key is not one recast can sign with, or not the certificate's: {e}")
                        })?;
                Some(Arc::new(certified))
            }
        };
        Ok(builder.with_client_cert_resolver(Arc::new(Presenting(presented))))
    }
}

/// What an upstream's TLS handshake asked of the connection: a client certificate, which the
/// connection had none of, or gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertificateAsked {
    NoneGiven,
    Given,
}

tokio::task_local! {
    /// Where the handshake of the connection being made notes that its upstream asked for a
    /// client certificate (0: not asked; else 1 + [`CertificateAsked`] as a number).
    static ASKED: Arc<AtomicU8>;
}

/// Runs `connecting` (a connector's future, whose TLS handshake runs within it), and tells
/// whether its upstream asked for a client certificate.
pub async fn noting_asked<F: Future>(connecting: F) -> (F::Output, Option<CertificateAsked>) {
    let asked = Arc::new(AtomicU8::new(0));
    let connected = ASKED.scope(asked.clone(), connecting).await;
    let asked = match asked.load(Ordering::Acquire) {
        1 => Some(CertificateAsked::NoneGiven),
        2 => Some(CertificateAsked::Given),
        _ => None,
    };
    (connected, asked)
}

/// Presents the route's certificate, if it has one, when an upstream asks for a client
/// certificate, and notes that it asked ([`noting_asked`]).
struct Presenting(Option<Arc<CertifiedKey>>);

impl fmt::Debug for Presenting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Presenting({})", if self.0.is_some() { "a certificate" } else { "none" })
    }
}

impl ResolvesClientCert for Presenting {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        // rustls sends no certificate when its key signs with none of the upstream's schemes.
        let given =
            self.0.as_ref().is_some_and(|certified| certified.key.choose_scheme(sigschemes).is_some());
        let asked = if given { 2 } else { 1 };
        // Outside [`noting_asked`] (no connection of a call) there is nothing to note.
        let _ = ASKED.try_with(|noted| noted.store(asked, Ordering::Release));
        self.0.clone()
    }

    fn has_certs(&self) -> bool {
        self.0.is_some()
    }
}

/// `pem`'s certificates; at least one, every block a certificate (a key pasted in with them is
/// refused: it would be stored and shown as a certificate is).
pub(crate) fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut certificates = Vec::new();
    let mut rest = pem.as_bytes();
    while let Some((kind, der)) =
        rustls::pki_types::pem::from_buf(&mut rest).map_err(|e| format!("not PEM certificates: {e}"))?
    {
        if kind != rustls::pki_types::pem::SectionKind::Certificate {
            return Err(format!(
                "holds a PEM block that is not a certificate ({kind:?}); give certificates only (a key goes in clientKey)"
            ));
        }
        certificates.push(CertificateDer::from(der));
    }
    if certificates.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".to_owned());
    }
    Ok(certificates)
}

/// Mozilla's roots, and the certificates of `RECAST_UPSTREAM_CA_FILE` (`extra`).
pub fn roots(extra: &[CertificateDer<'static>]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    for (n, certificate) in extra.iter().enumerate() {
        roots
            .add(certificate.clone())
            .map_err(|e| format!("certificate {} cannot be trusted as a CA: {e}", n + 1))?;
    }
    Ok(roots)
}

/// The certificates of a CA bundle file (`RECAST_UPSTREAM_CA_FILE`).
pub fn read_ca_file(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("RECAST_UPSTREAM_CA_FILE {} cannot be read: {e}", path.display()))?;
    let certificates =
        certificates(&text).map_err(|why| format!("RECAST_UPSTREAM_CA_FILE {}: {why}", path.display()))?;
    roots(&certificates).map_err(|why| format!("RECAST_UPSTREAM_CA_FILE {}: {why}", path.display()))?;
    Ok(certificates)
}

/// The TLS configuration of exports to a trace collector: Mozilla's roots, and the certificates
/// of `ca_file` (`OTEL_EXPORTER_OTLP_CERTIFICATE`).
pub fn collector_config(ca_file: Option<&std::path::Path>) -> Result<ClientConfig, String> {
    let extra = match ca_file {
        Some(path) => {
            let named = |why: String| format!("OTEL_EXPORTER_OTLP_CERTIFICATE {}: {why}", path.display());
            let text = std::fs::read_to_string(path).map_err(|e| named(format!("cannot be read: {e}")))?;
            certificates(&text).map_err(named)?
        }
        None => Vec::new(),
    };
    Ok(builder().with_root_certificates(roots(&extra)?).with_no_client_auth())
}

/// rustls with ring and the safe default protocol versions.
fn builder() -> rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        // The ring provider supports the default versions.
        .unwrap_or_else(|_| ClientConfig::builder())
}

/// The TLS configuration of connections without a route `tls`: `roots` trusted, nothing
/// presented (an upstream that asks for a client certificate is noted).
pub fn default_config(roots: RootCertStore) -> ClientConfig {
    builder().with_root_certificates(roots).with_client_cert_resolver(Arc::new(Presenting(None)))
}

/// Whether an error is, at its root, TLS refusing the connection (a certificate not trusted,
/// a handshake the upstream broke off, an alert it sent).
pub fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if e.is::<rustls::Error>() {
            return true;
        }
        // An I/O error's `source` skips the error it wraps (it gives that one's source): the
        // wrapped one is looked at itself.
        cause = match e.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref) {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    false
}
