//! The connection in use: one multiplexed connection checked out of the pool and shared by
//! every call, with a generation so that a late failure cannot discard its replacement.

use std::{
    pin::Pin,
    sync::{Arc, PoisonError, atomic::Ordering},
    time::Duration,
};

use super::{
    RedisBackend,
    connection::{Conn, Held},
};
use crate::{Error, ErrorKind};

/// How long a discarded connection's sockets stay open: longer than a failover pauses a
/// primary's writes (Redis's default `cluster-node-timeout` is 15 s).
const LINGER: Duration = Duration::from_secs(60);

/// The most discarded connections of one backend lingering at once.
const MAX_LINGERING: usize = 16;

/// The connection in use, and its generation.
#[derive(Default)]
pub(super) struct Shared {
    held: Option<Held>,
    generation: u64,
    /// Whether a Cluster client is being asked if it still answers (one probe at a time).
    #[cfg(feature = "cluster")]
    probing: bool,
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

    /// Gives up the connection of `generation` for a fresh one, off a Cluster; `linger` as
    /// [`give_up`](Self::give_up)'s. A Cluster's client repairs each node's connection itself,
    /// and a dead node's failures must not cost the live nodes' checks a new connection (its
    /// slot map, a socket per node).
    pub(super) fn discard(&self, generation: u64, linger: bool) {
        if !self.is_cluster() {
            self.give_up(generation, linger);
        }
    }

    /// Gives up the connection of `generation`, whatever the topology. One that may still be
    /// alive (its commands unanswered in time, not refused) `linger`s: its sockets stay open
    /// for [`LINGER`], so that what was written on them still runs on a server that was only
    /// slow or paused (`CLIENT PAUSE`, as a failover does). A closed socket's commands never
    /// run, among them a give-back whose caller stopped waiting (see `across_slots.rs`), which
    /// would leave its quota taken.
    fn give_up(&self, generation: u64, linger: bool) {
        let held = {
            let mut shared = self.lock();
            if shared.generation != generation {
                return;
            }
            shared.generation += 1;
            shared.held.take()
        };
        let Some(held) = held else {
            return;
        };
        let conn = held.discard();
        // Outside a runtime (shutting down) there is nothing to keep it open with.
        if !linger || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        // At most MAX_LINGERING at once: a server that keeps timing out must not pile up
        // sockets; past them, a connection closes now.
        let lingering = &self.inner.lingering;
        if lingering.fetch_add(1, Ordering::Relaxed) >= MAX_LINGERING {
            lingering.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let lingering = Arc::clone(lingering);
        tokio::spawn(async move {
            tokio::time::sleep(LINGER).await;
            drop(conn);
            lingering.fetch_sub(1, Ordering::Relaxed);
        });
    }

    /// The error of a command that ran out of the budget (see [`after_timeout`](Self::after_timeout)).
    pub(super) fn timed_out(&self, budget: Duration) -> Error {
        self.after_timeout();
        Error::new(
            ErrorKind::Timeout,
            format!("redis did not answer within the budget of {budget:?}"),
        )
    }

    /// What a command that ran out of time leaves to do. It may be stuck behind a dead
    /// connection: the next one takes a fresh connection. On a Cluster one node's silence is
    /// no reason to give up the others' connections, but the client itself is asked whether it
    /// still answers.
    pub(super) fn after_timeout(&self) {
        let generation = self.lock().generation;
        self.discard(generation, true);
        #[cfg(feature = "cluster")]
        self.probe(generation);
    }

    /// Asks the held Cluster client whether it still answers, and gives it up for a fresh one
    /// when it does not. redis-rs 1.8's Cluster client can stall for good: a slot refresh
    /// queued on its own lock behind a request it no longer polls, or waiting on a node that
    /// stopped answering. Every command then waits, whichever node it names; seen after a
    /// primary was killed under load, with every later check timing out for minutes. The
    /// stalled client's task cannot be stopped from outside: it stays, idle, with its sockets.
    #[cfg(feature = "cluster")]
    fn probe(&self, generation: u64) {
        let client = {
            let mut shared = self.lock();
            if shared.probing || shared.generation != generation {
                return;
            }
            let Some(Conn::Cluster(client)) = shared.held.as_ref().map(Held::conn) else {
                return;
            };
            shared.probing = true;
            client
        };
        let backend = self.clone();
        tokio::spawn(async move {
            let answers = super::cluster_pool::answers(client).await;
            backend.lock().probing = false;
            if !answers {
                tracing::warn!(
                    target: "redlimit",
                    "the Redis Cluster client stopped answering; connecting afresh"
                );
                backend.give_up(generation, true);
            }
        });
    }
}
