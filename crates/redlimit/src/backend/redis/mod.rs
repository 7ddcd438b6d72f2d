//! The Redis backend: one `FCALL` per check, or per batch of concurrent checks, over a pooled
//! multiplexed connection, on a standalone server, a Cluster, or a Sentinel-managed primary.

use std::{
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

mod across_slots;
mod batch;
mod bounded;
mod builder;
mod check;
#[cfg(feature = "cluster")]
mod cluster_pool;
mod connect;
mod connection;
mod events;
mod held;
mod leases;
mod node_pool;
mod operator;
pub(crate) mod protocol;
mod refusal;
mod run;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinels;
mod stored_state;
#[cfg(feature = "tls")]
mod tls;
mod url;

pub use self::builder::RedisBackendBuilder;
use self::{
    batch::Batcher,
    builder::Topology,
    connection::Pools,
    events::{Events, Subscriber},
    held::Shared,
    scripts::Scripts,
};
pub(crate) use self::{
    events::{DEAF_BLOCK_US, Heard},
    scripts::CHECK,
};

/// The Redis backend, through a deadpool-redis pool: a standalone server
/// ([`builder`](Self::builder)), a Redis Cluster ([`cluster`](Self::cluster), feature `cluster`)
/// or a Sentinel-managed primary ([`sentinel`](Self::sentinel), feature `sentinel`).
///
/// Every check is one `FCALL` of redlimit's function library: of a lean function per algorithm
/// for one policy, of one with every algorithm for several, so a check of several policies is
/// still one round trip; a node that lacks the library gets it by `FUNCTION LOAD` in the same
/// retry. Where the server refuses functions (its ACL, a proxy), the same checks go as scripts,
/// by `EVALSHA` (and `EVAL` on `NOSCRIPT`). Checks that
/// arrive while two calls are in flight wait and go together as one call when one returns,
/// each decided as it would be alone at that call's time (see [the algorithms
/// guide](crate::guide::algorithms)); a lone check goes at once. On a Cluster each slot has
/// its own two calls and queue, so no check waits behind a call to another node. A redis-rs
/// multiplexed connection carries any number of concurrent checks, so the backend keeps one
/// checked out and shares it instead of paying the pool's health-check `PING` on every checkout;
/// it goes back to the pool for a fresh one only when a command fails or times out (on a
/// Cluster never: its client repairs each node's connection itself). The time budget is the
/// only timer: connections have none of their own, and a reply larger than 4 MiB drops its
/// connection unread (over plain TCP). Nothing connects until the first check, so an
/// application starts even while Redis is down.
///
/// ```no_run
/// use std::time::Duration;
/// use redlimit::{Limiter, RedisBackend};
///
/// let redis = RedisBackend::builder("redis://127.0.0.1:6379")
///     .budget(Duration::from_millis(50))
///     .build()?;
/// let limiter = Limiter::new(redis);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

struct Inner {
    pools: Pools,
    scripts: Scripts,
    budget: Duration,
    /// Whether corrupt state is deleted and the check run again, and how often it was.
    repair: bool,
    repairs: AtomicU64,
    /// Whether checks go by `FCALL` of the library's functions: until the server refuses them
    /// (an ACL without `FCALL` or `FUNCTION LOAD`, a proxy that does not know them), when
    /// they go as scripts.
    functions: AtomicBool,
    shared: Mutex<Shared>,
    /// How many discarded connections are lingering (see `held.rs`).
    lingering: Arc<AtomicUsize>,
    /// Lets one check at a time fetch a connection, so a burst of first checks does not check
    /// out (and then recycle, with a `PING` each) a connection apiece.
    connecting: tokio::sync::Mutex<()>,
    batcher: Batcher,
    /// Operator events heard, and where to listen for them.
    events: Events,
    subscriber: Subscriber,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("pool", &self.inner.pools.status())
            .field("budget", &self.inner.budget)
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// A standalone Redis at `url` (`redis://[user:pass@]host:port[/db]`, or `rediss://…` over
    /// TLS with the feature `tls`). User name and password are the ACL's; `Debug` never shows
    /// them.
    pub fn builder(url: impl Into<String>) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Topology::Standalone(url.into()))
    }

    /// A standalone Redis through a deadpool-redis pool the application built, for settings
    /// the URL cannot carry: a credentials provider, its own TLS configuration, a connection
    /// hook. The builder's budget still bounds every check; its pool size does not apply.
    ///
    /// ```
    /// use redlimit::{RedisBackend, deadpool_redis};
    ///
    /// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let redis = RedisBackend::from_pool(pool).build()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_pool(pool: deadpool_redis::Pool) -> RedisBackendBuilder {
        RedisBackendBuilder::new(Topology::Pool(pool))
    }

    /// A Redis Cluster reached through any of `urls` (seed nodes; the rest is discovered).
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn cluster<I, S>(urls: I) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Topology::Cluster(
            urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// The primary named `master` that the sentinels at `urls` (`redis://host:26379`) point to;
    /// after a failover, new connections go to the new primary.
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel<I, S>(urls: I, master: impl Into<String>) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Topology::Sentinel {
            urls: urls.into_iter().map(Into::into).collect(),
            master: master.into(),
        })
    }

    /// The time budget of one check; see [`RedisBackendBuilder::budget`].
    pub fn budget(&self) -> Duration {
        self.inner.budget
    }

    /// Whether this is a Redis Cluster, whose keys live on several primaries.
    pub fn is_cluster(&self) -> bool {
        self.inner.pools.is_cluster()
    }

    /// Listens for operator events on `channel` (see [`Heard`]).
    pub(crate) fn listen(&self, channel: &str) {
        events::listen(&self.inner, channel);
    }

    /// What this backend heard of operator events so far.
    pub(crate) fn heard(&self) -> Heard {
        events::start(&self.inner);
        self.inner.events.heard()
    }

    /// Whether this backend listens for operator events now (see
    /// [`GuardBuilder::block_cache`](crate::GuardBuilder::block_cache)): `false` before a
    /// guard with a block cache first checked, while Redis is unreachable, and always for a
    /// backend built [`from_pool`](Self::from_pool), which has no address to listen at.
    pub fn is_listening(&self) -> bool {
        self.inner.events.is_listening()
    }

    /// How many times corrupt state was deleted; see [`RedisBackendBuilder::repair_corrupt_state`].
    pub fn repairs(&self) -> u64 {
        self.inner.repairs.load(Ordering::Relaxed)
    }
}
