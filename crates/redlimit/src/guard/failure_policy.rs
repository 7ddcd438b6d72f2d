use std::time::Duration;

use crate::{Decision, Limiter, MemoryBackend, Policy, Reason, RetryAfter};

/// What a [`GuardedLimiter`](crate::GuardedLimiter) answers when its backend fails, is later
/// than its budget, or its circuit is open.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Allow the request: availability before protection.
    Open,
    /// Deny the request: protection before availability (login and signup endpoints).
    Closed,
    /// Decide with another limiter, usually in process memory. Each instance then limits on its
    /// own, so N instances admit up to N × limit while it stands in.
    Local(Limiter),
}

impl FailurePolicy {
    /// Falls back to a fresh in-memory limiter with default capacity.
    pub fn local() -> Self {
        Self::Local(Limiter::new(MemoryBackend::default()))
    }
}

impl Decision {
    pub(crate) fn fail_open(policy: &Policy) -> Self {
        Self {
            allowed: true,
            limit: policy.limit(),
            remaining: policy.limit(),
            reset_after: Duration::ZERO,
            retry_after: None,
            delay: Duration::ZERO,
            policy: policy.shared_name(),
            reason: Reason::FailOpen,
        }
    }

    pub(crate) fn fail_closed(policy: &Policy, retry: Duration) -> Self {
        Self {
            allowed: false,
            limit: policy.limit(),
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: Some(RetryAfter::After(retry)),
            delay: Duration::ZERO,
            policy: policy.shared_name(),
            reason: Reason::FailClosed,
        }
    }
}
