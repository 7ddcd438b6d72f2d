//! Local blocks: once a key is denied with a known wait, further checks of it within that wait
//! are denied in process, with no Redis command.

use std::{
    collections::{HashMap, hash_map::DefaultHasher},
    hash::{Hash, Hasher},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use crate::{Decision, Reason, RetryAfter, evict};

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
/// Bounded: at most `max_keys` blocks; when full, expired blocks go first, then the sixteenth
/// ending soonest. Dropping a block only sends that client's next check to Redis.
#[derive(Debug)]
pub struct BlockCache {
    shards: Box<[Mutex<HashMap<String, Block>>]>,
    per_shard: usize,
}

#[derive(Debug, Clone)]
struct Block {
    until_us: u64,
    min_cost: u64,
    decisions: Vec<Decision>,
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
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: max_keys.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, client: &str) -> std::sync::MutexGuard<'_, HashMap<String, Block>> {
        let mut hasher = DefaultHasher::new();
        client.hash(&mut hasher);
        let index = usize::try_from(hasher.finish() % SHARDS as u64).unwrap_or(0);
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The decisions to deny with, if `client` is blocked for `cost` at `now_us`.
    pub(crate) fn blocked(&self, client: &str, cost: u64, now_us: u64) -> Option<Vec<Decision>> {
        let mut shard = self.shard(client);
        let block = shard.get(client)?;
        if block.until_us <= now_us {
            shard.remove(client);
            return None;
        }
        if cost < block.min_cost {
            return None;
        }
        let left = Duration::from_micros(block.until_us - now_us);
        let decisions = block
            .decisions
            .iter()
            .map(|d| {
                let mut d = d.clone();
                d.reason = Reason::LocalBlock;
                if !d.allowed {
                    d.retry_after = Some(RetryAfter::After(left));
                }
                d
            })
            .collect();
        Some(decisions)
    }

    /// Records the answer to a check of `cost` sent at `sent_us`, if it was a denial with a wait.
    pub(crate) fn record(&self, client: &str, cost: u64, sent_us: u64, decisions: &[Decision]) {
        // The request passes only once every denying policy admits it: the longest wait.
        let wait = decisions
            .iter()
            .filter(|d| !d.allowed)
            .map(|d| match d.retry_after {
                Some(RetryAfter::After(wait)) => Some(wait),
                _ => None,
            })
            .max();
        // Waits are whole milliseconds rounded up: take one off to never block too long.
        let Some(Some(wait)) = wait else { return };
        let wait_us = u64::try_from(wait.as_micros())
            .unwrap_or(u64::MAX)
            .saturating_sub(1000);
        if wait_us == 0 || cost == 0 {
            return;
        }
        let mut shard = self.shard(client);
        if !shard.contains_key(client) {
            evict::make_room(&mut shard, self.per_shard, sent_us, |b| b.until_us);
        }
        shard.insert(
            client.to_owned(),
            Block {
                until_us: sent_us.saturating_add(wait_us),
                min_cost: cost,
                decisions: decisions.to_vec(),
            },
        );
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
            policy: "p".into(),
            reason: Reason::Redis,
        }
    }

    #[test]
    fn blocks_the_same_or_larger_cost_until_the_wait_is_over() {
        let cache = BlockCache::new(100);
        cache.record("c", 2, 1_000_000, &[denied(10)]);
        // Blocked from the send time for 10 ms less 1 ms.
        let hit = cache.blocked("c", 2, 1_005_000).expect("blocked");
        assert_eq!(hit[0].reason, Reason::LocalBlock);
        assert_eq!(
            hit[0].retry_after,
            Some(RetryAfter::After(Duration::from_millis(4)))
        );
        assert!(cache.blocked("c", 3, 1_008_999).is_some());
        assert!(
            cache.blocked("c", 1, 1_005_000).is_none(),
            "a smaller cost may pass"
        );
        assert!(
            cache.blocked("c", 0, 1_005_000).is_none(),
            "peeks go to the backend"
        );
        assert!(cache.blocked("c", 2, 1_009_000).is_none(), "over");
        assert!(cache.is_empty(), "an expired block is dropped when met");
        assert!(cache.blocked("other", 2, 1_005_000).is_none());
    }

    #[test]
    fn only_denials_with_a_wait_block() {
        let cache = BlockCache::new(100);
        let mut allowed = denied(10);
        allowed.allowed = true;
        allowed.retry_after = None;
        cache.record("a", 1, 0, &[allowed.clone()]);
        let mut never = denied(10);
        never.retry_after = Some(RetryAfter::Never);
        cache.record("n", 1, 0, &[never]);
        cache.record("tiny", 1, 0, &[denied(1)]);
        assert!(cache.is_empty());
        // Several policies: the longest wait of the denying ones.
        cache.record("m", 1, 0, &[allowed, denied(5), denied(30)]);
        assert!(cache.blocked("m", 1, 28_000).is_some());
        assert!(cache.blocked("m", 1, 29_000).is_none());
    }

    #[test]
    fn stays_bounded() {
        let cache = BlockCache::new(32);
        for i in 0..1_000 {
            cache.record(&format!("c{i}"), 1, 0, &[denied(1_000 + i)]);
        }
        assert!(cache.len() <= 32, "{}", cache.len());
    }
}
