//! Settling an admitted reservation at its actual cost: giving back what it took beyond it (at
//! most its cost, only to the state it counted in, never below empty), or charging what it
//! cost beyond it (now, even past the limit). Mirrors each algorithm's settle in `lua/`.

use super::{State, Update, Write, bucket, counter, gcra, window};
use crate::{Algorithm, Policy, policy::MAX_EXACT};

/// Gives back `cost` to `state` as it is at `now_us` (a give-back check; the twin of the
/// scripts' REFUND): a log's newest entries, whenever they were taken, and for the others what a
/// reservation taken now would give back. Whether anything was given.
pub(crate) fn refund_now(policy: &Policy, state: &mut State, now_us: u64, cost: u64) -> bool {
    if let State::Log(entries) = state {
        let keep = entries
            .len()
            .saturating_sub(usize::try_from(cost).unwrap_or(usize::MAX));
        let removed = entries.len() > keep;
        entries.truncate(keep);
        return removed;
    }
    refund(policy, state, now_us, now_us, cost)
}

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
        State::Bucket { .. } => {
            let now = now_us / 1000;
            let (used, last) = bucket::current(policy, Some(state), now);
            if used == 0 {
                return false;
            }
            let used = used.saturating_sub(cost.saturating_mul(window));
            *state = State::Bucket { used, last };
        }
        State::Gcra { .. } => {
            let tat = gcra::current(policy, Some(state), now_us);
            if tat == now_us {
                return false;
            }
            let tat = tat
                .saturating_sub(cost.saturating_mul(policy.interval_us()))
                .max(now_us);
            *state = State::Gcra {
                tat,
                interval: policy.interval_us(),
            };
        }
        _ => return false,
    }
    true
}

/// The write charging `cost` at `now_us` to `state`, even past the limit, so the client's next
/// checks wait until the quota has refilled. Capped where the integer arithmetic would lose
/// exactness (a debt of centuries); a log adds at most the limit's entries and keeps the newest
/// limit of them, which decide alike (see `lua/sliding_window_log.lua`).
pub(crate) fn charge(policy: &Policy, state: Option<&State>, now_us: u64, cost: u64) -> Write {
    let now = now_us / 1000;
    match policy.algorithm() {
        Algorithm::FixedWindow | Algorithm::FixedWindowAnchored => {
            let aligned = policy.algorithm() == Algorithm::FixedWindow;
            let (start, count) = window::current(policy, state, now, aligned);
            let count = count.max(count.saturating_add(cost).min(MAX_EXACT / 2));
            window::write(policy, start, count, now)
        }
        Algorithm::SlidingWindowLog => Write {
            update: Update::LogAppend {
                at: now,
                count: cost.min(policy.limit()),
                window: policy.window_ms(),
                keep: Some(policy.limit()),
            },
            ttl_ms: policy.window_ms(),
        },
        Algorithm::SlidingWindowCounter => {
            let at = counter::current(policy, state, now);
            let most = (1 << 51) / policy.window_ms();
            let curr = at.curr.max(at.curr.saturating_add(cost).min(most));
            counter::write(policy, &at, curr)
        }
        Algorithm::TokenBucket => {
            let (used, last) = bucket::current(policy, state, now);
            let charged = cost.saturating_mul(policy.window_ms());
            let used = used.saturating_add(charged).min(bucket::most_used(policy));
            bucket::write(policy, used, last, now)
        }
        Algorithm::Gcra => {
            let tat = gcra::current(policy, state, now_us);
            let tat = tat
                .saturating_add(cost.saturating_mul(policy.interval_us()))
                .min(now_us + gcra::MAX_DEBT_US);
            gcra::write(policy, tat, now_us)
        }
    }
}
