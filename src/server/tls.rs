//! HTTPS at the listener (SPEC §7): the certificate chain and key it serves, read from their PEM
//! files (`RECAST_TLS_CERT`, `RECAST_TLS_KEY`) at the start, where a file that cannot be read or a
//! pair that does not match stops recast with a message naming the file, and read again on SIGHUP
//! and whenever either file changes. A new pair serves the connections made after it; open ones
//! keep the one they began with; a bad new pair keeps the old one (logged and counted). TLS 1.2
//! and 1.3 (rustls, its default cipher suites), ALPN `h2` and `http/1.1`, session tickets and a
//! session cache, so a client coming back resumes instead of a full handshake.
//!
//! With `RECAST_TLS_CLIENT_CA`, the handshake asks for a client certificate and verifies one
//! given against those authorities (refusing another's there); a client may give none, and is
//! then a caller only by a key or token. The authorities are read again with the pair, and then
//! sessions begun before are not resumed (a resumed session keeps the certificate its first
//! handshake verified). The verified certificate's names are read once per connection ([`ClientCertificate`]) for the
//! routes whose `callers` name `certificates`.
//!
//! The handshake has `RECAST_HEADER_TIMEOUT_MS` to end: a client that opens a connection and
//! sends its hello a byte at a time holds a worker's socket no longer than a slow request head.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ClientHello, ProducesTickets, ResolvesServerCert, StoresServerSessions};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use x509_cert::der::Decode as _;

use crate::callers::ClientCertificate;

/// How often the files are looked at for a change (their size and time of change; reading them
/// again only when one moved).
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// What the client and recast agreed to speak (ALPN; none offered is HTTP/1.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Http2,
    Http1,
}

impl Protocol {
    pub const ALL: [Protocol; 2] = [Protocol::Http2, Protocol::Http1];

    pub fn label(self) -> &'static str {
        match self {
            Protocol::Http2 => "h2",
            Protocol::Http1 => "http/1.1",
        }
    }
}

/// Why a handshake failed, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Not ended within the head timeout.
    Timeout,
    /// The client offered nothing recast takes (a version before TLS 1.2, no common cipher
    /// suite, an ALPN protocol other than `h2` and `http/1.1`).
    Incompatible,
    /// Anything else the client sent that TLS refuses (not TLS at all, a bad message).
    Protocol,
    /// The client went away during the handshake.
    Closed,
    /// The client's certificate was not one the client authorities signed, or not valid now.
    Certificate,
}

impl Failure {
    pub const ALL: [Failure; 5] =
        [Failure::Timeout, Failure::Incompatible, Failure::Protocol, Failure::Closed, Failure::Certificate];

    pub fn label(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Incompatible => "incompatible",
            Failure::Protocol => "protocol",
            Failure::Closed => "closed",
            Failure::Certificate => "certificate",
        }
    }

    fn of(error: &std::io::Error) -> Failure {
        use std::io::ErrorKind;
        match error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
            Some(rustls::Error::PeerIncompatible(_) | rustls::Error::NoApplicationProtocol) => {
                Failure::Incompatible
            }
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented) => {
                Failure::Certificate
            }
            Some(_) => Failure::Protocol,
            None if matches!(
                error.kind(),
                ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe
            ) =>
            {
                Failure::Closed
            }
            None => Failure::Protocol,
        }
    }
}

/// What `/metrics` shows of the listener's TLS.
#[derive(Default)]
pub struct TlsCounts {
    pub reloads: AtomicU64,
    pub reload_failures: AtomicU64,
    /// Handshakes ended, by [`Protocol`] (in [`Protocol::ALL`]'s order).
    pub handshakes: [AtomicU64; 2],
    /// Resumed handshakes among them.
    pub resumed: AtomicU64,
    /// Handshakes failed, by [`Failure`] (in [`Failure::ALL`]'s order).
    pub failures: [AtomicU64; 5],
}

/// A certificate chain and its key, as served.
struct Pair {
    key: Arc<CertifiedKey>,
    /// When the first certificate ends (seconds since the epoch).
    not_after: u64,
    /// Its serial number (hex), for the log.
    serial: String,
}

/// The pair new handshakes get.
#[derive(Debug)]
struct Served(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Served {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(PoisonError::into_inner).clone())
    }
}

/// The files' size and time of change, which a write, a copy or a symlink swapped by a
/// certificate manager all move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    cert: (u64, Option<SystemTime>),
    key: (u64, Option<SystemTime>),
    client_ca: (u64, Option<SystemTime>),
}

fn stamp_of(path: &Path) -> (u64, Option<SystemTime>) {
    match std::fs::metadata(path) {
        Ok(metadata) => (metadata.len(), metadata.modified().ok()),
        Err(_) => (0, None),
    }
}

/// The listener's TLS: its configuration, the pair served, and where the pair comes from.
pub struct ListenerTls {
    /// What new handshakes are made with: made again when the client authorities are read again.
    acceptor: RwLock<tokio_rustls::TlsAcceptor>,
    served: Arc<Served>,
    /// Readings of the client authorities: a client certificate verified under an earlier one no
    /// longer stands ([`ClientCertificate::current`]).
    authorities: Arc<AtomicU64>,
    cert_file: PathBuf,
    key_file: PathBuf,
    /// `RECAST_TLS_CLIENT_CA`.
    client_ca_file: Option<PathBuf>,
    /// The files as last read, good or bad: a change from it is read again.
    stamp: Mutex<Stamp>,
    /// When the pair served ends (seconds since the epoch).
    not_after: AtomicU64,
    pub counts: TlsCounts,
}

/// Session tickets (TLS 1.3 and 1.2), and a cache of sessions for 1.2 clients without tickets.
struct Resumption {
    ticketer: Arc<dyn ProducesTickets>,
    sessions: Arc<dyn StoresServerSessions>,
}

impl Resumption {
    fn new() -> Result<Resumption, String> {
        Ok(Resumption {
            ticketer: rustls::crypto::ring::Ticketer::new()
                .map_err(|e| format!("TLS cannot be set up: {e}"))?,
            sessions: rustls::server::ServerSessionMemoryCache::new(4096),
        })
    }
}

/// A handshake that ended: the stream, what it speaks, and the client's certificate when the
/// listener asked for one and the client gave it (verified).
pub struct Accepted {
    pub stream: TlsStream<TcpStream>,
    pub protocol: Protocol,
    pub certificate: Option<Arc<ClientCertificate>>,
}

impl ListenerTls {
    /// Reads the pair and the client authorities; the message of an error names the file at
    /// fault.
    pub fn new(
        cert_file: &Path,
        key_file: &Path,
        client_ca_file: Option<&Path>,
    ) -> Result<ListenerTls, String> {
        let stamp = stamp(cert_file, key_file, client_ca_file);
        let pair = read_pair(cert_file, key_file)?;
        let verifier = client_ca_file.map(read_client_ca).transpose()?;
        let served = Arc::new(Served(RwLock::new(pair.key.clone())));
        let acceptor = acceptor(&served, &Resumption::new()?, verifier)?;
        tracing::info!(serial = %pair.serial, not_after = pair.not_after, client_certificates = client_ca_file.is_some(), "serving HTTPS");
        Ok(ListenerTls {
            acceptor: RwLock::new(acceptor),
            served,
            authorities: Arc::new(AtomicU64::new(0)),
            cert_file: cert_file.to_owned(),
            key_file: key_file.to_owned(),
            client_ca_file: client_ca_file.map(Path::to_owned),
            stamp: Mutex::new(stamp),
            not_after: AtomicU64::new(pair.not_after),
            counts: TlsCounts::default(),
        })
    }

    /// The handshake of a connection, within `within`, or why not (counted).
    pub async fn accept(&self, stream: TcpStream, within: Duration) -> Result<Accepted, Failure> {
        let acceptor = self.acceptor.read().unwrap_or_else(PoisonError::into_inner).clone();
        let failure = match tokio::time::timeout(within, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => {
                let (_, connection) = stream.get_ref();
                let protocol =
                    if connection.alpn_protocol() == Some(b"h2") { Protocol::Http2 } else { Protocol::Http1 };
                let at = Protocol::ALL.iter().position(|p| *p == protocol).unwrap_or(1);
                self.counts.handshakes[at].fetch_add(1, Ordering::Relaxed);
                if connection.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
                    self.counts.resumed.fetch_add(1, Ordering::Relaxed);
                }
                let certificate = connection.peer_certificates().and_then(|chain| chain.first()).and_then(|der| {
                    let certificate = ClientCertificate::from_der(der.as_ref())
                        .map(|read| read.verified_under(self.authorities.clone()));
                    match &certificate {
                        Some(read) => tracing::debug!(subject = %read.subject, issuer = %read.issuer, "a client certificate was verified"),
                        None => tracing::debug!("a verified client certificate's names could not be read"),
                    }
                    certificate.map(Arc::new)
                });
                return Ok(Accepted { stream, protocol, certificate });
            }
            Ok(Err(e)) => Failure::of(&e),
            Err(_) => Failure::Timeout,
        };
        let at = Failure::ALL.iter().position(|f| *f == failure).unwrap_or(2);
        self.counts.failures[at].fetch_add(1, Ordering::Relaxed);
        tracing::debug!(kind = failure.label(), "a TLS handshake failed");
        Err(failure)
    }

    /// Reads the pair again: served from the next handshake on when good; when not, the old one
    /// stays, and the failure is logged and counted. Whether the new one is served.
    pub fn reload(&self) -> bool {
        *self.stamp.lock().unwrap_or_else(PoisonError::into_inner) =
            stamp(&self.cert_file, &self.key_file, self.client_ca_file.as_deref());
        let read = read_pair(&self.cert_file, &self.key_file).and_then(|pair| {
            let verifier = self.client_ca_file.as_deref().map(read_client_ca).transpose()?;
            Ok((pair, verifier))
        });
        match read {
            Ok((pair, verifier)) => {
                // With client authorities, sessions begun before are not resumed: a resumed
                // session keeps the client certificate its first handshake verified, which the
                // authorities read now may no longer sign. (Without them, the acceptor stays, and
                // its sessions with it.)
                if let Some(verifier) = verifier {
                    match Resumption::new().and_then(|fresh| acceptor(&self.served, &fresh, Some(verifier))) {
                        Ok(acceptor) => {
                            *self.acceptor.write().unwrap_or_else(PoisonError::into_inner) = acceptor;
                            self.authorities.fetch_add(1, Ordering::AcqRel);
                        }
                        Err(why) => {
                            self.counts.reload_failures.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(%why, "the TLS client authorities could not be read again; the ones before are still asked for");
                            return false;
                        }
                    }
                }
                *self.served.0.write().unwrap_or_else(PoisonError::into_inner) = pair.key;
                self.not_after.store(pair.not_after, Ordering::Relaxed);
                self.counts.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(serial = %pair.serial, not_after = pair.not_after, "the TLS certificate was read again; new connections get it");
                true
            }
            Err(why) => {
                self.counts.reload_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%why, "the TLS certificate, key or client authorities could not be read again; the ones before are still served");
                false
            }
        }
    }

    /// Whether either file changed since it was last read.
    fn changed(&self) -> bool {
        let now = stamp(&self.cert_file, &self.key_file, self.client_ca_file.as_deref());
        *self.stamp.lock().unwrap_or_else(PoisonError::into_inner) != now
    }

    /// Reads the pair again on SIGHUP and when a file changes, until it is dropped.
    pub async fn watch(self: Arc<Self>) {
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        let mut ticks = tokio::time::interval(WATCH_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                Some(()) = async { match hangups.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => {
                    tracing::info!("SIGHUP: reading the TLS certificate and key again");
                    self.reload();
                }
                _ = ticks.tick() => {
                    if self.changed() {
                        self.reload();
                    }
                }
            }
        }
    }

    /// Its part of `/metrics` (Prometheus text).
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let counts = &self.counts;
        let _ = writeln!(
            out,
            "# HELP recast_tls_certificate_expiry_seconds When the listener's certificate ends (seconds since the epoch).\n# TYPE recast_tls_certificate_expiry_seconds gauge\nrecast_tls_certificate_expiry_seconds {}",
            self.not_after.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP recast_tls_reloads_total Readings of the certificate and key after the start (SIGHUP or a file changed), by outcome; a failed one keeps the pair before.\n# TYPE recast_tls_reloads_total counter\nrecast_tls_reloads_total{{outcome=\"ok\"}} {}\nrecast_tls_reloads_total{{outcome=\"failed\"}} {}",
            counts.reloads.load(Ordering::Relaxed),
            counts.reload_failures.load(Ordering::Relaxed)
        );
        out.push_str("# HELP recast_tls_handshakes_total TLS handshakes ended, by the protocol agreed (ALPN).\n# TYPE recast_tls_handshakes_total counter\n");
        for (protocol, count) in Protocol::ALL.iter().zip(&counts.handshakes) {
            let _ = writeln!(
                out,
                "recast_tls_handshakes_total{{protocol=\"{}\"}} {}",
                protocol.label(),
                count.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP recast_tls_resumed_handshakes_total TLS handshakes that resumed an earlier session.\n# TYPE recast_tls_resumed_handshakes_total counter\nrecast_tls_resumed_handshakes_total {}",
            counts.resumed.load(Ordering::Relaxed)
        );
        out.push_str("# HELP recast_tls_handshake_failures_total TLS handshakes that failed, by kind (timeout, incompatible: nothing recast takes was offered, protocol, closed, certificate: a client certificate the client authorities did not sign).\n# TYPE recast_tls_handshake_failures_total counter\n");
        for (failure, count) in Failure::ALL.iter().zip(&counts.failures) {
            let _ = writeln!(
                out,
                "recast_tls_handshake_failures_total{{kind=\"{}\"}} {}",
                failure.label(),
                count.load(Ordering::Relaxed)
            );
        }
    }
}

/// Whether callers' credentials would cross a network readable: a listener without TLS on an
/// address other than a loopback one.
pub fn in_the_clear(listen: std::net::IpAddr, https: bool) -> bool {
    !https && !crate::config::is_loopback(listen)
}

fn stamp(cert_file: &Path, key_file: &Path, client_ca_file: Option<&Path>) -> Stamp {
    Stamp {
        cert: stamp_of(cert_file),
        key: stamp_of(key_file),
        client_ca: client_ca_file.map(stamp_of).unwrap_or_default(),
    }
}

/// What new handshakes are made with: the pair `served`, sessions resumed by `resumption`,
/// client certificates asked for and verified by `verifier` when there is one.
fn acceptor(
    served: &Arc<Served>,
    resumption: &Resumption,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS cannot be set up: {e}"))?;
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(served.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.ticketer = resumption.ticketer.clone();
    config.session_storage = resumption.sessions.clone();
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Reads the client authorities (PEM): a verifier that asks every client for a certificate,
/// refuses one none of them signed, and lets a client that gives none through.
fn read_client_ca(path: &Path) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let pem = std::fs::read(path)
        .map_err(|e| format!("the TLS client CA file {} cannot be read: {e}", path.display()))?;
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&pem) {
        let certificate = certificate
            .map_err(|_| format!("the TLS client CA file {} is not PEM certificates", path.display()))?;
        roots.add(certificate).map_err(|e| {
            format!("the TLS client CA file {} holds a certificate that cannot be used: {e}", path.display())
        })?;
    }
    if roots.is_empty() {
        return Err(format!("the TLS client CA file {} holds no certificate", path.display()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|e| format!("the TLS client CA file {} cannot be used: {e}", path.display()))
}

/// Reads a certificate chain and its key from their PEM files.
fn read_pair(cert_file: &Path, key_file: &Path) -> Result<Pair, String> {
    let read = |path: &Path, what: &str| {
        std::fs::read(path).map_err(|e| format!("the TLS {what} file {} cannot be read: {e}", path.display()))
    };
    let (cert_pem, key_pem) = (read(cert_file, "certificate")?, read(key_file, "key")?);
    let chain = String::from_utf8(cert_pem)
        .map_err(|_| format!("the TLS certificate file {} is not PEM text", cert_file.display()))
        .and_then(|pem| {
            crate::upstream::tls::certificates(&pem)
                .map_err(|why| format!("the TLS certificate file {}: {why}", cert_file.display()))
        })?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
        format!("the TLS key file {} holds no private key in PEM (PKCS#8, RSA or EC)", key_file.display())
    })?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("the TLS key in {} cannot sign: {e}", key_file.display()))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|e| {
        format!(
            "the TLS key in {} is not the key of the certificate in {} ({e})",
            key_file.display(),
            cert_file.display()
        )
    })?;
    let first = x509_cert::Certificate::from_der(certified.cert[0].as_ref())
        .map_err(|e| format!("the first certificate in {} cannot be read: {e}", cert_file.display()))?;
    let tbs = &first.tbs_certificate;
    let not_after = tbs.validity.not_after.to_unix_duration().as_secs();
    let serial = crate::hex::encode(tbs.serial_number.as_bytes());
    Ok(Pair { key: Arc::new(certified), not_after, serial })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_in_the_clear_only_on_plain_http_beyond_loopback() {
        let ip = |a: &str| a.parse::<std::net::IpAddr>().unwrap();
        let (loopback, loopback6, lan, any) = (ip("127.0.0.1"), ip("::1"), ip("10.1.2.3"), ip("0.0.0.0"));
        assert!(!in_the_clear(loopback, false) && !in_the_clear(loopback6, false));
        assert!(in_the_clear(lan, false) && in_the_clear(any, false));
        assert!(!in_the_clear(lan, true) && !in_the_clear(any, true));
    }
}
