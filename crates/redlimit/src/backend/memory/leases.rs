//! Concurrency leases in process: the memory backend's twin of `lua/lease.lua` and
//! `lua/renew.lua`.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use crate::{
    Error, Timestamp,
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

    /// Decides a check's lease `id` of `ttl_ms` in the set at `key` at `now_ms`: whether fewer
    /// than `limit` live ones are held (expired leases reclaimed first) goes to `decide`, which
    /// decides the check's policies (taking only when told the lease is free) and says whether
    /// the check was admitted: the lease is then taken. The set stays locked meanwhile, so
    /// the lease and the policies are decided as one. What `decide` made, and the lease's
    /// answer.
    pub(crate) fn hold<T>(
        &self,
        key: &str,
        (limit, ttl_ms): (u64, u64),
        id: &str,
        now_ms: u64,
        decide: impl FnOnce(bool) -> (T, bool),
    ) -> (T, Acquired) {
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
        let granted = held < limit;
        let (decided, admitted) = decide(granted);
        if !granted {
            let earliest = set
                .iter()
                .map(|(_, expiry)| *expiry)
                .min()
                .unwrap_or(now_ms);
            let refused = Acquired {
                granted,
                free: 0,
                wait_ms: earliest - now_ms,
            };
            return (decided, refused);
        }
        let mut free = limit - held;
        if admitted {
            set.push((id.to_owned(), now_ms + ttl_ms));
            free -= 1;
        } else if set.is_empty() {
            sets.remove(&key);
        }
        let acquired = Acquired {
            granted,
            free,
            wait_ms: 0,
        };
        (decided, acquired)
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

    /// Decides lease `id` at `now_ms` for a check whose policies admit.
    fn acquire(leases: &Leases, key: &str, limit: u64, id: &str, now_ms: u64) -> Acquired {
        leases
            .hold(key, (limit, 1_000), id, now_ms, |_| ((), true))
            .1
    }

    #[test]
    fn at_most_the_limit_is_held_and_expired_leases_are_reclaimed() {
        let leases = Leases::new(10);
        for (i, id) in ["a", "b"].iter().enumerate() {
            let got = acquire(&leases, "k", 2, id, 0);
            assert!(got.granted);
            assert_eq!(got.free, 1 - i as u64);
        }
        let full = acquire(&leases, "k", 2, "c", 500);
        assert_eq!((full.granted, full.wait_ms), (false, 500));
        assert!(
            leases.renew("k", 1_000, "a", 900),
            "a lives until 1,900 now"
        );
        assert!(acquire(&leases, "k", 2, "c", 1_000).granted, "b expired");
        leases.release("k", "a");
        assert!(
            acquire(&leases, "k", 2, "d", 1_000).granted,
            "a was given back"
        );
        assert!(!leases.renew("k", 1_000, "b", 1_000), "b is gone");
    }

    #[test]
    fn a_check_its_policies_refuse_takes_no_lease() {
        let leases = Leases::new(10);
        let ((), refused) = leases.hold("k", (1, 1_000), "a", 0, |free| {
            assert!(free);
            ((), false)
        });
        assert_eq!((refused.granted, refused.free), (true, 1));
        assert!(acquire(&leases, "k", 1, "b", 0).granted);
        assert!(!acquire(&leases, "k", 1, "c", 0).granted);
    }

    #[test]
    fn the_number_of_sets_is_bounded() {
        let leases = Leases::new(3);
        for key in 0..100 {
            assert!(acquire(&leases, &format!("k{key}"), 1, "x", 0).granted);
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
