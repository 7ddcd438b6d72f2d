//! The shards a check's keys live in, locked for the whole check: one client's shard, or, for a
//! check with a key per policy, each distinct shard in shard order (so that two checks never
//! wait on each other in a circle).

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{SHARDS, Shard};
use crate::{
    backend::query::Clients,
    client_id::{ClientId, ClientIds},
};

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
        let clients: Vec<ClientId> = (0..policies).map(|i| ids.id(clients.of(i))).collect();
        let mut places: Vec<usize> = clients
            .iter()
            .map(|&client| ClientIds::shard(client, SHARDS))
            .collect();
        places.sort_unstable();
        places.dedup();
        let of = clients
            .iter()
            .map(|&client| {
                let place = ClientIds::shard(client, SHARDS);
                (client, places.binary_search(&place).unwrap_or_default())
            })
            .collect();
        Self::Each {
            guards: places.into_iter().map(lock).collect(),
            of,
        }
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
