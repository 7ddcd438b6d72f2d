use std::sync::atomic::{AtomicU64, Ordering};

use crate::{ErrorKind, Reason};

/// Counts of what a [`GuardedLimiter`](crate::GuardedLimiter) answered and which failures it
/// met.
#[derive(Debug, Default)]
pub struct Stats {
    reasons: [AtomicU64; Reason::COUNT],
    errors: [AtomicU64; ErrorKind::COUNT],
    service_failures: AtomicU64,
}

impl Stats {
    /// How many checks were decided by `reason`.
    pub fn decided(&self, reason: Reason) -> u64 {
        self.reasons[reason.index()].load(Ordering::Relaxed)
    }

    /// How many checks met an error of `kind`.
    pub fn failed(&self, kind: ErrorKind) -> u64 {
        self.errors[kind.index()].load(Ordering::Relaxed)
    }

    /// How many responses of the protected service were server errors (5xx) after an allowed
    /// check; see [`GuardedLimiter::service_failed`](crate::GuardedLimiter::service_failed).
    pub fn service_failures(&self) -> u64 {
        self.service_failures.load(Ordering::Relaxed)
    }

    pub(crate) fn count_service_failure(&self) {
        self.service_failures.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_decided(&self, reason: Reason) {
        self.reasons[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_failed(&self, kind: ErrorKind) {
        self.errors[kind.index()].fetch_add(1, Ordering::Relaxed);
    }
}
