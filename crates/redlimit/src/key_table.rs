//! A bounded table of per-key state (the memory backend's keys, the block cache's blocks): open addressing with linear probing and one cache
//! line a slot. A client seen again after thousands of others is not in the CPU cache any more;
//! a lookup here costs one memory access for it, where a general-purpose map costs two or three
//! (its control bytes, then a bucket that may straddle two lines).

/// A key's identity in the table; never 0, which marks an empty slot.
pub(crate) type KeyId = u128;

/// What the table keeps of a key.
pub(crate) trait Expiring: Default {
    /// When the key's state ends, in microseconds.
    fn expires_at_us(&self) -> u64;
}

/// One key's id and value: one cache line for the backend's entries.
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Slot<V> {
    id: KeyId,
    value: V,
}

/// At most `capacity` keys and their values: a power-of-two number of slots, grown while it is
/// more than three quarters full up to the size that holds `capacity` at most seven eighths full.
#[derive(Debug)]
pub(crate) struct KeyTable<V> {
    slots: Vec<Slot<V>>,
    len: usize,
    capacity: usize,
}

impl<V: Expiring> KeyTable<V> {
    pub(crate) const fn new(capacity: usize) -> Self {
        Self {
            slots: Vec::new(),
            len: 0,
            capacity,
        }
    }

    /// The most slots: always more than `capacity`, so a probe always finds an empty slot.
    fn max_slots(&self) -> usize {
        (self.capacity + self.capacity / 7 + 1).next_power_of_two()
    }

    pub(crate) const fn len(&self) -> usize {
        self.len
    }

    /// Bytes on the heap: the slots, and what `value_heap` says each occupied value holds.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self, value_heap: impl Fn(&V) -> usize) -> usize {
        let values: usize = self
            .slots
            .iter()
            .filter(|slot| slot.id != 0)
            .map(|slot| value_heap(&slot.value))
            .sum();
        self.slots.capacity() * std::mem::size_of::<Slot<V>>() + values
    }

    /// Where `id` is, or the empty slot where it would go.
    fn probe(&self, id: KeyId) -> Result<usize, usize> {
        debug_assert!(id != 0 && !self.slots.is_empty());
        let mask = self.slots.len() - 1;
        // Ids are random: their low bits are as good a hash as any.
        let mut at = usize::try_from(id & 0xffff_ffff).unwrap_or(0) & mask;
        // Never more than `len` occupied slots: the loop ends at an empty one.
        loop {
            match self.slots[at].id {
                0 => return Err(at),
                found if found == id => return Ok(at),
                _ => at = (at + 1) & mask,
            }
        }
    }

    pub(crate) fn get(&self, id: KeyId) -> Option<&V> {
        if self.len == 0 {
            return None;
        }
        self.probe(id).ok().map(|at| &self.slots[at].value)
    }

    pub(crate) fn get_mut(&mut self, id: KeyId) -> Option<&mut V> {
        if self.len == 0 {
            return None;
        }
        let at = self.probe(id).ok()?;
        Some(&mut self.slots[at].value)
    }

    /// Adds `id`, which is not in the table, making room for it at `now_us` if the table is
    /// full.
    pub(crate) fn insert(&mut self, id: KeyId, value: V, now_us: u64) {
        self.make_room(now_us);
        let max = self.max_slots();
        if (self.len + 1) * 4 > self.slots.len() * 3 && self.slots.len() < max {
            self.rebuild((self.slots.len() * 2).max(16).min(max));
        }
        self.place(Slot { id, value });
    }

    fn place(&mut self, slot: Slot<V>) {
        if let Err(at) = self.probe(slot.id) {
            self.slots[at] = slot;
            self.len += 1;
        }
    }

    /// Moves the occupied slots into `size` new ones: how the table grows, and how keys whose
    /// id was zeroed leave it (linear probing cannot simply empty a slot).
    fn rebuild(&mut self, size: usize) {
        let old = std::mem::replace(
            &mut self.slots,
            std::iter::repeat_with(Slot::default).take(size).collect(),
        );
        self.len = 0;
        for slot in old.into_iter().filter(|slot| slot.id != 0) {
            self.place(slot);
        }
    }

    /// Makes room for one more key when `capacity` are held, by the eviction rule: expired
    /// keys first, then the sixteenth that expire soonest. One pass marks them, one rebuild
    /// drops them.
    fn make_room(&mut self, now_us: u64) {
        if self.len < self.capacity {
            return;
        }
        let mut live = Vec::with_capacity(self.len);
        for (at, slot) in self.slots.iter_mut().enumerate() {
            if slot.id == 0 {
                continue;
            }
            let expires_at_us = slot.value.expires_at_us();
            if expires_at_us <= now_us {
                slot.id = 0;
            } else {
                live.push((expires_at_us, at));
            }
        }
        if live.len() >= self.capacity {
            for at in soonest(live, self.capacity) {
                self.slots[at].id = 0;
            }
        }
        self.rebuild(self.slots.len());
    }
}

/// The size of one slot holding a `V`, for tests that keep it to a cache line.
#[cfg(test)]
pub(crate) const fn slot_size<V>() -> usize {
    std::mem::size_of::<Slot<V>>()
}

/// The keys of the sixteenth of `capacity` (at least one) that expire soonest, of `expiries`:
/// (expiry, key) pairs. A sixteenth at once, so a stream of new keys pays for the scan once per
/// many inserts, not on each.
fn soonest<K>(mut expiries: Vec<(u64, K)>, capacity: usize) -> impl Iterator<Item = K> {
    let count = (capacity / 16).max(1).min(expiries.len());
    if count > 0 {
        expiries.select_nth_unstable_by_key(count - 1, |(at, _)| *at);
    }
    expiries.into_iter().take(count).map(|(_, key)| key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq)]
    struct Expires(u64);

    impl Expiring for Expires {
        fn expires_at_us(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn finds_what_it_holds_across_growth_and_collisions() {
        let mut table = KeyTable::new(1_000);
        // Ids sharing their low bits collide on every table size.
        let ids: Vec<(KeyId, u64)> = (1..=1_000_u64)
            .map(|i| ((KeyId::from(i) << 64) | KeyId::from(i % 7 + 1), i))
            .collect();
        for &(id, n) in &ids {
            assert_eq!(table.get(id), None);
            table.insert(id, Expires(n), 0);
        }
        assert_eq!(table.len(), 1_000);
        for &(id, n) in &ids {
            assert_eq!(table.get(id), Some(&Expires(n)));
        }
        if let Some(value) = table.get_mut(ids[3].0) {
            value.0 = 99;
        }
        assert_eq!(table.get(ids[3].0), Some(&Expires(99)));
    }

    #[test]
    fn makes_room_by_dropping_the_expired_then_the_soonest() {
        let mut table = KeyTable::new(32);
        for id in 1..=32_u64 {
            table.insert(KeyId::from(id), Expires(100 + id), 0);
        }
        assert_eq!(
            table.slots.len(),
            64,
            "32 keys fit in at most 7/8 of the slots"
        );

        table.insert(33, Expires(200), 0);
        assert_eq!(table.len(), 31, "a sixteenth of 32 (two keys) made room");
        assert!(table.get(1).is_none() && table.get(2).is_none() && table.get(3).is_some());

        table.insert(34, Expires(200), 105);
        assert_eq!(table.len(), 32, "nothing is dropped below capacity");

        table.insert(35, Expires(200), 105);
        assert_eq!(table.len(), 30, "the three expired at 105 made room");
        assert!(table.get(5).is_none() && table.get(6).is_some() && table.get(35).is_some());
    }
}
