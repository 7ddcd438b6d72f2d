//! In-process backend: the same algorithms and integer arithmetic as the scripts, in bounded
//! memory.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::{
    ConfigError, KeyScheme, Policy,
    algorithm::{self, Denial, Plan, State, View},
    client_id::{ClientId, ClientIds},
    key_table::{Expiring, KeyId, KeyTable},
};

mod bans;
mod leases;
mod locked;
mod operator;
mod overrides;
mod recent;

use self::{bans::Bans, leases::Leases, locked::Locked, overrides::Overrides, recent::Recent};
use super::{
    answer::{Answer, Inspected, decision, mark_overridden},
    query::{Change, Clients, Query, Settlement, Started, stamp},
};
use crate::{
    Decision, Decisions, Error, Lease, Reason, Timestamp,
    check_request::{Options, borrowed_keys},
    concurrency::lease_id,
    decisions::Reservation,
    policy::MAX_EXACT,
};

const SHARDS: usize = 16;

/// In-process backend: state in this process only, for a single instance, for tests, and as the
/// fallback when Redis fails.
///
/// Decisions are identical to the Redis backend's for the same times and costs. Memory is
/// bounded: state is dropped when its time to live ends (checked on access and swept when a
/// shard fills), and at most [`max_keys`](MemoryBackendBuilder::max_keys) keys are tracked.
///
/// **Eviction rule.** When a new key arrives at a full shard, expired keys are dropped first;
/// if none has expired, the sixteenth of the shard's keys whose state expires soonest is dropped
/// (at once, so a flood of new keys pays for the scan once per many inserts). An evicted key restarts
/// with a full quota, so eviction can only make the limiter more lenient for that key, never
/// deny a request it would have allowed.
///
/// ```
/// use redlimit::{Limiter, MemoryBackend};
///
/// let limiter = Limiter::new(MemoryBackend::builder().max_keys(50_000).build()?);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    shards: Arc<[Mutex<Shard>]>,
    ids: Arc<ClientIds>,
    leases: Arc<Leases>,
    recent: Arc<Recent>,
    overrides: Arc<Overrides>,
    bans: Arc<Bans>,
}

/// A key's identity: the client's id mixed with the policy's. Keys are not stored: a lookup
/// touches no string.
struct KeyIds;

impl KeyIds {
    /// Distinct for distinct (prefix, policy, numbers), whatever the client id; never 0.
    fn of(keys: &KeyScheme, policy: &Policy, client: ClientId) -> KeyId {
        let which = policy.fingerprint() ^ keys.fingerprint().rotate_left(64);
        (client ^ which.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)).max(1)
    }
}

#[derive(Debug)]
struct Shard {
    entries: KeyTable<Entry>,
}

#[derive(Debug, Default)]
pub(crate) struct Entry {
    state: Option<State>,
    expires_at_us: u64,
}

impl Expiring for Entry {
    fn expires_at_us(&self) -> u64 {
        self.expires_at_us
    }
}

impl Entry {
    fn apply(&mut self, update: algorithm::Update, expires_at_us: u64, now_us: u64) {
        if self.expires_at_us <= now_us {
            self.state = None;
        }
        algorithm::apply(&mut self.state, update);
        self.expires_at_us = expires_at_us;
    }
}

impl Default for MemoryBackend {
    /// Tracks at most 100,000 keys.
    fn default() -> Self {
        Self::with_capacity(100_000)
    }
}

impl MemoryBackend {
    /// Starts a memory backend.
    pub fn builder() -> MemoryBackendBuilder {
        MemoryBackendBuilder { max_keys: 100_000 }
    }

    fn with_capacity(max_keys: usize) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS);
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    entries: KeyTable::new(per_shard),
                })
            })
            .collect();
        Self {
            shards,
            ids: Arc::default(),
            leases: Arc::new(Leases::new(max_keys)),
            recent: Arc::new(Recent::new(max_keys)),
            overrides: Arc::new(Overrides::new(max_keys)),
            bans: Arc::new(Bans::new(max_keys)),
        }
    }

    /// The first answers of requests with an id.
    pub(crate) fn recent(&self) -> &Recent {
        &self.recent
    }

    /// The per-client overrides.
    pub(crate) fn overrides(&self) -> &Overrides {
        &self.overrides
    }

    /// The concurrency leases.
    pub(crate) fn leases(&self) -> &Leases {
        &self.leases
    }

    /// How many keys hold state now (including expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entries
                    .len()
            })
            .sum()
    }

    /// Whether no key holds state.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks all `policies` (the query's, or its client's override) for the query's client at
    /// `now_us` atomically (the client's keys share a shard, whose lock is held for the whole
    /// check) and turns each policy's answer into a `T` (a decision) on the way out.
    pub(crate) fn check<T, C: FromIterator<T>>(
        &self,
        query: Query<'_>,
        policies: &[Policy],
        now_us: u64,
        mut finish: impl FnMut(&Policy, Answer) -> T,
    ) -> C {
        let (keys, cost) = (query.keys, query.options.cost);
        let mut locked = Locked::new(&self.shards, &self.ids, query.clients(), policies.len());
        if let [policy] = policies {
            let id = KeyIds::of(keys, policy, locked.client(0));
            let answer = locked.shard(0).check_one(policy, id, cost, now_us);
            return std::iter::once(finish(policy, answer)).collect();
        }
        let plans: Vec<(Plan, KeyId)> = policies
            .iter()
            .enumerate()
            .map(|(i, policy)| {
                let id = KeyIds::of(keys, policy, locked.client(i));
                let state = locked.shard(i).live(id, now_us);
                (algorithm::plan(policy, state, now_us, cost), id)
            })
            .collect();
        let admitted = plans.iter().all(|(plan, _)| plan.outcome.is_ok());
        plans
            .into_iter()
            .zip(policies)
            .enumerate()
            .map(|(i, ((plan, id), policy))| {
                let answer = match plan.outcome {
                    Err(denial) => Answer::denied(plan.before, denial),
                    Ok(_) if !admitted => Answer::allowed(plan.before, 0),
                    Ok((after, write)) => {
                        if let Some(write) = write {
                            let expires_at_us =
                                now_us.saturating_add(write.ttl_ms.saturating_mul(1000));
                            locked
                                .shard(i)
                                .write(id, write.update, expires_at_us, now_us);
                        }
                        Answer::allowed(after, plan.delay_ms)
                    }
                };
                finish(policy, answer)
            })
            .collect()
    }
}

impl MemoryBackend {
    /// Decides `query` here and now: with its set's concurrency limit, the lease and the
    /// policies as one (the twin of `lua/check.lua`'s LEASE), the lease held by the decisions.
    pub(crate) fn start(&self, query: Query<'_>) -> Started {
        // A give-back takes no lease.
        let concurrency = query.set.concurrency().filter(|_| !query.options.give_back);
        let Some(concurrency) = concurrency else {
            return Started::Ready(Ok(self.decide(query)));
        };
        let now_us = query.options.at.unwrap_or_else(Timestamp::now).as_micros();
        let query = Query {
            options: &Options {
                at: Some(Timestamp::from_micros(now_us)),
                ..*query.options
            },
            ..query
        };
        let key = concurrency.key(query.keys, query.clients().first());
        let id = lease_id();
        let numbers = (concurrency.limit(), concurrency.lease_ttl_ms());
        let (decisions, acquired) = self
            .leases()
            .hold(&key, numbers, &id, now_us / 1000, |free| {
                // Refused a lease, the check's policies decide without taking.
                let decisions = if free {
                    self.decide(query)
                } else {
                    self.peek_set(query, now_us)
                };
                let admitted = decisions.allowed() && query.options.cost > 0;
                (decisions, admitted)
            });
        let taken = decisions.allowed() && acquired.granted && query.options.cost > 0;
        let decisions = decisions.and(concurrency.decision(acquired, Reason::Memory));
        if !taken {
            return Started::Ready(Ok(decisions));
        }
        let lease = Lease::new(self.clone().into(), key, id, concurrency.lease_ttl_ms());
        Started::Ready(Ok(decisions.leased(lease)))
    }

    /// Each policy of `query`'s set decided at `now_us` without taking.
    fn peek_set(&self, query: Query<'_>, now_us: u64) -> Decisions {
        let clients = query.clients();
        let items = query.set.iter().enumerate().map(|(i, policy)| {
            let peeked = self.peek(
                query.keys,
                clients.of(i),
                policy,
                query.options.cost,
                now_us,
            );
            decision(policy, peeked.answer, Reason::Memory)
        });
        Decisions::new(items.collect::<Arc<[_]>>())
    }

    /// Decides `query`'s policies here and now.
    fn decide(&self, query: Query<'_>) -> Decisions {
        let Query {
            keys,
            set,
            client,
            options,
        } = query;
        let now_us = options.at.unwrap_or_else(Timestamp::now).as_micros();
        let clients = query.clients();
        // A client with an override is checked by the policies it names.
        let overridden = self.overrides().resolve(keys, set, clients, now_us);
        let policies = overridden.as_deref().unwrap_or(set);
        if options.give_back {
            // The twin of settle.lua's REFUND: given back to the state in force now, then
            // each policy's quota.
            let refund = Settlement::Refund { cost: options.cost };
            self.settle_policies(keys, clients, policies, refund, now_us);
            return self.peek_set(
                Query {
                    options: &Options {
                        cost: 0,
                        ..*options
                    },
                    ..query
                },
                now_us,
            );
        }
        let bans = policies.iter().any(|p| p.ban().is_some());
        let answers = || {
            if bans {
                return self.check_banning(query, policies, now_us);
            }
            self.check(query, policies, now_us, |_, answer| answer)
        };
        let (answers, taken_at_us) = match options.once {
            Some((id, window_ms)) => {
                let key = keys.once(set, clients.first(), options.keys, id, options.reserve);
                let (answers, replayed) = self.recent().once(&key, window_ms, now_us, answers);
                // A retry took nothing: its answer is not reserved.
                (answers, (!replayed).then_some(now_us))
            }
            None if !bans => {
                // The common check: decisions made on the way out, no answers kept.
                // Gathered where they are shared, with no copy.
                let decisions: Arc<[Decision]> = self.check(query, policies, now_us, |p, a| {
                    decision(p, a, Reason::Memory)
                });
                let mut decisions = Decisions::new(decisions);
                if overridden.is_some() {
                    mark_overridden(decisions.items_mut(), set);
                }
                return stamp(decisions, options, set, client, Some(now_us));
            }
            None => (answers(), Some(now_us)),
        };
        let mut decisions: Vec<Decision> = policies
            .iter()
            .zip(answers)
            .map(|(policy, answer)| decision(policy, answer, Reason::Memory))
            .collect();
        if overridden.is_some() {
            mark_overridden(&mut decisions, set);
        }
        let decisions = Decisions::new(decisions);
        stamp(decisions, options, set, client, taken_at_us)
    }
}

impl MemoryBackend {
    /// What `policy` holds for `client` at `now_us`, and the decision of `cost`, writing nothing.
    pub(crate) fn peek(
        &self,
        keys: &KeyScheme,
        client: &str,
        policy: &Policy,
        cost: u64,
        now_us: u64,
    ) -> Inspected {
        // A client's override, if it has one, names the numbers (and key) in force.
        let resolved = self.overrides().in_force(keys, policy, client, now_us);
        let overridden = resolved
            .as_ref()
            .map(|resolved| (resolved.limit(), keys.key(resolved, client)));
        let policy = resolved.as_ref().unwrap_or(policy);
        let (client, shard) = self.shard_of(client);
        let entry = shard
            .entries
            .get(KeyIds::of(keys, policy, client))
            .filter(|entry| entry.expires_at_us > now_us);
        let state = entry.and_then(|entry| entry.state.as_ref());
        let plan = algorithm::plan(policy, state, now_us, cost);
        Inspected {
            answer: match plan.outcome {
                Err(denial) => Answer::denied(plan.before, denial),
                Ok(_) => Answer::allowed(plan.before, plan.delay_ms),
            },
            ttl_ms: entry.map(|entry| (entry.expires_at_us - now_us) / 1000),
            state: state.map(State::fields).unwrap_or_default(),
            overridden,
        }
    }

    /// Forgets what `policy` holds for `client`; whether it held anything live at `now_us`.
    pub(crate) fn forget(
        &self,
        keys: &KeyScheme,
        client: &str,
        policy: &Policy,
        now_us: u64,
    ) -> bool {
        // And the state under the client's override, if one is in force.
        let overridden = self.overrides().in_force(keys, policy, client, now_us);
        let (client, mut shard) = self.shard_of(client);
        let mut live = false;
        for policy in std::iter::once(policy).chain(&overridden) {
            if let Some(entry) = shard.entries.get_mut(KeyIds::of(keys, policy, client)) {
                live |= entry.expires_at_us > now_us && entry.state.is_some();
                // Expired is absent: the slot is reused or swept like any other expired key.
                *entry = Entry::default();
            }
        }
        live
    }

    /// As [`check`](Self::check), for policies of which some ban (see `lua/check.lua`): a
    /// banned client is denied by that policy until its ban ends, the others only deciding;
    /// every denial by a policy that bans counts towards a ban, and the one that starts it
    /// answers the ban's length.
    pub(crate) fn check_banning(
        &self,
        query: Query<'_>,
        policies: &[Policy],
        now_us: u64,
    ) -> Vec<Answer> {
        let (keys, clients, cost) = (query.keys, query.clients(), query.options.cost);
        let now = now_us / 1000;
        let mut bans = self.bans.lock();
        let ban_keys: Vec<Option<String>> = policies
            .iter()
            .enumerate()
            .map(|(i, p)| p.ban().map(|_| keys.ban_key(p, clients.of(i))))
            .collect();
        let banned: Vec<Option<u64>> = ban_keys
            .iter()
            .map(|key| key.as_deref().and_then(|key| bans.banned(key, now)))
            .collect();
        let mut answers: Vec<Answer> = if banned.iter().any(Option::is_some) {
            policies
                .iter()
                .zip(&banned)
                .enumerate()
                .map(|(i, (policy, banned))| match banned {
                    Some(left) => Answer::banned(
                        View {
                            remaining: 0,
                            reset_ms: *left,
                        },
                        *left,
                    ),
                    None => self.peek(keys, clients.of(i), policy, cost, now_us).answer,
                })
                .collect()
        } else {
            self.check(query, policies, now_us, |_, answer| answer)
        };
        for ((policy, key), answer) in policies.iter().zip(&ban_keys).zip(&mut answers) {
            let (Some(ban), Some(key)) = (policy.ban(), key) else {
                continue;
            };
            if !matches!(answer.denial, Some(Denial::RetryAfterMs(_)))
                || bans.banned(key, now).is_some()
            {
                continue;
            }
            let millis = ban.millis().unwrap_or_default();
            if let Some(length) = bans.strike(key, millis, now) {
                let view = View {
                    reset_ms: answer.view.reset_ms.max(length),
                    ..answer.view
                };
                *answer = Answer::banned(view, length);
            }
        }
        answers
    }

    /// Settles what `reserved` took by `change`, at `now` (else this process's clock), under
    /// the overrides in force; how many policies changed.
    pub(crate) fn settle(
        &self,
        keys: &KeyScheme,
        reserved: &Reservation,
        change: Change,
        now: Option<Timestamp>,
    ) -> Result<u64, Error> {
        let (set, client) = (&reserved.set, &*reserved.client);
        let each = borrowed_keys(reserved.each.as_ref());
        let clients = Clients {
            client,
            each: each.as_deref(),
        };
        let now_us = now.unwrap_or_else(Timestamp::now).as_micros();
        let overridden = self.overrides().resolve(keys, set, clients, now_us);
        let policies = overridden.as_deref().unwrap_or(set);
        let settlement = Settlement::of(reserved, change, MAX_EXACT);
        let changed = self.settle_policies(keys, clients, policies, settlement, now_us);
        if let Some(id) = &reserved.once {
            let delta = match settlement {
                Settlement::GiveBack { cost, .. } | Settlement::Refund { cost } => {
                    i64::try_from(cost).unwrap_or(i64::MAX)
                }
                Settlement::Charge { cost } => -i64::try_from(cost).unwrap_or(i64::MAX),
            };
            self.recent().resettle(
                &keys.once(set, clients.first(), clients.each, id, true),
                delta,
            );
        }
        Ok(changed)
    }

    /// Settles what `policies` took for `client` (see [`algorithm::refund`] and
    /// [`algorithm::charge`]); how many policies changed.
    fn settle_policies(
        &self,
        keys: &KeyScheme,
        clients: Clients<'_>,
        policies: &[Policy],
        settlement: Settlement,
        now_us: u64,
    ) -> u64 {
        let mut locked = Locked::new(&self.shards, &self.ids, clients, policies.len());
        let mut changed = 0;
        for (i, policy) in policies.iter().enumerate() {
            let id = KeyIds::of(keys, policy, locked.client(i));
            let shard = locked.shard(i);
            match settlement {
                Settlement::GiveBack { .. } | Settlement::Refund { .. } => {
                    let entry = shard.entries.get_mut(id);
                    let live = entry.filter(|entry| entry.expires_at_us > now_us);
                    let given = live
                        .and_then(|entry| entry.state.as_mut())
                        .is_some_and(|state| match settlement {
                            Settlement::GiveBack { cost, at_us } => {
                                algorithm::refund(policy, state, at_us, now_us, cost)
                            }
                            _ => algorithm::refund_now(policy, state, now_us, settlement.cost()),
                        });
                    changed += u64::from(given);
                }
                Settlement::Charge { cost } => {
                    let write = algorithm::charge(policy, shard.live(id, now_us), now_us, cost);
                    let expires_at_us = now_us.saturating_add(write.ttl_ms.saturating_mul(1000));
                    shard.write(id, write.update, expires_at_us, now_us);
                    changed += 1;
                }
            }
        }
        changed
    }

    /// The client's id and its shard, locked: every key of one client lives there.
    fn shard_of(&self, client: &str) -> (ClientId, MutexGuard<'_, Shard>) {
        let client = self.ids.id(client);
        let shard = self.shards[ClientIds::shard(client, SHARDS)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (client, shard)
    }
}

impl Shard {
    /// One policy: a single lookup decides and writes.
    fn check_one(&mut self, policy: &Policy, id: KeyId, cost: u64, now_us: u64) -> Answer {
        let entry = self.entries.get_mut(id);
        let state = entry
            .as_ref()
            .filter(|entry| entry.expires_at_us > now_us)
            .and_then(|entry| entry.state.as_ref());
        let plan = algorithm::plan(policy, state, now_us, cost);
        let (after, write) = match plan.outcome {
            Err(denial) => return Answer::denied(plan.before, denial),
            Ok(admitted) => admitted,
        };
        if let Some(write) = write {
            let expires_at_us = now_us.saturating_add(write.ttl_ms.saturating_mul(1000));
            match entry {
                Some(entry) => entry.apply(write.update, expires_at_us, now_us),
                None => self.insert(id, write.update, expires_at_us, now_us),
            }
        }
        Answer::allowed(after, plan.delay_ms)
    }

    /// The key's state unless it has expired.
    fn live(&self, id: KeyId, now_us: u64) -> Option<&State> {
        self.entries
            .get(id)
            .filter(|entry| entry.expires_at_us > now_us)
            .and_then(|entry| entry.state.as_ref())
    }

    fn write(&mut self, id: KeyId, update: algorithm::Update, expires_at_us: u64, now_us: u64) {
        match self.entries.get_mut(id) {
            Some(entry) => entry.apply(update, expires_at_us, now_us),
            None => self.insert(id, update, expires_at_us, now_us),
        }
    }

    fn insert(&mut self, id: KeyId, update: algorithm::Update, expires_at_us: u64, now_us: u64) {
        let mut state = None;
        algorithm::apply(&mut state, update);
        let entry = Entry {
            state,
            expires_at_us,
        };
        self.entries.insert(id, entry, now_us);
    }
}

/// Builds a [`MemoryBackend`]; see [`MemoryBackend::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MemoryBackendBuilder {
    max_keys: usize,
}

impl MemoryBackendBuilder {
    /// The most keys tracked at once. Defaults to 100,000. Keys are spread over 16 shards by
    /// client, each holding a sixteenth of this.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Builds the backend.
    ///
    /// # Errors
    /// [`ConfigError::Zero`] when `max_keys` is zero.
    pub fn build(self) -> Result<MemoryBackend, ConfigError> {
        if self.max_keys == 0 {
            return Err(ConfigError::Zero { field: "max_keys" });
        }
        Ok(MemoryBackend::with_capacity(self.max_keys))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Algorithm, KeyScheme, PolicySet, check_request::Options};

    fn gcra() -> Policy {
        Policy::builder("p", Algorithm::Gcra)
            .limit(1)
            .window(Duration::from_secs(10))
            .build()
            .expect("valid")
    }

    fn bounded(max_keys: usize) -> MemoryBackend {
        MemoryBackend::builder()
            .max_keys(max_keys)
            .build()
            .expect("valid")
    }

    fn hit(backend: &MemoryBackend, policy: &Policy, client: &str, now_ms: u64) -> Answer {
        let set = PolicySet::from(policy.clone());
        let query = Query {
            keys: &KeyScheme::default(),
            set: &set,
            client,
            options: &Options::default(),
        };
        let mut answers: Vec<Answer> = backend.check(query, &set, now_ms * 1000, |_, a| a);
        answers.remove(0)
    }

    #[test]
    fn an_entry_takes_one_cache_line() {
        assert_eq!(crate::key_table::slot_size::<Entry>(), 64);
    }

    #[test]
    fn never_tracks_more_than_max_keys() {
        let backend = bounded(64);
        let policy = gcra();
        for client in 0..1_000 {
            hit(&backend, &policy, &format!("c{client}"), 1_000);
        }
        assert!(backend.len() <= 64, "{}", backend.len());
    }

    #[test]
    fn expired_state_is_dropped_before_live_state() {
        // One shard's worth: 16 keys in all, 1 per shard.
        let backend = bounded(16);
        let policy = gcra();
        let blocked = hit(&backend, &policy, "old", 0);
        assert!(blocked.denial.is_none());
        // Long after "old" expired, new clients take its room; a live client keeps its state.
        for client in 0..200 {
            hit(&backend, &policy, &format!("n{client}"), 60_000);
        }
        let live = "n199";
        assert!(
            hit(&backend, &policy, live, 60_001).denial.is_some(),
            "still limited"
        );
    }

    #[test]
    fn a_full_shard_evicts_the_key_closest_to_expiry() {
        // Two keys per shard.
        let backend = bounded(32);
        let policy = gcra();
        let shard_of = |client: &str| ClientIds::shard(backend.ids.id(client), SHARDS);
        let same: Vec<String> = (0..)
            .map(|i| format!("k{i}"))
            .filter(|c| shard_of(c) == shard_of("k0"))
            .take(3)
            .collect();
        // same[0] expires at 10 s, same[1] at 11 s; neither has expired when same[2] arrives.
        hit(&backend, &policy, &same[0], 0);
        hit(&backend, &policy, &same[1], 1_000);
        hit(&backend, &policy, &same[2], 2_000);
        assert_eq!(backend.len(), 2);
        assert!(
            hit(&backend, &policy, &same[1], 2_001).denial.is_some(),
            "the later-expiring key kept its state"
        );
        assert!(
            hit(&backend, &policy, &same[0], 2_002).denial.is_none(),
            "the evicted key starts over with a full quota"
        );
    }
}
