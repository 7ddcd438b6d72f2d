//! The check path: a check encoded once, decided alone or in a batch, its reply read into
//! decisions; and the settle of a reservation, a script call of its own.

use std::{sync::Arc, time::Duration};

use futures_util::FutureExt as _;

use super::{
    RedisBackend,
    across_slots::{Part, SlotGroup},
    batch::Member,
    protocol::{self, LeaseRequest, Reply, Request},
};
use crate::{
    Decision, Decisions, Error, ErrorKind, KeyScheme, Lease, Policy, PolicySet, Reason, Timestamp,
    backend::{
        answer::{decision, mark_overridden},
        query::{Change, Clients, Query, Settlement, Started, stamp},
    },
    check_request::{Options, borrowed_keys, owned_keys},
    concurrency::lease_id,
    decisions::Reservation,
    policy::MAX_EXACT,
};

impl Member {
    /// The call of `request` alone for `slot`'s batches, answered by `deadline`.
    pub(super) fn alone(
        keys: &KeyScheme,
        now_us: Option<u64>,
        request: &Request<'_>,
        slot: u16,
        deadline: tokio::time::Instant,
    ) -> Self {
        Self {
            call: Box::new(protocol::encode(keys, now_us, &[*request])),
            lean: request.lean(),
            reply_len: request.reply_len(),
            slot,
            deadline,
        }
    }
}

impl RedisBackend {
    /// Begins `query`: sent when the returned future is first polled.
    pub(crate) fn start(&self, query: Query<'_>) -> Started {
        let (keys, client, options) = (query.keys, query.client, query.options);
        let clients = query.clients();
        let slot = match self.slot_of(keys, clients, query.set.len()) {
            Slot::One(_) if options.give_back => return self.start_refund(query),
            Slot::One(slot) => slot,
            Slot::Several(_) if options.give_back => {
                return Started::Ready(Err(Error::new(
                    ErrorKind::InvalidInput,
                    "a give-back of keys in several Cluster slots (give back each slot's apart)",
                )));
            }
            Slot::Several(groups) => return self.start_across(query, groups),
        };
        // A lease of the set's concurrency limit, under the check's first key.
        let lease = query.set.concurrency().map(|policy| {
            let key = policy.key(keys, clients.first());
            (policy, key, lease_id())
        });
        // Encoded here, so the future owns only what the reply needs.
        let request = Request {
            cost: options.cost,
            once: options.once,
            reserve: options.reserve,
            each: options.keys,
            lease: lease
                .as_ref()
                .map(|(policy, key, id)| LeaseRequest { policy, key, id }),
            grant: options.grant,
            ..Request::new(query.set, client)
        };
        let now_us = options.at.map(Timestamp::as_micros);
        let budget = options.budget.unwrap_or(self.inner.budget);
        let deadline = tokio::time::Instant::now() + budget;
        let member = Member::alone(keys, now_us, &request, slot, deadline);
        let (redis, set) = (self.clone(), query.set.clone());
        // Only a reservation keeps its clients and request id, for the settle.
        let (client, each, once) = if options.reserve {
            let each = owned_keys(options.keys);
            let once = options.once.map(|(id, _)| id.to_owned());
            (client.to_owned(), each, once)
        } else {
            (String::new(), None, None)
        };
        let options = Options {
            once: None,
            keys: None,
            ..*options
        };
        let lease = lease.map(|(_, key, id)| (key, id));
        Started::Waiting(Box::pin(async move {
            let concurrency = set.concurrency();
            let request = Request {
                reserve: options.reserve,
                grant: options.grant,
                lease: concurrency
                    .zip(lease.as_ref())
                    .map(|(policy, (key, id))| LeaseRequest { policy, key, id }),
                ..Request::new(&set, "")
            };
            let reply = redis.reply_alone(member, request, budget).await?;
            let (taken_at_us, granted) = (reply.taken_at_us, reply.granted);
            let decisions = leased(&set, reply, lease, &redis);
            let each = borrowed_keys(each.as_ref());
            // A grant's reservation is of everything it took.
            let options = Options {
                once: once.as_deref().map(|id| (id, 0)),
                keys: each.as_deref(),
                cost: options.cost + granted,
                ..options
            };
            Ok(stamp(decisions, &options, &set, &client, taken_at_us))
        }))
    }

    /// Begins a give-back of `query`: the settle script's refund, one call, its reply the
    /// policies' quotas after it; then an operator event, as a reset's, so that no instance
    /// keeps blocking the client locally on a count that fell.
    fn start_refund(&self, query: Query<'_>) -> Started {
        let (keys, options) = (query.keys, query.options);
        let (channel, first) = (
            keys.events_channel(),
            keys.key(&query.set[0], query.clients().first()),
        );
        let request = Request {
            cost: options.cost,
            each: options.keys,
            refund: true,
            ..Request::new(query.set, query.client)
        };
        let call = protocol::encode(keys, options.at.map(Timestamp::as_micros), &[request]);
        let budget = options.budget.unwrap_or(self.inner.budget);
        let (redis, set) = (self.clone(), query.set.clone());
        Started::Waiting(Box::pin(async move {
            let reply = tokio::time::timeout(budget, redis.script(call, |s| &s.settle))
                .await
                .unwrap_or_else(|_| Err(redis.timed_out(budget)))?;
            let request = Request {
                refund: true,
                ..Request::new(&set, "")
            };
            let reply = protocol::decode(&reply, &request)?;
            let items: Arc<[Decision]> = decisions_of(&set, reply).collect();
            redis.publish(&channel, "refund", &first).await?;
            Ok(Decisions::new(items))
        }))
    }

    /// The reply to `member`, a call of `request` alone, read as `request`'s. The check's one
    /// timer (`budget`, to the member's deadline) covers its wait in the queue and its call.
    /// Begun when called (see [`decide`](Self::decide)); a combinator, not an `async fn`, so
    /// that the member and the wait are kept once in its state, not copied beside it.
    pub(super) fn reply_alone<'a>(
        &'a self,
        member: Member,
        request: Request<'a>,
        budget: Duration,
    ) -> impl Future<Output = Result<Reply, Error>> + Send + 'a {
        tokio::time::timeout_at(member.deadline, self.decide(member)).map(move |reply| {
            let reply = reply.unwrap_or_else(|_| Err(self.timed_out(budget)))?;
            protocol::decode(&reply, &request)
        })
    }

    /// The Cluster slot of the check's keys, which batches are made of: 0 off a Cluster, and
    /// the slot groups of its policies when their keys live in several.
    fn slot_of(&self, keys: &KeyScheme, clients: Clients<'_>, policies: usize) -> Slot {
        match self.slot_groups(keys, clients, policies) {
            Some(groups) => Slot::Several(groups),
            None => Slot::One(self.first_slot(keys, clients)),
        }
    }

    /// Settles what `reserved` took by `change`, at `now` (else Redis's time); how many
    /// policies changed. A reservation across Cluster slots is settled in each slot group, at
    /// the time its server took.
    pub(crate) async fn settle(
        &self,
        keys: &KeyScheme,
        reserved: &Reservation,
        change: Change,
        now: Option<Timestamp>,
    ) -> Result<u64, Error> {
        let each = borrowed_keys(reserved.each.as_ref());
        let clients = Clients {
            client: &reserved.client,
            each: each.as_deref(),
        };
        let once = reserved.once.as_deref();
        let settlement = Settlement::of(reserved, change, MAX_EXACT);
        let now_us = now.map(Timestamp::as_micros);
        let (Some(groups), Some(times)) = (
            self.slot_groups(keys, clients, reserved.set.len()),
            reserved.at_each.as_deref(),
        ) else {
            let part = Part::of(&reserved.set, clients);
            return self
                .settle_part(keys, &part, once, settlement, now_us, None)
                .await;
        };
        let settles = groups.iter().map(|group| {
            let part = Part::of_group(&reserved.set, clients, group);
            let settlement = settlement.at(times[group.places[0]]);
            async move {
                self.settle_part(keys, &part, once, settlement, now_us, None)
                    .await
            }
        });
        let mut changed = 0;
        for settled in futures_util::future::join_all(settles).await {
            changed += settled?;
        }
        Ok(changed)
    }

    /// Settles `part` of a reservation (with its request id `once`) by `settlement`, at
    /// `now_us` (else Redis's time); how many policies changed.
    pub(super) async fn settle_part(
        &self,
        keys: &KeyScheme,
        part: &Part<'_>,
        once: Option<&str>,
        settlement: Settlement,
        now_us: Option<u64>,
        given: Option<&str>,
    ) -> Result<u64, Error> {
        // With its request id (and as the reservation it was, which names the id's key), so
        // that a retry of the request is answered what is left after the settle.
        let request = Request {
            once: once.map(|id| (id, 0)),
            reserve: true,
            given,
            ..part.request()
        };
        let request = match settlement {
            Settlement::GiveBack { cost, at_us } => Request {
                cost,
                taken_at_us: Some(at_us),
                ..request
            },
            Settlement::Charge { cost } => Request { cost, ..request },
            Settlement::Refund { cost } => Request {
                cost,
                refund: true,
                ..request
            },
        };
        let call = protocol::encode(keys, now_us, &[request]);
        let reply = self.script(call, |scripts| &scripts.settle).await?;
        if request.refund {
            // A refund replies its policies' quotas: each was given back what it held.
            return Ok(request.policies.len() as u64);
        }
        Ok(protocol::decode_settled(&reply)
            .first()
            .copied()
            .unwrap_or(0))
    }
}

/// Where a check's keys live on a Cluster.
enum Slot {
    One(u16),
    Several(Vec<SlotGroup>),
}

/// A check's decisions of `set` from a script's `reply`, holding the lease it took on `redis`
/// (its key and id: `lease`) when its concurrency limit granted one to an admitted check.
fn leased(
    set: &PolicySet,
    mut reply: Reply,
    lease: Option<(String, String)>,
    redis: &RedisBackend,
) -> Decisions {
    let acquired = reply.lease.take();
    let concurrency = set.concurrency().zip(acquired);
    let leased = concurrency.map(|(policy, acquired)| policy.decision(acquired, Reason::Redis));
    // Gathered where they are shared, with no copy.
    let items: Arc<[Decision]> = decisions_of(set, reply).chain(leased).collect();
    let mut decisions = Decisions::new(items);
    mark_overridden(decisions.items_mut(), set);
    match (concurrency, lease) {
        (Some((concurrency, acquired)), Some((key, id)))
            if decisions.allowed() && acquired.granted =>
        {
            let ttl_ms = concurrency.lease_ttl_ms();
            decisions.leased(Lease::new(redis.clone().into(), key, id, ttl_ms))
        }
        _ => decisions,
    }
}

/// A check's decisions of `policies` from a script's `reply`: each policy's answer, with the
/// numbers in force of those that take overrides (which decisions differ from their policies',
/// [`mark_overridden`] tells once they are gathered).
pub(super) fn decisions_of(
    policies: &[Policy],
    reply: Reply,
) -> impl Iterator<Item = Decision> + '_ {
    let mut in_force = reply.in_force.into_iter();
    policies
        .iter()
        .zip(reply.answers)
        .map(move |(policy, answer)| {
            let mut decision = decision(policy, answer, Reason::Redis);
            let numbers = policy.takes_overrides().then(|| in_force.next()).flatten();
            if let Some(numbers) = numbers {
                decision.limit = numbers.limit;
                decision.window = Duration::from_millis(numbers.window_ms);
                decision.burst = numbers.burst;
            }
            decision
        })
}
