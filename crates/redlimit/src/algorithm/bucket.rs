//! Token bucket: `limit` tokens per `window`, at most `burst`. Tokens are kept multiplied by the
//! window length, so a refill of `elapsed_ms × limit` is exact.

use super::{Denial, Plan, State, Update, View, Write};
use crate::Policy;

pub(super) fn plan(policy: &Policy, state: Option<&State>, now: u64, cost: u64) -> Plan {
    let (rate, window, burst) = (policy.limit(), policy.window_ms(), policy.burst());
    let full = burst * window;
    let (tokens, last) = match state {
        Some(&State::Bucket { tokens, last }) => {
            let elapsed = now.saturating_sub(last);
            let missing = full.saturating_sub(tokens);
            let tokens = if elapsed >= missing.div_ceil(rate) {
                full
            } else {
                tokens + elapsed * rate
            };
            (tokens, last.max(now))
        }
        _ => (full, now),
    };
    // Refills count from `last`, which is later than `now` when time stepped back: every wait
    // starts there.
    let lag = last - now;
    let view = |tokens: u64| View {
        remaining: tokens / window,
        reset_ms: lag + (full - tokens).div_ceil(rate),
    };
    let before = view(tokens);
    if cost > burst {
        return Plan::denied(before, Denial::Never);
    }
    let needed = cost * window;
    if needed > tokens {
        return Plan::denied(
            before,
            Denial::RetryAfterMs(lag + (needed - tokens).div_ceil(rate)),
        );
    }
    let tokens = tokens - needed;
    let write = Write {
        update: Update::Replace(State::Bucket { tokens, last }),
        ttl_ms: lag + (full - tokens).div_ceil(rate),
    };
    Plan::admitted(before, view(tokens), write, cost)
}
