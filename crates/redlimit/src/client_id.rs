//! Client ids: one keyed hash pass over the client text, shared by the memory backend and the
//! block cache, so neither stores (or hashes again) what a client sent.

use std::{
    collections::hash_map::RandomState,
    hash::{BuildHasher, Hash, Hasher},
};

/// A short keyed hash of `client` for logs and traces: the same client gets the same tag in one
/// process, and the tag does not give the client's text (an API key, say) away.
pub(crate) fn tag(client: &str) -> impl std::fmt::Display {
    static KEY: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    let hash = KEY.get_or_init(RandomState::new).hash_one(client);
    format!("{:08x}", hash >> 32)
}

/// A client's 128-bit id: never 0, which the key tables keep for an empty slot.
pub(crate) type ClientId = u128;

/// Hashes clients with a random key drawn when it is made, so a client cannot aim for a
/// collision it cannot compute.
#[derive(Debug, Default)]
pub(crate) struct ClientIds {
    seed: RandomState,
}

impl ClientIds {
    /// Two outputs of one pass over the client: the second is drawn after one more byte, from
    /// the hasher's 256-bit state, so two clients that share the first half still differ in the
    /// second (unless their states collide too).
    // Inlined: on the memory backend's path of every request, and small.
    #[inline]
    pub(crate) fn id(&self, client: &str) -> ClientId {
        let mut hasher = self.seed.build_hasher();
        client.hash(&mut hasher);
        let high = hasher.finish();
        hasher.write_u8(0x5a);
        ((u128::from(high) << 64) | u128::from(hasher.finish())).max(1)
    }

    /// Which of `shards` holds `id`: from the high half, where the key tables' probes (which
    /// start from the low bits) do not look.
    #[inline]
    pub(crate) fn shard(id: ClientId, shards: usize) -> usize {
        usize::try_from((id >> 64) % shards as u128).unwrap_or(0)
    }
}
