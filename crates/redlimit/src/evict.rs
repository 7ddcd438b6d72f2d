//! Making room in a full, bounded map: expired entries first, then those that expire soonest.

use std::{
    collections::HashMap,
    hash::{BuildHasher, Hash},
};

/// Makes room for one more entry in `map`, which holds at most `capacity`. Drops every entry
/// expired at `now`; if that is not enough, drops the sixteenth of the entries that expire
/// soonest, so a stream of new keys pays for the scan once per many inserts, not on each.
pub(crate) fn make_room<K, V, S>(
    map: &mut HashMap<K, V, S>,
    capacity: usize,
    now: u64,
    expires: impl Fn(&V) -> u64,
) where
    K: Eq + Hash + Clone,
    S: BuildHasher,
{
    if map.len() < capacity {
        return;
    }
    map.retain(|_, value| expires(value) > now);
    if map.len() < capacity {
        return;
    }
    let expiries = map.iter().map(|(k, v)| (expires(v), k.clone())).collect();
    for key in soonest(expiries, capacity) {
        map.remove(&key);
    }
}

/// The keys of the sixteenth of `capacity` (at least one) that expire soonest, of `expiries`:
/// (expiry, key) pairs.
pub(crate) fn soonest<K>(mut expiries: Vec<(u64, K)>, capacity: usize) -> impl Iterator<Item = K> {
    let count = (capacity / 16).max(1).min(expiries.len());
    if count > 0 {
        expiries.select_nth_unstable_by_key(count - 1, |(at, _)| *at);
    }
    expiries.into_iter().take(count).map(|(_, key)| key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_go_first_then_the_soonest_to_expire() {
        let mut map: HashMap<u32, u64> = (0..32).map(|k| (k, 100 + u64::from(k))).collect();
        make_room(&mut map, 32, 105, |&at| at);
        assert_eq!(map.len(), 26, "the six expired at 105 are gone");
        assert!(!map.contains_key(&5) && map.contains_key(&6));

        let mut full: HashMap<u32, u64> = (0..32).map(|k| (k, 100 + u64::from(k))).collect();
        make_room(&mut full, 32, 0, |&at| at);
        assert_eq!(full.len(), 30, "a sixteenth of 32 is dropped");
        assert!(!full.contains_key(&0) && !full.contains_key(&1) && full.contains_key(&2));

        let mut roomy: HashMap<u32, u64> = HashMap::from([(1, 0)]);
        make_room(&mut roomy, 32, 10, |&at| at);
        assert_eq!(roomy.len(), 1, "nothing happens below capacity");
    }
}
