//! What a guard is built from: the builder's settings, handed to the guard whole.

use std::{sync::Arc, time::Duration};

use crate::{BlockCache, CircuitBreaker, FailurePolicy, Limiter, PolicySet, Timestamp};

/// A source of explicit check times, for tests and replays; see
/// [`GuardBuilder::clock`](crate::GuardBuilder::clock).
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// What a guard is built from.
pub(super) struct Parts {
    pub(super) limiter: Limiter,
    pub(super) policies: PolicySet,
    pub(super) failure: FailurePolicy,
    pub(super) budget: Duration,
    pub(super) breaker: CircuitBreaker,
    pub(super) shadow: bool,
    pub(super) near_share: f64,
    /// `None`: the default for the policies.
    pub(super) blocks: Option<Option<BlockCache>>,
    pub(super) clock: Option<Clock>,
}
