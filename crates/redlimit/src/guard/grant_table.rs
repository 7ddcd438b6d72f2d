//! Hot-key mode's grants: units a guard took from the backend beyond a request's cost, spent by
//! that client's next requests in process (see [`Grants`](crate::Grants)).

use std::{
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::{
    Decision, Decisions, Grants, Reason,
    client_id::{ClientId, ClientIds},
    key_table::{Expiring, KeyTable},
};

const SHARDS: usize = 16;
/// The most clients whose grants a guard keeps; a client dropped only fetches anew.
const MAX_CLIENTS: usize = 10_000;

/// One guard's grants, by client.
#[derive(Debug)]
pub(super) struct GrantTable {
    ids: ClientIds,
    shards: Box<[Mutex<KeyTable<Entry>>]>,
    max: u64,
    life_us: u64,
}

/// One client's grants and what sizes the next.
#[derive(Debug, Default)]
struct Entry {
    /// Live grants, oldest first: spent in that order. Two at most but for a moment, the one
    /// being spent and the one fetched when it was half spent.
    grants: Vec<Arc<Grant>>,
    /// Whether a fetch is under way: one at a time per client.
    fetching: bool,
    /// Requests seen since the last fetch began, and when it began (us; 0: never).
    seen: u64,
    since_us: u64,
    /// The size the last fetch asked for.
    size: u64,
    /// The lowest quota of the first policy an exact check answered since the newest grant's
    /// fetch began, and since the last fetch began: one that ran after a grant was taken
    /// lowers what that grant's quota says, and it was answered after its fetch began.
    low: Option<u64>,
    next_low: Option<u64>,
}

impl Entry {
    fn held(&self) -> u64 {
        self.grants
            .iter()
            .map(|g| g.left.load(Ordering::Acquire))
            .sum()
    }

    /// `decisions` as a check reports them, with what is held. While a grant lives, the
    /// backend's quota now is the lowest of the newest grant's and of the exact checks'
    /// answered since its fetch began (nothing ran after it but those), so each policy's quota
    /// is lowered by how far its first policy's is above that.
    fn report(&self, decisions: &Decisions, reason: Reason) -> Decisions {
        let first = decisions.first().map_or(0, |d| d.remaining);
        let newest = self.grants.last().and_then(|g| g.reserved.first());
        let floor = newest.map_or(first, |d| d.remaining.min(self.low.unwrap_or(u64::MAX)));
        local(decisions, first.saturating_sub(floor), self.held(), reason)
    }
}

impl Expiring for Entry {
    fn expires_at_us(&self) -> u64 {
        self.grants.iter().map(|g| g.expires_us).max().unwrap_or(0)
    }
}

/// Units taken from the backend with `reserved`, an admitted reservation of the request's cost
/// and the grant's; what is left of them is given back when the grant's life ends.
#[derive(Debug)]
pub(super) struct Grant {
    left: AtomicU64,
    expires_us: u64,
    pub(super) reserved: Decisions,
}

impl Grant {
    /// Takes what is left of the grant, for good: what its end gives back.
    pub(super) fn end(&self) -> u64 {
        self.left.swap(0, Ordering::AcqRel)
    }

    fn spend(&self, cost: u64) -> bool {
        self.left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(cost)
            })
            .is_ok()
    }

    fn live(&self, now_us: u64) -> bool {
        now_us < self.expires_us && self.left.load(Ordering::Acquire) > 0
    }
}

/// What a check in hot-key mode does.
pub(super) enum Spend {
    /// Decided in process; a fetch to start in the background when the grants run low.
    Local(Decisions, Option<Fetch>),
    /// Goes to the backend.
    Backend(Pending),
}

/// A check of a client in hot-key mode that went to the backend.
pub(super) enum Pending {
    /// Taking a grant, when the fetch asks for more than nothing.
    Fetch(Fetch),
    /// Exact: a fetch for this client is under way.
    Exact(ClientId),
}

impl Pending {
    /// The most the check takes beyond its cost, when it takes a grant.
    pub(super) fn grant(&self) -> Option<u64> {
        match self {
            Self::Fetch(fetch) if fetch.size > 0 => Some(fetch.size),
            _ => None,
        }
    }
}

/// A fetch of a grant under way: clears the client's mark when dropped, whatever became of it.
#[derive(Debug)]
pub(super) struct Fetch {
    table: Arc<GrantTable>,
    id: ClientId,
    /// The most the fetch takes beyond its request's cost (0: nothing, an exact check).
    pub(super) size: u64,
    sent_us: u64,
}

impl Drop for Fetch {
    fn drop(&mut self) {
        if let Some(entry) = self.table.shard(self.id).get_mut(self.id) {
            entry.fetching = false;
        }
    }
}

impl GrantTable {
    pub(super) fn new(grants: Grants) -> Self {
        let per_shard = MAX_CLIENTS.div_ceil(SHARDS);
        Self {
            ids: ClientIds::default(),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(KeyTable::new(per_shard)))
                .collect(),
            max: grants.max(),
            life_us: u64::try_from(grants.life_span().as_micros()).unwrap_or(u64::MAX),
        }
    }

    fn shard(&self, id: ClientId) -> MutexGuard<'_, KeyTable<Entry>> {
        self.shards[ClientIds::shard(id, SHARDS)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A check of `cost` by `client` at `now_us`: spent from its grants if they hold enough,
    /// else a fetch (one at a time), else exact.
    pub(super) fn spend(self: &Arc<Self>, client: &str, cost: u64, now_us: u64) -> Spend {
        let id = self.ids.id(client);
        let mut shard = self.shard(id);
        if shard.get_mut(id).is_none() {
            shard.insert(id, Entry::default(), now_us);
        }
        let Some(entry) = shard.get_mut(id) else {
            return Spend::Backend(Pending::Exact(id));
        };
        entry.seen += 1;
        entry.grants.retain(|grant| grant.live(now_us));
        if entry.grants.iter().any(|grant| grant.spend(cost)) {
            let newest = entry.grants.last().map(|g| &g.reserved);
            let decisions = newest.map(|d| entry.report(d, Reason::Grant));
            // Half spent: the next grant is fetched while this one lasts.
            let refill = (!entry.fetching && entry.held() * 2 < entry.size)
                .then(|| self.begin(entry, id, now_us));
            if let Some(decisions) = decisions {
                return Spend::Local(decisions, refill);
            }
        }
        if entry.fetching {
            return Spend::Backend(Pending::Exact(id));
        }
        Spend::Backend(Pending::Fetch(self.begin(entry, id, now_us)))
    }

    /// Marks a fetch for `entry` under way, sized to the requests it saw in half a grant's
    /// life (since the last fetch began), at most the grants' `max`.
    fn begin(self: &Arc<Self>, entry: &mut Entry, id: ClientId, now_us: u64) -> Fetch {
        let elapsed = now_us.saturating_sub(entry.since_us).max(1);
        let size = if entry.since_us == 0 {
            0
        } else {
            let wanted =
                u128::from(entry.seen) * u128::from(self.life_us / 2) / u128::from(elapsed);
            u64::try_from(wanted).unwrap_or(u64::MAX).min(self.max)
        };
        (entry.fetching, entry.seen, entry.since_us, entry.size) = (true, 0, now_us.max(1), size);
        entry.next_low = None;
        Fetch {
            table: Arc::clone(self),
            id,
            size,
            sent_us: now_us,
        }
    }

    /// The backend's `decisions` on a check of `cost` that was `pending`, as the check reports
    /// them, and the grant it took (to give back what is left of it when its life ends).
    pub(super) fn answered(
        &self,
        pending: Pending,
        cost: u64,
        decisions: Decisions,
    ) -> (Option<(Arc<Grant>, Duration)>, Decisions) {
        match pending {
            Pending::Fetch(fetch) => self.fetched(fetch, cost, decisions),
            Pending::Exact(id) => (None, self.exact(id, decisions)),
        }
    }

    /// Keeps what `fetch` took beyond `cost` (its `decisions`' reservation) as a grant living
    /// until its life or its first policy's window ends, whichever is sooner; returns it (for
    /// its end to give back what is left), and the decisions as the check reports them.
    fn fetched(
        &self,
        fetch: Fetch,
        cost: u64,
        decisions: Decisions,
    ) -> (Option<(Arc<Grant>, Duration)>, Decisions) {
        let extra = decisions
            .reserved_cost()
            .map_or(0, |taken| taken.saturating_sub(cost));
        // Ends by the soonest reset (a fixed window's grant is spent in its window), less 1 ms
        // for the rounding of the reply's milliseconds.
        let reset_us = decisions
            .iter()
            .map(|d| u64::try_from(d.reset_after.as_micros()).unwrap_or(u64::MAX))
            .min()
            .unwrap_or(0);
        let life_us = self.life_us.min(reset_us.saturating_sub(1000));
        let mut shard = self.shard(fetch.id);
        if shard.get_mut(fetch.id).is_none() {
            let entry = Entry {
                since_us: fetch.sent_us.max(1),
                size: fetch.size,
                ..Entry::default()
            };
            shard.insert(fetch.id, entry, fetch.sent_us);
        }
        let Some(entry) = shard.get_mut(fetch.id) else {
            return (None, decisions);
        };
        if extra == 0 || life_us == 0 {
            return (None, entry.report(&decisions, Reason::Redis));
        }
        let grant = Arc::new(Grant {
            left: AtomicU64::new(extra),
            expires_us: fetch.sent_us.saturating_add(life_us),
            reserved: decisions,
        });
        entry.grants.push(Arc::clone(&grant));
        entry.low = entry.next_low;
        let decisions = entry.report(&grant.reserved, Reason::Redis);
        (Some((grant, Duration::from_micros(life_us))), decisions)
    }

    /// An exact check's `decisions` for the client `id`, as the check reports them: with what
    /// its grants hold; an admitted one lowers what they report.
    fn exact(&self, id: ClientId, decisions: Decisions) -> Decisions {
        let mut shard = self.shard(id);
        let Some(entry) = shard.get_mut(id) else {
            return decisions;
        };
        if decisions.allowed() {
            let first = decisions.first().map_or(0, |d| d.remaining);
            let lower = |low: Option<u64>| Some(low.map_or(first, |low| low.min(first)));
            (entry.low, entry.next_low) = (lower(entry.low), lower(entry.next_low));
        }
        entry.report(&decisions, Reason::Redis)
    }
}

/// `decisions` as a check reports them with `held` units granted in process and `lag` taken
/// since they were answered: each policy's quota so moved, decided by `reason`, no
/// reservation.
fn local(decisions: &Decisions, lag: u64, held: u64, reason: Reason) -> Decisions {
    let items: Vec<Decision> = decisions
        .iter()
        .map(|d| Decision {
            remaining: d.remaining.saturating_sub(lag).saturating_add(held),
            reason,
            ..d.clone()
        })
        .collect();
    Decisions::new(items)
}
