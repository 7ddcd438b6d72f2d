//! An algorithm's state as Redis stores it, read into the fields the memory backend names:
//! the packed strings of `lua/fixed_window.lua`, `lua/gcra.lua`, `lua/token_bucket.lua` and
//! `lua/sliding_window_counter.lua` unpacked, for an operator's inspect.

use crate::Algorithm;

/// A fixed window's string state is its head (fw: the window's number; fwa: its start in ms,
/// or in the short form the start's remainder by [`SPAN`]) times this, plus its count
/// (`lua/fixed_window.lua`).
const PACK: u64 = 1_000_000;

/// An anchored window's short head (1 to `SPAN`) is its start's remainder by this (ms), read as
/// the start nearest the time of reading with that remainder; a head over it is the start.
const SPAN: u64 = 8_000_000_000;

/// The start (ms) of an anchored window whose head is `head`, read at `now_ms`, as
/// `anchored_start` in `lua/fixed_window.lua` reads it.
fn anchored_start(head: u64, now_ms: u64) -> u64 {
    if head == 0 || head > SPAN {
        return head;
    }
    let ahead = (i128::from(head) - i128::from(now_ms)).rem_euclid(i128::from(SPAN));
    let ahead = if ahead > i128::from(SPAN / 2) {
        ahead - i128::from(SPAN)
    } else {
        ahead
    };
    u64::try_from(i128::from(now_ms) + ahead).unwrap_or(0)
}

/// `state`, field and value pairs as the inspect script read them from a key of `algorithm`,
/// as the memory backend names them; `window` and `now_ms` place a fixed window's start.
pub(super) fn named(
    algorithm: Algorithm,
    state: Vec<String>,
    window: u64,
    now_ms: u64,
) -> Vec<(String, String)> {
    let mut fields = state.into_iter();
    let mut pairs = Vec::new();
    while let (Some(field), Some(value)) = (fields.next(), fields.next()) {
        match (field.as_str(), value.parse::<u64>()) {
            ("value", Ok(packed))
                if matches!(
                    algorithm,
                    Algorithm::FixedWindow | Algorithm::FixedWindowAnchored
                ) =>
            {
                let head = packed / PACK;
                let start = if algorithm == Algorithm::FixedWindow {
                    head.saturating_mul(window)
                } else {
                    anchored_start(head, now_ms)
                };
                pairs.push(("s".to_owned(), start.to_string()));
                pairs.push(("n".to_owned(), (packed % PACK).to_string()));
            }
            // Numbers in one string, named as the memory backend names them.
            ("value", _)
                if matches!(
                    algorithm,
                    Algorithm::Gcra | Algorithm::TokenBucket | Algorithm::SlidingWindowCounter
                ) =>
            {
                let names: &[&str] = match algorithm {
                    Algorithm::Gcra => &["tat", "interval"],
                    Algorithm::TokenBucket => &["u", "l"],
                    _ => &["w", "p", "c"],
                };
                let mut numbers = value.split(':');
                for name in names {
                    let number = numbers.next().unwrap_or_default();
                    pairs.push(((*name).to_owned(), number.to_owned()));
                }
            }
            _ => pairs.push((field, value)),
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_anchored_head_is_read_as_the_start_nearest_the_time_of_reading() {
        let now = 1_780_000_000_000;
        for start in [
            now,
            now - 59_999,
            now + 30_000,
            now - 3_999_999_999,
            now + SPAN / 2,
        ] {
            let head = match start % SPAN {
                0 => SPAN,
                rest => rest,
            };
            assert_eq!(anchored_start(head, now), start, "{start}");
        }
        // A multiple of SPAN is written as SPAN; a head of 0 is no window, over SPAN a start.
        let multiple = now / SPAN * SPAN;
        assert_eq!(anchored_start(SPAN, multiple + 5), multiple);
        assert_eq!(anchored_start(0, now), 0);
        assert_eq!(anchored_start(now, now + 7), now);
    }

    #[test]
    fn packed_states_are_named_as_in_memory() {
        let named = |algorithm, state: &[&str]| {
            named(
                algorithm,
                state.iter().map(|s| (*s).to_owned()).collect(),
                60_000,
                0,
            )
        };
        assert_eq!(
            named(Algorithm::FixedWindow, &["value", "3000007"]),
            [
                ("s".to_owned(), "180000".to_owned()),
                ("n".to_owned(), "7".to_owned())
            ]
        );
        assert_eq!(
            named(Algorithm::Gcra, &["value", "12:34"]),
            [
                ("tat".to_owned(), "12".to_owned()),
                ("interval".to_owned(), "34".to_owned())
            ]
        );
        assert_eq!(
            named(Algorithm::SlidingWindowCounter, &["value", "29:4:1"]),
            [
                ("w".to_owned(), "29".to_owned()),
                ("p".to_owned(), "4".to_owned()),
                ("c".to_owned(), "1".to_owned())
            ]
        );
        assert_eq!(
            named(Algorithm::SlidingWindowLog, &["a", "b"]),
            [("a".to_owned(), "b".to_owned())]
        );
    }
}
