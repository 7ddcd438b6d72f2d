//! The pool of Redis Cluster connections, whose client never sends a command again by itself.
//! redis-rs's cluster client by default resends a request after a lost connection, and a
//! script whose reply was lost may have run: sent again, its checks would count twice. What
//! Redis refused unrun (a redirect, `CLUSTERDOWN` during a failover) is sent again by the
//! backend instead (see `refusal.rs`).

use std::sync::atomic::AtomicUsize;

use deadpool::managed;
use deadpool_redis::redis::{
    AsyncConnectionConfig, Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, RedisResult,
    Value,
    aio::{ConnectionLike, MultiplexedConnection},
    cluster::{ClusterClient, ClusterClientBuilder},
    cluster_async::{ClusterConnection, Connect},
    cluster_routing::{RoutingInfo, SingleNodeRoutingInfo},
};

/// A connection to the Cluster: one per node, each with its replies bounded.
pub(crate) type Cluster = ClusterConnection<NodeConnection>;

/// A connection to one node of the Cluster, with its replies bounded (see `bounded.rs`).
#[derive(Clone)]
pub(crate) struct NodeConnection(MultiplexedConnection);

impl Connect for NodeConnection {
    fn connect_with_config<'a, T>(info: T, config: AsyncConnectionConfig) -> RedisFuture<'a, Self>
    where
        T: IntoConnectionInfo + Send + 'a,
    {
        Box::pin(async move {
            let info = info.into_connection_info()?;
            super::connect::connect(&info, config).await.map(Self)
        })
    }
}

impl ConnectionLike for NodeConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.get_db()
    }
}

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
    type Type = Cluster;
    type Error = RedisError;

    async fn create(&self) -> Result<Cluster, RedisError> {
        // The generic connection (hidden from redis-rs's docs, yet public) is how a Cluster's
        // node connections get a stream of their own.
        self.client.get_async_generic_connection().await
    }

    async fn recycle(
        &self,
        conn: &mut Cluster,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        super::connect::recycle_with_ping(conn, &self.pings).await
    }
}

/// The pool of [`ClusterManager`]'s connections.
pub(crate) type ClusterPool = managed::Pool<ClusterManager>;

/// A connection checked out of a [`ClusterPool`].
pub(crate) type ClusterObject = managed::Object<ClusterManager>;

/// How long a Cluster client may leave every probe unanswered before it is taken for stalled:
/// a `PING` to a node it holds a connection to is answered within a millisecond on a live
/// network.
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Probes sent at once, each to a node of the client's choosing: one node that stopped
/// answering leaves them all unanswered only if each picked it.
const PROBES: usize = 3;

/// Whether `client` still answers: any reply or error to one of its probes within
/// [`PROBE_WAIT`].
pub(crate) async fn answers(client: Cluster) -> bool {
    let probes = (0..PROBES).map(|_| {
        let mut client = client.clone();
        Box::pin(async move {
            client
                .route_command(
                    deadpool_redis::redis::cmd("PING"),
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                )
                .await
        })
    });
    tokio::time::timeout(PROBE_WAIT, futures_util::future::select_all(probes))
        .await
        .is_ok()
}
