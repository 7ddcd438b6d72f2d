//! Where state lives, and the one place that tells the backends apart.

mod bans;
mod connection;
pub(crate) mod leases;
mod memory;
mod overrides;
mod recent;
mod redis;
mod redis_url;
pub(crate) mod script;
#[cfg(feature = "tls")]
mod tls;

use std::{future::Future, pin::Pin, time::Duration};

use self::script::{Answer, Inspected, Invocation};
pub use self::{
    memory::{MemoryBackend, MemoryBackendBuilder},
    redis::{RedisBackend, RedisBackendBuilder},
};
use crate::{
    Decision, Decisions, Error, ErrorKind, KeyScheme, Policy, PolicySet, Reason, RetryAfter,
    Timestamp, algorithm::Denial, check_request::Options, decisions::Reservation,
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

    /// Begins the check of `set` for `client` that `options` describe. In process it is
    /// decided here; on Redis the returned future sends it when first polled.
    pub(crate) fn start(
        &self,
        keys: &KeyScheme,
        set: &PolicySet,
        client: &str,
        options: &Options<'_>,
    ) -> Started {
        let cost = options.cost;
        match self {
            Self::Memory(memory) => {
                let now_us = options.at.unwrap_or_else(Timestamp::now).as_micros();
                // A client with an override is checked by the policies it names.
                let overridden = memory.overrides().resolve(keys, set, client, now_us);
                let policies = overridden.as_deref().unwrap_or(set);
                let bans = policies.iter().any(|p| p.ban().is_some());
                let answers = || {
                    if bans {
                        return memory.check_banning(keys, client, policies, cost, now_us);
                    }
                    memory.check(keys, client, policies, cost, now_us, |_, answer| answer)
                };
                let (answers, taken_at_us) = match options.once {
                    Some((id, window_ms)) => {
                        let key = keys.once(set, client, id);
                        let (answers, replayed) =
                            memory.recent().once(&key, window_ms, now_us, answers);
                        // A retry took nothing: its answer is not refundable.
                        (answers, (!replayed).then_some(now_us))
                    }
                    None if !bans => {
                        // The common check: decisions made on the way out, no answers kept.
                        let decisions =
                            memory.check(keys, client, policies, cost, now_us, |p, a| {
                                decision(p, a, Reason::Memory)
                            });
                        let decisions = Decisions::new(decisions);
                        return Started::Ready(Ok(stamp(
                            decisions,
                            options,
                            set,
                            client,
                            Some(now_us),
                        )));
                    }
                    None => (answers(), Some(now_us)),
                };
                let decisions = policies
                    .iter()
                    .zip(answers)
                    .map(|(policy, answer)| decision(policy, answer, Reason::Memory))
                    .collect();
                let decisions = Decisions::new(decisions);
                Started::Ready(Ok(stamp(decisions, options, set, client, taken_at_us)))
            }
            Self::Redis(redis) => {
                let redis = redis.clone();
                let mut names = keys.check_keys(set, client);
                let mut extra = Vec::new();
                if let Some((id, window_ms)) = options.once {
                    names.push(keys.once(set, client, id));
                    extra.push(window_ms.to_string());
                }
                if options.reserve {
                    extra.push(script::RESERVE.to_owned());
                }
                let set = set.clone();
                let options = Options {
                    once: None,
                    ..*options
                };
                let client = if options.reserve {
                    client.to_owned()
                } else {
                    String::new()
                };
                Started::Waiting(Box::pin(async move {
                    let call = Invocation {
                        policies: &set,
                        keys: &names,
                        cost,
                        now_us: options.at.map(Timestamp::as_micros),
                        extra: &extra,
                    };
                    let reply = redis.check(call, options.budget).await?;
                    let mut limits = reply.limits.into_iter();
                    let decisions = set
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
                    // A retry's reply says 0: it took nothing.
                    let taken_at_us = reply.taken_at_us.filter(|&at| at > 0);
                    Ok(stamp(decisions, &options, &set, &client, taken_at_us))
                }))
            }
        }
    }

    /// Gives back `cost` of what `reserved` took, at `now` (else the backend's time); how
    /// many policies gave something back.
    pub(crate) async fn refund(
        &self,
        keys: &KeyScheme,
        reserved: &Reservation,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<u64, Error> {
        let (set, client, taken_at_us) = (&reserved.set, &*reserved.client, reserved.at_us);
        match self {
            Self::Memory(memory) => {
                let now_us = now.unwrap_or_else(Timestamp::now).as_micros();
                let overridden = memory.overrides().resolve(keys, set, client, now_us);
                let policies = overridden.as_deref().unwrap_or(set);
                Ok(memory.refund(keys, client, policies, cost, taken_at_us, now_us))
            }
            Self::Redis(redis) => {
                let names = keys.check_keys(set, client);
                let at = [taken_at_us.to_string()];
                let call = Invocation {
                    policies: set,
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

/// `decisions`, refundable if they answer an admitted reservation taken at `taken_at_us`.
fn stamp(
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
