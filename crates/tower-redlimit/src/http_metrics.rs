//! The layer's own series in the [`metrics`] facade: what the HTTP side sees that the limiter
//! does not (requests on the lists, the service's server errors). Registered once per tier,
//! with the recorder in force when the layer wraps a service.

use metrics::{Counter, counter, describe_counter};
use redlimit::GuardedLimiter;

/// Requests on an allow or deny list, decided without a backend call.
const LISTED: &str = "redlimit_listed_total";
/// Server errors of the protected service after an allowed check.
const SERVICE_FAILURES: &str = "redlimit_service_failures_total";

/// One tier's HTTP series, labelled by its guard's policy names joined by `+`.
pub(crate) struct HttpSeries {
    /// On the allow list, on the deny list.
    listed: [Counter; 2],
    service_failures: Counter,
}

impl HttpSeries {
    pub(crate) fn new(guard: &GuardedLimiter) -> Self {
        describe_counter!(
            LISTED,
            "Requests on the allow or deny list, decided without a backend call"
        );
        describe_counter!(
            SERVICE_FAILURES,
            "Server errors (5xx) of the protected service after an allowed check"
        );
        let names: Vec<&str> = guard.policies().iter().map(|p| p.name()).collect();
        let label = names.join("+");
        Self {
            listed: ["allow", "deny"]
                .map(|list| counter!(LISTED, "policy" => label.clone(), "list" => list)),
            service_failures: counter!(SERVICE_FAILURES, "policy" => label),
        }
    }

    /// Counts a request an allow list (`allowed`) or a deny list let through or turned away.
    pub(crate) fn listed(&self, allowed: bool) {
        self.listed[usize::from(!allowed)].increment(1);
    }

    /// Counts a server error (5xx) of the service after an allowed check: the limiter's own
    /// view of "the handler failed" beside "the limiter said no".
    pub(crate) fn service_failed(&self) {
        self.service_failures.increment(1);
    }
}
