//! Delay mode's waiting room: how many requests of one layer may wait for their slot at once.

use std::{fmt, sync::Arc};

use metrics::{Counter, Gauge, counter, describe_counter, describe_gauge, gauge};
use redlimit::GuardedLimiter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Delay mode: requests waiting now.
const WAITING: &str = "redlimit_waiting";
/// Delay mode: requests with no place left to wait.
const DELAY_REJECTED: &str = "redlimit_delay_rejected_total";

/// The bounded set of requests waiting for their slot in one layer.
#[derive(Debug)]
pub(crate) struct Waiters {
    places: Arc<Semaphore>,
    max: usize,
    gauge: Gauge,
    rejected: Counter,
}

impl Waiters {
    /// A room for `max` waiters of the layer of `guard`, its series (labelled by the guard's
    /// policy names joined by `+`) registered with the recorder in force now.
    pub(crate) fn new(max: usize, guard: &GuardedLimiter) -> Self {
        describe_gauge!(WAITING, "Requests waiting for their slot now (delay mode)");
        describe_counter!(
            DELAY_REJECTED,
            "Requests turned away in delay mode because every place to wait was taken"
        );
        let names: Vec<&str> = guard.policies().iter().map(|p| p.name()).collect();
        let label = names.join("+");
        let gauge = gauge!(WAITING, "policy" => label.clone());
        let rejected = counter!(DELAY_REJECTED, "policy" => label);
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

/// A request's place among the waiters of a layer in delay mode, held while it waits for its
/// slot and given back when dropped (the wait is over, or the client went away).
#[must_use = "the place is given back when dropped"]
pub(crate) struct Waiting {
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
