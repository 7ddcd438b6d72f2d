//! Where state lives, and the one place that tells the backends apart.

mod connection;
mod memory;
mod redis;
pub(crate) mod script;
#[cfg(feature = "tls")]
mod tls;

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use self::script::{Answer, Invocation};
pub use self::{
    memory::{MemoryBackend, MemoryBackendBuilder},
    redis::{RedisBackend, RedisBackendBuilder},
};
use crate::{
    Decision, Decisions, Error, KeyScheme, Policy, Reason, RetryAfter, Timestamp, algorithm::Denial,
};

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

/// A check the backend has begun: decided already (in process), or an answer to wait for.
pub(crate) enum Started {
    Ready(Result<Decisions, Error>),
    /// Boxed: the Redis future is large, and callers should not carry (and move) its space.
    Waiting(Pin<Box<dyn Future<Output = Result<Decisions, Error>> + Send>>),
}

/// The policies of a check: borrowed while it is decided in process, copied into the future
/// only when it waits for Redis.
pub(crate) trait Policies {
    /// What the waiting future keeps.
    type Owned: AsRef<[Policy]> + Send + 'static;

    fn as_slice(&self) -> &[Policy];

    fn to_owned_policies(&self) -> Self::Owned;
}

impl Policies for Policy {
    type Owned = [Policy; 1];

    fn as_slice(&self) -> &[Policy] {
        std::slice::from_ref(self)
    }

    fn to_owned_policies(&self) -> [Policy; 1] {
        [self.clone()]
    }
}

impl Policies for [Policy] {
    type Owned = Vec<Policy>;

    fn as_slice(&self) -> &[Policy] {
        self
    }

    fn to_owned_policies(&self) -> Vec<Policy> {
        self.to_vec()
    }
}

impl Policies for Arc<[Policy]> {
    type Owned = Self;

    fn as_slice(&self) -> &[Policy] {
        self
    }

    fn to_owned_policies(&self) -> Self {
        Arc::clone(self)
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

    /// Begins a check of `policies` (valid: not empty, no name twice) for `client`. In process
    /// it is decided here; on Redis the returned future sends it when first polled.
    pub(crate) fn start<P: Policies + ?Sized>(
        &self,
        keys: &KeyScheme,
        policies: &P,
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Started {
        match self {
            Self::Memory(memory) => {
                let now_us = now.unwrap_or_else(Timestamp::now).as_micros();
                let decisions = memory.check(
                    keys,
                    client,
                    policies.as_slice(),
                    cost,
                    now_us,
                    |policy, answer| decision(policy, answer, Reason::Memory),
                );
                Started::Ready(Ok(Decisions::new(decisions)))
            }
            Self::Redis(redis) => {
                let redis = redis.clone();
                let policies = policies.to_owned_policies();
                let keys: Vec<String> = policies
                    .as_ref()
                    .iter()
                    .map(|p| keys.key(p, client))
                    .collect();
                Started::Waiting(Box::pin(async move {
                    let policies = policies.as_ref();
                    let call = Invocation {
                        policies,
                        keys: &keys,
                        cost,
                        now_us: now.map(Timestamp::as_micros),
                    };
                    let answers = redis.check(call).await?;
                    let decisions = policies
                        .iter()
                        .zip(answers)
                        .map(|(policy, answer)| decision(policy, answer, Reason::Redis))
                        .collect();
                    Ok(Decisions::new(decisions))
                }))
            }
        }
    }
}

fn decision(policy: &Policy, answer: Answer, reason: Reason) -> Decision {
    Decision {
        allowed: answer.denial.is_none(),
        limit: policy.limit(),
        remaining: answer.view.remaining,
        reset_after: Duration::from_millis(answer.view.reset_ms),
        retry_after: answer.denial.map(|denial| match denial {
            Denial::RetryAfterMs(ms) => RetryAfter::After(Duration::from_millis(ms)),
            Denial::Never => RetryAfter::Never,
        }),
        policy: policy.shared_name(),
        reason,
    }
}
