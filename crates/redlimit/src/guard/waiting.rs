//! Delay mode's waiting room: how many requests may wait for their slot at once.

use std::{fmt, sync::Arc};

use metrics::{Counter, Gauge};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bounded set of requests waiting for their slot in one guard.
#[derive(Debug)]
pub(crate) struct Waiters {
    places: Arc<Semaphore>,
    max: usize,
    gauge: Gauge,
    rejected: Counter,
}

impl Waiters {
    pub(crate) fn new(max: usize, gauge: Gauge, rejected: Counter) -> Self {
        Self {
            places: Arc::new(Semaphore::new(max)),
            max,
            gauge,
            rejected,
        }
    }

    /// A place to wait in, or `None` (counted) when every place is taken.
    pub(crate) fn enter(&self) -> Option<Waiting> {
        match Arc::clone(&self.places).try_acquire_owned() {
            Ok(permit) => {
                self.gauge.increment(1.0);
                Some(Waiting {
                    _permit: permit,
                    gauge: self.gauge.clone(),
                })
            }
            Err(_) => {
                self.rejected.increment(1);
                None
            }
        }
    }

    /// How many requests wait now.
    pub(crate) fn count(&self) -> usize {
        self.max - self.places.available_permits()
    }
}

/// A request's place among the waiters of a [`GuardedLimiter`](crate::GuardedLimiter) in delay
/// mode, held while it waits for its slot and given back when dropped (the wait is over, or the
/// client went away); see [`GuardedLimiter::wait`](crate::GuardedLimiter::wait).
#[must_use = "the place is given back when dropped"]
pub struct Waiting {
    _permit: OwnedSemaphorePermit,
    gauge: Gauge,
}

impl fmt::Debug for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waiting").finish_non_exhaustive()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.gauge.decrement(1.0);
    }
}
