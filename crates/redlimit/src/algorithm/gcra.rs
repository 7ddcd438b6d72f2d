//! GCRA: one theoretical arrival time (TAT) in microseconds. Each request moves it one emission
//! interval later; a request passes while the TAT stays within `burst` intervals of now. In
//! delay mode it passes while its slot is within the policy's `max_delay`, and waits for it.

use super::{Denial, Plan, State, Update, View, Write};
use crate::Policy;

pub(super) fn plan(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Plan {
    let (interval, burst) = (policy.interval_us(), policy.burst());
    let tolerance = burst * interval;
    let slack = policy.max_delay_ms() * 1000;
    let tat = match state {
        Some(&State::Gcra { tat }) => tat.max(now),
        _ => now,
    };
    let view = |tat: u64| View {
        remaining: tolerance.saturating_sub(tat - now) / interval,
        reset_ms: (tat - now).div_ceil(1000),
    };
    let before = view(tat);
    if cost > burst {
        return Plan::denied(before, Denial::Never);
    }
    let new_tat = tat + cost * interval;
    if new_tat - now > tolerance + slack {
        let wait_us = new_tat - tolerance - slack - now;
        return Plan::denied(before, Denial::RetryAfterMs(wait_us.div_ceil(1000)));
    }
    let write = Write {
        update: Update::Replace(State::Gcra { tat: new_tat }),
        ttl_ms: (new_tat - now).div_ceil(1000),
    };
    Plan {
        delay_ms: new_tat.saturating_sub(tolerance + now).div_ceil(1000),
        ..Plan::admitted(before, view(new_tat), write, cost)
    }
}
