//! A huge reply, in a binary of its own so that the process's peak memory is this test's: a
//! server answering a check with a gigabyte costs neither the memory nor the time to read it.

use std::time::{Duration, Instant};

use redlimit::{
    Algorithm, CircuitBreaker, FailurePolicy, GuardedLimiter, Limiter, Policy, RedisBackend,
};
use redlimit_tests::HugeReplyServer;

const BUDGET: Duration = Duration::from_millis(50);
/// Scheduling slack on a loaded 2-core machine; the budget is what is being tested.
const MARGIN: Duration = Duration::from_secs(1);

/// The process's resident memory now and at its peak, in kB (Linux's `/proc`).
fn memory_kb() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/self/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_reply_is_refused_within_the_budget_without_buffering_it() {
    let server = HugeReplyServer::start();
    let limiter = Limiter::new(
        RedisBackend::builder(server.url())
            .budget(BUDGET)
            .build()
            .expect("a valid url"),
    );
    let policy = Policy::builder("api", Algorithm::Gcra)
        .limit(10)
        .window(Duration::from_secs(1))
        .build()
        .expect("a valid policy");
    let guard = GuardedLimiter::builder(limiter, policy)
        .failure(FailurePolicy::Open)
        .budget(BUDGET)
        // Every check goes to the server: none is answered by an open circuit.
        .circuit_breaker(CircuitBreaker::new(u32::MAX, Duration::from_secs(1)))
        .build();
    let (normal_kb, _) = memory_kb();
    for round in 1..=5 {
        let started = Instant::now();
        let checks: Vec<_> = (0..20)
            .map(|i| {
                let guard = guard.clone();
                tokio::spawn(async move {
                    let begun = Instant::now();
                    let decisions = guard.check(&format!("client-{i}")).await;
                    (begun.elapsed(), decisions)
                })
            })
            .collect();
        let mut slowest = Duration::ZERO;
        for check in checks {
            let (took, decisions) = check.await.expect("a check");
            let error = decisions.error().expect("the failure policy answered");
            assert!(error.is_backend() || error.is_timeout(), "{error}");
            slowest = slowest.max(took);
        }
        let (now_kb, peak_kb) = memory_kb();
        println!(
            "round {round}: 20 checks answered in {:?}, the slowest after {slowest:?}; \
             memory {normal_kb} kB before, {now_kb} kB now, {peak_kb} kB at the peak",
            started.elapsed()
        );
        assert!(slowest < BUDGET + MARGIN, "round {round}: {slowest:?}");
        assert!(
            peak_kb < normal_kb + 50 * 1024,
            "round {round}: peak {peak_kb} kB against {normal_kb} kB before"
        );
    }
}
