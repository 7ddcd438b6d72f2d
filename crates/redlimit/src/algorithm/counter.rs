//! Sliding window counter: `prev × (window − elapsed) / window + curr`, kept scaled by the window
//! so every comparison is between integers.

use super::{Denial, Plan, State, Update, View, Write};
use crate::Policy;

/// Where a check at `now` counts: its window's index, how far into it, how far it was moved
/// forward (`shift`), and the previous and current counts it weighs.
pub(super) struct Position {
    pub(super) index: u64,
    pub(super) elapsed: u64,
    pub(super) shift: u64,
    pub(super) prev: u64,
    pub(super) curr: u64,
}

pub(super) fn current(policy: &Policy, state: Option<&State>, now: u64) -> Position {
    let window = policy.window_ms();
    // A check stamped before the stored window (a clock that stepped back) is taken at that
    // window's start, where its counts weigh the most; `shift` carries every wait back to `now`.
    let index = match state {
        Some(&State::Counter { window: w, .. }) => (now / window).max(w),
        _ => now / window,
    };
    let at = now.max(index * window);
    let (prev, curr) = match state {
        Some(&State::Counter {
            window: w,
            prev,
            curr,
        }) if w == index => (prev, curr),
        Some(&State::Counter {
            window: w, curr, ..
        }) if w + 1 == index => (curr, 0),
        _ => (0, 0),
    };
    Position {
        index,
        elapsed: at - index * window,
        shift: at - now,
        prev,
        curr,
    }
}

/// The write counting `curr` in the position's window.
pub(super) fn write(policy: &Policy, at: &Position, curr: u64) -> Write {
    let window = policy.window_ms();
    Write {
        update: Update::Replace(State::Counter {
            window: at.index,
            prev: at.prev,
            curr,
        }),
        ttl_ms: at.shift + 2 * window - at.elapsed,
    }
}

pub(super) fn plan(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Plan {
    let (limit, window) = (policy.limit(), policy.window_ms());
    let at = current(policy, state, now);
    let Position {
        elapsed,
        shift,
        prev,
        curr,
        ..
    } = at;
    let capacity = limit * window;
    let estimate = |curr: u64| prev * (window - elapsed) + curr * window;
    let view = |curr: u64| View {
        remaining: capacity.saturating_sub(estimate(curr)) / window,
        // The current count weighs on through the next window; the previous one until this
        // window ends.
        reset_ms: if curr > 0 {
            shift + 2 * window - elapsed
        } else if prev > 0 {
            shift + window - elapsed
        } else {
            0
        },
    };
    let before = view(curr);
    if cost > limit {
        return Plan::denied(before, Denial::Never);
    }
    if estimate(curr) + cost * window > capacity {
        return Plan::denied(
            before,
            Denial::RetryAfterMs(shift + retry_ms(limit, window, elapsed, prev, curr, cost)),
        );
    }
    let curr = curr + cost;
    Plan::admitted(before, view(curr), write(policy, &at, curr), cost)
}

/// The earliest wait after which `cost` fits; requires `cost <= limit` and a denial now.
fn retry_ms(limit: u64, window: u64, elapsed: u64, prev: u64, curr: u64, cost: u64) -> u64 {
    // Later in this window, once `prev × (window − e) ≤ (limit − curr − cost) × window`.
    if let Some(room) = limit.checked_sub(curr + cost) {
        let fits = room * window / prev.max(1);
        if prev > 0 && fits >= 1 {
            return window - fits - elapsed;
        }
    }
    // Otherwise in the next window, where `curr` becomes the previous count.
    let next = ((limit - cost) * window)
        .checked_div(curr)
        .map_or(0, |fits| window.saturating_sub(fits));
    window - elapsed + next
}
