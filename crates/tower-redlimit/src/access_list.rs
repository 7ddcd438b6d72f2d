//! Allow and deny lists: clients by network or by key, decided before any limit is checked.

use std::{collections::HashSet, net::IpAddr};

use http::request::Parts;
use ipnet::IpNet;
use redlimit::ConfigError;

use crate::ClientIp;

/// Clients named by network (`10.0.0.0/8`, `203.0.113.9`, `2001:db8::/32`) or by the layer's
/// key (`key:k1`), for [`RateLimitLayer::allow`](crate::RateLimitLayer::allow) and
/// [`deny`](crate::RateLimitLayer::deny). Networks are matched against the client's address as
/// [`client_ip`](Self::client_ip) finds it (defaults to the peer), keys against the key the
/// layer's extractor gives.
///
/// ```
/// use tower_redlimit::{AccessList, ClientIp};
///
/// let partners = AccessList::new(["10.0.0.0/8", "192.0.2.7", "key:partner-key-1"])?
///     .client_ip(ClientIp::behind_proxies(["10.1.0.0/16"])?);
/// assert!(AccessList::new(["10.0.0.0/33"]).is_err());
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct AccessList {
    networks: Vec<IpNet>,
    keys: HashSet<String>,
    client_ip: ClientIp,
}

impl AccessList {
    /// A list of `entries`: networks in CIDR notation, single addresses, and `key:VALUE`.
    ///
    /// # Errors
    /// [`ConfigError::UnknownValue`] naming an entry that is none of them.
    pub fn new<I, S>(entries: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut networks = Vec::new();
        let mut keys = HashSet::new();
        for entry in entries {
            let entry = entry.as_ref();
            if let Some(key) = entry.strip_prefix("key:") {
                keys.insert(key.to_owned());
            } else if let Ok(network) = entry.parse::<IpNet>() {
                networks.push(network.trunc());
            } else if let Ok(address) = entry.parse::<IpAddr>() {
                networks.push(IpNet::from(address));
            } else {
                return Err(ConfigError::UnknownValue {
                    field: "access list entry (a network, an address or key:VALUE)",
                    value: entry.to_owned(),
                });
            }
        }
        Ok(Self {
            networks,
            keys,
            client_ip: ClientIp::peer(),
        })
    }

    /// How the client's address is found for the networks. Defaults to [`ClientIp::peer`].
    #[must_use]
    pub fn client_ip(mut self, client_ip: ClientIp) -> Self {
        self.client_ip = client_ip;
        self
    }

    /// Whether the request's client (by its address or its `key`) is on the list.
    pub(crate) fn contains(&self, request: &Parts, key: Option<&str>) -> bool {
        if key.is_some_and(|key| self.keys.contains(key)) {
            return true;
        }
        !self.networks.is_empty()
            && self
                .client_ip
                .client_addr(request)
                .is_some_and(|address| self.networks.iter().any(|n| n.contains(&address)))
    }
}
