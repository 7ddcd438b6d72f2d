//! The pools of the three Redis topologies behind one connection type.

use deadpool_redis::redis::{
    Cmd, Pipeline, RedisFuture, Value,
    aio::{ConnectionLike, MultiplexedConnection},
};

use deadpool_redis::PoolError;

use crate::{Error, ErrorKind};

/// A pool per topology.
pub(crate) enum Pools {
    Standalone(super::standalone_pool::StandalonePool),
    /// A pool the application built.
    Application(deadpool_redis::Pool),
    #[cfg(feature = "cluster")]
    Cluster(super::cluster_pool::ClusterPool),
    #[cfg(feature = "sentinel")]
    Sentinel(super::sentinel_pool::SentinelPool),
}

/// A connection checked out of its pool and kept for sharing.
pub(crate) enum Held {
    Standalone(super::standalone_pool::StandaloneObject),
    Application(deadpool_redis::Connection),
    #[cfg(feature = "cluster")]
    Cluster(super::cluster_pool::ClusterObject),
    #[cfg(feature = "sentinel")]
    Sentinel(super::sentinel_pool::SentinelObject),
}

/// A clone of the held connection: multiplexed, so clones share one socket (or, for a cluster,
/// one socket per node).
#[derive(Clone)]
pub(crate) enum Conn {
    Multiplexed(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(super::cluster_pool::Cluster),
}

impl Pools {
    /// Whether the keys are spread over the nodes of a Cluster.
    pub(crate) const fn is_cluster(&self) -> bool {
        match self {
            Self::Standalone(_) | Self::Application(_) => false,
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => true,
            #[cfg(feature = "sentinel")]
            Self::Sentinel(_) => false,
        }
    }

    pub(crate) fn status(&self) -> deadpool_redis::Status {
        match self {
            Self::Standalone(pool) => pool.status(),
            Self::Application(pool) => pool.status(),
            #[cfg(feature = "cluster")]
            Self::Cluster(pool) => pool.status(),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(pool) => pool.status(),
        }
    }

    pub(crate) async fn get(&self) -> Result<Held, Error> {
        // Out of time is a timeout whichever timer said so (the pool's or the connection's).
        let unavailable = |err: &PoolError| {
            let kind = match err {
                PoolError::Timeout(_) => ErrorKind::Timeout,
                PoolError::Backend(err) if err.is_timeout() => ErrorKind::Timeout,
                _ => ErrorKind::Backend,
            };
            let cause = match err {
                PoolError::Backend(err) => super::refusal::cause(err),
                _ => None,
            };
            let cause = cause.map(|cause| cause + ": ").unwrap_or_default();
            Error::new(kind, format!("no redis connection: {cause}{err}"))
        };
        Ok(match self {
            Self::Standalone(pool) => {
                Held::Standalone(pool.get().await.map_err(|e| unavailable(&e))?)
            }
            Self::Application(pool) => {
                Held::Application(pool.get().await.map_err(|e| unavailable(&e))?)
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(pool) => Held::Cluster(pool.get().await.map_err(|e| unavailable(&e))?),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(pool) => Held::Sentinel(pool.get().await.map_err(|e| unavailable(&e))?),
        })
    }
}

impl Held {
    pub(crate) fn conn(&self) -> Conn {
        match self {
            Self::Standalone(held) => Conn::Multiplexed((**held).clone()),
            Self::Application(held) => Conn::Multiplexed((**held).clone()),
            #[cfg(feature = "cluster")]
            Self::Cluster(held) => Conn::Cluster((**held).clone()),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(held) => Conn::Multiplexed((**held).clone()),
        }
    }

    /// Removes the connection from its pool for good: a connection that failed is not recycled.
    pub(crate) fn discard(self) {
        match self {
            Self::Standalone(held) => {
                drop(super::standalone_pool::StandaloneObject::take(held));
            }
            Self::Application(held) => drop(deadpool_redis::Connection::take(held)),
            #[cfg(feature = "cluster")]
            Self::Cluster(held) => drop(super::cluster_pool::ClusterObject::take(held)),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(held) => drop(super::sentinel_pool::SentinelObject::take(held)),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Multiplexed(conn) => conn.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Multiplexed(conn) => conn.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Multiplexed(conn) => conn.get_db(),
            #[cfg(feature = "cluster")]
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}
