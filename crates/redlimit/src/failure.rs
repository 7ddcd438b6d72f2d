//! What a check answers when the backend fails: fail open, fail closed, or a local fallback, behind
//! a time budget and a circuit breaker, with counters for every outcome.

use std::{
    collections::HashSet,
    fmt,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    BlockCache, ConfigError, Decision, Error, ErrorKind, Limiter, MemoryBackend, Policy, Reason,
    RetryAfter, Timestamp,
};

/// What a [`GuardedLimiter`] answers when its backend fails, times out, or its circuit is open.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Allow the request: availability before protection.
    Open,
    /// Deny the request: protection before availability (login and signup endpoints).
    Closed,
    /// Decide with another limiter, usually in process memory. Each instance then limits on its
    /// own, so N instances admit up to N × limit while it stands in.
    Local(Limiter),
}

impl FailurePolicy {
    /// Falls back to a fresh in-memory limiter with default capacity.
    pub fn local() -> Self {
        Self::Local(Limiter::new(MemoryBackend::default()))
    }
}

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

    fn lock(&self) -> std::sync::MutexGuard<'_, Circuit> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a check may call the backend now.
    fn permit(&self) -> bool {
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

    fn record(&self, healthy: bool) {
        let mut state = self.lock();
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
    }
}

/// Counts of what a [`GuardedLimiter`] answered and which failures it met.
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

    fn count(&self, reason: Reason) {
        self.reasons[reason_index(reason)].fetch_add(1, Ordering::Relaxed);
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

/// The answer of a [`GuardedLimiter`]: always decisions, and the error that led to them when the
/// backend did not decide.
#[derive(Debug)]
#[non_exhaustive]
pub struct Checked {
    /// One per policy, in order.
    pub decisions: Vec<Decision>,
    /// Why the failure policy answered instead of the backend, if it did. `None` with a failure
    /// reason means the circuit was open.
    pub error: Option<Error>,
}

impl Checked {
    /// Whether every policy allowed the request.
    pub fn allowed(&self) -> bool {
        self.decisions.iter().all(|d| d.allowed)
    }
}

/// A [`Limiter`] with a fixed set of policies, a time budget, a failure policy and a circuit
/// breaker: every check returns decisions, whatever happens to the backend.
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
/// let guarded = GuardedLimiter::new(Limiter::new(MemoryBackend::default()), [policy])?
///     .failure(FailurePolicy::local())
///     .budget(Duration::from_millis(20));
/// assert!(guarded.check("client", 1).await.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct GuardedLimiter {
    limiter: Limiter,
    policies: Arc<[Policy]>,
    failure: FailurePolicy,
    breaker: Arc<CircuitBreaker>,
    budget: Duration,
    stats: Arc<Stats>,
    clock: Option<Clock>,
    blocks: Option<Arc<BlockCache>>,
}

/// A source of explicit check times, for tests and replays; see [`GuardedLimiter::clock`].
pub type Clock = Arc<dyn Fn() -> Timestamp + Send + Sync>;

impl fmt::Debug for GuardedLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GuardedLimiter")
            .field("policies", &self.policies)
            .field("failure", &self.failure)
            .field("budget", &self.budget)
            .field("circuit_open", &self.breaker.is_open())
            .finish_non_exhaustive()
    }
}

impl GuardedLimiter {
    /// Guards `limiter` checking `policies` together.
    ///
    /// # Errors
    /// [`ConfigError::Missing`] for no policy, [`ConfigError::Duplicate`] naming a policy given
    /// twice.
    pub fn new(
        limiter: Limiter,
        policies: impl IntoIterator<Item = Policy>,
    ) -> Result<Self, ConfigError> {
        let policies: Arc<[Policy]> = policies.into_iter().collect();
        if policies.is_empty() {
            return Err(ConfigError::Missing { field: "policies" });
        }
        let mut names = HashSet::new();
        if let Some(twice) = policies.iter().find(|p| !names.insert(p.name())) {
            return Err(ConfigError::Duplicate {
                field: "policies",
                value: twice.name().to_owned(),
            });
        }
        Ok(Self {
            limiter,
            policies,
            failure: FailurePolicy::Open,
            breaker: Arc::default(),
            budget: Duration::from_millis(50),
            stats: Arc::default(),
            clock: None,
            blocks: Some(Arc::default()),
        })
    }

    /// What to answer when the backend fails. Defaults to [`FailurePolicy::Open`].
    #[must_use]
    pub fn failure(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// The most one check may wait for the backend before the failure policy answers.
    /// Defaults to 50 ms; `Duration::ZERO` leaves only the backend's own budget.
    #[must_use]
    pub fn budget(mut self, budget: Duration) -> Self {
        self.budget = budget;
        self
    }

    /// The circuit breaker. Defaults to [`CircuitBreaker::default`].
    #[must_use]
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = Arc::new(breaker);
        self
    }

    /// Denies clients known to be over their limit locally, with no backend call; see
    /// [`BlockCache`]. Defaults to `Some(BlockCache::default())`; `None` sends every check to
    /// the backend.
    #[must_use]
    pub fn block_cache(mut self, cache: Option<BlockCache>) -> Self {
        self.blocks = cache.map(Arc::new);
        self
    }

    /// Decides at the times `clock` gives instead of the backend's clock (Redis `TIME`): for
    /// tests and deterministic replays. Defaults to none.
    #[must_use]
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The policies, in order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The guarded limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The circuit breaker.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// Checks one request of `cost` by `client` against every policy. Never fails: when the
    /// backend does, the failure policy decides and [`Checked::error`] says why.
    pub async fn check(&self, client: &str, cost: u64) -> Checked {
        if let Some(checked) = self.check_now(client, cost) {
            return checked;
        }
        let sent_us = self.local_now_us();
        let error = if self.breaker.permit() {
            match self.backend_check(client, cost).await {
                Ok(decisions) => {
                    self.breaker.record(true);
                    if let Some(blocks) = &self.blocks {
                        blocks.record(client, cost, sent_us, &decisions);
                    }
                    self.count(&decisions);
                    return Checked {
                        decisions,
                        error: None,
                    };
                }
                Err(error) => {
                    // One client's corrupt key says nothing about the backend's health.
                    self.breaker.record(error.is_corrupt_state());
                    self.stats.errors[error_index(error.kind())].fetch_add(1, Ordering::Relaxed);
                    Some(error)
                }
            }
        } else {
            None
        };
        let decisions = self.fail(client, cost).await;
        self.count(&decisions);
        Checked { decisions, error }
    }

    /// The check, answered without waiting when it can be: on the memory backend, or when the
    /// client is blocked locally (see [`BlockCache`]). `None` means the backend must be asked:
    /// call [`check`](Self::check).
    pub fn check_now(&self, client: &str, cost: u64) -> Option<Checked> {
        let now = self.clock.as_ref().map(|clock| clock());
        let decisions = match self.limiter.run_now(&self.policies, client, cost, now) {
            Some(decisions) => decisions,
            None => {
                // A cost no policy can ever grant gets its "never" from the backend.
                let grantable = self.policies.iter().all(|p| cost <= p.capacity());
                let blocks = self.blocks.as_ref().filter(|_| grantable)?;
                blocks.blocked(client, cost, self.local_now_us())?
            }
        };
        self.count(&decisions);
        Some(Checked {
            decisions,
            error: None,
        })
    }

    /// Microseconds on the clock block times are kept in: the explicit clock if there is one,
    /// else a monotonic one.
    fn local_now_us(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock().as_micros(),
            None => u64::try_from(process_start().elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }

    async fn backend_check(&self, client: &str, cost: u64) -> Result<Vec<Decision>, Error> {
        let now = self.clock.as_ref().map(|clock| clock());
        let check = self.limiter.run(&self.policies, client, cost, now);
        if self.budget.is_zero() {
            return check.await;
        }
        tokio::time::timeout(self.budget, check)
            .await
            .unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no decision within the budget of {:?}", self.budget),
                ))
            })
    }

    async fn fail(&self, client: &str, cost: u64) -> Vec<Decision> {
        let now = self.clock.as_ref().map(|clock| clock());
        match &self.failure {
            FailurePolicy::Open => self.policies.iter().map(Decision::fail_open).collect(),
            FailurePolicy::Local(local) => match local.run(&self.policies, client, cost, now).await
            {
                Ok(mut decisions) => {
                    for decision in &mut decisions {
                        decision.reason = Reason::Fallback;
                    }
                    decisions
                }
                Err(_) => self.closed(),
            },
            FailurePolicy::Closed => self.closed(),
        }
    }

    fn closed(&self) -> Vec<Decision> {
        let retry = self.breaker.cooldown().max(Duration::from_secs(1));
        self.policies
            .iter()
            .map(|p| Decision::fail_closed(p, retry))
            .collect()
    }

    fn count(&self, decisions: &[Decision]) {
        if let Some(first) = decisions.first() {
            self.stats.count(first.reason);
        }
    }
}

fn process_start() -> Instant {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *START.get_or_init(Instant::now)
}

impl Decision {
    fn fail_open(policy: &Policy) -> Self {
        Self {
            allowed: true,
            limit: policy.limit(),
            remaining: policy.limit(),
            reset_after: Duration::ZERO,
            retry_after: None,
            policy: policy.shared_name(),
            reason: Reason::FailOpen,
        }
    }

    fn fail_closed(policy: &Policy, retry: Duration) -> Self {
        Self {
            allowed: false,
            limit: policy.limit(),
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: Some(RetryAfter::After(retry)),
            policy: policy.shared_name(),
            reason: Reason::FailClosed,
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

    #[test]
    fn policies_are_validated() {
        let limiter = Limiter::new(MemoryBackend::default());
        assert_eq!(
            GuardedLimiter::new(limiter.clone(), []).map(|_| ()),
            Err(ConfigError::Missing { field: "policies" })
        );
        let p = Policy::builder("p", crate::Algorithm::Gcra)
            .limit(1)
            .window(Duration::from_secs(1))
            .build()
            .expect("valid");
        assert!(GuardedLimiter::new(limiter, [p.clone(), p]).is_err());
    }
}
