//! Fixed window, aligned to `floor(now / window)` or anchored at the first hit.

use super::{Denial, Plan, State, Update, View, Write};
use crate::Policy;

/// The start and count of the window a check at `now` counts in.
pub(super) fn current(
    policy: &Policy,
    state: Option<&State>,
    now: u64,
    aligned: bool,
) -> (u64, u64) {
    let window = policy.window_ms();
    let fresh_start = if aligned { now - now % window } else { now };
    // A check stamped before the stored window (a clock that stepped back) counts in it: a
    // fresh window there would admit the limit once more.
    match state {
        Some(&State::Window { start, count })
            if (aligned && start >= fresh_start) || (!aligned && now < start + window) =>
        {
            (start, count)
        }
        _ => (fresh_start, 0),
    }
}

/// The write keeping `count` in the window at `start`, at `now`.
pub(super) fn write(policy: &Policy, start: u64, count: u64, now: u64) -> Write {
    Write {
        update: Update::Replace(State::Window { start, count }),
        ttl_ms: start + policy.window_ms() - now,
    }
}

pub(super) fn plan(
    policy: &Policy,
    state: Option<&State>,
    now: u64,
    cost: u64,
    aligned: bool,
) -> Plan {
    let (limit, window) = (policy.limit(), policy.window_ms());
    let (start, count) = current(policy, state, now, aligned);
    let end = start + window;
    let view = |count: u64| View {
        remaining: limit.saturating_sub(count),
        reset_ms: if count > 0 { end - now } else { 0 },
    };
    let before = view(count);
    if cost > limit {
        return Plan::denied(before, Denial::Never);
    }
    if count + cost > limit {
        return Plan::denied(before, Denial::RetryAfterMs(end - now));
    }
    let count = count + cost;
    Plan::admitted(before, view(count), write(policy, start, count, now), cost)
}
