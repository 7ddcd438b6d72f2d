//! Checks under load while a primary dies and a replica takes over: shared by the Cluster and
//! Sentinel tests.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use redlimit::{CircuitBreaker, FailurePolicy, GuardedLimiter, Limiter, Reason};

use crate::support::policy;

/// Each check's budget; the backend's own is larger, so this one is what is tested.
pub(crate) const BUDGET: Duration = Duration::from_millis(200);
/// Scheduling slack on a loaded 2-core machine.
const MARGIN: Duration = Duration::from_secs(2);
/// The longest the whole test may run.
const LIMIT: Duration = Duration::from_secs(60);

/// What the checks saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) checks: usize,
    pub(crate) slowest: Duration,
    pub(crate) failed_open: usize,
    /// Checks answered by Redis after the promotion was observed.
    pub(crate) redis_after_promotion: usize,
    /// Checks Redis admitted, each of cost 1.
    pub(crate) redis_admitted: usize,
    /// Checks answered by the failure policy after an error (a budget run out, a connection
    /// lost): each may have reached Redis and been counted there without its answer arriving.
    pub(crate) unanswered: usize,
    /// What the client's state counts at the end, read from the new primary.
    pub(crate) counted: Option<u64>,
}

/// The limit of the load's policy: never reached.
const LIMIT_OF_LOAD: u64 = 1_000_000;

/// A guarded limiter that fails open, on `limiter`: a window of an hour from the client's first
/// check, so that what its state counts at the end is every check Redis took.
pub(crate) fn guarded(limiter: Limiter) -> GuardedLimiter {
    let p = policy(
        redlimit::Algorithm::FixedWindowAnchored,
        LIMIT_OF_LOAD,
        3_600_000,
        None,
    );
    GuardedLimiter::builder(limiter, p)
        .failure(FailurePolicy::Open)
        .budget(BUDGET)
        .circuit_breaker(CircuitBreaker::new(3, Duration::from_millis(300)))
        .build()
}

/// Runs 8 tasks of checks on the `client` key while `fail_over` kills the primary and waits for
/// the promotion (it runs on a blocking thread and returns whatever it must keep alive), then
/// keeps checking until Redis answers again.
pub(crate) async fn checks_through_failover<T: Send + 'static>(
    guard: GuardedLimiter,
    client: &str,
    fail_over: impl FnOnce() -> T + Send + 'static,
) -> (Seen, T) {
    let promoted = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (guard, client) = (guard.clone(), client.to_owned());
            let (promoted, stop) = (Arc::clone(&promoted), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut seen = Seen::default();
                while !stop.load(Ordering::SeqCst) && started.elapsed() < LIMIT {
                    let after_promotion = promoted.load(Ordering::SeqCst);
                    let begun = Instant::now();
                    let checked = guard.check(&client).await;
                    let took = begun.elapsed();
                    seen.checks += 1;
                    seen.slowest = seen.slowest.max(took);
                    match checked[0].reason {
                        Reason::FailOpen => {
                            seen.failed_open += 1;
                            seen.unanswered += usize::from(checked.error().is_some());
                        }
                        Reason::Redis if after_promotion => seen.redis_after_promotion += 1,
                        _ => {}
                    }
                    if checked[0].reason == Reason::Redis && checked[0].allowed {
                        seen.redis_admitted += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                seen
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let kept = tokio::task::spawn_blocking(fail_over)
        .await
        .expect("fail over");
    promoted.store(true, Ordering::SeqCst);
    // Keep checking until Redis has answered for a while after the promotion.
    while started.elapsed() < LIMIT && guard.stats().decided(Reason::Redis) > 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if recovered(&guard, client).await {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let mut total = Seen::default();
    for task in tasks {
        let seen = task.await.expect("a check task panicked");
        total.checks += seen.checks;
        total.slowest = total.slowest.max(seen.slowest);
        total.failed_open += seen.failed_open;
        total.redis_after_promotion += seen.redis_after_promotion;
        total.redis_admitted += seen.redis_admitted;
        total.unanswered += seen.unanswered;
    }
    // Read from Redis, not a failure policy: a busy machine may let one read miss its budget.
    while total.counted.is_none() && started.elapsed() < LIMIT + MARGIN {
        let state = guard.check(client).cost(0).await;
        if state[0].reason == Reason::Redis {
            total.counted = Some(LIMIT_OF_LOAD - state[0].remaining);
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    (total, kept)
}

/// Whether `client`'s keys are decided by Redis again: probed with the load's own client, since
/// on a Cluster another client's keys may live on a primary that never failed (each range of
/// slots has a circuit of its own).
async fn recovered(guard: &GuardedLimiter, client: &str) -> bool {
    guard.check(client).cost(0).await[0].reason == Reason::Redis
}

/// The assertions every failover test makes.
pub(crate) fn assert_survived(seen: &Seen, what: &str) {
    assert!(seen.checks > 100, "{what}: load ran: {seen:?}");
    assert!(
        seen.slowest < BUDGET + MARGIN,
        "{what}: a check hung: {seen:?}"
    );
    assert!(
        seen.failed_open > 0,
        "{what}: the gap was answered by the failure policy: {seen:?}"
    );
    assert!(
        seen.redis_after_promotion > 0,
        "{what}: checks went to the new primary: {seen:?}"
    );
    // Replication is asynchronous, so the new primary may have lost the last checks the old one
    // took; a check whose answer was lost (the primary died after running it, or its budget ran
    // out while Redis was still to answer) may count without being seen. More than both is a
    // check taken twice (a batch run again).
    let counted = seen.counted.expect("the state read from the new primary");
    assert!(
        counted > 0 && counted <= (seen.redis_admitted + seen.unanswered) as u64,
        "{what}: no check counted twice: {seen:?}"
    );
}
