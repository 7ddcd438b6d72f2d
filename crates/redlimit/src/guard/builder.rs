use std::{fmt, time::Duration};

use super::parts::{Clock, Parts};
use crate::{BlockCache, CircuitBreaker, FailurePolicy, GuardedLimiter, Limiter, PolicySet};

/// Builds a [`GuardedLimiter`]: each setting is independent of the others and of their
/// order; [`build`](Self::build) makes the metrics, circuits and waiting room once.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, FailurePolicy, GuardedLimiter, Limiter, MemoryBackend, Policy};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let policy = Policy::builder("api", Algorithm::Gcra)
///     .limit(100)
///     .window(Duration::from_secs(60))
///     .build()?;
/// let guard = GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy)
///     .failure(FailurePolicy::local())
///     .budget(Duration::from_millis(20))
///     .build();
/// assert!(guard.check("client").await.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[must_use]
pub struct GuardBuilder {
    parts: Parts,
}

impl fmt::Debug for GuardBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts = &self.parts;
        f.debug_struct("GuardBuilder")
            .field("policies", &parts.policies)
            .field("failure", &parts.failure)
            .field("budget", &parts.budget)
            .field("shadow", &parts.shadow)
            .finish_non_exhaustive()
    }
}

impl GuardedLimiter {
    /// Starts a guard of `limiter` checking `policies` (one policy converts, several are a
    /// [`PolicySet`]): set what differs from the defaults, then [`build`](GuardBuilder::build).
    pub fn builder(limiter: Limiter, policies: impl Into<PolicySet>) -> GuardBuilder {
        GuardBuilder::new(limiter, policies.into())
    }
}

impl GuardBuilder {
    fn new(limiter: Limiter, policies: PolicySet) -> Self {
        Self {
            parts: Parts {
                limiter,
                policies,
                failure: FailurePolicy::Open,
                budget: Duration::from_millis(50),
                breaker: CircuitBreaker::default(),
                shadow: false,
                near_share: 0.2,
                blocks: None,
                clock: None,
            },
        }
    }

    /// What to answer when the backend fails. Defaults to [`FailurePolicy::Open`].
    pub fn failure(mut self, failure: FailurePolicy) -> Self {
        self.parts.failure = failure;
        self
    }

    /// The time budget of one check: the most it may wait for the backend (a Redis
    /// connection from the pool included) before the failure policy answers, counted as
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout). It replaces the backend's
    /// [budget](crate::RedisBackendBuilder::budget) for the guard's checks: one timer per
    /// check. `Duration::ZERO` keeps the backend's. Defaults to 50 ms.
    pub fn budget(mut self, budget: Duration) -> Self {
        self.parts.budget = budget;
        self
    }

    /// The circuit breaker. Defaults to [`CircuitBreaker::default`].
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.parts.breaker = breaker;
        self
    }

    /// Dry run: every check is made, consumes, is counted and logged as usual, but a request
    /// that would be denied passes, its decisions marked [`Reason::Shadow`](crate::Reason::Shadow)
    /// (with the remaining quota and waits of the denial, so rate-limit headers stay
    /// truthful). For trying a new limit on live traffic before enforcing it. Defaults to
    /// `false`.
    ///
    /// Applies to all the guard's policies: to shadow a new policy beside enforced ones, give
    /// it a guard (and a layer) of its own, since a check of several policies consumes only
    /// when every one of them admits.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.parts.shadow = shadow;
        self
    }

    /// An allowed decision with at most `share` of its policy's limit remaining (rounded
    /// down) is counted as `near_limit` in the metrics instead of `allowed`. Defaults to 0.2.
    pub fn near_limit(mut self, share: f64) -> Self {
        self.parts.near_share = share;
        self
    }

    /// Denies clients known to be over their limit locally, with no backend call; see
    /// [`BlockCache`]. On Redis the backend then listens for operators' resets and overrides,
    /// which lift local blocks at every instance (see
    /// [`RedisBackend::is_listening`](crate::RedisBackend::is_listening)). Defaults to
    /// `Some(BlockCache::default())` on Redis; `None` sends every check to the backend. The
    /// memory backend decides in process anyway and never uses one.
    pub fn block_cache(mut self, cache: Option<BlockCache>) -> Self {
        self.parts.blocks = Some(cache);
        self
    }

    /// Decides at the times `clock` gives instead of the backend's clock (Redis `TIME`): for
    /// tests and deterministic replays. A check's own [`at`](crate::CheckRequest::at) comes
    /// first. Defaults to none.
    pub fn clock(mut self, clock: Clock) -> Self {
        self.parts.clock = Some(clock);
        self
    }

    /// The guard, its metrics registered with the recorder in force now (install yours
    /// first).
    pub fn build(self) -> GuardedLimiter {
        GuardedLimiter::from_parts(self.parts)
    }
}
