use std::sync::atomic::{AtomicU64, Ordering};

use crate::{ErrorKind, Reason};

/// Counts of what a [`GuardedLimiter`](crate::GuardedLimiter) answered and which failures it
/// met.
#[derive(Debug, Default)]
pub struct Stats {
    reasons: [AtomicU64; Reason::COUNT],
    errors: [AtomicU64; ErrorKind::COUNT],
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

    pub(crate) fn count_decided(&self, reason: Reason) {
        self.reasons[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_failed(&self, kind: ErrorKind) {
        self.errors[kind.index()].fetch_add(1, Ordering::Relaxed);
    }
}
