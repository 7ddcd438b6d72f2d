//! The check path: a check encoded once, decided alone or in a batch, its reply read into
//! decisions; and the settle of a reservation, a script call of its own.

use super::{
    RedisBackend,
    batch::Member,
    protocol::{self, Request},
};
use crate::{
    Decisions, Error, ErrorKind, KeyScheme, Reason, Timestamp,
    backend::{
        answer::decision,
        query::{Change, Clients, Query, Settlement, Started, stamp},
    },
    check_request::{Options, borrowed_keys, owned_keys},
    decisions::Reservation,
    policy::MAX_EXACT,
};

impl RedisBackend {
    /// Begins `query`: sent when the returned future is first polled.
    pub(crate) fn start(&self, query: Query<'_>) -> Started {
        let (keys, client, options) = (query.keys, query.client, query.options);
        let clients = query.clients();
        let slot = match self.slot_of(keys, clients, query.set.len()) {
            Ok(slot) => slot,
            Err(error) => return Started::Ready(Err(error)),
        };
        // Encoded here, so the future owns only what the reply needs.
        let request = Request {
            cost: options.cost,
            once: options.once,
            reserve: options.reserve,
            each: options.keys,
            ..Request::new(query.set, client)
        };
        let now_us = options.at.map(Timestamp::as_micros);
        let budget = options.budget.unwrap_or(self.inner.budget);
        let member = Member {
            call: protocol::encode(keys, now_us, &[request]),
            lean: request.lean(),
            reply_len: request.reply_len(),
            slot,
            deadline: tokio::time::Instant::now() + budget,
        };
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
        Started::Waiting(Box::pin(async move {
            let request = Request {
                reserve: options.reserve,
                ..Request::new(&set, "")
            };
            // The check's one timer, over its wait in the queue and its call. Awaited here,
            // not in `within_budget`: a check's future holds redis-rs's large one, and one
            // more layer around it cost about 1 µs of CPU per check in the benchmark's HTTP
            // mode (moves and polls of the larger state).
            let reply = tokio::time::timeout(budget, redis.decide(member))
                .await
                .unwrap_or_else(|_| Err(redis.timed_out(budget)))?;
            let reply = protocol::decode(&reply, &[request])?
                .pop()
                .ok_or_else(|| Error::new(ErrorKind::Backend, "no reply to a check"))?;
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
            let each = borrowed_keys(each.as_ref());
            let options = Options {
                once: once.as_deref().map(|id| (id, 0)),
                keys: each.as_deref(),
                ..options
            };
            Ok(stamp(decisions, &options, &set, &client, reply.taken_at_us))
        }))
    }

    /// The Cluster slot of the check's keys, which batches are made of; 0 off a Cluster. Keys
    /// of one check in different slots cannot go in one call: an error saying so.
    fn slot_of(
        &self,
        keys: &KeyScheme,
        clients: Clients<'_>,
        policies: usize,
    ) -> Result<u16, Error> {
        #[cfg(feature = "cluster")]
        if self.is_cluster() {
            let slot = keys.slot(clients.first());
            if (1..policies).any(|i| keys.slot(clients.of(i)) != slot) {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    "on a Redis Cluster, the keys of one check must share a slot: write them with \
                     one tenant tag ({tenant}ip:10.0.0.1, {tenant}key:k7) under \
                     KeyScheme::tenant_tags",
                ));
            }
            return Ok(slot);
        }
        let _ = (keys, clients, policies);
        Ok(0)
    }

    /// Settles what `reserved` took by `change`, at `now` (else Redis's time); how many
    /// policies changed.
    pub(crate) async fn settle(
        &self,
        keys: &KeyScheme,
        reserved: &Reservation,
        change: Change,
        now: Option<Timestamp>,
    ) -> Result<u64, Error> {
        let (set, client) = (&reserved.set, &*reserved.client);
        // With its request id (and as the reservation it was, which names the id's key), so
        // that a retry of the request is answered what is left after the settle.
        let each = borrowed_keys(reserved.each.as_ref());
        let request = Request {
            once: reserved.once.as_deref().map(|id| (id, 0)),
            reserve: true,
            each: each.as_deref(),
            ..Request::new(set, client)
        };
        let request = match Settlement::of(reserved, change, MAX_EXACT) {
            Settlement::GiveBack { cost, at_us } => Request {
                cost,
                taken_at_us: Some(at_us),
                ..request
            },
            Settlement::Charge { cost } => Request { cost, ..request },
        };
        let call = protocol::encode(keys, now.map(Timestamp::as_micros), &[request]);
        let reply = self.script(call, |scripts| &scripts.settle).await?;
        Ok(protocol::decode_settled(&reply)
            .first()
            .copied()
            .unwrap_or(0))
    }
}
