//! Building a [`RedisBackend`]: where its Redis is (the topology), its budget and pool, TLS,
//! and the pools and listener made from them, every setting validated once.

use std::{
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64},
    },
    time::Duration,
};

use deadpool_redis::{
    Runtime,
    redis::{ConnectionInfo, IntoConnectionInfo},
};

#[cfg(feature = "sentinel")]
use super::sentinels;
#[cfg(feature = "tls")]
use super::tls;
use super::{
    Inner, RedisBackend,
    batch::Batcher,
    connection::Pools,
    events::{Events, Subscriber},
    node_pool::{Node, NodeManager, NodePool},
    scripts::Scripts,
    url::check_url,
};
#[cfg(feature = "cluster")]
use super::{cluster_pool, connect};
use crate::{ConfigError, redacted_url};

/// Where the backend's Redis is. Its `Debug` shows URLs without their credentials.
#[derive(Clone)]
pub(super) enum Topology {
    Standalone(String),
    /// A pool the application built: its own credentials, TLS and settings.
    Pool(deadpool_redis::Pool),
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        urls: Vec<String>,
        master: String,
    },
}

impl fmt::Debug for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Standalone(url) => f
                .debug_tuple("Standalone")
                .field(&redacted_url(url))
                .finish(),
            Self::Pool(pool) => f.debug_tuple("Pool").field(&pool.status()).finish(),
            #[cfg(feature = "cluster")]
            Self::Cluster(seeds) => f.debug_tuple("Cluster").field(&urls(seeds)).finish(),
            #[cfg(feature = "sentinel")]
            Self::Sentinel {
                urls: sentinels,
                master,
            } => f
                .debug_struct("Sentinel")
                .field("urls", &urls(sentinels))
                .field("master", master)
                .finish(),
        }
    }
}

#[cfg(any(feature = "cluster", feature = "sentinel"))]
fn urls(urls: &[String]) -> Vec<String> {
    urls.iter().map(|url| redacted_url(url)).collect()
}

/// Builds a [`RedisBackend`]; see [`RedisBackend::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct RedisBackendBuilder {
    topology: Topology,
    budget: Duration,
    pool_size: usize,
    repair: bool,
    #[cfg(feature = "tls")]
    tls: tls::Tls,
}

impl RedisBackendBuilder {
    pub(super) fn new(topology: Topology) -> Self {
        Self {
            topology,
            budget: Duration::from_millis(100),
            pool_size: 4,
            repair: false,
            #[cfg(feature = "tls")]
            tls: tls::Tls::default(),
        }
    }

    /// The time budget of a check made without a guard, and of the operator's commands
    /// (inspect, reset, overrides, leases): waiting for a connection, connecting and the reply
    /// together. Defaults to 100 ms. A [`GuardedLimiter`](crate::GuardedLimiter)'s checks are
    /// timed by [its budget](crate::GuardBuilder::budget) instead, on the same one timer, so
    /// a guarded check has exactly one budget; either way, running out of it is
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The most connections the pool opens. Defaults to 4; one multiplexed connection serves
    /// all concurrent checks, the rest stand by for reconnects.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size;
        self
    }

    /// Trusts the certificate authority in `pem` (PEM-encoded) instead of the system's roots, for
    /// a standalone `rediss://` server, a Cluster's nodes or the primary sentinels name (reached
    /// over TLS when any certificate is given) with a private CA. Defaults to the system's
    /// roots.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_ca(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.root_ca = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (both PEM-encoded) to a standalone `rediss://`
    /// server, a Cluster's nodes or the primary sentinels name, when they ask for one
    /// (`tls-auth-clients yes`). Defaults to none.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((certificate_pem.into(), key_pem.into()));
        self
    }

    /// Whether a key that cannot be read (the wrong type, a value redlimit never writes) is
    /// deleted and the check run again on fresh state, logged at `warn` and counted in
    /// [`RedisBackend::repairs`]. Defaults to `false`: corrupt state is an
    /// [`ErrorKind::CorruptState`](crate::ErrorKind::CorruptState) error, so that nothing someone else stored is deleted; with
    /// fail open that client is unlimited until the key is fixed, with fail closed locked out.
    pub fn repair_corrupt_state(mut self, repair: bool) -> Self {
        self.repair = repair;
        self
    }

    /// Validates the settings and builds the backend, without connecting.
    ///
    /// # Errors
    /// A [`ConfigError`] for an unparsable URL, no URL, a zero budget or a zero pool size.
    pub fn build(self) -> Result<RedisBackend, ConfigError> {
        if self.budget.is_zero() {
            return Err(ConfigError::Zero { field: "budget" });
        }
        if self.pool_size == 0 {
            return Err(ConfigError::Zero { field: "pool_size" });
        }
        #[cfg(feature = "tls")]
        tls::install_crypto_provider();
        let pools = self.pools()?;
        let batcher = Batcher::new(pools.is_cluster());
        // After the pools, whose errors name each setting first.
        let subscriber = self.subscriber()?;
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                pools,
                scripts: Scripts::new(),
                budget: self.budget,
                repair: self.repair,
                repairs: AtomicU64::new(0),
                functions: AtomicBool::new(true),
                shared: Mutex::default(),
                lingering: Arc::default(),
                connecting: tokio::sync::Mutex::default(),
                batcher,
                events: Events::default(),
                subscriber,
            }),
        })
    }

    /// The sentinels at `urls` naming `master`, with this builder's certificates for it.
    #[cfg(feature = "sentinel")]
    fn sentinels(&self, urls: &[String], master: &str) -> sentinels::Sentinels {
        sentinels::Sentinels {
            urls: urls.to_vec(),
            master: master.to_owned(),
            #[cfg(feature = "tls")]
            certificates: self.tls.certificates(),
        }
    }

    /// Where the backend listens for operator events: the settings its connections use.
    fn subscriber(&self) -> Result<Subscriber, ConfigError> {
        let node = |url: &str| -> Result<ConnectionInfo, ConfigError> {
            #[cfg(feature = "tls")]
            if let Some(info) = self.tls.connection_info(url)? {
                return Ok(info);
            }
            url.into_connection_info().map_err(|e| ConfigError::Redis {
                field: "redis url",
                message: e.to_string(),
            })
        };
        Ok(match &self.topology {
            Topology::Pool(_) => Subscriber::None,
            Topology::Standalone(url) => Subscriber::Nodes(vec![node(url)?]),
            #[cfg(feature = "cluster")]
            Topology::Cluster(urls) => {
                Subscriber::Nodes(urls.iter().map(|url| node(url)).collect::<Result<_, _>>()?)
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { urls, master } => {
                Subscriber::Sentinel(self.sentinels(urls, master))
            }
        })
    }

    fn pools(&self) -> Result<Pools, ConfigError> {
        let invalid = |field: &'static str| {
            move |err: &dyn fmt::Display| ConfigError::Redis {
                field,
                message: err.to_string(),
            }
        };
        // No timer of the pool's or the connection's own (see `connection::untimed`): every
        // wait (for the pool, to connect, for a reply) happens inside the caller's one timer,
        // the check's budget or the backend's, so a check's budget is never cut short by another.
        macro_rules! pool {
            ($builder:expr, $field:literal) => {
                $builder
                    .max_size(self.pool_size)
                    .runtime(Runtime::Tokio1)
                    .build()
                    .map_err(|e| invalid($field)(&e))?
            };
        }
        Ok(match &self.topology {
            Topology::Pool(pool) => Pools::Application(pool.clone()),
            Topology::Standalone(url) => {
                check_url("redis url", url)?;
                #[cfg(feature = "tls")]
                let info = self.tls.connection_info(url)?;
                #[cfg(not(feature = "tls"))]
                let info = None;
                let info = match info {
                    Some(info) => info,
                    None => url
                        .as_str()
                        .into_connection_info()
                        .map_err(|e| invalid("redis url")(&e))?,
                };
                let manager = NodeManager::new(Node::At(info));
                Pools::Node(pool!(NodePool::builder(manager), "redis url"))
            }
            #[cfg(feature = "cluster")]
            Topology::Cluster(urls) => {
                if urls.is_empty() {
                    return Err(ConfigError::Missing {
                        field: "cluster urls",
                    });
                }
                for url in urls {
                    check_url("cluster urls", url)?;
                }
                #[cfg_attr(not(feature = "tls"), expect(unused_mut))]
                let mut client =
                    deadpool_redis::redis::cluster::ClusterClientBuilder::new(urls.clone());
                #[cfg(feature = "tls")]
                if let Some(certificates) = self.tls.certificates() {
                    client = client.certs(certificates);
                }
                // A connect timer is the one timer the cluster client insists on (1 s unless
                // set; its replies have none unless set): one so long that the caller's budget
                // always ends first.
                let client = client.connection_timeout(connect::NO_TIMER);
                let manager = cluster_pool::ClusterManager::new(client)
                    .map_err(|e| invalid("cluster urls")(&e))?;
                Pools::Cluster(pool!(
                    cluster_pool::ClusterPool::builder(manager),
                    "cluster urls"
                ))
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { urls, master } => {
                if urls.is_empty() {
                    return Err(ConfigError::Missing {
                        field: "sentinel urls",
                    });
                }
                for url in urls {
                    check_url("sentinel urls", url)?;
                }
                let sentinels = self
                    .sentinels(urls, master)
                    .client()
                    .map_err(|e| invalid("sentinel urls")(&e))?;
                let manager = NodeManager::new(Node::Primary(tokio::sync::Mutex::new(sentinels)));
                Pools::Node(pool!(NodePool::builder(manager), "sentinel urls"))
            }
        })
    }
}
