//! Where state lives, and the one place that tells the backends apart.

mod answer;
pub(crate) mod memory;
pub(crate) mod redis;

use std::{future::Future, pin::Pin, time::Duration};

pub(crate) use self::redis::{DEAF_BLOCK_US, Heard};
use self::{
    answer::{Answer, Inspected},
    memory::leases::Acquired,
    redis::protocol::{self, Call, Request},
};
pub use self::{
    memory::{MemoryBackend, MemoryBackendBuilder},
    redis::{RedisBackend, RedisBackendBuilder},
};
use crate::{
    Decision, Decisions, Error, ErrorKind, KeyScheme, Policy, PolicySet, Reason, RetryAfter,
    Timestamp, algorithm::Denial, check_request::Options, decisions::Reservation,
    policy::MAX_EXACT,
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
        let (set, client) = (&reserved.set, &*reserved.client);
        let settlement = match change {
            Change::GiveBack(cost) => Settlement::GiveBack {
                cost,
                at_us: reserved.at_us,
            },
            Change::Charge(cost) => Settlement::Charge {
                cost: cost.min(MAX_EXACT),
            },
        };
        match self {
            Self::Memory(memory) => {
                let now_us = now.unwrap_or_else(Timestamp::now).as_micros();
                let overridden = memory.overrides().resolve(keys, set, client, now_us);
                let policies = overridden.as_deref().unwrap_or(set);
                Ok(memory.settle(keys, client, policies, settlement, now_us))
            }
            Self::Redis(redis) => {
                let request = match settlement {
                    Settlement::GiveBack { cost, at_us } => Request {
                        cost,
                        taken_at_us: Some(at_us),
                        ..Request::new(set, client)
                    },
                    Settlement::Charge { cost } => Request {
                        cost,
                        ..Request::new(set, client)
                    },
                };
                let call = protocol::encode(keys, now.map(Timestamp::as_micros), &[request]);
                let reply = redis.script(call, |scripts| &scripts.settle).await?;
                Ok(protocol::decode_settled(&reply)
                    .first()
                    .copied()
                    .unwrap_or(0))
            }
        }
    }
}

/// How a settle changes what a reservation took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Gives this much back.
    GiveBack(u64),
    /// Takes this much more, even past the limit.
    Charge(u64),
}

/// A [`Change`] as a backend applies it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Settlement {
    /// Gives back `cost` to the state the reservation taken at `at_us` counted in.
    GiveBack { cost: u64, at_us: u64 },
    /// Takes `cost` more now, even past the limit.
    Charge { cost: u64 },
}

impl Backend {
    /// Checks `client` of `policy` by `overridden` (the policy with the override's numbers)
    /// until `ttl` from now, for every instance.
    pub(crate) async fn set_override(
        &self,
        keys: &KeyScheme,
        (policy, client): (&Policy, &str),
        overridden: Policy,
        ttl: Duration,
    ) -> Result<(), Error> {
        let key = keys.override_key(policy, client);
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        match self {
            Self::Memory(memory) => {
                let now_us = Timestamp::now().as_micros();
                let expires_at_us = now_us.saturating_add(ttl_ms.saturating_mul(1000));
                memory
                    .overrides()
                    .set(key, overridden, now_us, expires_at_us)
            }
            Self::Redis(redis) => {
                let value = protocol::override_value(&overridden, &keys.key(&overridden, client));
                redis
                    .set(Call::keys(vec![key.clone()]), &value, ttl_ms)
                    .await?;
                redis
                    .publish(&keys.events_channel(), "override", &key)
                    .await
            }
        }
    }

    /// Ends `client`'s override of `policy`; whether one was in force.
    pub(crate) async fn clear_override(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
    ) -> Result<bool, Error> {
        let key = keys.override_key(policy, client);
        match self {
            Self::Memory(memory) => {
                Ok(memory.overrides().clear(&key, Timestamp::now().as_micros()))
            }
            Self::Redis(redis) => {
                let cleared = redis.delete(Call::keys(vec![key.clone()])).await?;
                redis
                    .publish(&keys.events_channel(), "clear-override", &key)
                    .await?;
                Ok(cleared)
            }
        }
    }
}

/// One check as a backend receives it.
#[derive(Clone, Copy)]
pub(crate) struct Query<'a> {
    /// How the policies' keys are named.
    pub(crate) keys: &'a KeyScheme,
    /// The policies checked together.
    pub(crate) set: &'a PolicySet,
    /// Whose check it is.
    pub(crate) client: &'a str,
    /// What the check asks for besides.
    pub(crate) options: &'a Options<'a>,
}

/// `decisions`, reserved if they answer an admitted reservation taken at `taken_at_us`.
pub(super) fn stamp(
    decisions: Decisions,
    options: &Options<'_>,
    set: &PolicySet,
    client: &str,
    taken_at_us: Option<u64>,
) -> Decisions {
    match taken_at_us {
        Some(at_us) if options.reserve && decisions.allowed() && options.cost > 0 => decisions
            .reserved(Reservation {
                set: set.clone(),
                client: client.into(),
                cost: options.cost,
                at_us,
            }),
        _ => decisions,
    }
}

impl Backend {
    /// Takes lease `id` of `ttl_ms` in the set at `key` if fewer than `limit` are held; the
    /// answer and the reason it carries.
    pub(crate) async fn acquire_lease(
        &self,
        key: &str,
        limit: u64,
        ttl_ms: u64,
        id: &str,
    ) -> Result<(Acquired, Reason), Error> {
        match self {
            Self::Memory(memory) => {
                let now_ms = Timestamp::now().as_micros() / 1000;
                let acquired = memory.leases().acquire(key, limit, ttl_ms, id, now_ms);
                Ok((acquired, Reason::Memory))
            }
            Self::Redis(redis) => {
                let call = protocol::lease(key.to_owned(), limit, ttl_ms, id);
                let reply = redis.script(call, |s| &s.acquire).await?;
                Ok((protocol::decode_acquired(&reply)?, Reason::Redis))
            }
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
            Self::Memory(memory) => {
                let now_ms = Timestamp::now().as_micros() / 1000;
                Ok(memory.leases().renew(key, ttl_ms, id, now_ms))
            }
            Self::Redis(redis) => {
                let call = protocol::lease(key.to_owned(), 0, ttl_ms, id);
                let reply = redis.script(call, |s| &s.renew).await?;
                Ok(reply.first() == Some(&1))
            }
        }
    }

    /// Gives lease `id` in the set at `key` back at once if it lives in this process; whether
    /// it did (a lease on Redis needs [`release_lease`](Self::release_lease)).
    pub(crate) fn release_lease_in_process(&self, key: &str, id: &str) -> bool {
        match self {
            Self::Memory(memory) => {
                memory.leases().release(key, id);
                true
            }
            Self::Redis(_) => false,
        }
    }

    /// Gives lease `id` in the set at `key` back.
    pub(crate) async fn release_lease(&self, key: &str, id: &str) -> Result<(), Error> {
        match self {
            Self::Memory(memory) => {
                memory.leases().release(key, id);
                Ok(())
            }
            Self::Redis(redis) => redis.release(Call::keys(vec![key.to_owned()]), id).await,
        }
    }
}

/// How an operator's read of one key is named: by client (the backend computes the key), or by
/// the Redis key a scan found.
pub(crate) enum Target<'a> {
    Client(&'a str),
    Key(String),
}

impl Backend {
    /// The reason decisions of this backend carry.
    const fn reason(&self) -> Reason {
        match self {
            Self::Redis(_) => Reason::Redis,
            Self::Memory(_) => Reason::Memory,
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
        let inspected = match (self, &target) {
            (Self::Memory(memory), Target::Client(client)) => {
                memory.inspect(keys, client, policy, 1, Timestamp::now().as_micros())
            }
            (Self::Memory(_), Target::Key(_)) => return Err(no_key_names()),
            (Self::Redis(redis), Target::Client(client)) => {
                // A client's override, if it has one, names the key and numbers in force.
                let one = std::slice::from_ref(policy);
                let call = protocol::encode(keys, None, &[Request::new(one, client)]);
                redis.inspect(call, policy.algorithm()).await?
            }
            (Self::Redis(redis), Target::Key(key)) => {
                // The key a scan found: no client, so no override to read.
                let one = std::slice::from_ref(policy);
                let request = Request {
                    marks: false,
                    ..Request::new(one, "")
                };
                let mut call = protocol::encode(keys, None, &[request]);
                call.keys = vec![key.clone()];
                redis.inspect(call, policy.algorithm()).await?
            }
        };
        let mut decision = decision(policy, inspected.answer, self.reason());
        let key = match &inspected.overridden {
            Some((limit, key)) => {
                decision.limit = *limit;
                key.clone()
            }
            None => target.key(keys, policy),
        };
        Ok((key, decision, inspected))
    }

    /// Deletes what `policy` holds for `client`; whether it held anything.
    pub(crate) async fn reset(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
    ) -> Result<bool, Error> {
        match self {
            Self::Memory(memory) => {
                Ok(memory.reset(keys, client, policy, Timestamp::now().as_micros()))
            }
            Self::Redis(redis) => {
                let mut names = vec![keys.key(policy, client)];
                if policy.takes_overrides() {
                    // And the key of the client's override, if one is in force: in the same
                    // slot, so one DEL takes both.
                    let (in_force, _, _) =
                        self.inspect(keys, policy, Target::Client(client)).await?;
                    if in_force != names[0] {
                        names.push(in_force);
                    }
                }
                let deleted = redis.delete(Call::keys(names.clone())).await?;
                redis
                    .publish(&keys.events_channel(), "reset", &names[0])
                    .await?;
                Ok(deleted)
            }
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
            Self::Memory(_) => Err(no_key_names()),
            Self::Redis(redis) => {
                let pattern = keys.pattern(policy);
                redis
                    .scan(Call::keys(vec![pattern.clone()]), &pattern, max_calls)
                    .await
            }
        }
    }
}

impl Target<'_> {
    fn key(&self, keys: &KeyScheme, policy: &Policy) -> String {
        match self {
            Self::Client(client) => keys.key(policy, client),
            Self::Key(key) => key.clone(),
        }
    }
}

fn no_key_names() -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        "the memory backend keeps hashes of its keys, not their names: nothing to scan",
    )
}

pub(super) fn decision(policy: &Policy, answer: Answer, reason: Reason) -> Decision {
    Decision {
        allowed: answer.denial.is_none(),
        limit: policy.limit(),
        remaining: answer.view.remaining,
        reset_after: Duration::from_millis(answer.view.reset_ms),
        retry_after: answer.denial.map(|denial| match denial {
            Denial::RetryAfterMs(ms) => RetryAfter::After(Duration::from_millis(ms)),
            Denial::Never => RetryAfter::Never,
        }),
        delay: Duration::from_millis(answer.delay_ms),
        policy: policy.shared_name(),
        reason,
        banned: answer.banned,
    }
}
