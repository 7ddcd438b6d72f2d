//! GCRA: one theoretical arrival time (TAT) in microseconds and the emission interval it was
//! reached by. Each request moves it one interval later; a request passes while the TAT stays
//! within `burst` intervals of now. In delay mode it passes while its slot is within the
//! policy's `max_delay`, and waits for it. A TAT reached by another interval (a changed limit)
//! is read as the same number of requests owed, at the interval in force.

use super::{Denial, Plan, State, Update, View, Write};
use crate::Policy;

/// The most a settle may leave owed (µs), so that every TAT stays exact in a double.
pub(super) const MAX_DEBT_US: u64 = 1 << 52;

/// The TAT at `now` under the policy's interval: never before now.
pub(super) fn current(policy: &Policy, state: Option<&State>, now: u64) -> u64 {
    match state {
        Some(&State::Gcra { tat, interval }) if tat > now => {
            if interval == policy.interval_us() {
                tat
            } else {
                // The same operations, in doubles, as the script's, so both round alike.
                #[allow(
                    clippy::cast_precision_loss,
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss
                )]
                let debt = ((tat - now) as f64 * policy.interval_us() as f64 / interval as f64)
                    .ceil() as u64;
                now + debt
            }
        }
        _ => now,
    }
}

/// The write keeping `tat`, at `now`.
pub(super) fn write(policy: &Policy, tat: u64, now: u64) -> Write {
    Write {
        update: Update::Replace(State::Gcra {
            tat,
            interval: policy.interval_us(),
        }),
        ttl_ms: (tat - now).div_ceil(1000),
    }
}

pub(super) fn plan(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Plan {
    let (interval, burst) = (policy.interval_us(), policy.burst());
    let tolerance = burst * interval;
    let slack = policy.max_delay_ms() * 1000;
    let tat = current(policy, state, now);
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
    Plan {
        delay_ms: new_tat.saturating_sub(tolerance + now).div_ceil(1000),
        ..Plan::admitted(before, view(new_tat), write(policy, new_tat, now), cost)
    }
}
