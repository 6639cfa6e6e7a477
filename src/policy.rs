//! The outbound policy (SPEC §6): which addresses recast may connect to. Upstreams are clients'
//! choices, so every address is checked after canonicalisation, at registration and again when
//! connecting, and the connection goes to exactly the address that was checked.
//!
//! Enforced inside the upstream client's connector ([`PolicyResolver`] for names, [`Guarded`] for
//! literal addresses), so no code path can reach an upstream without passing it.

use std::fmt;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// One entry of `RECAST_UPSTREAM_ALLOW`: a network (`10.0.0.0/8`, `127.0.0.1`) or a host name
/// whose addresses are all allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowEntry {
    Net(IpNet),
    Host(String),
}

impl FromStr for AllowEntry {
    type Err = String;

    fn from_str(text: &str) -> Result<AllowEntry, String> {
        let text = text.trim();
        if let Ok(net) = text.parse::<IpNet>() {
            // `::ffff:10.0.0.0/104` means 10.0.0.0/8: addresses are judged in their IPv4 form.
            if let IpNet::V6(v6) = net
                && let Some(v4) = v6.addr().to_ipv4_mapped()
                && v6.prefix_len() >= 96
                && let Ok(v4) = Ipv4Net::new(v4, v6.prefix_len() - 96)
            {
                return Ok(AllowEntry::Net(IpNet::V4(v4.trunc())));
            }
            return Ok(AllowEntry::Net(net.trunc()));
        }
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Ok(AllowEntry::Net(IpNet::from(canonical(ip))));
        }
        let valid = !text.is_empty()
            && text.len() <= 253
            && text.split('.').all(|label| {
                !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if valid {
            Ok(AllowEntry::Host(text.to_ascii_lowercase()))
        } else {
            Err(format!("`{text}` is neither a network (like 10.0.0.0/8), an address, nor a host name"))
        }
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowEntry::Net(net) => net.fmt(f),
            AllowEntry::Host(host) => host.fmt(f),
        }
    }
}

/// `RECAST_UPSTREAM_ALLOW`: entries separated by commas; empty allows nothing beyond public
/// addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(pub Vec<AllowEntry>);

impl FromStr for AllowList {
    type Err = String;

    fn from_str(text: &str) -> Result<AllowList, String> {
        let entries = text.split(',').filter(|entry| !entry.trim().is_empty());
        entries.map(str::parse).collect::<Result<_, _>>().map(AllowList)
    }
}

impl fmt::Display for AllowList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("nothing");
        }
        let entries: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&entries.join(","))
    }
}

/// Why an upstream address is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAllowed {
    pub host: String,
    /// The refused addresses, canonical; empty when the name had no address at all.
    pub addresses: Vec<IpAddr>,
}

impl fmt::Display for NotAllowed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.addresses.is_empty() {
            return write!(f, "`{}` has no address", self.host);
        }
        let addresses: Vec<String> = self.addresses.iter().map(ToString::to_string).collect();
        write!(
            f,
            "`{}` is {}, which is not a public address; RECAST_UPSTREAM_ALLOW can allow it",
            self.host,
            addresses.join(", ")
        )
    }
}

impl std::error::Error for NotAllowed {}

/// The policy: public addresses, plus what `RECAST_UPSTREAM_ALLOW` lists.
#[derive(Debug, Clone)]
pub struct OutboundPolicy {
    nets: Vec<IpNet>,
    hosts: Vec<String>,
    /// Whether public addresses are allowed (always in service; harnesses turn it off).
    public: bool,
}

impl Default for OutboundPolicy {
    fn default() -> OutboundPolicy {
        OutboundPolicy { nets: Vec::new(), hosts: Vec::new(), public: true }
    }
}

impl OutboundPolicy {
    pub fn new(allow: &AllowList) -> OutboundPolicy {
        OutboundPolicy::with_public(allow, true)
    }

    /// Only what `allow` lists, no public address: for harnesses that must stay on loopback.
    pub fn only(allow: &AllowList) -> OutboundPolicy {
        OutboundPolicy::with_public(allow, false)
    }

    fn with_public(allow: &AllowList, public: bool) -> OutboundPolicy {
        let mut policy = OutboundPolicy { public, ..OutboundPolicy::default() };
        for entry in &allow.0 {
            match entry {
                AllowEntry::Net(net) => policy.nets.push(*net),
                AllowEntry::Host(host) => policy.hosts.push(host.clone()),
            }
        }
        policy
    }

    /// Whether one address of `host` may be connected to.
    pub fn allows(&self, host: &str, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        (self.public && is_public(ip))
            || self.nets.iter().any(|net| net.contains(&ip))
            || self.hosts.iter().any(|allowed| allowed.eq_ignore_ascii_case(host.trim_end_matches('.')))
    }

    /// The addresses of `host` that may be connected to, as given (each is judged by its
    /// canonical form, but a NAT64 or 6to4 address is dialled as itself); an error when none may.
    pub fn filter(&self, host: &str, addresses: &[IpAddr]) -> Result<Vec<IpAddr>, NotAllowed> {
        let allowed: Vec<IpAddr> = addresses.iter().copied().filter(|ip| self.allows(host, *ip)).collect();
        if allowed.is_empty() {
            let addresses = addresses.iter().map(|ip| canonical(*ip)).collect();
            return Err(NotAllowed { host: host.to_owned(), addresses });
        }
        Ok(allowed)
    }
}

/// The IPv4 address an IPv6 address stands for, where it stands for one: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::/96`) and 6to4
/// (`2002:aabb:ccdd::/16`). Checking the IPv4 address closes those ways around the policy.
pub fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from(((hi as u32) << 16) | lo as u32);
    match s {
        // ::a.b.c.d, but not :: and ::1 themselves.
        [0, 0, 0, 0, 0, 0, hi, lo] if (hi, lo) != (0, 0) && (hi, lo) != (0, 1) => {
            IpAddr::V4(embedded(hi, lo))
        }
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => IpAddr::V4(embedded(hi, lo)),
        [0x2002, hi, lo, ..] => IpAddr::V4(embedded(hi, lo)),
        _ => ip,
    }
}

/// Globally routable unicast: not loopback, private, link-local, CGNAT, unique-local, multicast,
/// unspecified, broadcast, documentation, benchmarking or otherwise reserved (IANA special-purpose
/// registries). Takes a canonical address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !V4_SPECIAL.iter().any(|(net, len)| in_v4(v4, *net, *len)),
        IpAddr::V6(v6) => {
            // Global unicast is 2000::/3; within it, some blocks are special too.
            in_v6(v6, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3)
                && !V6_SPECIAL.iter().any(|(net, len)| in_v6(v6, *net, *len))
        }
    }
}

const V4_SPECIAL: [([u8; 4], u8); 15] = [
    ([0, 0, 0, 0], 8),       // "this network", unspecified
    ([10, 0, 0, 0], 8),      // private
    ([100, 64, 0, 0], 10),   // CGNAT (shared address space)
    ([127, 0, 0, 0], 8),     // loopback
    ([169, 254, 0, 0], 16),  // link-local, cloud metadata
    ([172, 16, 0, 0], 12),   // private
    ([192, 0, 0, 0], 24),    // IETF protocol assignments
    ([192, 0, 2, 0], 24),    // documentation
    ([192, 88, 99, 0], 24),  // 6to4 relay anycast
    ([192, 168, 0, 0], 16),  // private
    ([198, 18, 0, 0], 15),   // benchmarking
    ([198, 51, 100, 0], 24), // documentation
    ([203, 0, 113, 0], 24),  // documentation
    ([224, 0, 0, 0], 4),     // multicast
    ([240, 0, 0, 0], 4),     // reserved, including the broadcast address
];

const V6_SPECIAL: [([u16; 8], u8); 4] = [
    ([0x2001, 0, 0, 0, 0, 0, 0, 0], 23), // IETF protocol assignments (Teredo, ORCHID, ...)
    ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32), // documentation
    ([0x2002, 0, 0, 0, 0, 0, 0, 0], 16), // 6to4 (its IPv4 address is checked instead)
    ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20), // documentation
];

fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u8) -> bool {
    Ipv4Net::new(Ipv4Addr::from(net), len).is_ok_and(|net| net.contains(&ip))
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], len: u8) -> bool {
    Ipv6Net::new(Ipv6Addr::from(net), len).is_ok_and(|net| net.contains(&ip))
}

/// Resolves host names. The system's resolver in service; a stub in tests.
pub trait Lookup: Send + Sync + 'static {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>;
}

/// A resolver that knows no name (for harnesses that must not query DNS).
pub struct NoLookup;

impl Lookup for NoLookup {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>> {
        let error =
            std::io::Error::new(std::io::ErrorKind::NotFound, format!("`{host}` is not resolved here"));
        Box::pin(std::future::ready(Err(error)))
    }
}

/// The operating system's resolver (`getaddrinfo`, on a blocking thread).
pub struct SystemLookup;

impl Lookup for SystemLookup {
    fn lookup(&self, host: &str) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<IpAddr>>> + Send>> {
        let host = host.to_owned();
        Box::pin(async move {
            let addresses = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addresses.map(|a| a.ip()).collect())
        })
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The connector's resolver: looks a name up and keeps only the addresses the policy allows, so
/// the connection is made to an address that was checked, never to a second lookup's answer.
#[derive(Clone)]
pub struct PolicyResolver {
    pub policy: Arc<OutboundPolicy>,
    pub lookup: Arc<dyn Lookup>,
}

impl tower_service::Service<Name> for PolicyResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let (policy, lookup) = (self.policy.clone(), self.lookup.clone());
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found = lookup.lookup(&host).await?;
            let allowed = policy.filter(&host, &found)?;
            // The port is set by the connector from the URL.
            Ok(allowed.into_iter().map(|ip| SocketAddr::new(ip, 0)).collect::<Vec<_>>().into_iter())
        })
    }
}

/// Wraps the TCP connector: a URL whose host is a literal address (which the connector does not
/// resolve) is checked here; a name goes on to [`PolicyResolver`]. URLs with credentials are
/// refused outright.
#[derive(Clone)]
pub struct Guarded<C> {
    pub inner: C,
    pub policy: Arc<OutboundPolicy>,
}

impl<C> tower_service::Service<http::Uri> for Guarded<C>
where
    C: tower_service::Service<http::Uri> + Clone + Send + 'static,
    C::Future: Send + 'static,
    C::Error: Into<BoxError>,
{
    type Response = C::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<C::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let refusal = check_literal(&self.policy, &uri);
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            if let Some(refusal) = refusal {
                return Err(refusal);
            }
            connecting.await.map_err(Into::into)
        })
    }
}

/// The address a URL host names literally (`10.0.0.1`, `[::1]`), if it is one.
pub fn literal_address(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

fn check_literal(policy: &OutboundPolicy, uri: &http::Uri) -> Option<BoxError> {
    let authority = uri.authority()?;
    if authority.as_str().contains('@') {
        return Some(Box::new(NotAllowed { host: authority.host().to_owned(), addresses: Vec::new() }));
    }
    let host = authority.host();
    let ip = literal_address(host)?;
    match policy.filter(host, &[ip]) {
        Ok(_) => None,
        Err(refusal) => Some(Box::new(refusal)),
    }
}

/// The policy refusal somewhere in an error's chain of causes, if any.
pub fn refusal_in<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e NotAllowed> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(refusal) = e.downcast_ref::<NotAllowed>() {
            return Some(refusal);
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn only_public_addresses_pass_by_default() {
        let policy = OutboundPolicy::default();
        let refused = [
            "127.0.0.1",
            "127.255.255.254",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "192.0.2.1",
            "198.51.100.7",
            "203.0.113.9",
            "198.18.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "2001:db8::1",
            "fec0::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
            "100::1",
        ];
        for address in refused {
            assert!(!policy.allows("h", ip(address)), "{address} must be refused");
        }
        let public = [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ];
        for address in public {
            assert!(policy.allows("h", ip(address)), "{address} is public");
        }
    }

    #[test]
    fn odd_ipv4_spellings_are_canonical_after_url_parsing() {
        // The URL parser turns these into dotted quads before any check; make sure it does.
        for (url, host) in [
            ("http://2130706433/", "127.0.0.1"),
            ("http://0x7f.1/", "127.0.0.1"),
            ("http://0177.0.0.1/", "127.0.0.1"),
            ("http://127.1/", "127.0.0.1"),
            ("http://0x7f000001/", "127.0.0.1"),
            ("http://[::ffff:7f00:1]/", "[::ffff:7f00:1]"),
        ] {
            let parsed = url::Url::parse(url).unwrap();
            assert_eq!(parsed.host_str(), Some(host), "{url}");
            let literal = host.trim_start_matches('[').trim_end_matches(']');
            assert!(!OutboundPolicy::default().allows(host, literal.parse().unwrap()), "{url}");
        }
    }

    #[test]
    fn the_allow_list_opens_networks_and_names() {
        let entries: AllowList = " 127.0.0.1/32, 10.0.0.0/8,Internal.Example.com,::1,".parse().unwrap();
        let policy = OutboundPolicy::new(&entries);
        assert!(policy.allows("x", ip("127.0.0.1")));
        assert!(!policy.allows("x", ip("127.0.0.2")));
        assert!(policy.allows("x", ip("::ffff:127.0.0.1")), "checked after canonicalisation");
        assert!(policy.allows("x", ip("10.200.1.1")));
        let mapped = OutboundPolicy::new(&"::ffff:10.0.0.0/104".parse().unwrap());
        assert!(mapped.allows("x", ip("10.1.2.3")) && mapped.allows("x", ip("::ffff:10.1.2.3")));
        assert!(policy.allows("x", ip("::1")));
        assert!(policy.allows("internal.example.com", ip("192.168.1.1")));
        assert!(policy.allows("internal.example.com.", ip("192.168.1.1")));
        assert!(!policy.allows("other.example.com", ip("192.168.1.1")));
        for bad in ["", "10.0.0.0/33", "a b", "x_y.example", "http://x"] {
            assert!(bad.parse::<AllowEntry>().is_err(), "{bad}");
        }
        assert!("10.0.0.0/8,a b".parse::<AllowList>().is_err());
        assert_eq!("".parse::<AllowList>(), Ok(AllowList::default()), "unset and empty are the same");
    }

    #[test]
    fn a_harness_policy_allows_only_its_list() {
        let policy = OutboundPolicy::only(&"127.0.0.77".parse().unwrap());
        assert!(policy.allows("h", ip("127.0.0.77")));
        assert!(!policy.allows("h", ip("8.8.8.8")));
        assert!(!policy.allows("h", ip("127.0.0.1")));
    }

    #[test]
    fn filtering_keeps_allowed_addresses_and_explains_refusals() {
        let policy = OutboundPolicy::default();
        let kept = policy.filter("mixed", &[ip("10.0.0.1"), ip("8.8.8.8")]).unwrap();
        assert_eq!(kept, [ip("8.8.8.8")]);
        // Judged as 93.184.216.34, but dialled through the NAT64 gateway as given.
        let kept = policy.filter("nat64", &[ip("64:ff9b::5db8:d822"), ip("64:ff9b::a00:1")]).unwrap();
        assert_eq!(kept, [ip("64:ff9b::5db8:d822")]);
        let refusal = policy.filter("evil", &[ip("::ffff:169.254.169.254")]).unwrap_err();
        assert_eq!(refusal.addresses, [ip("169.254.169.254")]);
        assert!(refusal.to_string().contains("RECAST_UPSTREAM_ALLOW"));
        assert!(policy.filter("none", &[]).is_err());
    }

    #[test]
    fn literal_addresses_and_credentials_in_urls_are_caught_before_connecting() {
        let policy = OutboundPolicy::default();
        for uri in [
            "http://127.0.0.1:8080/x",
            "http://[::1]/",
            "http://[::ffff:10.0.0.1]/",
            "http://user:pw@example.com/",
        ] {
            let uri: http::Uri = uri.parse().unwrap();
            assert!(check_literal(&policy, &uri).is_some(), "{uri}");
        }
        for uri in ["http://example.com/", "http://8.8.8.8/"] {
            assert!(check_literal(&policy, &uri.parse().unwrap()).is_none(), "{uri}");
        }
    }
}
