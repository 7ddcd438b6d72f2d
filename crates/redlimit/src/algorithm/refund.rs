//! Giving back what an admitted reservation took, for a response that should not count: at most
//! its cost, only to the state it counted in, never below empty. Mirrors `lua/refund.lua`.

use super::State;
use crate::Policy;

/// Gives back `cost` taken at `at_us` from `state`, at `now_us`; whether anything was given.
pub(crate) fn refund(
    policy: &Policy,
    state: &mut State,
    at_us: u64,
    now_us: u64,
    cost: u64,
) -> bool {
    let (window, at) = (policy.window_ms(), at_us / 1000);
    match state {
        // A newer window owes the reservation nothing.
        State::Window { start, count } if *start <= at && at < *start + window && *count > 0 => {
            *count -= cost.min(*count);
        }
        State::Counter {
            window: w, curr, ..
        } if *w == at / window && *curr > 0 => {
            *curr -= cost.min(*curr);
        }
        State::Counter {
            window: w, prev, ..
        } if *w == at / window + 1 && *prev > 0 => {
            *prev -= cost.min(*prev);
        }
        State::Log(entries) => {
            let first = entries.partition_point(|&t| t < at);
            let stamped = entries.range(first..).take_while(|&&t| t == at).count();
            if stamped == 0 {
                return false;
            }
            entries.drain(first..first + stamped.min(usize::try_from(cost).unwrap_or(usize::MAX)));
        }
        State::Bucket { tokens, .. } => {
            *tokens = (*tokens + cost * window).min(policy.burst() * window);
        }
        State::Gcra { tat } if *tat > now_us => {
            *tat = tat.saturating_sub(cost * policy.interval_us()).max(now_us);
        }
        _ => return false,
    }
    true
}
