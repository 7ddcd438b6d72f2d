//! One circuit breaker, or on a Redis Cluster one per range of slots, so that a dead primary
//! sends only its own clients to the failure policy.

use std::sync::Arc;

use super::metrics::Metrics;
use crate::{CircuitBreaker, Limiter};

/// Ranges of Redis Cluster slots with a circuit each: a Cluster has at most this many primaries
/// worth telling apart, and a primary's slots are usually one contiguous range.
#[cfg(feature = "cluster")]
const SLOT_RANGES: usize = 64;

/// A guard's circuits: one, or on a Cluster one per range of slots.
pub(super) struct Breakers {
    circuits: Arc<[CircuitBreaker]>,
}

impl Breakers {
    /// Fresh circuits of `settings` for `limiter`'s backend, each with its gauge in `metrics`.
    pub(super) fn new(limiter: &Limiter, settings: &CircuitBreaker, metrics: &Metrics) -> Self {
        #[cfg(feature = "cluster")]
        let ranges = if limiter.backend().is_cluster() {
            SLOT_RANGES
        } else {
            1
        };
        #[cfg(not(feature = "cluster"))]
        let ranges = {
            let _ = limiter;
            1
        };
        let label = |range: usize| match ranges {
            1 => "0".to_owned(),
            _ => format!(
                "{}-{}",
                range * 16_384 / ranges,
                (range + 1) * 16_384 / ranges - 1
            ),
        };
        Self {
            circuits: (0..ranges)
                .map(|range| settings.fresh(metrics.circuit(label(range))))
                .collect(),
        }
    }

    /// The circuit that `client`'s keys answer to.
    pub(super) fn of(&self, limiter: &Limiter, client: &str) -> &CircuitBreaker {
        #[cfg(feature = "cluster")]
        if self.circuits.len() > 1 {
            let slot = usize::from(limiter.keys().slot(client));
            return &self.circuits[slot * self.circuits.len() / 16_384];
        }
        let _ = (limiter, client);
        &self.circuits[0]
    }

    /// The first circuit: the only one off a Cluster.
    pub(super) fn first(&self) -> &CircuitBreaker {
        &self.circuits[0]
    }

    /// Whether any circuit is open.
    pub(super) fn any_open(&self) -> bool {
        self.circuits.iter().any(CircuitBreaker::is_open)
    }
}
