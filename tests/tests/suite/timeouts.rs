//! Every wait is bounded: an unreachable or silent Redis costs at most the time budget.

use std::{
    net::TcpListener,
    thread,
    time::{Duration, Instant},
};

use redlimit::{Algorithm, CircuitBreaker, ErrorKind, GuardedLimiter, Limiter, RedisBackend};
use redlimit_tests::{RedisServer, free_port};

use crate::support::{alone, policy};

const BUDGET: Duration = Duration::from_millis(200);
/// Scheduling slack on a loaded 2-core machine; the budget is what is being tested.
const MARGIN: Duration = Duration::from_secs(2);

fn limiter(url: String) -> Limiter {
    Limiter::new(
        RedisBackend::builder(url)
            .budget(BUDGET)
            .build()
            .expect("valid"),
    )
}

/// A server that accepts up to `connections` and never replies: its URL, and the thread holding
/// them.
fn silent_server(connections: usize) -> (String, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("redis://{}", listener.local_addr().expect("address"));
    let holder = thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().take(connections) {
            held.push(stream);
        }
    });
    (url, holder)
}

#[tokio::test]
async fn a_redis_that_never_answers_costs_the_budget() {
    let (url, holder) = silent_server(16);
    let limiter = limiter(url);
    let p = policy(Algorithm::Gcra, 10, 1_000, None);
    for _ in 0..3 {
        let started = Instant::now();
        let err = limiter.check(&alone(&p), "c").await.expect_err("no answer");
        let took = started.elapsed();
        assert!(err.is_timeout(), "{err}");
        assert!(took < BUDGET + MARGIN, "took {took:?}");
    }
    drop(holder);
}

/// A guarded check has one budget, the guard's, whether it is shorter or longer than the
/// backend's: a Redis that never answers is counted as a timeout, never as a backend error.
#[tokio::test]
async fn a_hung_redis_is_always_counted_as_a_timeout() {
    let (url, holder) = silent_server(32);
    let p = policy(Algorithm::Gcra, 10, 1_000, None);
    for guard_budget in [BUDGET / 2, BUDGET, BUDGET * 2] {
        let guard = GuardedLimiter::builder(limiter(url.clone()), p.clone())
            .budget(guard_budget)
            .circuit_breaker(CircuitBreaker::new(u32::MAX, Duration::from_secs(1)))
            .build();
        for _ in 0..3 {
            let decisions = guard.check("c").await;
            let error = decisions.error().expect("failed open");
            assert!(error.is_timeout(), "budget {guard_budget:?}: {error}");
        }
        let stats = guard.stats();
        assert_eq!(stats.failed(ErrorKind::Timeout), 3, "{guard_budget:?}");
        assert_eq!(stats.failed(ErrorKind::Backend), 0, "{guard_budget:?}");
    }
    drop(holder);
}

#[tokio::test]
async fn a_redis_that_is_down_fails_fast_and_is_used_again_when_back() {
    let port = free_port();
    let limiter = limiter(format!("redis://127.0.0.1:{port}"));
    let p = policy(Algorithm::FixedWindow, 10, 60_000, None);
    let started = Instant::now();
    let err = limiter
        .check(&alone(&p), "c")
        .await
        .expect_err("nothing listens");
    assert!(err.is_backend() || err.is_timeout(), "{err}");
    assert!(started.elapsed() < BUDGET + MARGIN);

    // A server appears on that port: the same limiter reaches it without a restart.
    let server = RedisServer::start_on_port(port);
    assert_eq!(server.port(), port);
    let decision = limiter.check(&alone(&p), "c").await.expect("redis is back")[0].clone();
    assert!(decision.allowed);
}
