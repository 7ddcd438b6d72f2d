//! A check whose keys live in several slots of a Redis Cluster (an IP's key and an API key's,
//! untagged): decided in one call per slot group, all sent at once, and kept all or nothing by
//! giving back.
//!
//! Each slot group is a check of its policies, all or nothing within it as any check, taken by
//! its own server at its own time. When every group admits, the check is admitted; when one
//! denies or fails, the groups that took give back what they took before the check is
//! answered, within its budget. No policy ever admits above its limit, since every take is one
//! atomic check against that limit; what other requests see meanwhile is only ever less quota
//! (the part taken, for the round trip of the give-back), never more. If a group's primary dies
//! between its take and the give-back, what it took stays taken until its window passes: a
//! refused request may then have spent quota, but never is one request too many admitted. The
//! same holds for a take whose answer did not come within the budget: whether it ran is
//! unknown, so nothing is given back for it; and for a give-back left unanswered, which makes a
//! check that failed fail as unanswered (a timeout), so that its caller knows it may have spent.

use std::borrow::Cow;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::{
    RedisBackend,
    batch::Member,
    check::decisions_of,
    protocol::{LeaseRequest, Request},
};
use crate::{
    Decision, Decisions, Error, KeyScheme, Lease, Policy, Reason, Timestamp,
    backend::{
        answer::mark_overridden,
        query::{Clients, Query, Settlement, Started},
    },
    check_request::OwnedKeys,
    concurrency::lease_id,
    decisions::Reservation,
};

/// The policies of a check whose keys live in one Cluster slot, by their places in the set.
pub(super) struct SlotGroup {
    pub(super) slot: u16,
    pub(super) places: Vec<usize>,
}

/// Some of a check's policies and their clients' keys: a slot group's, or all of them.
pub(super) struct Part<'a> {
    policies: Cow<'a, [Policy]>,
    client: &'a str,
    each: Option<Cow<'a, [&'a str]>>,
}

impl<'a> Part<'a> {
    /// All of `set`, for `clients`.
    pub(super) fn of(set: &'a [Policy], clients: Clients<'a>) -> Self {
        Self {
            policies: Cow::Borrowed(set),
            client: clients.client,
            each: clients.each.map(Cow::Borrowed),
        }
    }

    /// The policies of `set` in `group`, each under its own key of `clients`.
    pub(super) fn of_group(set: &[Policy], clients: Clients<'a>, group: &SlotGroup) -> Self {
        let each: Vec<&'a str> = group.places.iter().map(|&i| clients.of(i)).collect();
        Self {
            policies: group.places.iter().map(|&i| set[i].clone()).collect(),
            client: each[0],
            each: Some(Cow::Owned(each)),
        }
    }

    /// A plain check of cost 1 of this part.
    pub(super) fn request(&self) -> Request<'_> {
        Request {
            each: self.each.as_deref(),
            ..Request::new(&self.policies, self.client)
        }
    }
}

impl RedisBackend {
    /// The Cluster slot of the check's first key; 0 off a Cluster.
    pub(super) fn first_slot(&self, keys: &KeyScheme, clients: Clients<'_>) -> u16 {
        #[cfg(feature = "cluster")]
        if self.is_cluster() {
            return keys.slot(clients.first());
        }
        let _ = (keys, clients);
        0
    }

    /// The slot groups of a check's policies, in the order of their first policies, when on a
    /// Cluster their keys live in more than one slot; `None` otherwise.
    pub(super) fn slot_groups(
        &self,
        keys: &KeyScheme,
        clients: Clients<'_>,
        policies: usize,
    ) -> Option<Vec<SlotGroup>> {
        #[cfg(feature = "cluster")]
        if self.is_cluster() && clients.each.is_some() {
            let mut groups: Vec<SlotGroup> = Vec::new();
            for i in 0..policies {
                let slot = keys.slot(clients.of(i));
                match groups.iter_mut().find(|group| group.slot == slot) {
                    Some(group) => group.places.push(i),
                    None => groups.push(SlotGroup {
                        slot,
                        places: vec![i],
                    }),
                }
            }
            return (groups.len() > 1).then_some(groups);
        }
        let _ = (keys, clients, policies);
        None
    }

    /// Begins `query`, whose keys live in the slots of `groups`: a reservation in each group,
    /// sent at once, given back in the groups that took when another denies or fails.
    pub(super) fn start_across(&self, query: Query<'_>, groups: Vec<SlotGroup>) -> Started {
        let options = *query.options;
        let budget = options.budget.unwrap_or(self.inner.budget);
        let deadline = Instant::now() + budget;
        let clients = query.clients();
        let each: OwnedKeys = (0..query.set.len()).map(|i| clients.of(i).into()).collect();
        let once = options
            .once
            .map(|(id, window)| (Box::<str>::from(id), window));
        let client: Box<str> = query.client.into();
        let (redis, set, scheme) = (self.clone(), query.set.clone(), query.keys.clone());
        // The set's concurrency limit is decided in the first group, whose slot its key (under
        // the first client's) shares.
        let mut lease = set
            .concurrency()
            .map(|policy| (policy.key(&scheme, clients.first()), lease_id()));
        Started::Waiting(Box::pin(async move {
            let keys: Vec<&str> = each.iter().map(|key| &**key).collect();
            let clients = Clients {
                client: &client,
                each: Some(&keys),
            };
            let parts: Vec<Part<'_>> = groups
                .iter()
                .map(|group| Part::of_group(&set, clients, group))
                .collect();
            let once = once.as_ref().map(|(id, window)| (&**id, *window));
            let now_us = options.at.map(Timestamp::as_micros);
            let concurrency = set.concurrency();
            let takes = parts
                .iter()
                .zip(&groups)
                .enumerate()
                .map(|(i, (part, group))| {
                    // Reserved, whatever the check asked: the time it took at is what a give-back
                    // needs.
                    let request = Request {
                        cost: options.cost,
                        once,
                        reserve: true,
                        lease: concurrency
                            .zip(lease.as_ref())
                            .filter(|_| i == 0)
                            .map(|(policy, (key, id))| LeaseRequest { policy, key, id }),
                        ..part.request()
                    };
                    let member = Member::alone(&scheme, now_us, &request, group.slot, deadline);
                    redis.reply_alone(member, request, budget)
                });
            let mut decided: Vec<Option<Decision>> = vec![None; set.len()];
            // Whether each group admitted, and the time it took at (its server's) when it took
            // (a retry's replay took nothing).
            let mut admitted: Vec<Option<Option<u64>>> = vec![None; groups.len()];
            let mut failed = None;
            // The concurrency limit's decision, and the lease it took: given back when dropped
            // unless the check is admitted.
            let (mut leased, mut held) = (None, None);
            for (i, reply) in join_all(takes).await.into_iter().enumerate() {
                let mut reply = match reply {
                    Ok(reply) => reply,
                    Err(error) => {
                        // A timeout first: a take left unanswered may have run, and its check
                        // must say so (see the module's docs), whatever another group failed.
                        if error.is_timeout() || failed.is_none() {
                            failed = Some(error);
                        }
                        continue;
                    }
                };
                let at_us = reply.taken_at_us;
                let acquired = reply.lease.take();
                let mut decisions: Vec<Decision> =
                    decisions_of(&parts[i].policies, reply).collect();
                mark_overridden(&mut decisions, &parts[i].policies);
                // The group's policies, and its lease when it carried one.
                let mut all = decisions.iter().all(|decision| decision.allowed);
                if let (Some(policy), Some(acquired)) = (concurrency, acquired) {
                    leased = Some(policy.decision(acquired, Reason::Redis));
                    if all && acquired.granted && options.cost > 0 {
                        held = lease.take().map(|(key, id)| {
                            Lease::new(redis.clone().into(), key, id, policy.lease_ttl_ms())
                        });
                    }
                    all = all && acquired.granted;
                }
                if all {
                    admitted[i] = Some(at_us);
                }
                for (&place, decision) in groups[i].places.iter().zip(decisions) {
                    decided[place] = Some(decision);
                }
            }
            let every = failed.is_none() && admitted.iter().all(Option::is_some);
            if !every && options.cost > 0 {
                let given = admitted.iter().enumerate().filter_map(|(i, took)| {
                    let at_us = (*took).flatten()?;
                    // A task of its own: a caller that stops waiting does not stop it.
                    let back = GiveBack {
                        redis: redis.clone(),
                        scheme: scheme.clone(),
                        policies: parts[i].policies.to_vec(),
                        keys: groups[i].places.iter().map(|&p| each[p].clone()).collect(),
                        once: once.map(|(id, _)| id.into()),
                        cost: options.cost,
                        at_us,
                    };
                    Some(async move { (i, tokio::spawn(back.run()).await) })
                });
                for (i, given) in join_all(given).await {
                    match given {
                        Ok(Ok(_)) => {
                            // As a check denied on one server answers: each policy's quota
                            // before the request.
                            for &place in &groups[i].places {
                                if let Some(decision) = &mut decided[place] {
                                    decision.remaining = decision
                                        .remaining
                                        .saturating_add(options.cost)
                                        .min(decision.limit);
                                }
                            }
                        }
                        Ok(Err(error)) => {
                            tracing::warn!(
                                %error,
                                "a refused check across Cluster slots could not give back what \
                                 one slot took: it stays taken until its window passes"
                            );
                            // A failing check whose give-back went unanswered fails as unanswered:
                            // whether it spent quota is unknown, as for a take left unanswered. A
                            // refusal stays one, so that no failure policy admits what a policy
                            // denied.
                            if error.is_timeout() && failed.is_some() {
                                failed = Some(error);
                            }
                        }
                        Err(error) => tracing::warn!(%error, "a give-back's task failed"),
                    }
                }
            }
            if let Some(error) = failed {
                return Err(error);
            }
            let decisions = Decisions::new(
                decided
                    .into_iter()
                    .flatten()
                    .chain(leased)
                    .collect::<std::sync::Arc<[_]>>(),
            );
            let decisions = match held {
                Some(lease) if every => decisions.leased(lease),
                _ => decisions,
            };
            let times: Option<Vec<u64>> = admitted.iter().map(|took| (*took).flatten()).collect();
            match times {
                Some(times) if every && options.reserve && options.cost > 0 => {
                    let mut at_each = vec![0; set.len()];
                    for (group, at_us) in groups.iter().zip(times) {
                        for &place in &group.places {
                            at_each[place] = at_us;
                        }
                    }
                    Ok(decisions.reserved(Reservation {
                        set: set.clone(),
                        client: client.clone(),
                        cost: options.cost,
                        at_us: at_each[0],
                        once: once.map(|(id, _)| id.into()),
                        each: Some(each.clone()),
                        at_each: Some(at_each.into()),
                    }))
                }
                _ => Ok(decisions),
            }
        }))
    }
}

/// What one slot group of a refused check gives back, owned by a task of its own.
struct GiveBack {
    redis: RedisBackend,
    scheme: KeyScheme,
    policies: Vec<Policy>,
    keys: Vec<Box<str>>,
    once: Option<Box<str>>,
    cost: u64,
    at_us: u64,
}

impl GiveBack {
    /// Gives back, sent again while it fails (up to [`GIVE_BACK_SENDS`] times): a Cluster client
    /// that stalled may never have sent it, or Redis ran it and the answer was lost, so it
    /// carries a token by which only its first run gives back.
    async fn run(self) -> Result<u64, Error> {
        let keys: Vec<&str> = self.keys.iter().map(|key| &**key).collect();
        let part = Part {
            policies: Cow::Borrowed(&self.policies),
            client: keys[0],
            each: Some(Cow::Borrowed(&keys)),
        };
        let settlement = Settlement::GiveBack {
            cost: self.cost,
            at_us: self.at_us,
        };
        let token = lease_id();
        let mut sent = 1;
        loop {
            let given = self
                .redis
                .settle_part(
                    &self.scheme,
                    &part,
                    self.once.as_deref(),
                    settlement,
                    None,
                    Some(&token),
                )
                .await;
            match given {
                Err(error) if sent < GIVE_BACK_SENDS && !error.is_corrupt_state() => {
                    tracing::debug!(%error, "a give-back across Cluster slots failed: sent again");
                    // Time for a stalled client to be found out and replaced (see held.rs).
                    tokio::time::sleep(RESEND_AFTER).await;
                    sent += 1;
                }
                given => return given,
            }
        }
    }
}

/// How many times a give-back is sent at most, [`RESEND_AFTER`] apart: a stalled Cluster
/// client is found out by probes it leaves unanswered for a second (`PROBE_WAIT`), then
/// replaced.
const GIVE_BACK_SENDS: u32 = 3;
const RESEND_AFTER: std::time::Duration = std::time::Duration::from_secs(1);
