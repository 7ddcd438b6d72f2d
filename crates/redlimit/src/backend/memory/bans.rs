//! The memory backend's bans, as `lua/prelude.lua`'s `banned` and `strike` keep them in Redis:
//! per client of a policy that bans, its denials within the last `within` and its ban.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard, PoisonError},
};

/// Ban records by key (as the Redis backend names a client's ban key).
#[derive(Debug)]
pub(crate) struct Bans {
    map: Mutex<HashMap<String, Record>>,
    max: usize,
}

#[derive(Debug, Default, Clone, Copy)]
struct Record {
    /// Denials counted since the first of them, until `strikes_end_ms`.
    strikes: u64,
    strikes_end_ms: u64,
    /// Banned until, and bans so far, remembered until `end_ms`.
    until_ms: u64,
    bans: u64,
    end_ms: u64,
}

impl Record {
    fn is_live(&self, now: u64) -> bool {
        self.strikes_end_ms > now || self.end_ms > now
    }
}

/// The ban records, locked for one check.
pub(crate) struct Locked<'a> {
    map: MutexGuard<'a, HashMap<String, Record>>,
    max: usize,
}

impl Bans {
    /// At most `max` clients' records at once.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            map: Mutex::default(),
            max,
        }
    }

    /// Locked for one check, so that a check and its strike are one step for every client.
    pub(crate) fn lock(&self) -> Locked<'_> {
        Locked {
            map: self.map.lock().unwrap_or_else(PoisonError::into_inner),
            max: self.max,
        }
    }
}

impl Locked<'_> {
    /// The ms until `key`'s ban ends, or `None` when it is not banned.
    pub(crate) fn banned(&self, key: &str, now: u64) -> Option<u64> {
        let record = self.map.get(key)?;
        (record.end_ms > now && record.until_ms > now).then(|| record.until_ms - now)
    }

    /// Counts a denial of the ban `[after, within, for, max]` (ms); the ban's length when it
    /// starts one. A full table counts nothing new: a client it has no room for is not banned.
    pub(crate) fn strike(
        &mut self,
        key: &str,
        [after, within, length, most]: [u64; 4],
        now: u64,
    ) -> Option<u64> {
        if !self.map.contains_key(key) && self.map.len() >= self.max {
            self.map.retain(|_, record| record.is_live(now));
            if self.map.len() >= self.max {
                return None;
            }
        }
        let record = self.map.entry(key.to_owned()).or_default();
        if record.strikes_end_ms <= now {
            record.strikes = 0;
        }
        if record.end_ms <= now {
            record.bans = 0;
        }
        record.strikes += 1;
        if record.strikes == 1 {
            record.strikes_end_ms = now + within;
        }
        if record.strikes <= after {
            return None;
        }
        record.strikes = 0;
        record.strikes_end_ms = 0;
        record.bans += 1;
        let length = if most > 0 {
            length
                .saturating_mul(1 << (record.bans - 1).min(40))
                .min(most)
        } else {
            length
        };
        record.until_ms = now + length;
        record.end_ms = now + length + most;
        Some(length)
    }
}
