//! The connectors every upstream connection is made with: the policy's resolver and its check
//! of literal addresses, wrapped in TLS (rustls) for `https://` URLs, HTTP/2 offered by ALPN when
//! asked.

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;

use super::tls;
use crate::policy::{Guarded, PolicyResolver};

/// The connector of a call: TLS over [`Plain`].
pub(super) type Connector = HttpsConnector<Plain>;
/// The TCP connector every TLS connector wraps: the policy's resolver, and its check of literal
/// addresses.
pub(super) type Plain = Guarded<HttpConnector<PolicyResolver>>;

/// `inner` with TLS (rustls with ring, Mozilla's roots) for `https://` URLs, HTTP/1.1.
pub(crate) fn https_or_http<C>(inner: C) -> HttpsConnector<C> {
    let roots = tls::roots(&[]).unwrap_or_else(|_| rustls::RootCertStore::empty());
    with_config(inner, tls::default_config(roots), false)
}

/// `inner` with TLS as `config` says for `https://` URLs: HTTP/1.1, and HTTP/2 offered by ALPN
/// when `http2`.
pub(super) fn with_config<C>(inner: C, config: rustls::ClientConfig, http2: bool) -> HttpsConnector<C> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config).https_or_http();
    if http2 {
        builder.enable_all_versions().wrap_connector(inner)
    } else {
        builder.enable_http1().wrap_connector(inner)
    }
}
