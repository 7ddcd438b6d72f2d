use std::{fmt, str::FromStr};

use http::HeaderName;
use redlimit::ConfigError;

/// The header trusted proxies report the client's address in; [`ClientIp`](super::ClientIp)
/// reads this one and no other.
///
/// | in front of the app | header |
/// |---|---|
/// | nginx (`proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for`) | `x-forwarded-for` |
/// | nginx (`proxy_set_header X-Real-IP $remote_addr`) | `x-real-ip` |
/// | HAProxy (`option forwardfor`) | `x-forwarded-for` |
/// | AWS ALB | `x-forwarded-for` |
/// | a proxy writing RFC 7239 (Envoy, HAProxy `option forwarded`) | `forwarded` |
/// | Cloudflare | `cf-connecting-ip` |
/// | Fly.io | `fly-client-ip` |
/// | Akamai, Cloudflare Enterprise | `true-client-ip` |
///
/// ```
/// use tower_redlimit::ClientIpHeader;
///
/// assert_eq!("forwarded".parse::<ClientIpHeader>()?, ClientIpHeader::Forwarded);
/// let cloudflare: ClientIpHeader = "CF-Connecting-IP".parse()?;
/// assert_eq!(cloudflare.to_string(), "cf-connecting-ip");
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientIpHeader {
    /// `X-Forwarded-For`, a list each proxy appends to, read from the right.
    XForwardedFor,
    /// `Forwarded` (RFC 7239), its `for=` addresses read from the right.
    Forwarded,
    /// A header holding one address, which the trusted proxy overwrites: `X-Real-IP`,
    /// `CF-Connecting-IP`, `Fly-Client-IP`, `True-Client-IP`.
    Single(HeaderName),
}

/// `X-Forwarded-For`, what nginx, HAProxy and AWS ALB append to.
impl Default for ClientIpHeader {
    fn default() -> Self {
        Self::XForwardedFor
    }
}

impl FromStr for ClientIpHeader {
    type Err = ConfigError;

    /// `x-forwarded-for`, `forwarded`, or the name of a single-address header (any case).
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let header = HeaderName::try_from(name.trim()).map_err(|_| ConfigError::UnknownValue {
            field: "client ip header",
            value: name.to_owned(),
        })?;
        Ok(if header == "x-forwarded-for" {
            Self::XForwardedFor
        } else if header == http::header::FORWARDED {
            Self::Forwarded
        } else {
            Self::Single(header)
        })
    }
}

impl fmt::Display for ClientIpHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::XForwardedFor => "x-forwarded-for",
            Self::Forwarded => "forwarded",
            Self::Single(name) => name.as_str(),
        })
    }
}
