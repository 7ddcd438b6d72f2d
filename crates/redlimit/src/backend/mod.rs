//! Where state lives, and the one place that tells the backends apart: each [`Backend`] method
//! hands its work to the backend's own.

mod answer;
pub(crate) mod memory;
mod query;
pub(crate) mod redis;

use std::time::Duration;

pub(crate) use self::{
    answer::{Acquired, Inspected},
    query::{Change, Query, Started, Target},
    redis::{DEAF_BLOCK_US, Heard},
};
pub use self::{
    memory::{MemoryBackend, MemoryBackendBuilder},
    redis::{RedisBackend, RedisBackendBuilder},
};
use crate::{Decision, Error, KeyScheme, Policy, Timestamp, decisions::Reservation};

/// Where a [`Limiter`](crate::Limiter) keeps its state.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// A Redis server shared by every instance of the application.
    Redis(RedisBackend),
    /// This process's memory.
    Memory(MemoryBackend),
}

impl From<RedisBackend> for Backend {
    fn from(backend: RedisBackend) -> Self {
        Self::Redis(backend)
    }
}

impl From<MemoryBackend> for Backend {
    fn from(backend: MemoryBackend) -> Self {
        Self::Memory(backend)
    }
}

impl Backend {
    /// Whether checks cross the network (and so are worth a time budget, a circuit breaker
    /// and a block cache).
    pub fn is_remote(&self) -> bool {
        matches!(self, Self::Redis(_))
    }

    /// Whether the backend is a Redis Cluster, where one node can fail alone.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Redis(redis) if redis.is_cluster())
    }

    /// Begins `query`. In process it is decided here; on Redis the returned future sends it
    /// when first polled.
    pub(crate) fn start(&self, query: Query<'_>) -> Started {
        match self {
            Self::Memory(memory) => memory.start(query),
            Self::Redis(redis) => redis.start(query),
        }
    }

    /// Settles what `reserved` took by `change`, at `now` (else the backend's time); how many
    /// policies changed.
    pub(crate) async fn settle(
        &self,
        keys: &KeyScheme,
        reserved: &Reservation,
        change: Change,
        now: Option<Timestamp>,
    ) -> Result<u64, Error> {
        match self {
            Self::Memory(memory) => memory.settle(keys, reserved, change, now),
            Self::Redis(redis) => redis.settle(keys, reserved, change, now).await,
        }
    }

    /// Checks `client` of `policy` by `overridden` (the policy with the override's numbers)
    /// until `ttl` from now, for every instance.
    pub(crate) async fn set_override(
        &self,
        keys: &KeyScheme,
        target: (&Policy, &str),
        overridden: Policy,
        ttl: Duration,
    ) -> Result<(), Error> {
        match self {
            Self::Memory(memory) => memory.set_override(keys, target, overridden, ttl),
            Self::Redis(redis) => redis.set_override(keys, target, overridden, ttl).await,
        }
    }

    /// Ends `client`'s override of `policy`; whether one was in force.
    pub(crate) async fn clear_override(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
    ) -> Result<bool, Error> {
        match self {
            Self::Memory(memory) => memory.clear_override(keys, policy, client),
            Self::Redis(redis) => redis.clear_override(keys, policy, client).await,
        }
    }

    /// Gives lease `id` in the set at `key` `ttl_ms` more; whether it was still held.
    pub(crate) async fn renew_lease(
        &self,
        key: &str,
        id: &str,
        ttl_ms: u64,
    ) -> Result<bool, Error> {
        match self {
            Self::Memory(memory) => memory.renew_lease(key, id, ttl_ms),
            Self::Redis(redis) => redis.renew_lease(key, id, ttl_ms).await,
        }
    }

    /// Gives lease `id` in the set at `key` back at once if it lives in this process; whether
    /// it did (a lease on Redis needs [`release_lease`](Self::release_lease)).
    pub(crate) fn release_lease_in_process(&self, key: &str, id: &str) -> bool {
        match self {
            Self::Memory(memory) => memory.release_lease(key, id).is_ok(),
            Self::Redis(_) => false,
        }
    }

    /// Gives lease `id` in the set at `key` back.
    pub(crate) async fn release_lease(&self, key: &str, id: &str) -> Result<(), Error> {
        match self {
            Self::Memory(memory) => memory.release_lease(key, id),
            Self::Redis(redis) => redis.release_lease(key, id).await,
        }
    }

    /// What `policy` holds for `target` and the decision a request of cost 1 would get, writing
    /// nothing; with the Redis key it lives under.
    pub(crate) async fn inspect(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        target: Target<'_>,
    ) -> Result<(String, Decision, Inspected), Error> {
        match self {
            Self::Memory(memory) => memory.inspect(keys, policy, target),
            Self::Redis(redis) => redis.inspect(keys, policy, target).await,
        }
    }

    /// Deletes what `policy` holds for `client`; whether it held anything.
    pub(crate) async fn reset(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
    ) -> Result<bool, Error> {
        match self {
            Self::Memory(memory) => memory.reset(keys, policy, client),
            Self::Redis(redis) => redis.reset(keys, policy, client).await,
        }
    }

    /// The Redis keys of `policy`, by a `SCAN` of at most `max_calls` calls per primary: the
    /// keys, the calls made, and whether the scan went through every key.
    pub(crate) async fn scan(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        max_calls: u64,
    ) -> Result<(Vec<String>, u64, bool), Error> {
        match self {
            Self::Memory(memory) => memory.scan(),
            Self::Redis(redis) => redis.scan(keys, policy, max_calls).await,
        }
    }
}
