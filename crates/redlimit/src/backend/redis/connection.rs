//! The pools of the Redis topologies behind one connection type.

use deadpool_redis::redis::{
    Cmd, Pipeline, RedisFuture, Value,
    aio::{ConnectionLike, MultiplexedConnection},
};

use deadpool_redis::PoolError;

use crate::{Error, ErrorKind};

/// A pool per topology.
pub(crate) enum Pools {
    /// A standalone server, or the primary sentinels name.
    Node(super::node_pool::NodePool),
    /// A pool the application built.
    Application(deadpool_redis::Pool),
    #[cfg(feature = "cluster")]
    Cluster(super::cluster_pool::ClusterPool),
}

/// A connection checked out of its pool and kept for sharing.
pub(crate) enum Held {
    Node(super::node_pool::NodeObject),
    Application(deadpool_redis::Connection),
    #[cfg(feature = "cluster")]
    Cluster(super::cluster_pool::ClusterObject),
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
            Self::Node(_) | Self::Application(_) => false,
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => true,
        }
    }

    pub(crate) fn status(&self) -> deadpool_redis::Status {
        match self {
            Self::Node(pool) => pool.status(),
            Self::Application(pool) => pool.status(),
            #[cfg(feature = "cluster")]
            Self::Cluster(pool) => pool.status(),
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
            Self::Node(pool) => Held::Node(pool.get().await.map_err(|e| unavailable(&e))?),
            Self::Application(pool) => {
                Held::Application(pool.get().await.map_err(|e| unavailable(&e))?)
            }
            #[cfg(feature = "cluster")]
            Self::Cluster(pool) => Held::Cluster(pool.get().await.map_err(|e| unavailable(&e))?),
        })
    }
}

impl Held {
    pub(crate) fn conn(&self) -> Conn {
        match self {
            Self::Node(held) => Conn::Multiplexed((**held).clone()),
            Self::Application(held) => Conn::Multiplexed((**held).clone()),
            #[cfg(feature = "cluster")]
            Self::Cluster(held) => Conn::Cluster((**held).clone()),
        }
    }

    /// Removes the connection from its pool for good (a connection that failed is not
    /// recycled): what is left of it, its sockets closed when that is dropped.
    pub(crate) fn discard(self) -> Box<dyn Send> {
        match self {
            Self::Node(held) => Box::new(super::node_pool::NodeObject::take(held)),
            Self::Application(held) => Box::new(deadpool_redis::Connection::take(held)),
            #[cfg(feature = "cluster")]
            Self::Cluster(held) => Box::new(super::cluster_pool::ClusterObject::take(held)),
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
