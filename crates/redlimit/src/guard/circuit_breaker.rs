use metrics::Gauge;
use std::{
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

/// Stops calling a failing backend for a cooldown, then lets one probe through.
///
/// After `threshold` consecutive failures (errors or timeouts; corrupt state of one key does not
/// count) the circuit opens: checks go straight to the failure policy and cost no latency. After
/// `cooldown` one check probes the backend; success closes the circuit, failure opens it again.
#[derive(Debug)]
pub struct CircuitBreaker {
    threshold: u32,
    cooldown: Duration,
    state: Mutex<Circuit>,
    /// `redlimit_circuit_open`: set when the circuit opens or closes.
    gauge: Gauge,
}

#[derive(Debug, Clone, Copy)]
enum Circuit {
    Closed { failures: u32 },
    Open { until: Instant },
    Probing { since: Instant },
}

impl Default for CircuitBreaker {
    /// Opens after 5 consecutive failures, for 2 seconds.
    fn default() -> Self {
        Self::new(5, Duration::from_secs(2))
    }
}

impl CircuitBreaker {
    /// Opens after `threshold` consecutive failures (at least 1), for `cooldown`.
    pub fn new(threshold: u32, cooldown: Duration) -> Self {
        Self {
            threshold: threshold.max(1),
            cooldown,
            state: Mutex::new(Circuit::Closed { failures: 0 }),
            gauge: Gauge::noop(),
        }
    }

    /// A closed breaker with the same settings, reporting its state to `gauge`.
    pub(crate) fn fresh(&self, gauge: Gauge) -> Self {
        gauge.set(0.0);
        Self {
            gauge,
            ..Self::new(self.threshold, self.cooldown)
        }
    }

    /// How long the circuit stays open.
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// Whether the circuit is open (or probing) right now.
    pub fn is_open(&self) -> bool {
        !matches!(*self.lock(), Circuit::Closed { .. })
    }

    fn lock(&self) -> MutexGuard<'_, Circuit> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a check may call the backend now.
    pub(crate) fn permit(&self) -> bool {
        let mut state = self.lock();
        if let Circuit::Closed { .. } = *state {
            return true;
        }
        let now = Instant::now();
        match *state {
            Circuit::Closed { .. } => true,
            Circuit::Open { until } if now < until => false,
            // A probe whose caller went away never reports: after a cooldown, probe again.
            Circuit::Probing { since } if now < since + self.cooldown => false,
            Circuit::Open { .. } | Circuit::Probing { .. } => {
                *state = Circuit::Probing { since: now };
                true
            }
        }
    }

    pub(crate) fn record(&self, healthy: bool) {
        let mut state = self.lock();
        let was_closed = matches!(*state, Circuit::Closed { .. });
        *state = match (*state, healthy) {
            (_, true) => Circuit::Closed { failures: 0 },
            (Circuit::Closed { failures }, false) if failures + 1 < self.threshold => {
                Circuit::Closed {
                    failures: failures + 1,
                }
            }
            (_, false) => Circuit::Open {
                until: Instant::now() + self.cooldown,
            },
        };
        let closed = matches!(*state, Circuit::Closed { .. });
        if closed != was_closed {
            self.gauge.set(if closed { 0.0 } else { 1.0 });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_after_the_threshold_and_probes_after_the_cooldown() {
        let breaker = CircuitBreaker::new(2, Duration::from_millis(30));
        assert!(breaker.permit());
        breaker.record(false);
        assert!(breaker.permit(), "one failure is below the threshold");
        breaker.record(false);
        assert!(!breaker.permit(), "open");
        std::thread::sleep(Duration::from_millis(40));
        assert!(breaker.permit(), "one probe after the cooldown");
        assert!(!breaker.permit(), "only one");
        breaker.record(false);
        assert!(!breaker.permit(), "a failed probe opens it again");
        std::thread::sleep(Duration::from_millis(40));
        assert!(breaker.permit());
        breaker.record(true);
        assert!(
            breaker.permit() && breaker.permit(),
            "a good probe closes it"
        );
    }
}
