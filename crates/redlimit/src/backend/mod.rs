//! Where state lives, and the one place that tells the backends apart.

mod bans;
mod connection;
pub(crate) mod leases;
mod memory;
mod overrides;
mod recent;
mod redis;
pub(crate) mod script;
#[cfg(feature = "tls")]
mod tls;

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use self::script::{Answer, Inspected, Invocation};
pub use self::{
    memory::{MemoryBackend, MemoryBackendBuilder},
    redis::{RedisBackend, RedisBackendBuilder},
};
use crate::{
    Decision, Decisions, Error, ErrorKind, KeyScheme, Policy, Reason, RetryAfter, Timestamp,
    algorithm::Denial, decisions::Reservation,
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

    /// Begins a check of `policies` (valid: not empty, no name twice) for `client`, counted
    /// once per request id and kept refundable as `extras` say. In process it is decided here;
    /// on Redis the returned future sends it when first polled.
    pub(crate) fn start<P: Policies + ?Sized>(
        &self,
        keys: &KeyScheme,
        policies: &P,
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
        extras: &Extras,
    ) -> Started {
        match self {
            Self::Memory(memory) => {
                let now_us = now.unwrap_or_else(Timestamp::now).as_micros();
                let policies = policies.as_slice();
                // A client with an override is checked by the policies it names.
                let overridden = memory.overrides().resolve(keys, policies, client, now_us);
                let policies = overridden.as_deref().unwrap_or(policies);
                let bans = policies.iter().any(|p| p.ban().is_some());
                let answers = || {
                    if bans {
                        return memory.check_banning(keys, client, policies, cost, now_us);
                    }
                    memory.check(keys, client, policies, cost, now_us, |_, answer| answer)
                };
                let answers = match &extras.once {
                    Some(once) => {
                        let key = keys.once(policies, client, &once.id);
                        memory.recent().once(&key, once.window_ms, now_us, answers)
                    }
                    None if !bans => {
                        // The common check: decisions made on the way out, no answers kept.
                        let decisions =
                            memory.check(keys, client, policies, cost, now_us, |p, a| {
                                decision(p, a, Reason::Memory)
                            });
                        let decisions = Decisions::new(decisions);
                        return Started::Ready(Ok(extras.stamp(
                            decisions,
                            Some(now_us),
                            client,
                            cost,
                        )));
                    }
                    None => answers(),
                };
                let decisions = policies
                    .iter()
                    .zip(answers)
                    .map(|(policy, answer)| decision(policy, answer, Reason::Memory))
                    .collect();
                let decisions = Decisions::new(decisions);
                Started::Ready(Ok(extras.stamp(decisions, Some(now_us), client, cost)))
            }
            Self::Redis(redis) => {
                let redis = redis.clone();
                let mut names = keys.check_keys(policies.as_slice(), client);
                let mut extra = Vec::new();
                if let Some(once) = &extras.once {
                    names.push(keys.once(policies.as_slice(), client, &once.id));
                    extra.push(once.window_ms.to_string());
                }
                if extras.reserve {
                    extra.push(script::RESERVE.to_owned());
                }
                let policies = policies.to_owned_policies();
                let reserve = Extras {
                    once: None,
                    reserve: extras.reserve,
                };
                let client = if extras.reserve {
                    client.to_owned()
                } else {
                    String::new()
                };
                Started::Waiting(Box::pin(async move {
                    let policies = policies.as_ref();
                    let call = Invocation {
                        policies,
                        keys: &names,
                        cost,
                        now_us: now.map(Timestamp::as_micros),
                        extra: &extra,
                    };
                    let reply = redis.check(call).await?;
                    let mut limits = reply.limits.into_iter();
                    let decisions = policies
                        .iter()
                        .zip(reply.answers)
                        .map(|(policy, answer)| {
                            let mut decision = decision(policy, answer, Reason::Redis);
                            if policy.takes_overrides() {
                                decision.limit = limits.next().unwrap_or(decision.limit);
                            }
                            decision
                        })
                        .collect();
                    let decisions = Decisions::new(decisions);
                    Ok(reserve.stamp(decisions, reply.taken_at_us, &client, cost))
                }))
            }
        }
    }

    /// Gives back `cost` of what `reserved` took from `policies`, at `now` (else the backend's
    /// time); how many policies gave something back.
    pub(crate) async fn refund(
        &self,
        keys: &KeyScheme,
        policies: &[Policy],
        reserved: &Reservation,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<u64, Error> {
        let (client, taken_at_us) = (&*reserved.client, reserved.at_us);
        match self {
            Self::Memory(memory) => {
                let now_us = now.unwrap_or_else(Timestamp::now).as_micros();
                let overridden = memory.overrides().resolve(keys, policies, client, now_us);
                let policies = overridden.as_deref().unwrap_or(policies);
                Ok(memory.refund(keys, client, policies, cost, taken_at_us, now_us))
            }
            Self::Redis(redis) => {
                let names = keys.check_keys(policies, client);
                let at = [taken_at_us.to_string()];
                let call = Invocation {
                    policies,
                    keys: &names,
                    cost,
                    now_us: now.map(Timestamp::as_micros),
                    extra: &at,
                };
                let reply = redis.script(call, |scripts| &scripts.refund).await?;
                Ok(reply.first().map_or(0, |&n| u64::try_from(n).unwrap_or(0)))
            }
        }
    }
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
                let value = format!(
                    "{},{},{},{}",
                    overridden.limit(),
                    overridden.window_ms(),
                    overridden.burst(),
                    keys.key(&overridden, client)
                );
                redis
                    .set(Invocation::of_key(policy, &key), &value, ttl_ms)
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
            Self::Redis(redis) => redis.delete(Invocation::of_key(policy, &key)).await,
        }
    }
}

/// What a check does besides deciding: answer retries of one request id once, and keep its
/// time so that [`Backend::refund`] can give back what it took.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extras {
    pub(crate) once: Option<Once>,
    pub(crate) reserve: bool,
}

impl Extras {
    /// `decisions`, refundable if this is an admitted reservation taken at `taken_at_us`.
    fn stamp(
        &self,
        decisions: Decisions,
        taken_at_us: Option<u64>,
        client: &str,
        cost: u64,
    ) -> Decisions {
        match taken_at_us {
            Some(at_us) if self.reserve && decisions.allowed() && cost > 0 => {
                decisions.reserved(Reservation {
                    client: client.into(),
                    cost,
                    at_us,
                })
            }
            _ => decisions,
        }
    }
}

/// Retries counted once: a check with the same request `id` within `window_ms` answers what
/// the first one answered, and consumes nothing more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Once {
    pub(crate) id: String,
    pub(crate) window_ms: u64,
}

/// The longest a request id's first answer is remembered.
const MAX_ONCE_WINDOW: Duration = Duration::from_secs(86_400);

impl Once {
    /// Request `id`, remembered for `window` in whole milliseconds, from 1 ms to 24 hours.
    pub(crate) fn new(id: &str, window: Duration) -> Self {
        let window = window.clamp(Duration::from_millis(1), MAX_ONCE_WINDOW);
        Self {
            id: id.to_owned(),
            window_ms: u64::try_from(window.as_millis()).unwrap_or(1),
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
            (Self::Redis(redis), _) => {
                let mut names = vec![target.key(keys, policy)];
                // A client's override, if it has one, names the key and numbers in force.
                if let (Target::Client(client), true) = (&target, policy.takes_overrides()) {
                    names.push(keys.override_key(policy, client));
                }
                redis.inspect(Invocation::of_keys(policy, &names)).await?
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
                redis.delete(Invocation::of_keys(policy, &names)).await
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
                    .scan(Invocation::of_key(policy, &pattern), &pattern, max_calls)
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
        delay: Duration::from_millis(answer.delay_ms),
        policy: policy.shared_name(),
        reason,
        banned: answer.banned,
    }
}
