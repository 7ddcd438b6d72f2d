//! The connection in use: one multiplexed connection checked out of the pool and shared by
//! every call, with a generation so that a late failure cannot discard its replacement.

use std::{pin::Pin, sync::PoisonError, time::Duration};

use super::{
    RedisBackend,
    connection::{Conn, Held},
};
use crate::{Error, ErrorKind};

/// The connection in use, and its generation.
#[derive(Default)]
pub(super) struct Shared {
    held: Option<Held>,
    generation: u64,
}

impl RedisBackend {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.inner
            .shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) async fn connection(&self) -> Result<(Conn, u64), Error> {
        if let Some(held) = self.held() {
            return Ok(held);
        }
        let _only_one = self.inner.connecting.lock().await;
        if let Some(held) = self.held() {
            return Ok(held);
        }
        // Boxed and its type erased: a pool's checkout (its wait, asking the sentinels, the
        // connect, redis-rs's set-up) is a deep future that every call's own would otherwise
        // hold, taking the compiler past its depth limits under a layer (its size and whether
        // it is `Send`); it runs only when no connection is held.
        let checkout: Pin<Box<dyn Future<Output = Result<Held, Error>> + Send + '_>> =
            Box::pin(self.inner.pools.get());
        let fresh = checkout.await?;
        let mut shared = self.lock();
        let conn: Conn = shared.held.get_or_insert(fresh).conn();
        Ok((conn, shared.generation))
    }

    fn held(&self) -> Option<(Conn, u64)> {
        let shared = self.lock();
        shared
            .held
            .as_ref()
            .map(|held| (held.conn(), shared.generation))
    }

    /// Gives up the connection of `generation` for a fresh one, off a Cluster. A Cluster's
    /// client repairs each node's connection itself, and a dead node's failures must not cost
    /// the live nodes' checks a new connection (its slot map, a socket per node).
    pub(super) fn discard(&self, generation: u64) {
        if self.is_cluster() {
            return;
        }
        let mut shared = self.lock();
        if shared.generation == generation {
            shared.generation += 1;
            if let Some(held) = shared.held.take() {
                held.discard();
            }
        }
    }

    /// The error of a command that ran out of the budget. A command that hangs may be stuck
    /// behind a dead connection: the next one takes a fresh connection.
    pub(super) fn timed_out(&self, budget: Duration) -> Error {
        let generation = self.lock().generation;
        self.discard(generation);
        Error::new(
            ErrorKind::Timeout,
            format!("redis did not answer within the budget of {budget:?}"),
        )
    }
}
