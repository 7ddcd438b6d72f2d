//! What a backend answers, on Redis and in memory alike: for one policy of a check, for an
//! operator's read, for a lease.

use std::time::Duration;

use super::query::Target;
use crate::{
    Decision, KeyScheme, Policy, Reason, RetryAfter,
    algorithm::{Denial, View},
};

/// One policy's answer from the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) view: View,
    pub(crate) denial: Option<Denial>,
    /// Delay mode: how long an admitted request waits for its slot, in milliseconds.
    pub(crate) delay_ms: u64,
    /// Denied by a ban.
    pub(crate) banned: bool,
}

impl Answer {
    pub(crate) const fn denied(view: View, denial: Denial) -> Self {
        Self {
            view,
            denial: Some(denial),
            delay_ms: 0,
            banned: false,
        }
    }

    /// Denied by a ban that ends in `left_ms`.
    pub(crate) const fn banned(view: View, left_ms: u64) -> Self {
        Self {
            view,
            denial: Some(Denial::RetryAfterMs(left_ms)),
            delay_ms: 0,
            banned: true,
        }
    }

    pub(crate) const fn allowed(view: View, delay_ms: u64) -> Self {
        Self {
            view,
            denial: None,
            delay_ms,
            banned: false,
        }
    }
}

/// What the inspect script read: the decision of its cost (the quota as it is, nothing
/// consumed), the key's time to live, and its state as field, value pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    pub(crate) answer: Answer,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) state: Vec<(String, String)>,
    /// The limit in force and the key read, when an override named others than the policy's.
    pub(crate) overridden: Option<(u64, String)>,
}

impl Inspected {
    /// The key read, the decision of `policy` (with the limit in force) and what was read, for
    /// an operator's read of `target`.
    pub(crate) fn seen(
        self,
        keys: &KeyScheme,
        policy: &Policy,
        target: &Target<'_>,
        reason: Reason,
    ) -> (String, Decision, Self) {
        let mut decision = decision(policy, self.answer, reason);
        let key = match &self.overridden {
            Some((limit, key)) => {
                decision.limit = *limit;
                decision.overridden = true;
                key.clone()
            }
            None => target.key(keys, policy),
        };
        (key, decision, self)
    }
}

/// A concurrency limit's answer to a check: granted or not, the free slots after it, and when denied the wait
/// in milliseconds until the earliest lease expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acquired {
    pub(crate) granted: bool,
    pub(crate) free: u64,
    pub(crate) wait_ms: u64,
}

/// `policy`'s decision from its `answer`.
pub(crate) fn decision(policy: &Policy, answer: Answer, reason: Reason) -> Decision {
    Decision {
        allowed: answer.denial.is_none(),
        limit: policy.limit(),
        remaining: answer.view.remaining,
        reset_after: Duration::from_millis(answer.view.reset_ms),
        retry_after: answer.denial.map(|denial| match denial {
            Denial::RetryAfterMs(ms) => RetryAfter::After(Duration::from_millis(ms)),
            Denial::Never => RetryAfter::Never,
        }),
        delay: Duration::from_millis(answer.delay_ms),
        policy: policy.shared_name(),
        reason,
        banned: answer.banned,
        window: policy.window(),
        burst: policy.burst(),
        overridden: false,
    }
}

/// Flags each of `decisions` whose numbers in force are not those of its policy in `set` (a
/// per-client override).
pub(crate) fn mark_overridden(decisions: &mut [Decision], set: &[Policy]) {
    for (decision, policy) in decisions.iter_mut().zip(set) {
        decision.overridden = (decision.limit, decision.window, decision.burst)
            != (policy.limit(), policy.window(), policy.burst());
    }
}
