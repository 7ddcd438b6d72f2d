//! The pool of Redis Cluster connections, whose client never sends a command again by itself.
//! redis-rs's cluster client by default resends a request after a lost connection, and a
//! script whose reply was lost may have run: sent again, its checks would count twice. What
//! Redis refused unrun (a redirect, `CLUSTERDOWN` during a failover) is sent again by the
//! backend instead (see `refusal.rs`).

use std::sync::atomic::AtomicUsize;

use deadpool::managed;
use deadpool_redis::redis::{
    RedisError, RedisResult,
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::ClusterConnection,
};

/// Makes cluster connections that never retry, and checks a pooled one with a `PING`.
pub(crate) struct ClusterManager {
    client: ClusterClient,
    pings: AtomicUsize,
}

impl ClusterManager {
    /// A manager for the cluster `builder` reaches (its seeds, and certificates).
    pub(crate) fn new(builder: ClusterClientBuilder) -> RedisResult<Self> {
        Ok(Self {
            client: builder.retries(0).build()?,
            pings: AtomicUsize::new(0),
        })
    }
}

impl managed::Manager for ClusterManager {
    type Type = ClusterConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<ClusterConnection, RedisError> {
        self.client.get_async_connection().await
    }

    async fn recycle(
        &self,
        conn: &mut ClusterConnection,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        super::connection::recycle_with_ping(conn, &self.pings).await
    }
}

/// The pool of [`ClusterManager`]'s connections.
pub(crate) type ClusterPool = managed::Pool<ClusterManager>;

/// A connection checked out of a [`ClusterPool`].
pub(crate) type ClusterObject = managed::Object<ClusterManager>;
