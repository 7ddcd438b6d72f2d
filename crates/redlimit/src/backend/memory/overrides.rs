//! The memory backend's per-client overrides: the policy a client of an overridable policy is
//! checked by, until its override ends.

use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
};

use crate::{Error, ErrorKind, KeyScheme, Policy, backend::query::Clients};

/// Overrides by key (as the Redis backend names them), each with its policy and expiry.
#[derive(Debug)]
pub(crate) struct Overrides {
    map: Mutex<HashMap<String, (Policy, u64)>>,
    max: usize,
}

impl Overrides {
    /// At most `max` overrides at once.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            map: Mutex::default(),
            max,
        }
    }

    /// Checks `client` of `key`'s policy by `policy` until `expires_at_us`.
    pub(crate) fn set(
        &self,
        key: String,
        policy: Policy,
        now_us: u64,
        expires_at_us: u64,
    ) -> Result<(), Error> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= self.max && !map.contains_key(&key) {
            map.retain(|_, (_, expires)| *expires > now_us);
            if map.len() >= self.max {
                return Err(Error::new(
                    ErrorKind::InvalidInput,
                    format!("the memory backend holds {} overrides already", self.max),
                ));
            }
        }
        map.insert(key, (policy, expires_at_us));
        Ok(())
    }

    /// Ends the override at `key`; whether one was in force at `now_us`.
    pub(crate) fn clear(&self, key: &str, now_us: u64) -> bool {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(key)
            .is_some_and(|(_, expires_at_us)| expires_at_us > now_us)
    }

    /// The policy `client` of `policy` is checked by at `now_us` when an override of it is in
    /// force.
    pub(crate) fn in_force(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
        now_us: u64,
    ) -> Option<Policy> {
        let client = Clients { client, each: None };
        self.resolve(keys, std::slice::from_ref(policy), client, now_us)?
            .pop()
    }

    /// The policies `clients` are checked by at `now_us`: `None` when no policy takes overrides
    /// or none is overridden for its client.
    pub(crate) fn resolve(
        &self,
        keys: &KeyScheme,
        policies: &[Policy],
        clients: Clients<'_>,
        now_us: u64,
    ) -> Option<Vec<Policy>> {
        if !policies.iter().any(Policy::takes_overrides) {
            return None;
        }
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        let mut found = false;
        let resolved = policies
            .iter()
            .enumerate()
            .map(|(i, policy)| {
                let overridden = policy
                    .takes_overrides()
                    .then(|| map.get(&keys.override_key(policy, clients.of(i))))
                    .flatten()
                    .filter(|(_, expires_at_us)| *expires_at_us > now_us);
                found |= overridden.is_some();
                overridden.map_or_else(|| policy.clone(), |(policy, _)| policy.clone())
            })
            .collect();
        found.then_some(resolved)
    }
}
