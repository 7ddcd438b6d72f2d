//! Fixed window, aligned to `floor(now / window)` or anchored at the first hit.

use super::{Denial, Plan, State, Update, View, Write};
use crate::Policy;

pub(super) fn plan(
    policy: &Policy,
    state: Option<&State>,
    now: u64,
    cost: u64,
    aligned: bool,
) -> Plan {
    let (limit, window) = (policy.limit(), policy.window_ms());
    let fresh_start = if aligned { now - now % window } else { now };
    // A check stamped before the stored window (a clock that stepped back) counts in it: a
    // fresh window there would admit the limit once more.
    let (start, count) = match state {
        Some(&State::Window { start, count })
            if (aligned && start >= fresh_start) || (!aligned && now < start + window) =>
        {
            (start, count)
        }
        _ => (fresh_start, 0),
    };
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
    let write = Write {
        update: Update::Replace(State::Window { start, count }),
        ttl_ms: end - now,
    };
    Plan::admitted(before, view(count), write, cost)
}
