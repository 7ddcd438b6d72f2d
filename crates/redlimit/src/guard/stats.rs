use std::sync::atomic::{AtomicU64, Ordering};

use crate::{ErrorKind, Reason};

/// Counts of what a [`GuardedLimiter`](crate::GuardedLimiter) answered and which failures it
/// met.
#[derive(Debug, Default)]
pub struct Stats {
    reasons: [AtomicU64; 6],
    errors: [AtomicU64; 4],
}

impl Stats {
    /// How many checks were decided by `reason`.
    pub fn decided(&self, reason: Reason) -> u64 {
        self.reasons[reason_index(reason)].load(Ordering::Relaxed)
    }

    /// How many checks met an error of `kind`.
    pub fn failed(&self, kind: ErrorKind) -> u64 {
        self.errors[error_index(kind)].load(Ordering::Relaxed)
    }

    pub(crate) fn count_decided(&self, reason: Reason) {
        self.reasons[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_failed(&self, kind: ErrorKind) {
        self.errors[error_index(kind)].fetch_add(1, Ordering::Relaxed);
    }
}

const fn reason_index(reason: Reason) -> usize {
    match reason {
        Reason::Redis => 0,
        Reason::Memory => 1,
        Reason::LocalBlock => 2,
        Reason::FailOpen => 3,
        Reason::FailClosed => 4,
        Reason::Fallback => 5,
    }
}

const fn error_index(kind: ErrorKind) -> usize {
    match kind {
        ErrorKind::Timeout => 0,
        ErrorKind::Backend => 1,
        ErrorKind::CorruptState => 2,
        ErrorKind::InvalidInput => 3,
    }
}
