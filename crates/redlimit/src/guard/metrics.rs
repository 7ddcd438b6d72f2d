//! The guard's series in the [`metrics`] facade. Handles are registered once, when the guard is
//! built, so a check costs an atomic increment per series, never a registry lookup.

use std::{sync::Arc, time::Duration};

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};

use crate::{Decision, ErrorKind, PolicySet, Reason};

/// Decisions by policy, outcome and reason.
pub(crate) const DECISIONS: &str = "redlimit_decisions_total";
/// Checks that the backend failed, by kind.
pub(crate) const BACKEND_ERRORS: &str = "redlimit_backend_errors_total";
/// The backend's round trip of a check, in seconds.
pub(crate) const CHECK_DURATION: &str = "redlimit_check_duration_seconds";
/// Whether a circuit is open (1) or closed (0).
pub(crate) const CIRCUIT_OPEN: &str = "redlimit_circuit_open";
/// Delay mode: requests admitted to wait for their slot.
pub(crate) const DELAYED: &str = "redlimit_delayed_total";

/// How a decision is counted: exactly one of these per policy per check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Allowed,
    NearLimit,
    Limited,
    /// Denied by a ban (see `Ban`): only for policies that ban.
    Banned,
}

const OUTCOMES: [Outcome; 4] = [
    Outcome::Allowed,
    Outcome::NearLimit,
    Outcome::Limited,
    Outcome::Banned,
];

impl Outcome {
    const fn as_str(self) -> &'static str {
        match self {
            Self::Allowed => "allowed",
            Self::NearLimit => "near_limit",
            Self::Limited => "limited",
            Self::Banned => "banned",
        }
    }
}

/// Every reason, in the order of [`Reason::index`].
const REASONS: [Reason; Reason::COUNT] = [
    Reason::Redis,
    Reason::Memory,
    Reason::LocalBlock,
    Reason::FailOpen,
    Reason::FailClosed,
    Reason::Fallback,
    Reason::Shadow,
    Reason::Grant,
];

const KINDS: [ErrorKind; ErrorKind::COUNT] = [
    ErrorKind::Timeout,
    ErrorKind::Backend,
    ErrorKind::CorruptState,
    ErrorKind::InvalidInput,
];

/// Whether a decision of `reason` can be counted as `outcome` on a backend that is `remote`
/// (Redis) or not (memory), for a policy of `kind`: only those series are registered, so an
/// exposition shows no series that can never move.
const fn possible(outcome: Outcome, reason: Reason, remote: bool, kind: Kind) -> bool {
    let bans = matches!(kind, Kind::Banning);
    if matches!(reason, Reason::Grant) {
        return remote
            && matches!(kind, Kind::Granted)
            && matches!(outcome, Outcome::Allowed | Outcome::NearLimit);
    }
    if matches!(outcome, Outcome::Banned) && (!bans || matches!(reason, Reason::Shadow)) {
        return false;
    }
    // Leases are neither cached locally nor shadowed.
    if matches!(kind, Kind::Concurrency) && matches!(reason, Reason::LocalBlock | Reason::Shadow) {
        return false;
    }
    match reason {
        Reason::Memory if remote => false,
        Reason::Redis | Reason::LocalBlock if !remote => false,
        Reason::Redis | Reason::Memory | Reason::Fallback => true,
        Reason::FailOpen => matches!(outcome, Outcome::Allowed),
        Reason::LocalBlock => matches!(outcome, Outcome::Limited | Outcome::Banned),
        Reason::FailClosed | Reason::Shadow => matches!(outcome, Outcome::Limited),
        Reason::Grant => false,
    }
}

/// What a policy's decisions can be: which of its series are registered.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Rate,
    /// A rate policy with a ban.
    Banning,
    /// A rate policy in hot-key mode.
    Granted,
    Concurrency,
}

/// One policy's decision counters and its near-limit threshold.
#[derive(Debug)]
struct PolicySeries {
    /// Allowed with at most this many remaining counts as near the limit.
    near: u64,
    /// By `outcome * Reason::COUNT + reason`.
    decisions: Vec<Counter>,
}

impl PolicySeries {
    fn new(name: &str, limit: u64, kind: Kind, remote: bool, near_share: f64) -> Self {
        let mut decisions = Vec::with_capacity(OUTCOMES.len() * REASONS.len());
        for outcome in OUTCOMES {
            for reason in REASONS {
                decisions.push(if possible(outcome, reason, remote, kind) {
                    counter!(
                        DECISIONS,
                        "policy" => name.to_owned(),
                        "outcome" => outcome.as_str(),
                        "reason" => reason.as_str(),
                    )
                } else {
                    Counter::noop()
                });
            }
        }
        Self {
            near: near_threshold(limit, near_share),
            decisions,
        }
    }

    fn count(&self, decision: &Decision) {
        let outcome = if decision.reason == Reason::Shadow {
            Outcome::Limited
        } else if decision.banned {
            Outcome::Banned
        } else if !decision.allowed {
            Outcome::Limited
        } else if decision.remaining <= self.near {
            Outcome::NearLimit
        } else {
            Outcome::Allowed
        };
        let at = outcome as usize * Reason::COUNT + decision.reason.index();
        self.decisions[at].increment(1);
    }
}

/// The series of one guard.
#[derive(Debug)]
pub(crate) struct Metrics {
    policies: Vec<PolicySeries>,
    errors: [Counter; ErrorKind::COUNT],
    delayed: Counter,
    duration: Histogram,
    /// The `policy` label of series about a whole check: the guard's names joined by `+`.
    label: Arc<str>,
}

impl Metrics {
    /// Registers the series of a guard of `policies` on a `remote` backend or not with the
    /// recorder installed now; a decision is near the limit when allowed with at most
    /// `near_share` of its limit left.
    pub(crate) fn new(policies: &PolicySet, remote: bool, near_share: f64) -> Self {
        describe();
        let names: Vec<&str> = policies.iter().map(|p| p.name()).collect();
        let label: Arc<str> = names.join("+").into();
        let rates = policies.iter().map(|policy| {
            let kind = if policy.ban().is_some() {
                Kind::Banning
            } else if policy.grants().is_some() {
                Kind::Granted
            } else {
                Kind::Rate
            };
            PolicySeries::new(policy.name(), policy.limit(), kind, remote, near_share)
        });
        // Its decision comes after the policies'.
        let concurrency = policies.concurrency().map(|policy| {
            let (name, limit) = (policy.name(), policy.limit());
            PolicySeries::new(name, limit, Kind::Concurrency, remote, near_share)
        });
        let series = rates.chain(concurrency).collect();
        let guard = label.to_string();
        Self {
            policies: series,
            errors: KINDS.map(
                |kind| counter!(BACKEND_ERRORS, "policy" => guard.clone(), "kind" => kind.as_str()),
            ),
            delayed: counter!(DELAYED, "policy" => guard.clone()),
            duration: histogram!(CHECK_DURATION, "policy" => guard),
            label,
        }
    }

    /// Counts the decisions of one check, which are in the order of the guard's policies, its
    /// concurrency limit's last.
    pub(crate) fn decided(&self, decisions: &[Decision]) {
        for (series, decision) in self.policies.iter().zip(decisions) {
            series.count(decision);
        }
    }

    /// The guard's policy names joined by `+`.
    pub(crate) fn label(&self) -> &str {
        &self.label
    }

    pub(crate) fn failed(&self, kind: ErrorKind) {
        self.errors[kind.index()].increment(1);
    }

    pub(crate) fn delayed(&self) {
        self.delayed.increment(1);
    }

    pub(crate) fn round_trip(&self, took: Duration) {
        self.duration.record(took.as_secs_f64());
    }

    /// The gauge of circuit `circuit` of this guard (`"0"`, or a Cluster's slot range).
    pub(crate) fn circuit(&self, circuit: String) -> Gauge {
        gauge!(CIRCUIT_OPEN, "policy" => self.label.to_string(), "circuit" => circuit)
    }
}

/// The series' help texts, for the exposition.
fn describe() {
    describe_counter!(
        DECISIONS,
        "Decisions by policy, outcome (allowed, near_limit, limited, banned) and reason (the path that decided)"
    );
    describe_counter!(BACKEND_ERRORS, "Checks whose backend failed, by kind");
    describe_histogram!(
        CHECK_DURATION,
        Unit::Seconds,
        "The backend's round trip of a check, within the time budget"
    );
    describe_gauge!(CIRCUIT_OPEN, "1 while a circuit breaker is open, else 0");
    describe_counter!(
        DELAYED,
        "Requests admitted in delay mode to wait for their slot"
    );
}

/// `floor(limit × share)`, in `0..=limit`.
fn near_threshold(limit: u64, share: f64) -> u64 {
    // Limits are below 2^53, exact as doubles; the product is clamped before the cast back.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let near = (limit as f64 * share.clamp(0.0, 1.0)).floor() as u64;
    near.min(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_limit_is_a_share_of_the_limit_rounded_down() {
        assert_eq!(near_threshold(5, 0.2), 1);
        assert_eq!(near_threshold(100, 0.2), 20);
        assert_eq!(near_threshold(4, 0.2), 0);
        assert_eq!(near_threshold(10, 7.0), 10);
        assert_eq!(near_threshold(10, -1.0), 0);
    }

    #[test]
    fn every_reason_is_listed_in_its_index_order() {
        for (at, reason) in REASONS.iter().enumerate() {
            assert_eq!(reason.index(), at);
        }
        for (at, kind) in KINDS.iter().enumerate() {
            assert_eq!(kind.index(), at);
        }
    }
}
