//! Token bucket: `limit` tokens per `window`, at most `burst`. What was taken is kept (not what
//! is left), multiplied by the window length so a refill of `elapsed_ms × limit` is exact, and
//! so a changed limit or burst reads the state as it stands.

use super::{Denial, Plan, State, Update, View, Write};
use crate::{Policy, policy::MAX_EXACT};

/// The tokens taken (× window) at `now` and the time refills count from.
pub(super) fn current(policy: &Policy, state: Option<&State>, now: u64) -> (u64, u64) {
    match state {
        Some(&State::Bucket { used, last }) => {
            let elapsed = now.saturating_sub(last);
            let used = if elapsed >= used.div_ceil(policy.limit()) {
                0
            } else {
                used - elapsed * policy.limit()
            };
            (used, last.max(now))
        }
        _ => (0, now),
    }
}

/// The write keeping `used` (× window) from `last`, at `now`.
pub(super) fn write(policy: &Policy, used: u64, last: u64, now: u64) -> Write {
    Write {
        update: Update::Replace(State::Bucket { used, last }),
        ttl_ms: last - now + used.div_ceil(policy.limit()),
    }
}

/// The most a charge may leave taken (× window): every sum stays exact in a double.
pub(super) fn most_used(policy: &Policy) -> u64 {
    MAX_EXACT - policy.burst() * policy.window_ms()
}

pub(super) fn plan(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Plan {
    let (rate, window, burst) = (policy.limit(), policy.window_ms(), policy.burst());
    let full = burst * window;
    let (used, last) = current(policy, state, now);
    // Refills count from `last`, which is later than `now` when time stepped back: every wait
    // starts there.
    let lag = last - now;
    let view = |used: u64| View {
        remaining: full.saturating_sub(used) / window,
        reset_ms: lag + used.div_ceil(rate),
    };
    let before = view(used);
    if cost > burst {
        return Plan::denied(before, Denial::Never);
    }
    let needed = cost * window;
    if used + needed > full {
        return Plan::denied(
            before,
            Denial::RetryAfterMs(lag + (used + needed - full).div_ceil(rate)),
        );
    }
    let used = used + needed;
    Plan::admitted(before, view(used), write(policy, used, last, now), cost)
}
