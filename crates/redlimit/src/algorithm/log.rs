//! Sliding window log: every admitted request's time, so no span of `window` holds more than
//! `limit`.

use std::collections::VecDeque;

use super::{Denial, Plan, State, Update, View, Write};
use crate::Policy;

pub(super) fn plan(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Plan {
    let (limit, window) = (policy.limit(), policy.window_ms());
    let empty = VecDeque::new();
    let entries = match state {
        Some(State::Log(entries)) => entries,
        _ => &empty,
    };
    // An entry at `t` counts while `t > now - window`.
    let first_live = entries.partition_point(|&t| t + window <= now);
    let count = entries.len() - first_live;
    let view = |count: u64, newest: Option<u64>| View {
        remaining: limit.saturating_sub(count),
        reset_ms: newest.map_or(0, |t| t + window - now),
    };
    let newest = entries.back().copied().filter(|_| count > 0);
    let count = count as u64;
    let before = view(count, newest);
    if cost > limit {
        return Plan::denied(before, Denial::Never);
    }
    if count + cost > limit {
        // The oldest `count + cost - limit` live entries must leave the window first.
        let leaving = usize::try_from(count + cost - limit).unwrap_or(usize::MAX);
        let last_to_leave = entries[first_live + leaving - 1];
        return Plan::denied(before, Denial::RetryAfterMs(last_to_leave + window - now));
    }
    let newest_after = if cost > 0 {
        Some(newest.map_or(now, |t| t.max(now)))
    } else {
        newest
    };
    let write = Write {
        update: Update::LogAppend {
            at: now,
            count: cost,
            window,
            keep: None,
        },
        ttl_ms: newest_after.map_or(window, |t| t + window - now),
    };
    Plan::admitted(before, view(count + cost, newest_after), write, cost)
}
