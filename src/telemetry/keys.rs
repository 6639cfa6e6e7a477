//! The attributes recast's spans carry, their protobuf written at compile time: each key as the
//! start of an OTLP `KeyValue` ([`Key`]), and the attributes whose value is one of a few known
//! texts (a method, a route template, a protocol version) whole ([`Attribute`]). Recording a span
//! then copies a key's bytes instead of encoding them field by field on every call.

/// The most bytes a key's protobuf takes: its tag, its length and at most 38 bytes of name.
pub(super) const KEY_ROOM: usize = 40;

/// An attribute's key: `KeyValue.key` as protobuf (tag 1, its length, the name), kept in a fixed
/// array so that it is copied whole, without a call to copy a length known only at run time.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    pub(super) written: [u8; KEY_ROOM],
    pub(super) len: usize,
}

impl Key {
    /// The key named `name` (at most 38 bytes: a longer one fails the build where it is made).
    pub const fn new(name: &str) -> Key {
        let name = name.as_bytes();
        assert!(name.len() + 2 <= KEY_ROOM, "an attribute's name is at most 38 bytes");
        let mut written = [0u8; KEY_ROOM];
        written[0] = 1 << 3 | 2;
        written[1] = name.len() as u8;
        let mut i = 0;
        while i < name.len() {
            written[2 + i] = name[i];
            i += 1;
        }
        Key { written, len: name.len() + 2 }
    }

    /// The key's protobuf.
    pub fn bytes(&self) -> &[u8] {
        &self.written[..self.len]
    }
}

/// The most bytes an attribute written whole takes.
const ATTRIBUTE_ROOM: usize = 72;

/// An attribute with a text value known when the program is built: a `Span.attributes` field
/// (tag 9) as protobuf, written once.
#[derive(Debug, Clone, Copy)]
pub struct Attribute {
    written: [u8; ATTRIBUTE_ROOM],
    len: usize,
}

impl Attribute {
    /// `key` with the text `value` (together at most 64 bytes: more fails the build).
    pub const fn text(key: &str, value: &str) -> Attribute {
        let (key, value) = (key.as_bytes(), value.as_bytes());
        // KeyValue { key (1): key, value (2): AnyValue { string_value (1): value } }
        let any = 2 + value.len();
        let len = 2 + key.len() + 2 + any;
        assert!(2 + len <= ATTRIBUTE_ROOM, "a constant attribute's key and value are at most 64 bytes");
        let mut written = [0u8; ATTRIBUTE_ROOM];
        let mut at = 0;
        let head = [9 << 3 | 2, len as u8, 1 << 3 | 2, key.len() as u8];
        let mut i = 0;
        while i < head.len() {
            written[at] = head[i];
            at += 1;
            i += 1;
        }
        i = 0;
        while i < key.len() {
            written[at] = key[i];
            at += 1;
            i += 1;
        }
        let middle = [2 << 3 | 2, any as u8, 1 << 3 | 2, value.len() as u8];
        i = 0;
        while i < middle.len() {
            written[at] = middle[i];
            at += 1;
            i += 1;
        }
        i = 0;
        while i < value.len() {
            written[at] = value[i];
            at += 1;
            i += 1;
        }
        Attribute { written, len: at }
    }

    /// The attribute's protobuf, a `Span.attributes` field.
    pub fn bytes(&self) -> &[u8] {
        &self.written[..self.len]
    }
}

// OpenTelemetry's HTTP conventions.
pub const METHOD: Key = Key::new("http.request.method");
pub const METHOD_ORIGINAL: Key = Key::new("http.request.method_original");
pub const RESEND_COUNT: Key = Key::new("http.request.resend_count");
pub const STATUS_CODE: Key = Key::new("http.response.status_code");
pub const ROUTE: Key = Key::new("http.route");
pub const URL_PATH: Key = Key::new("url.path");
pub const URL_FULL: Key = Key::new("url.full");
pub const SERVER_ADDRESS: Key = Key::new("server.address");
pub const SERVER_PORT: Key = Key::new("server.port");
pub const CLIENT_ADDRESS: Key = Key::new("client.address");
pub const USER_AGENT: Key = Key::new("user_agent.original");
pub const ERROR_TYPE: Key = Key::new("error.type");

// recast's own.
pub const ROUTE_ID: Key = Key::new("recast.route.id");
pub const CACHE: Key = Key::new("recast.cache");
/// Who called a route with `callers` (SPEC §2.4): `key`, `jwt` or `certificate`; the consumer of
/// a key, the issuer of a token or client certificate (never the key, the token, its subject or
/// the certificate's names, which may be a person's).
pub const CALLER_KIND: Key = Key::new("recast.caller.kind");
pub const CALLER_CONSUMER: Key = Key::new("recast.caller.consumer");
pub const CALLER_ISSUER: Key = Key::new("recast.caller.issuer");
pub const SOURCE: Key = Key::new("recast.source");
pub const TOKEN_REQUEST: Key = Key::new("recast.oauth2.token_request");
pub const ABANDONED: Key = Key::new("recast.abandoned");
pub const DOCUMENT_SIZE: Key = Key::new("recast.document.size");
pub const OUTPUT_SIZE: Key = Key::new("recast.output.size");

/// `url.scheme`: plain HTTP, or HTTPS when the listener serves TLS (SPEC §7).
pub const SCHEME_HTTP: Attribute = Attribute::text("url.scheme", "http");
pub const SCHEME_HTTPS: Attribute = Attribute::text("url.scheme", "https");

/// `network.protocol.version` of each version recast speaks.
pub const PROTOCOL_1_0: Attribute = Attribute::text("network.protocol.version", "1.0");
pub const PROTOCOL_1_1: Attribute = Attribute::text("network.protocol.version", "1.1");
pub const PROTOCOL_2: Attribute = Attribute::text("network.protocol.version", "2");

/// The low-cardinality name of a method for `http.request.method`: the methods of RFC 9110 and
/// `PATCH` as they are, anything else `_OTHER`; and that attribute, written.
pub fn method(method: &http::Method) -> (&'static str, &'static Attribute) {
    static METHODS: [Attribute; 10] = [
        Attribute::text("http.request.method", "GET"),
        Attribute::text("http.request.method", "POST"),
        Attribute::text("http.request.method", "PUT"),
        Attribute::text("http.request.method", "PATCH"),
        Attribute::text("http.request.method", "DELETE"),
        Attribute::text("http.request.method", "HEAD"),
        Attribute::text("http.request.method", "OPTIONS"),
        Attribute::text("http.request.method", "TRACE"),
        Attribute::text("http.request.method", "CONNECT"),
        Attribute::text("http.request.method", "_OTHER"),
    ];
    // Compared as methods, not as texts; the last attribute is `_OTHER`'s.
    static KNOWN: [http::Method; 9] = [
        http::Method::GET,
        http::Method::POST,
        http::Method::PUT,
        http::Method::PATCH,
        http::Method::DELETE,
        http::Method::HEAD,
        http::Method::OPTIONS,
        http::Method::TRACE,
        http::Method::CONNECT,
    ];
    let i = KNOWN.iter().position(|known| known == method).unwrap_or(KNOWN.len());
    let name = KNOWN.get(i).map_or("_OTHER", http::Method::as_str);
    (name, &METHODS[i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_attributes_are_the_protobuf_of_a_key_value() {
        assert_eq!(URL_PATH.bytes(), b"\x0a\x08url.path");
        assert_eq!(SCHEME_HTTP.bytes(), b"\x4a\x14\x0a\x0aurl.scheme\x12\x06\x0a\x04http");
        let (name, written) = method(&http::Method::from_bytes(b"PROPFIND").unwrap());
        assert_eq!(
            (name, written.bytes()),
            ("_OTHER", Attribute::text("http.request.method", "_OTHER").bytes())
        );
        for name in ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "CONNECT"] {
            let (named, written) = method(&http::Method::from_bytes(name.as_bytes()).unwrap());
            assert_eq!(
                (named, written.bytes()),
                (name, Attribute::text("http.request.method", name).bytes())
            );
        }
    }
}
