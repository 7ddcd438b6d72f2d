use std::{sync::Arc, time::Duration};

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
    /// Falls back to a fresh in-memory limiter with default capacity: the short form of
    /// `FailurePolicy::Local(Limiter::new(MemoryBackend::default()))`, the usual choice. Build
    /// the variant yourself only to bound the fallback's memory
    /// ([`MemoryBackend::builder`](crate::MemoryBackend::builder)) or to share one fallback
    /// between guards.
    pub fn local() -> Self {
        Self::Local(Limiter::new(MemoryBackend::default()))
    }
}

impl Decision {
    pub(crate) fn fail_open(policy: &Policy) -> Self {
        Self {
            window: policy.window(),
            burst: policy.burst(),
            ..Self::fail_open_of(policy.shared_name(), policy.limit())
        }
    }

    /// A fail-open decision of the limit `limit` named `policy`.
    pub(crate) fn fail_open_of(policy: Arc<str>, limit: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining: limit,
            reset_after: Duration::ZERO,
            retry_after: None,
            delay: Duration::ZERO,
            policy,
            reason: Reason::FailOpen,
            banned: false,
            window: Duration::ZERO,
            burst: limit,
            overridden: false,
        }
    }

    pub(crate) fn fail_closed(policy: &Policy, retry: Duration) -> Self {
        Self {
            window: policy.window(),
            burst: policy.burst(),
            ..Self::fail_closed_of(policy.shared_name(), policy.limit(), retry)
        }
    }

    /// A fail-closed decision of the limit `limit` named `policy`.
    pub(crate) fn fail_closed_of(policy: Arc<str>, limit: u64, retry: Duration) -> Self {
        Self {
            allowed: false,
            limit,
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: Some(RetryAfter::After(retry)),
            delay: Duration::ZERO,
            policy,
            reason: Reason::FailClosed,
            banned: false,
            window: Duration::ZERO,
            burst: limit,
            overridden: false,
        }
    }
}
