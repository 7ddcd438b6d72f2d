//! Concurrency leases in process: the memory backend's twin of `lua/acquire.lua` and
//! `lua/renew.lua`.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use crate::{
    Error, Reason, Timestamp,
    backend::{answer::Acquired, memory::MemoryBackend},
    client_id::{ClientId, ClientIds},
};

/// Lease sets by key, bounded: when full, expired sets go first, then any (an evicted set's
/// slots come free, which can only make the limit more lenient).
#[derive(Debug)]
pub(crate) struct Leases {
    sets: Mutex<HashMap<ClientId, Vec<(String, u64)>>>,
    ids: ClientIds,
    max_keys: usize,
}

impl Leases {
    pub(crate) fn new(max_keys: usize) -> Self {
        Self {
            sets: Mutex::default(),
            ids: ClientIds::default(),
            max_keys,
        }
    }

    /// Acquires lease `id` of `ttl_ms` in the set at `key` if fewer than `limit` live ones
    /// are held at `now_ms`; expired leases are reclaimed first.
    pub(crate) fn acquire(
        &self,
        key: &str,
        limit: u64,
        ttl_ms: u64,
        id: &str,
        now_ms: u64,
    ) -> Acquired {
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        let key = self.ids.id(key);
        if !sets.contains_key(&key) && sets.len() >= self.max_keys {
            sets.retain(|_, set| set.iter().any(|(_, expiry)| *expiry > now_ms));
            if sets.len() >= self.max_keys
                && let Some(any) = sets.keys().next().copied()
            {
                sets.remove(&any);
            }
        }
        let set = sets.entry(key).or_default();
        set.retain(|(_, expiry)| *expiry > now_ms);
        let held = set.len() as u64;
        if held < limit {
            set.push((id.to_owned(), now_ms + ttl_ms));
            return Acquired {
                granted: true,
                free: limit - held - 1,
                wait_ms: 0,
            };
        }
        let earliest = set
            .iter()
            .map(|(_, expiry)| *expiry)
            .min()
            .unwrap_or(now_ms);
        Acquired {
            granted: false,
            free: 0,
            wait_ms: earliest - now_ms,
        }
    }

    /// Extends lease `id` to `ttl_ms` from `now_ms`; whether it was still held.
    pub(crate) fn renew(&self, key: &str, ttl_ms: u64, id: &str, now_ms: u64) -> bool {
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        let lease = sets.get_mut(&self.ids.id(key)).and_then(|set| {
            set.iter_mut()
                .find(|(held, expiry)| held == id && *expiry > now_ms)
        });
        match lease {
            Some((_, expiry)) => {
                *expiry = now_ms + ttl_ms;
                true
            }
            None => false,
        }
    }

    /// Gives lease `id` back.
    pub(crate) fn release(&self, key: &str, id: &str) {
        let mut sets = self.sets.lock().unwrap_or_else(PoisonError::into_inner);
        let key = self.ids.id(key);
        if let Some(set) = sets.get_mut(&key) {
            set.retain(|(held, _)| held != id);
            if set.is_empty() {
                sets.remove(&key);
            }
        }
    }
}

/// The memory backend's lease operations, with its clock in milliseconds.
impl MemoryBackend {
    /// Takes lease `id` of `ttl_ms` in the set at `key` if fewer than `limit` are held.
    pub(crate) fn acquire_lease(
        &self,
        key: &str,
        limit: u64,
        ttl_ms: u64,
        id: &str,
    ) -> Result<(Acquired, Reason), Error> {
        let acquired = self.leases().acquire(key, limit, ttl_ms, id, now_ms());
        Ok((acquired, Reason::Memory))
    }

    /// Gives lease `id` in the set at `key` `ttl_ms` more; whether it was still held.
    pub(crate) fn renew_lease(&self, key: &str, id: &str, ttl_ms: u64) -> Result<bool, Error> {
        Ok(self.leases().renew(key, ttl_ms, id, now_ms()))
    }

    /// Gives lease `id` in the set at `key` back.
    pub(crate) fn release_lease(&self, key: &str, id: &str) -> Result<(), Error> {
        self.leases().release(key, id);
        Ok(())
    }
}

fn now_ms() -> u64 {
    Timestamp::now().as_micros() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_the_limit_is_held_and_expired_leases_are_reclaimed() {
        let leases = Leases::new(10);
        for (i, id) in ["a", "b"].iter().enumerate() {
            let got = leases.acquire("k", 2, 1_000, id, 0);
            assert!(got.granted);
            assert_eq!(got.free, 1 - i as u64);
        }
        let full = leases.acquire("k", 2, 1_000, "c", 500);
        assert_eq!((full.granted, full.wait_ms), (false, 500));
        assert!(
            leases.renew("k", 1_000, "a", 900),
            "a lives until 1,900 now"
        );
        assert!(
            leases.acquire("k", 2, 1_000, "c", 1_000).granted,
            "b expired"
        );
        leases.release("k", "a");
        assert!(
            leases.acquire("k", 2, 1_000, "d", 1_000).granted,
            "a was given back"
        );
        assert!(!leases.renew("k", 1_000, "b", 1_000), "b is gone");
    }

    #[test]
    fn the_number_of_sets_is_bounded() {
        let leases = Leases::new(3);
        for key in 0..100 {
            assert!(
                leases
                    .acquire(&format!("k{key}"), 1, 60_000, "x", 0)
                    .granted
            );
        }
        assert!(
            leases
                .sets
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .len()
                <= 3
        );
    }
}
