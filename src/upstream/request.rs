//! What the client sends upstream: a request, built by a route for each call
//! (`crate::route`), and the digest that tells which requests are the same.

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, Method, Uri};

/// The request a call sends upstream.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl UpstreamRequest {
    /// A SHA-256 of everything this request sends upstream: its method, its target, every header
    /// (name and value) and its body. Two calls of one route version share a cached answer only
    /// when their requests have the same digest, that is only when they would send the same
    /// request: whatever a caller contributes (query, `Accept`, `Accept-Language`,
    /// `X-Mapped-Auth`, body, `Content-Type`) is in it, and so is any part added to the request
    /// later, since the request is taken apart whole below.
    pub fn digest(&self) -> [u8; 32] {
        let UpstreamRequest { method, uri, headers, body } = self;
        let mut context = ring::digest::Context::new(&ring::digest::SHA256);
        // Every part is preceded by its length, so no two different requests hash the same text.
        let mut part = |bytes: &[u8]| {
            context.update(&(bytes.len() as u64).to_be_bytes());
            context.update(bytes);
        };
        part(method.as_str().as_bytes());
        part(uri.scheme_str().unwrap_or_default().as_bytes());
        part(uri.authority().map_or("", |authority| authority.as_str()).as_bytes());
        part(uri.path_and_query().map_or("", |target| target.as_str()).as_bytes());
        // In name order, so two requests that hold the same headers hash the same whatever order
        // they were set in; the values of one name keep theirs, which is sent.
        let mut names: smallvec::SmallVec<[&HeaderName; 8]> = headers.keys().collect();
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        part(&(names.len() as u64).to_be_bytes());
        for name in names {
            part(name.as_str().as_bytes());
            let values = headers.get_all(name);
            part(&(values.iter().count() as u64).to_be_bytes());
            for value in values {
                part(value.as_bytes());
            }
        }
        part(body);
        let mut digest = [0u8; 32];
        digest.copy_from_slice(context.finish().as_ref());
        digest
    }
}
