//! The pool of connections to a standalone server, each with its replies bounded (see
//! `bounded.rs`) and no timer of its own.

use std::sync::atomic::AtomicUsize;

use deadpool::managed;
use deadpool_redis::redis::{ConnectionInfo, RedisError, aio::MultiplexedConnection};

/// Makes connections to the server `info` names, and checks a pooled one with a `PING`. No
/// `Debug`: its settings may hold a password.
pub(crate) struct StandaloneManager {
    info: ConnectionInfo,
    pings: AtomicUsize,
}

impl StandaloneManager {
    pub(crate) fn new(info: ConnectionInfo) -> Self {
        Self {
            info,
            pings: AtomicUsize::new(0),
        }
    }
}

impl managed::Manager for StandaloneManager {
    type Type = MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, RedisError> {
        super::connect::connect(&self.info, super::connect::untimed()).await
    }

    async fn recycle(
        &self,
        conn: &mut MultiplexedConnection,
        _: &managed::Metrics,
    ) -> managed::RecycleResult<RedisError> {
        super::connect::recycle_with_ping(conn, &self.pings).await
    }
}

/// The pool of [`StandaloneManager`]'s connections.
pub(crate) type StandalonePool = managed::Pool<StandaloneManager>;

/// A connection checked out of a [`StandalonePool`].
pub(crate) type StandaloneObject = managed::Object<StandaloneManager>;
