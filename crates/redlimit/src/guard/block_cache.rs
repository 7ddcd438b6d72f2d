//! Local blocks: once a key is denied with a known wait, further checks of it within that wait
//! are denied in process, with no Redis command.

use std::{
    sync::{
        Mutex, MutexGuard, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::{
    Decision, Decisions, Reason, RetryAfter,
    backend::{DEAF_BLOCK_US, Heard},
    client_id::{ClientId, ClientIds},
    key_table::{Expiring, KeyTable},
};

const SHARDS: usize = 16;

/// Remembers denied clients until the earliest moment their request could pass, so a flood from
/// one client costs Redis nothing while it lasts.
///
/// A block is recorded when a check of cost `c` is denied with a wait; it then denies checks of
/// cost `c` or more by the same client until the wait is over, counted from when the denied check
/// was *sent* and less 1 ms of rounding. That makes it safe: every algorithm reports the earliest
/// time the same cost could pass, its usage only falls as time passes, and other requests only
/// add to it, so within the block Redis would deny those checks too. It never allows anything,
/// and it never denies what Redis would allow for the same key and cost. This holds for the
/// sliding algorithms too (their estimates fall monotonically between requests); smaller costs
/// and peeks (cost 0) always go to Redis.
///
/// A locally blocked check reports the decisions of the denial that set the block (their quota
/// figures as they were then), with reason [`Reason::LocalBlock`] and the wait that is left.
///
/// Operators' actions reach it: [`Limiter::reset`](crate::Limiter::reset), `set_override` and
/// `clear_override` publish an event that every instance's Redis backend hears on one connection
/// of its own, and a block recorded before the latest event is not used (every block: resets
/// are rare, and each blocked client's next check then goes to Redis once). While the listener
/// is not connected (Redis restarting, a failover), a block is used for at most 1 s after it
/// was recorded, so a reset is never hidden for longer.
///
/// Bounded: at most `max_keys` blocks, each of a fixed size whatever the client's key (clients
/// are kept as 128-bit keyed hashes, never as their text); when full, expired blocks go first,
/// then the sixteenth ending soonest. Dropping a block only sends that client's next check to
/// Redis.
#[derive(Debug)]
pub struct BlockCache {
    ids: ClientIds,
    shards: Box<[Mutex<KeyTable<Block>>]>,
    /// When the last block recorded ends (us): until then a check looks its client up; after
    /// it, none can be blocked, and a check neither hashes its client nor takes a lock.
    last_until_us: AtomicU64,
    #[cfg(test)]
    pub(crate) counts: counts::Counts,
}

#[derive(Debug, Default)]
struct Block {
    until_us: u64,
    min_cost: u64,
    decisions: Vec<Decision>,
    /// When it was recorded, under how many operator events heard, and whether a listener
    /// heard events then: one recorded deaf may have missed an event already, so it is used
    /// for at most [`DEAF_BLOCK_US`] even once a listener hears.
    since_us: u64,
    generation: u64,
    heard_since: bool,
}

impl Block {
    /// Whether it still denies `cost` at `now_us`, given what was `heard`.
    fn denies(&self, cost: u64, now_us: u64, heard: Heard) -> bool {
        self.until_us > now_us
            && cost >= self.min_cost
            && self.generation == heard.generation
            && ((heard.listening && self.heard_since)
                || now_us < self.since_us.saturating_add(DEAF_BLOCK_US))
    }
}

impl Expiring for Block {
    fn expires_at_us(&self) -> u64 {
        self.until_us
    }
}

/// Where one client's block is: its id, hashed once per check and used for the lookup and for
/// recording the answer.
#[derive(Debug)]
pub(crate) struct Slot {
    id: ClientId,
}

impl Default for BlockCache {
    /// At most 10,000 blocked clients.
    fn default() -> Self {
        Self::new(10_000)
    }
}

impl BlockCache {
    /// A cache of at most `max_keys` blocked clients (at least 16).
    pub fn new(max_keys: usize) -> Self {
        let per_shard = max_keys.div_ceil(SHARDS).max(1);
        Self {
            ids: ClientIds::default(),
            shards: (0..SHARDS)
                .map(|_| Mutex::new(KeyTable::new(per_shard)))
                .collect(),
            last_until_us: AtomicU64::new(0),
            #[cfg(test)]
            counts: counts::Counts::default(),
        }
    }

    /// Whether a client may be blocked at `now_us`: some block recorded ends after it. Where
    /// none does (the common case on a service not under attack), a check on Redis spares the
    /// client's keyed hash and the shard's lock: some 450 instructions (callgrind, the bench's
    /// `--mode http` on Redis).
    pub(crate) fn may_block(&self, now_us: u64) -> bool {
        now_us < self.last_until_us.load(Ordering::Relaxed)
    }

    /// The slot of `client`.
    pub(crate) fn slot(&self, client: &str) -> Slot {
        #[cfg(test)]
        self.counts.hashed();
        Slot {
            id: self.ids.id(client),
        }
    }

    fn shard(&self, slot: &Slot) -> MutexGuard<'_, KeyTable<Block>> {
        #[cfg(test)]
        self.counts.locked();
        self.shards[ClientIds::shard(slot.id, SHARDS)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The decisions to deny with, if the client at `slot` is blocked for `cost` at `now_us`,
    /// given the operator events `heard`.
    pub(crate) fn blocked(
        &self,
        slot: &Slot,
        cost: u64,
        now_us: u64,
        heard: Heard,
    ) -> Option<Decisions> {
        let shard = self.shard(slot);
        let block = shard
            .get(slot.id)
            .filter(|block| block.denies(cost, now_us, heard))?;
        let left = Duration::from_micros(block.until_us - now_us);
        let decisions: Vec<_> = block
            .decisions
            .iter()
            .map(|d| Decision {
                reason: Reason::LocalBlock,
                retry_after: if d.allowed {
                    d.retry_after
                } else {
                    Some(RetryAfter::After(left))
                },
                ..d.clone()
            })
            .collect();
        Some(Decisions::new(decisions))
    }

    /// Records the answer to a check of `client` (at `slot`, if the check looked it up) of
    /// `cost` sent at `sent_us` (when `heard` was what the backend had heard), if it was a
    /// denial with a wait.
    pub(crate) fn record(
        &self,
        client: &str,
        slot: Option<Slot>,
        cost: u64,
        (sent_us, heard): (u64, Heard),
        decisions: &Decisions,
    ) {
        // Waits are whole milliseconds rounded up: take one off to never block too long.
        let Some(RetryAfter::After(wait)) = decisions.retry_after() else {
            return;
        };
        let wait_us = u64::try_from(wait.as_micros())
            .unwrap_or(u64::MAX)
            .saturating_sub(1000);
        if wait_us == 0 || cost == 0 {
            return;
        }
        let block = Block {
            until_us: sent_us.saturating_add(wait_us),
            min_cost: cost,
            decisions: decisions.to_vec(),
            since_us: sent_us,
            generation: heard.generation,
            heard_since: heard.listening,
        };
        self.last_until_us
            .fetch_max(block.until_us, Ordering::Relaxed);
        let slot = slot.unwrap_or_else(|| self.slot(client));
        let mut shard = self.shard(&slot);
        match shard.get_mut(slot.id) {
            Some(existing) => *existing = block,
            None => shard.insert(slot.id, block, sent_us),
        }
    }

    /// Forgets `client`'s block: its count fell (a give-back through this guard), so the
    /// backend may admit it now. Other instances hear of it by an operator event.
    pub(crate) fn lift(&self, client: &str) {
        let slot = self.slot(client);
        if let Some(block) = self.shard(&slot).get_mut(slot.id) {
            block.until_us = 0;
        }
    }

    /// How many clients are blocked or were and have not been swept.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// Whether no client is blocked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How often the cache hashed a client and took a shard's lock, for tests that hold a check to
/// one of each.
#[cfg(test)]
pub(crate) mod counts {
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, Default)]
    pub(crate) struct Counts {
        hashes: AtomicUsize,
        locks: AtomicUsize,
    }

    impl Counts {
        pub(super) fn hashed(&self) {
            self.hashes.fetch_add(1, Ordering::Relaxed);
        }

        pub(super) fn locked(&self) {
            self.locks.fetch_add(1, Ordering::Relaxed);
        }

        /// (hashes, locks) so far.
        pub(crate) fn get(&self) -> (usize, usize) {
            (
                self.hashes.load(Ordering::Relaxed),
                self.locks.load(Ordering::Relaxed),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(retry_ms: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 10,
            remaining: 0,
            reset_after: Duration::from_millis(retry_ms),
            retry_after: Some(RetryAfter::After(Duration::from_millis(retry_ms))),
            delay: Duration::ZERO,
            policy: "p".into(),
            reason: Reason::Redis,
            banned: false,
            window: Duration::from_secs(1),
            burst: 10,
            overridden: false,
        }
    }

    /// A listener that heard nothing yet.
    const LISTENING: Heard = Heard {
        generation: 0,
        listening: true,
    };

    fn record(cache: &BlockCache, client: &str, cost: u64, sent_us: u64, decisions: &[Decision]) {
        let decisions = Decisions::new(decisions.to_vec());
        cache.record(client, None, cost, (sent_us, LISTENING), &decisions);
    }

    fn blocked(cache: &BlockCache, client: &str, cost: u64, now_us: u64) -> Option<Decisions> {
        cache.blocked(&cache.slot(client), cost, now_us, LISTENING)
    }

    #[test]
    fn an_operator_event_drops_every_block_and_a_deaf_cache_keeps_one_for_a_second() {
        let cache = BlockCache::new(100);
        record(&cache, "c", 1, 0, &[denied(60_000)]);
        assert!(blocked(&cache, "c", 1, 10_000).is_some());
        let event = Heard {
            generation: 1,
            listening: true,
        };
        assert!(
            cache.blocked(&cache.slot("c"), 1, 10_000, event).is_none(),
            "an event was heard since"
        );
        let deaf = Heard {
            listening: false,
            ..LISTENING
        };
        let slot = cache.slot("c");
        assert!(cache.blocked(&slot, 1, DEAF_BLOCK_US - 1, deaf).is_some());
        assert!(
            cache.blocked(&slot, 1, DEAF_BLOCK_US, deaf).is_none(),
            "unheard events: at most 1 s"
        );
    }

    /// A block recorded before the listener first subscribes is kept when it does (a flood
    /// at start is answered locally), yet still for at most a second: an event published
    /// before the subscription went unheard.
    #[test]
    fn a_block_recorded_deaf_is_kept_once_listening_for_at_most_a_second() {
        let cache = BlockCache::new(100);
        let deaf = Heard {
            listening: false,
            ..LISTENING
        };
        let slot = cache.slot("c");
        let decisions = Decisions::new(vec![denied(60_000)]);
        cache.record("c", Some(cache.slot("c")), 1, (0, deaf), &decisions);
        assert!(cache.blocked(&slot, 1, 10_000, LISTENING).is_some());
        assert!(
            cache
                .blocked(&slot, 1, DEAF_BLOCK_US - 1, LISTENING)
                .is_some()
        );
        assert!(cache.blocked(&slot, 1, DEAF_BLOCK_US, LISTENING).is_none());
        // Recorded while listening: used until it ends.
        record(&cache, "c", 1, 0, &[denied(60_000)]);
        assert!(blocked(&cache, "c", 1, DEAF_BLOCK_US * 10).is_some());
    }

    #[test]
    fn blocks_the_same_or_larger_cost_until_the_wait_is_over() {
        let cache = BlockCache::new(100);
        record(&cache, "c", 2, 1_000_000, &[denied(10)]);
        // Blocked from the send time for 10 ms less 1 ms.
        let hit = blocked(&cache, "c", 2, 1_005_000).expect("blocked");
        assert_eq!(hit[0].reason, Reason::LocalBlock);
        assert_eq!(
            hit[0].retry_after,
            Some(RetryAfter::After(Duration::from_millis(4)))
        );
        assert!(blocked(&cache, "c", 3, 1_008_999).is_some());
        assert!(
            blocked(&cache, "c", 1, 1_005_000).is_none(),
            "a smaller cost may pass"
        );
        assert!(
            blocked(&cache, "c", 0, 1_005_000).is_none(),
            "peeks go to the backend"
        );
        assert!(blocked(&cache, "c", 2, 1_009_000).is_none(), "over");
        assert!(blocked(&cache, "other", 2, 1_005_000).is_none());
    }

    #[test]
    fn only_denials_with_a_wait_block() {
        let cache = BlockCache::new(100);
        let mut allowed = denied(10);
        allowed.allowed = true;
        allowed.retry_after = None;
        record(&cache, "a", 1, 0, &[allowed.clone()]);
        let mut never = denied(10);
        never.retry_after = Some(RetryAfter::Never);
        record(&cache, "n", 1, 0, &[never]);
        record(&cache, "tiny", 1, 0, &[denied(1)]);
        assert!(cache.is_empty());
        // Several policies: the longest wait of the denying ones.
        record(&cache, "m", 1, 0, &[allowed, denied(5), denied(30)]);
        assert!(blocked(&cache, "m", 1, 28_000).is_some());
        assert!(blocked(&cache, "m", 1, 29_000).is_none());
    }

    #[test]
    fn a_thousand_blocked_clients_with_60_kb_keys_take_under_2_mb() {
        let cache = BlockCache::default();
        let long = "k".repeat(60_000);
        for i in 0..1_000 {
            record(&cache, &format!("{long}{i}"), 1, 0, &[denied(60_000)]);
        }
        assert_eq!(cache.len(), 1_000);
        let bytes: usize = cache
            .shards
            .iter()
            .map(|shard| {
                let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
                shard.heap_bytes(|block| block.decisions.capacity() * size_of::<Decision>())
            })
            .sum();
        println!("1,000 blocked clients with 60 KB keys: {bytes} bytes in the block cache");
        assert!(bytes < 2_000_000, "{bytes} bytes");
    }

    #[test]
    fn stays_bounded_whatever_the_size_of_the_keys() {
        let cache = BlockCache::new(32);
        let long = "k".repeat(60_000);
        for i in 0..1_000 {
            record(&cache, &format!("{long}{i}"), 1, 0, &[denied(1_000 + i)]);
        }
        assert!(cache.len() <= 32, "{}", cache.len());
        assert!(blocked(&cache, &format!("{long}999"), 1, 0).is_some());
    }
}
