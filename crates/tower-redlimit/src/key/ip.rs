use std::{
    borrow::Cow,
    net::{IpAddr, Ipv6Addr, SocketAddr},
};

use http::{HeaderMap, request::Parts};
use ipnet::IpNet;
use redlimit::ConfigError;

use super::{ClientIpHeader, KeyExtractor};

/// The client's IP address: the peer of the connection, or behind trusted proxies the address
/// they report in the one header the deployment names ([`ClientIpHeader`]).
///
/// The peer address comes from axum's `ConnectInfo<SocketAddr>` (feature `axum`; serve with
/// `into_make_service_with_connect_info::<SocketAddr>()`), tonic's `TcpConnectInfo` (feature
/// `tonic`), or a plain `SocketAddr` in the request extensions.
///
/// Behind proxies, only the header set with [`header`](Self::header) is read (defaults to
/// `X-Forwarded-For`), never a fallback: proxies append to one header and pass the others
/// through, so any other header is whatever the client wrote. A list header (`X-Forwarded-For`,
/// `Forwarded`) is read from the right: each trusted proxy appends the address it received from,
/// so the first address from the right that is not a trusted proxy is the client; the leftmost
/// address is never taken on trust. A single-address header (`X-Real-IP`, `CF-Connecting-IP`, …)
/// is taken as the trusted proxy wrote it. Headers from an untrusted peer are ignored.
///
/// IPv6 clients are grouped by their /64 network by default, since one host usually holds a
/// whole /64.
///
/// ```
/// use tower_redlimit::{ClientIp, KeyExtractor};
///
/// let ip = ClientIp::behind_proxies(["10.0.0.0/8"])?;
/// let mut request = http::Request::get("/")
///     .header("x-forwarded-for", "6.6.6.6, 203.0.113.7, 10.0.0.2")
///     .body(())
///     .unwrap();
/// request.extensions_mut().insert("10.0.0.1:443".parse::<std::net::SocketAddr>().unwrap());
/// let (parts, ()) = request.into_parts();
/// assert_eq!(ip.extract(&parts).as_deref(), Some("203.0.113.7"));
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct ClientIp {
    trusted: Vec<IpNet>,
    header: ClientIpHeader,
    ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self::peer()
    }
}

impl ClientIp {
    /// The connection's peer address; forwarding headers are ignored.
    pub fn peer() -> Self {
        Self {
            trusted: Vec::new(),
            header: ClientIpHeader::default(),
            ipv6_prefix: 64,
        }
    }

    /// The client behind the proxies in `networks` (CIDRs such as `10.0.0.0/8`, `::1/128`, or
    /// single addresses), as they report it in `X-Forwarded-For`; see [`header`](Self::header).
    ///
    /// # Errors
    /// [`ConfigError::UnknownValue`] naming a network that does not parse.
    pub fn behind_proxies<I, S>(networks: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let trusted = networks
            .into_iter()
            .map(|n| network(n.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            trusted,
            ..Self::peer()
        })
    }

    /// The one header the trusted proxies report the client in. Defaults to
    /// [`ClientIpHeader::XForwardedFor`] (nginx's `$proxy_add_x_forwarded_for`, HAProxy's
    /// `option forwardfor`, AWS ALB); see [`ClientIpHeader`] for the others.
    #[must_use]
    pub fn header(mut self, header: ClientIpHeader) -> Self {
        self.header = header;
        self
    }

    /// How many leading bits of an IPv6 address identify a client. Defaults to 64; 128 keys
    /// every address on its own. Values over 128 count as 128.
    #[must_use]
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|net| net.contains(&ip))
    }

    /// The client address, before grouping.
    pub fn client_addr(&self, request: &Parts) -> Option<IpAddr> {
        let peer = peer_addr(request)?.to_canonical();
        if !self.is_trusted(peer) {
            return Some(peer);
        }
        let chain = match &self.header {
            ClientIpHeader::XForwardedFor => x_forwarded_for(&request.headers),
            ClientIpHeader::Forwarded => forwarded_for(&request.headers),
            ClientIpHeader::Single(name) => {
                let value = request.headers.get(name).and_then(|v| v.to_str().ok());
                return Some(value.and_then(parse_ip).unwrap_or(peer));
            }
        };
        let Some(chain) = chain else {
            return Some(peer);
        };
        let mut nearest = peer;
        for hop in chain.iter().rev() {
            match hop {
                // A hop a trusted proxy could not name: stop at the nearest one we know.
                None => return Some(nearest),
                Some(ip) if self.is_trusted(*ip) => nearest = *ip,
                Some(ip) => return Some(*ip),
            }
        }
        Some(nearest)
    }
}

impl KeyExtractor for ClientIp {
    /// Never the client's: the peer address is the server's to provide.
    fn missing_by_client(&self, _: &Parts) -> bool {
        false
    }

    fn describe(&self) -> String {
        let peer = "the peer address (serve axum with into_make_service_with_connect_info; \
                    tonic records it)";
        if self.trusted.is_empty() {
            return peer.to_owned();
        }
        format!("{peer} and header {}", self.header)
    }

    fn extract<'a>(&self, request: &'a Parts) -> Option<Cow<'a, str>> {
        Some(Cow::Owned(match self.client_addr(request)? {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) if self.ipv6_prefix >= 128 => v6.to_string(),
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.ipv6_prefix))
                    .unwrap_or(0);
                let network = Ipv6Addr::from(u128::from(v6) & mask);
                format!("{network}/{}", self.ipv6_prefix)
            }
        }))
    }
}

fn peer_addr(request: &Parts) -> Option<IpAddr> {
    let extensions = &request.extensions;
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    #[cfg(feature = "tonic")]
    if let Some(addr) = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(tonic::transport::server::TcpConnectInfo::remote_addr)
    {
        return Some(addr.ip());
    }
    extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

/// The `for=` addresses of every `Forwarded` header, left to right; `None` for one that is not
/// an address (`unknown`, an obfuscated name, garbage).
fn forwarded_for(headers: &HeaderMap) -> Option<Vec<Option<IpAddr>>> {
    let mut hops = Vec::new();
    for value in headers.get_all(http::header::FORWARDED) {
        let Ok(value) = value.to_str() else {
            hops.push(None);
            continue;
        };
        for element in value.split(',') {
            let node = element.split(';').find_map(|pair| {
                let (name, value) = pair.split_once('=')?;
                name.trim()
                    .eq_ignore_ascii_case("for")
                    .then(|| value.trim().trim_matches('"'))
            });
            if let Some(node) = node {
                hops.push(parse_ip(node));
            }
        }
    }
    (!hops.is_empty()).then_some(hops)
}

fn x_forwarded_for(headers: &HeaderMap) -> Option<Vec<Option<IpAddr>>> {
    let mut hops = Vec::new();
    for value in headers.get_all("x-forwarded-for") {
        match value.to_str() {
            Ok(value) => hops.extend(value.split(',').map(|hop| parse_ip(hop.trim()))),
            Err(_) => hops.push(None),
        }
    }
    (!hops.is_empty()).then_some(hops)
}

/// An address as proxies write it: `1.2.3.4`, `1.2.3.4:80`, `2001:db8::1`, `[2001:db8::1]:80`.
fn parse_ip(text: &str) -> Option<IpAddr> {
    let text = text.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    if let Ok(socket) = text.parse::<SocketAddr>() {
        return Some(socket.ip().to_canonical());
    }
    // `[v6]` without a port (`[v6]:port` parsed as a socket address above).
    let bracketed = text.strip_prefix('[')?.strip_suffix(']')?;
    bracketed
        .parse::<Ipv6Addr>()
        .ok()
        .map(|ip| IpAddr::V6(ip).to_canonical())
}

/// A trusted network: a CIDR (`10.0.0.0/8`) or a single address.
fn network(text: &str) -> Result<IpNet, ConfigError> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| ConfigError::UnknownValue {
            field: "trusted proxy network",
            value: text.to_owned(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(peer: &str, headers: &[(&str, &str)]) -> Parts {
        let mut builder = http::Request::get("/");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let mut request = builder.body(()).expect("request");
        request
            .extensions_mut()
            .insert(peer.parse::<SocketAddr>().expect("socket address"));
        request.into_parts().0
    }

    fn key(extractor: &ClientIp, peer: &str, headers: &[(&str, &str)]) -> String {
        extractor
            .extract(&request(peer, headers))
            .expect("a key")
            .into_owned()
    }

    #[test]
    fn an_untrusted_peer_cannot_spoof_its_address() {
        let peer = ClientIp::peer();
        let spoof = [("x-forwarded-for", "1.1.1.1"), ("x-real-ip", "2.2.2.2")];
        assert_eq!(key(&peer, "203.0.113.5:1000", &spoof), "203.0.113.5");
        let proxies = ClientIp::behind_proxies(["10.0.0.0/8"]).expect("valid");
        assert_eq!(key(&proxies, "203.0.113.5:1000", &spoof), "203.0.113.5");
    }

    #[test]
    fn behind_trusted_proxies_the_rightmost_untrusted_address_is_the_client() {
        let proxies = ClientIp::behind_proxies(["10.0.0.0/8", "192.168.1.1"]).expect("valid");
        let peer = "10.0.0.1:443";
        let chain = [("x-forwarded-for", "6.6.6.6, 198.51.100.4, 192.168.1.1")];
        assert_eq!(key(&proxies, peer, &chain), "198.51.100.4");
        // Several headers form one list, in order.
        let split = [
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "198.51.100.4:5000, 10.1.2.3"),
        ];
        assert_eq!(key(&proxies, peer, &split), "198.51.100.4");
        let forwarded = [(
            "forwarded",
            "for=6.6.6.6, for=\"[2001:db8:1:2::9]:4711\";proto=https, for=10.0.0.9",
        )];
        let rfc = proxies.clone().header(ClientIpHeader::Forwarded);
        assert_eq!(key(&rfc, peer, &forwarded), "2001:db8:1:2::/64");
        // X-Real-IP (or any single-address header) only when named, and only from a trusted peer.
        let real = proxies.clone().header("x-real-ip".parse().expect("valid"));
        assert_eq!(
            key(&real, peer, &[("x-real-ip", "198.51.100.8")]),
            "198.51.100.8"
        );
        assert_eq!(
            key(&real, "203.0.113.5:1", &[("x-real-ip", "198.51.100.8")]),
            "203.0.113.5"
        );
        assert_eq!(key(&real, peer, &[]), "10.0.0.1", "absent: the peer");
        // All hops trusted: the farthest proxy.
        assert_eq!(
            key(&proxies, peer, &[("x-forwarded-for", "10.9.9.9")]),
            "10.9.9.9"
        );
    }

    /// Proxies append to one header and pass the client's others through: with one header
    /// named, the others never change the key.
    #[test]
    fn only_the_named_header_is_read() {
        let peer = "127.0.0.1:443";
        let xff = ClientIp::behind_proxies(["127.0.0.1/32"]).expect("valid");
        let rfc = xff.clone().header(ClientIpHeader::Forwarded);
        for n in 1..=5 {
            let spoofed_forwarded = format!("for=198.51.100.{n}");
            let headers = [
                ("x-forwarded-for", "203.0.113.50"),
                ("forwarded", spoofed_forwarded.as_str()),
                ("x-real-ip", "198.51.100.77"),
            ];
            assert_eq!(key(&xff, peer, &headers), "203.0.113.50");
            let spoofed_xff = format!("198.51.100.{n}");
            let headers = [
                ("forwarded", "for=203.0.113.60"),
                ("x-forwarded-for", spoofed_xff.as_str()),
                ("x-real-ip", "198.51.100.77"),
            ];
            assert_eq!(key(&rfc, peer, &headers), "203.0.113.60");
        }
        // Without the named header, the peer: never another header.
        let only_forwarded = [("forwarded", "for=198.51.100.9")];
        assert_eq!(key(&xff, peer, &only_forwarded), "127.0.0.1");
        let only_xff = [("x-forwarded-for", "198.51.100.9")];
        assert_eq!(key(&rfc, peer, &only_xff), "127.0.0.1");
    }

    #[test]
    fn malformed_chains_stop_at_the_nearest_known_hop_without_panicking() {
        let proxies = ClientIp::behind_proxies(["10.0.0.0/8"]).expect("valid");
        let peer = "10.0.0.1:443";
        for garbage in [
            "",
            ",,,",
            "not-an-ip",
            "1.2.3.4, unknown",
            "[::1",
            "999.1.1.1",
            "\u{e9}",
            "for=",
        ] {
            let got = key(&proxies, peer, &[("x-forwarded-for", garbage)]);
            assert_eq!(got, "10.0.0.1", "{garbage:?}");
            let rfc = proxies.clone().header(ClientIpHeader::Forwarded);
            let got = key(&rfc, peer, &[("forwarded", garbage)]);
            assert!(!got.is_empty(), "{garbage:?}");
        }
        let hidden = [("forwarded", "for=_hidden, for=unknown")];
        let rfc = proxies.clone().header(ClientIpHeader::Forwarded);
        assert_eq!(key(&rfc, peer, &hidden), "10.0.0.1");
        let behind_garbage = [("x-forwarded-for", "garbage, 10.2.2.2")];
        assert_eq!(key(&proxies, peer, &behind_garbage), "10.2.2.2");
    }

    #[test]
    fn ipv6_is_grouped_by_prefix() {
        let peer = ClientIp::peer();
        assert_eq!(
            key(&peer, "[2001:db8:a:b:c:d:e:f]:1", &[]),
            "2001:db8:a:b::/64"
        );
        let exact = ClientIp::peer().ipv6_prefix(128);
        assert_eq!(key(&exact, "[2001:db8::1]:1", &[]), "2001:db8::1");
        let wide = ClientIp::peer().ipv6_prefix(0);
        assert_eq!(key(&wide, "[2001:db8::1]:1", &[]), "::/0");
        // IPv4-mapped IPv6 is the IPv4 address.
        assert_eq!(key(&peer, "[::ffff:192.0.2.1]:1", &[]), "192.0.2.1");
    }

    #[test]
    fn networks_are_validated() {
        for bad in ["10.0.0.0/33", "nope", "::1/129", "10.0.0.0/x"] {
            assert!(ClientIp::behind_proxies([bad]).is_err(), "{bad}");
        }
        let net = network("10.0.0.0/8").expect("valid");
        assert!(net.contains(&"10.255.0.1".parse::<IpAddr>().expect("ip")));
        assert!(!net.contains(&"11.0.0.1".parse::<IpAddr>().expect("ip")));
        assert!(!net.contains(&"::1".parse::<IpAddr>().expect("ip")));
        let one = network("192.168.1.1").expect("a single address");
        assert!(one.contains(&"192.168.1.1".parse::<IpAddr>().expect("ip")));
        assert!(!one.contains(&"192.168.1.2".parse::<IpAddr>().expect("ip")));
    }

    #[test]
    #[cfg(feature = "axum")]
    fn the_peer_comes_from_axum_connect_info() {
        let mut request = http::Request::get("/").body(()).expect("request");
        let peer: SocketAddr = "198.51.100.1:9".parse().expect("address");
        request
            .extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let parts = request.into_parts().0;
        assert_eq!(
            ClientIp::peer().extract(&parts).as_deref(),
            Some("198.51.100.1")
        );
    }

    #[test]
    #[cfg(feature = "tonic")]
    fn the_peer_comes_from_tonic_connect_info() {
        let mut request = http::Request::get("/").body(()).expect("request");
        request
            .extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some("198.51.100.2:9".parse().expect("address")),
            });
        let parts = request.into_parts().0;
        assert_eq!(
            ClientIp::peer().extract(&parts).as_deref(),
            Some("198.51.100.2")
        );
    }

    #[test]
    fn no_peer_no_key() {
        let parts = http::Request::get("/")
            .body(())
            .expect("request")
            .into_parts()
            .0;
        assert_eq!(ClientIp::peer().extract(&parts), None);
    }
}
