use std::{
    fmt,
    sync::{Arc, OnceLock},
    time::{Duration, Instant},
};

use tracing::{Instrument, Span, field};

use super::{
    block_cache::Slot,
    breakers::Breakers,
    error_log::ErrorLog,
    grant_table::{Fetch, Grant, GrantTable, Pending, Spend},
    metrics::Metrics,
    parts::{Clock, Parts},
};
use crate::{
    BlockCache, Check, CheckRequest, CircuitBreaker, Decision, Decisions, Error, ErrorKind,
    FailurePolicy, Limiter, PolicySet, Reason, SettleFuture, SettleRequest, Stats, Timestamp,
    backend::{Backend, Heard, Started},
    check_request::{Options, borrowed_keys, owned_keys},
    client_id,
};

/// A [`Limiter`] with a fixed set of policies, a time budget, a failure policy, a circuit
/// breaker and a local block cache: every check returns decisions, whatever happens to the
/// backend.
///
/// The policies are validated once, when the guard is built. Cheap to clone: clones share
/// everything, counters and circuit included. The [tower layer](https://docs.rs/tower-redlimit)
/// takes one of these.
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
/// assert!(guard.check("client").cost(5).await.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
///
/// # Metrics
///
/// Through the [`metrics`](https://docs.rs/metrics) facade; the series are registered with the
/// recorder in force when the guard is built (install yours first), so a check costs an atomic
/// increment per series. No label holds a client key.
///
/// | name | type | labels | what |
/// |---|---|---|---|
/// | `redlimit_decisions_total` | counter | `policy`, `outcome`, `reason` | one per policy per check; `outcome`: `allowed`, `near_limit` (allowed with at most [`near_limit`](crate::GuardBuilder::near_limit) of the limit left), `limited`, or `banned` (a ban's denial, for a policy that bans; see [`Ban`](crate::Ban)); `reason`: [`Reason::as_str`], where `shadow` is a would-be denial let through (a concurrency limit's too, under its name) |
/// | `redlimit_backend_errors_total` | counter | `policy`, `kind` | checks whose backend failed, by [`ErrorKind::as_str`] |
/// | `redlimit_check_duration_seconds` | histogram | `policy` | the backend's round trip of a check on Redis |
/// | `redlimit_circuit_open` | gauge | `policy`, `circuit` | 1 while a circuit is open, else 0; `circuit` is `0`, or a Cluster's slot range such as `0-255` |
/// | `redlimit_delayed_total` | counter | `policy` | delay mode: requests admitted to wait for their slot |
///
/// `policy` is the policy's name on decisions, and the guard's policy names joined by `+` on
/// the series of a whole check.
///
/// # Tracing
///
/// Each check is a `debug` span `redlimit.check` (target `redlimit`) with `policies`, `cost`,
/// `client` (a short hash keyed per process, never the client's text), `reason` and `allowed`;
/// each denial is a `debug` event in it, and backend errors are `warn` events, at most once per
/// distinct error per 5 s.
#[derive(Clone)]
pub struct GuardedLimiter {
    inner: Arc<Guard>,
}

struct Guard {
    limiter: Limiter,
    policies: PolicySet,
    /// The largest cost every policy can grant: a larger one is "never", which the backend says.
    capacity: u64,
    /// Whether a policy bans: the block cache then keeps bans only.
    bans: bool,
    failure: FailurePolicy,
    /// One circuit, or on a Cluster one per range of slots, so that a dead primary sends only
    /// its own keys to the failure policy.
    breakers: Breakers,
    budget: Duration,
    stats: Arc<Stats>,
    clock: Option<Clock>,
    /// Whether the backend is over the network: only then are a circuit breaker and a block
    /// cache worth their cost (in process, asking the backend is as cheap).
    remote: bool,
    blocks: Option<Arc<BlockCache>>,
    /// Hot-key mode's grants, when every policy has them and the backend is remote.
    grants: Option<Arc<GrantTable>>,
    errors: Arc<ErrorLog>,
    metrics: Arc<Metrics>,
    /// Dry run: a denial is reported and counted, and the request passes.
    shadow: bool,
}

impl fmt::Debug for GuardedLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let guard = &self.inner;
        f.debug_struct("GuardedLimiter")
            .field("policies", &guard.policies)
            .field("failure", &guard.failure)
            .field("budget", &guard.budget)
            .field("shadow", &guard.shadow)
            .field("circuit_open", &guard.breakers.any_open())
            .finish_non_exhaustive()
    }
}

impl GuardedLimiter {
    pub(super) fn from_parts(parts: Parts) -> Self {
        let Parts {
            limiter,
            policies,
            failure,
            budget,
            breaker,
            shadow,
            near_share,
            blocks,
            clock,
        } = parts;
        let remote = limiter.backend().is_remote();
        let metrics = Arc::new(Metrics::new(&policies, remote, near_share));
        let breakers = Breakers::new(&limiter, &breaker, &metrics);
        let blocks = blocks
            .unwrap_or_else(|| Some(BlockCache::default()))
            .filter(|_| remote)
            .map(Arc::new);
        if let (Some(_), Backend::Redis(redis)) = (&blocks, limiter.backend()) {
            // Operators' resets and overrides lift local blocks at every instance.
            redis.listen(&limiter.keys().events_channel());
        }
        let grants = policies
            .grants()
            .filter(|_| remote)
            .map(|grants| Arc::new(GrantTable::new(grants)));
        Self {
            inner: Arc::new(Guard {
                grants,
                bans: policies.iter().any(|p| p.ban().is_some()),
                capacity: policies.capacity(),
                limiter,
                policies,
                failure,
                breakers,
                budget,
                stats: Arc::default(),
                clock,
                remote,
                blocks,
                errors: Arc::default(),
                metrics,
                shadow,
            }),
        }
    }

    /// The policies, in order.
    pub fn policies(&self) -> &PolicySet {
        &self.inner.policies
    }

    /// The guarded limiter.
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// The circuit breaker; on a Cluster, that of the first of its ranges of slots.
    pub fn breaker(&self) -> &CircuitBreaker {
        self.inner.breakers.first()
    }

    /// Whether the guard is in shadow (dry-run) mode; see [`shadow`](crate::GuardBuilder::shadow).
    pub fn is_shadow(&self) -> bool {
        self.inner.shadow
    }

    /// The block cache, if there is one.
    pub fn blocks(&self) -> Option<&BlockCache> {
        self.inner.blocks.as_deref()
    }

    /// A check of `client` against every policy, of cost 1 at the guard's clock unless the
    /// request says otherwise (see [`CheckRequest`]). Awaited, or [started](CheckRequest::start),
    /// it never fails: when the backend does, the failure policy decides and
    /// [`Decisions::error`] says why.
    ///
    /// A check with a request id or a reservation skips the block cache (a retry's first
    /// answer is the backend's to give; a settle may free the quota a denial saw exhausted).
    /// When the backend fails, a local fallback answers without ids and reserves in its own
    /// limiter, where [`settle`](Self::settle) settles; an open or closed answer has nothing
    /// to settle.
    pub fn check<'a>(&'a self, client: &'a str) -> CheckRequest<'a, Self> {
        CheckRequest::new(self, &self.inner.policies, client)
    }

    /// Settles the reservation `reserved` at its `actual` cost (see [`Limiter::settle`]),
    /// within the guard's budget, with the limiter that took it (the local fallback's, for a
    /// reservation it made). Awaited, whether anything was given back or charged; a failure is
    /// logged and counted like a check's, and changes nothing: the reservation stays counted as
    /// it was.
    pub fn settle<'a>(&'a self, reserved: &'a Decisions, actual: u64) -> SettleRequest<'a, Self> {
        SettleRequest::new(self, reserved, actual)
    }

    async fn settled(&self, reserved: &Decisions, actual: u64, at: Option<Timestamp>) -> bool {
        if reserved.reserved_cost().is_none() {
            return false;
        }
        let guard = &*self.inner;
        let at = at.or_else(|| guard.clock.as_ref().map(|clock| clock()));
        // A reservation the local fallback took is owed back there.
        let limiter = match (&guard.failure, reserved.first().map(|d| d.reason)) {
            (FailurePolicy::Local(local), Some(Reason::Fallback)) => local,
            _ => &guard.limiter,
        };
        match guard
            .within_budget(limiter.settled(reserved, actual, at))
            .await
        {
            Ok(changed) => changed,
            Err(error) => {
                guard.count_failed(error.kind());
                guard.errors.report(&error, &guard.policies);
                false
            }
        }
    }

    fn checked(&self, client: &str, options: &Options<'_>) -> Check {
        let (cost, reserve) = (options.cost, options.reserve);
        let guard = &*self.inner;
        // A check with a key per policy answers to its first key's circuit (on a Cluster every
        // key of one check is in its slot).
        let client = options
            .keys
            .and_then(|keys| keys.first().copied())
            .unwrap_or(client);
        let span = guard.span(client, cost);
        let timed = Options {
            at: options
                .at
                .or_else(|| guard.clock.as_ref().map(|clock| clock())),
            budget: (!guard.budget.is_zero()).then_some(guard.budget),
            ..*options
        };
        // Hot-key mode: spent from a grant (before a block: what the grant holds was taken),
        // or fetching one with this check (a reservation of the check's cost and the grant's,
        // which the grant's end settles), or exact.
        let grants = guard
            .grants
            .as_ref()
            .filter(|_| options.once.is_none() && !reserve && options.keys.is_none())
            .filter(|_| !options.give_back);
        let mut pending = None;
        if let Some(grants) = grants {
            match grants.spend(client, cost, guard.local_now_us()) {
                Spend::Local(decisions, refill) => {
                    if let Some(refill) = refill {
                        self.refill(client, refill, &timed);
                    }
                    return Check::ready(guard.finish(decisions, &span));
                }
                Spend::Backend(sent) => pending = Some(sent),
            }
        }
        // Where the answer is recorded if it blocks, and when the check was sent.
        let mut block = None;
        // A cost no policy can ever grant gets its "never" from the backend; a retry's first
        // answer is the backend's to give.
        let blocks = guard
            .blocks
            .as_ref()
            .filter(|_| cost <= guard.capacity && options.once.is_none() && !reserve)
            .filter(|_| !options.give_back)
            // A block is one client's: a check of several keys is not one client's denial.
            .filter(|_| options.keys.is_none());
        if let Some(blocks) = blocks {
            let sent_us = guard.local_now_us();
            let heard = guard.heard();
            let slot = blocks.may_block(sent_us).then(|| blocks.slot(client));
            if let Some(blocked) = slot
                .as_ref()
                .and_then(|slot| blocks.blocked(slot, cost, sent_us, heard))
            {
                return Check::ready(guard.finish(blocked, &span));
            }
            block = Some((slot, (sent_us, heard)));
        }
        // An open circuit answers before a check is even begun.
        if guard.remote && !guard.breaker(client).permit() {
            return self.fail(client, options, None, span);
        }
        let options = timed;
        let grant = pending.as_ref().and_then(Pending::grant);
        let sent = Options {
            grant,
            reserve: reserve || grant.is_some(),
            ..options
        };
        match guard.limiter.start(&guard.policies, client, &sent) {
            Started::Ready(Ok(decisions)) => {
                let decisions = match pending {
                    Some(pending) => self.granted(pending, cost, decisions, Instant::now()),
                    None => decisions,
                };
                Check::ready(guard.finish(decisions, &span))
            }
            Started::Ready(Err(error)) => {
                guard.count_failed(error.kind());
                self.fail(client, &options, Some(error), span)
            }
            Started::Waiting(answer) => {
                let this = self.clone();
                let client = client.to_owned();
                // Entered at each poll only where a subscriber wants it: a span no one records
                // still costs its entries and exits (some 350 instructions a check with
                // `tracing`'s `log` feature, which axum's defaults turn on).
                let inside = (!span.is_disabled()).then(|| span.clone());
                // Owned for the failure policy's local check, which needs them too.
                let keys = owned_keys(options.keys);
                let options = Options {
                    once: None,
                    keys: None,
                    ..options
                };
                let answered = async move {
                    let sent = Instant::now();
                    // The backend times the check by the guard's budget: one timer.
                    let answer = answer.await;
                    this.inner.metrics.round_trip(sent.elapsed());
                    let answer = match (answer, pending) {
                        (Ok(decisions), Some(pending)) => {
                            Ok(this.granted(pending, cost, decisions, sent))
                        }
                        (answer, _) => answer,
                    };
                    let keys = borrowed_keys(keys.as_ref());
                    let options = Options {
                        keys: keys.as_deref(),
                        ..options
                    };
                    this.remote(answer, &client, &options, block, span).await
                };
                match inside {
                    Some(inside) => Check::waiting(answered.instrument(inside)),
                    None => Check::waiting(answered),
                }
            }
        }
    }

    /// What a check that fetched a grant (sent at `sent`) reports; the grant is kept, and what
    /// is left of it given back when its life ends.
    fn granted(
        &self,
        pending: Pending,
        cost: u64,
        decisions: Decisions,
        sent: Instant,
    ) -> Decisions {
        let Some(grants) = &self.inner.grants else {
            return decisions;
        };
        let (grant, decisions) = grants.answered(pending, cost, decisions);
        if let Some((grant, life)) = grant {
            self.end_at(grant, sent + life);
        }
        decisions
    }

    /// Gives back what is left of `grant` at `end` (outside a runtime, nothing: the grant
    /// still ends, and what it held stays counted until its window passes).
    fn end_at(&self, grant: Arc<Grant>, end: Instant) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let this = self.clone();
        runtime.spawn(async move {
            tokio::time::sleep_until(end.into()).await;
            let left = grant.end();
            if let Some(taken) = grant.reserved.reserved_cost().filter(|_| left > 0) {
                this.settled(&grant.reserved, taken - left, None).await;
            }
        });
    }

    /// Fetches `client`'s next grant in the background while the last one lasts: a check of
    /// cost 0 taking up to the fetch's size, at `options`' time and budget.
    fn refill(&self, client: &str, fetch: Fetch, options: &Options<'_>) {
        let guard = &*self.inner;
        if tokio::runtime::Handle::try_current().is_err() || !guard.breaker(client).permit() {
            return;
        }
        let options = Options {
            cost: 0,
            grant: Some(fetch.size),
            reserve: true,
            ..*options
        };
        let Started::Waiting(answer) = guard.limiter.start(&guard.policies, client, &options)
        else {
            return;
        };
        let this = self.clone();
        let client = client.to_owned();
        tokio::spawn(async move {
            let sent = Instant::now();
            match answer.await {
                Ok(decisions) => {
                    this.inner.breaker(&client).record(true);
                    this.granted(Pending::Fetch(fetch), 0, decisions, sent);
                }
                Err(error) => {
                    let guard = &*this.inner;
                    if error.counts_for_breaker() {
                        guard.breaker(&client).record(error.is_corrupt_state());
                    }
                    guard.count_failed(error.kind());
                    guard.errors.report(&error, &guard.policies);
                }
            }
        });
    }

    /// Takes the backend's answer (recorded in the block cache at `block`), or its failure to
    /// the failure policy.
    async fn remote(
        &self,
        answer: Result<Decisions, Error>,
        client: &str,
        options: &Options<'_>,
        block: Option<(Option<Slot>, (u64, Heard))>,
        span: Span,
    ) -> Decisions {
        let guard = &*self.inner;
        let cost = options.cost;
        match answer {
            Ok(decisions) => {
                guard.breaker(client).record(true);
                if let (Some(blocks), true) = (&guard.blocks, options.give_back) {
                    blocks.lift(client);
                }
                // Where policies ban, only a ban is kept locally: every other denial must reach
                // the backend, which counts it towards a ban.
                let keep = !guard.bans || decisions.iter().any(|d| d.banned);
                if let (Some(blocks), Some((slot, sent)), true) = (&guard.blocks, block, keep) {
                    blocks.record(client, slot, cost, sent, &decisions);
                }
                guard.finish(decisions, &span)
            }
            Err(error) => {
                // One client's corrupt key says nothing about the backend's health; a failed
                // batch counts once, not once per check in it.
                if error.counts_for_breaker() {
                    guard.breaker(client).record(error.is_corrupt_state());
                }
                guard.count_failed(error.kind());
                self.fail(client, options, Some(error), span).await
            }
        }
    }

    /// The failure policy's answer, after `error` (or with none: the circuit is open).
    fn fail(&self, client: &str, options: &Options<'_>, error: Option<Error>, span: Span) -> Check {
        let guard = &*self.inner;
        if let Some(error) = &error {
            guard.errors.report(error, &guard.policies);
        }
        let local = match &guard.failure {
            FailurePolicy::Open => {
                let concurrency = guard.policies.concurrency();
                let concurrency =
                    concurrency.map(|c| Decision::fail_open_of(c.name().into(), c.limit()));
                let open = guard.policies.iter().map(Decision::fail_open);
                let open: Vec<_> = open.chain(concurrency).collect();
                return Check::ready(guard.finish(Decisions::new(open).with_error(error), &span));
            }
            FailurePolicy::Closed => {
                return Check::ready(guard.finish(guard.closed().with_error(error), &span));
            }
            FailurePolicy::Local(local) => local,
        };
        // A reservation stays one in the local limiter, so its settle is owed there; request
        // ids are the backend's to remember.
        let options = Options {
            at: options
                .at
                .or_else(|| guard.clock.as_ref().map(|clock| clock())),
            once: None,
            ..*options
        };
        match local.start(&guard.policies, client, &options) {
            Started::Ready(answer) => Check::ready(guard.fallback(answer, error, &span)),
            Started::Waiting(answer) => {
                let this = self.clone();
                Check::waiting(async move { this.inner.fallback(answer.await, error, &span) })
            }
        }
    }
}

impl Guard {
    /// The circuit that `client`'s keys answer to.
    fn breaker(&self, client: &str) -> &CircuitBreaker {
        self.breakers.of(&self.limiter, client)
    }

    async fn within_budget<T>(
        &self,
        answer: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        if self.budget.is_zero() {
            return answer.await;
        }
        tokio::time::timeout(self.budget, answer)
            .await
            .unwrap_or_else(|_| {
                Err(Error::new(
                    ErrorKind::Timeout,
                    format!("no decision within the budget of {:?}", self.budget),
                ))
            })
    }

    /// The fallback limiter's decisions, or a closed answer when it failed too.
    fn fallback(
        &self,
        answer: Result<Decisions, Error>,
        error: Option<Error>,
        span: &Span,
    ) -> Decisions {
        let decisions = match answer {
            Ok(decisions) => decisions.decided_by(Reason::Fallback),
            Err(_) => self.closed(),
        };
        self.finish(decisions.with_error(error), span)
    }

    /// When a client answered closed may try again: once the circuit could have closed.
    fn retry_when_closed(&self) -> Duration {
        self.breakers.first().cooldown().max(Duration::from_secs(1))
    }

    fn closed(&self) -> Decisions {
        let retry = self.retry_when_closed();
        let closed = self
            .policies
            .iter()
            .map(|p| Decision::fail_closed(p, retry));
        let concurrency = self
            .policies
            .concurrency()
            .map(|c| Decision::fail_closed_of(c.name().into(), c.limit(), retry));
        Decisions::new(closed.chain(concurrency).collect::<Arc<[_]>>())
    }

    /// The check's span: the client only as a keyed hash, since the client text may be an API
    /// key. Nothing is computed when no subscriber wants it.
    fn span(&self, client: &str, cost: u64) -> Span {
        let span = tracing::debug_span!(
            target: "redlimit",
            "redlimit.check",
            policies = %self.metrics.label(),
            cost,
            client = field::Empty,
            reason = field::Empty,
            allowed = field::Empty,
        );
        if !span.is_disabled() {
            span.record("client", field::display(client_id::tag(client)));
        }
        span
    }

    fn count_failed(&self, kind: ErrorKind) {
        self.stats.count_failed(kind);
        self.metrics.failed(kind);
    }

    /// The check's last step on every path: shadow mode lets a denial pass, then the decisions
    /// are counted and traced.
    fn finish(&self, decisions: Decisions, span: &Span) -> Decisions {
        let decisions = if self.shadow {
            decisions.shadowed()
        } else {
            decisions
        };
        // One path decides all the policies of a check: the first one's reason is theirs,
        // unless shadow mode let one of them pass.
        let shadowed = decisions.iter().find(|d| d.reason == Reason::Shadow);
        let reason = shadowed.or(decisions.first()).map(|d| d.reason);
        if let Some(reason) = reason {
            self.stats.count_decided(reason);
        }
        self.metrics.decided(&decisions);
        let allowed = decisions.allowed();
        if allowed && !decisions.delay().is_zero() {
            self.metrics.delayed();
        }
        if !span.is_disabled() {
            span.record("reason", reason.map_or("", Reason::as_str));
            span.record("allowed", allowed);
        }
        if !allowed || shadowed.is_some() {
            let denied = shadowed.unwrap_or_else(|| decisions.most_restrictive());
            tracing::debug!(
                target: "redlimit",
                parent: span,
                policy = %denied.policy,
                reason = denied.reason.as_str(),
                retry_after = ?denied.retry_after,
                "rate limit exceeded"
            );
        }
        decisions
    }

    /// Microseconds on the clock block times are kept in: the explicit clock if there is one,
    /// else a monotonic one.
    /// What the backend heard of operators' events, which lift local blocks.
    fn heard(&self) -> Heard {
        match self.limiter.backend() {
            Backend::Redis(redis) => redis.heard(),
            Backend::Memory(_) => Heard {
                generation: 0,
                listening: true,
            },
        }
    }

    fn local_now_us(&self) -> u64 {
        match &self.clock {
            Some(clock) => clock().as_micros(),
            None => u64::try_from(process_start().elapsed().as_micros()).unwrap_or(u64::MAX),
        }
    }
}

fn process_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

impl<'a> CheckRequest<'a, GuardedLimiter> {
    /// Begins the check: decided at once (the memory backend, a local block, an open
    /// circuit: see [`Check::into_ready`]) or waiting for Redis.
    pub fn start(self) -> Check {
        self.on.checked(self.client, &self.options)
    }
}

impl<'a> std::future::IntoFuture for CheckRequest<'a, GuardedLimiter> {
    type Output = Decisions;
    type IntoFuture = Check;

    fn into_future(self) -> Check {
        self.start()
    }
}

impl<'a> std::future::IntoFuture for SettleRequest<'a, GuardedLimiter> {
    type Output = bool;
    type IntoFuture = SettleFuture<'a, bool>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.on.settled(self.reserved, self.actual, self.at))
    }
}
