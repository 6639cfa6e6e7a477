//! What an HTTP/1.1 exchange reads from and how it fails: the stream of one upstream
//! connection, how much a read asks for, and why an exchange failed.

use hyper_util::rt::TokioIo;

/// The stream of one upstream connection, plain or TLS.
pub(super) type Stream = TokioIo<hyper_rustls::MaybeHttpsStream<TokioIo<tokio::net::TcpStream>>>;

/// What a read asks for at least.
pub(super) const READ_SIZE: usize = 8 * 1024;

/// Why an exchange failed.
#[derive(Debug)]
pub(super) enum Failed {
    /// Not one byte of the request went out: the connection refused the first write. On a pooled
    /// connection the upstream closed it; the request may be sent again whatever its method.
    Unsent(String),
    /// TLS refused the exchange: a certificate not trusted, or an alert from the upstream (why).
    Tls(String),
    /// The connection failed before any byte of an answer came back: on a pooled connection, the
    /// upstream most likely closed it while it was idle, and an idempotent request may be sent
    /// again.
    Stale(String),
    /// The connection broke, or the answer is not HTTP/1.1.
    Broken(String),
    /// The body is larger than allowed (decoded, when it comes in a content coding).
    TooLarge,
    /// A 2xx answer's content coding is not one recast decodes (its name).
    UnknownCoding(String),
    /// A coded body does not decode (why).
    Undecodable(String),
}
