//! The shards a check's keys live in, locked for the whole check: one client's shard, or, for a
//! check with a key per policy, each distinct shard in shard order (so that two checks never
//! wait on each other in a circle).

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{SHARDS, Shard};
use crate::{
    backend::query::Clients,
    client_id::{ClientId, ClientIds},
};

// A check's shards are a bitmask of a `u32`.
const _: () = assert!(SHARDS <= 32);

/// The locked shards of a check of `policies` policies, and each policy's client id.
pub(super) enum Locked<'a> {
    One(ClientId, MutexGuard<'a, Shard>),
    /// Per policy: its client id and the place of its shard's guard.
    Each {
        guards: Vec<MutexGuard<'a, Shard>>,
        of: Vec<(ClientId, usize)>,
    },
}

impl<'a> Locked<'a> {
    /// Locks what `clients` of `policies` policies need in `shards`.
    pub(super) fn new(
        shards: &'a [Mutex<Shard>],
        ids: &ClientIds,
        clients: Clients<'_>,
        policies: usize,
    ) -> Self {
        let lock = |at: usize| shards[at].lock().unwrap_or_else(PoisonError::into_inner);
        if clients.each.is_none() {
            let client = ids.id(clients.client);
            return Self::One(client, lock(ClientIds::shard(client, SHARDS)));
        }
        let of: Vec<(ClientId, usize)> = (0..policies)
            .map(|i| {
                let client = ids.id(clients.of(i));
                (client, ClientIds::shard(client, SHARDS))
            })
            .collect();
        // The shards needed, as bits: locked in shard order, each policy pointing at its
        // shard's guard by the number of needed shards below it.
        let needed = of.iter().fold(0_u32, |bits, &(_, shard)| bits | 1 << shard);
        let guards = (0..SHARDS)
            .filter(|shard| needed & 1 << shard != 0)
            .map(lock)
            .collect();
        let of = of
            .into_iter()
            .map(|(client, shard)| {
                let below = needed & ((1 << shard) - 1);
                (client, below.count_ones() as usize)
            })
            .collect();
        Self::Each { guards, of }
    }

    /// The client id of the `i`th policy.
    pub(super) fn client(&self, i: usize) -> ClientId {
        match self {
            Self::One(client, _) => *client,
            Self::Each { of, .. } => of[i].0,
        }
    }

    /// The shard of the `i`th policy's key.
    pub(super) fn shard(&mut self, i: usize) -> &mut Shard {
        match self {
            Self::One(_, guard) => guard,
            Self::Each { guards, of } => &mut guards[of[i].1],
        }
    }
}
