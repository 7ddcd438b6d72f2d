//! An operator's commands on the memory backend: read and reset a client's state, set and clear
//! its overrides. Nothing to scan: keys are kept as hashes, not names.

use std::time::Duration;

use super::MemoryBackend;
use crate::{
    Decision, Error, ErrorKind, KeyScheme, Policy, Reason, Timestamp,
    backend::{answer::Inspected, query::Target},
};

impl MemoryBackend {
    /// What `policy` holds for `target` and the decision a request of cost 1 would get, writing
    /// nothing; with the key it lives under.
    pub(crate) fn inspect(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        target: Target<'_>,
    ) -> Result<(String, Decision, Inspected), Error> {
        let Target::Client(client) = target else {
            return Err(no_key_names());
        };
        let inspected = self.peek(keys, client, policy, 1, Timestamp::now().as_micros());
        Ok(inspected.seen(keys, policy, &target, Reason::Memory))
    }

    /// Deletes what `policy` holds for `client`; whether it held anything.
    pub(crate) fn reset(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
    ) -> Result<bool, Error> {
        Ok(self.forget(keys, client, policy, Timestamp::now().as_micros()))
    }

    /// Checks `client` of `policy` by `overridden` until `ttl` from now.
    pub(crate) fn set_override(
        &self,
        keys: &KeyScheme,
        (policy, client): (&Policy, &str),
        overridden: Policy,
        ttl: Duration,
    ) -> Result<(), Error> {
        let key = keys.override_key(policy, client);
        let now_us = Timestamp::now().as_micros();
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let expires_at_us = now_us.saturating_add(ttl_ms.saturating_mul(1000));
        self.overrides().set(key, overridden, now_us, expires_at_us)
    }

    /// Ends `client`'s override of `policy`; whether one was in force.
    pub(crate) fn clear_override(
        &self,
        keys: &KeyScheme,
        policy: &Policy,
        client: &str,
    ) -> Result<bool, Error> {
        let key = keys.override_key(policy, client);
        Ok(self.overrides().clear(&key, Timestamp::now().as_micros()))
    }

    /// The keys of `policy`: none to tell, see [`no_key_names`].
    pub(crate) fn scan(&self) -> Result<(Vec<String>, u64, bool), Error> {
        Err(no_key_names())
    }
}

fn no_key_names() -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        "the memory backend keeps hashes of its keys, not their names: nothing to scan",
    )
}
