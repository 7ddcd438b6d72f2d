//! The pool of connections to one server: a standalone one, or the primary the sentinels name
//! (asked at every new connection, so after a failover new connections go to the new
//! primary). Each connection has no timer of its own and its replies bounded.

use std::{borrow::Cow, sync::atomic::AtomicUsize};

use deadpool::managed;
use deadpool_redis::redis::{ConnectionInfo, RedisError, aio::MultiplexedConnection};

use super::connect::{connect, recycle_with_ping, untimed};

/// Which server a [`NodeManager`] connects to.
pub(crate) enum Node {
    /// The server at this address.
    At(ConnectionInfo),
    /// The primary these sentinels name now.
    #[cfg(feature = "sentinel")]
    Primary(tokio::sync::Mutex<deadpool_redis::redis::sentinel::SentinelClient>),
}

/// Makes connections to its node, and checks a pooled one with a `PING`. No `Debug`: its
/// settings may hold a password.
pub(crate) struct NodeManager {
    node: Node,
    pings: AtomicUsize,
}

impl NodeManager {
    pub(crate) fn new(node: Node) -> Self {
        Self {
            node,
            pings: AtomicUsize::new(0),
        }
    }
}

impl managed::Manager for NodeManager {
    type Type = MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, RedisError> {
        let info = match &self.node {
            Node::At(info) => Cow::Borrowed(info),
            // redis-rs's questions to the sentinels keep their own timers: 500 ms a sentinel
            // before it asks the next.
            #[cfg(feature = "sentinel")]
            Node::Primary(sentinels) => {
                let primary = sentinels.lock().await.async_get_client().await?;
                Cow::Owned(primary.get_connection_info().clone())
            }
        };
        connect(&info, untimed()).await
    }

    async fn recycle(
        &self,
        conn: &mut MultiplexedConnection,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        recycle_with_ping(conn, &self.pings).await
    }
}

/// The pool of [`NodeManager`]'s connections.
pub(crate) type NodePool = managed::Pool<NodeManager>;

/// A connection checked out of a [`NodePool`].
pub(crate) type NodeObject = managed::Object<NodeManager>;
