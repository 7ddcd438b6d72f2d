//! Every wait is bounded: an unreachable or silent Redis costs at most the time budget.

use std::{
    net::TcpListener,
    thread,
    time::{Duration, Instant},
};

use redlimit::{Algorithm, CircuitBreaker, ErrorKind, GuardedLimiter, Limiter, RedisBackend};
use redlimit_tests::{RedisCluster, RedisSentinel, RedisServer, free_port, pause_writes, unpause};

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

/// The budget is a check's one clock: with Redis paused (`CLIENT PAUSE … WRITE`: the
/// connection is up, a script waits, while sentinels' and the cluster's pings are answered, so
/// nothing fails over), a guard answers its failure policy when its budget ends, neither
/// earlier (redis-rs's own 500 ms response timer, or its 1 s connect timer) nor much later.
/// `node` is the connection that pauses the server serving `client`.
async fn a_paused_redis_costs_exactly_the_budget(
    limiter: Limiter,
    client: &str,
    mut node: deadpool_redis::redis::Connection,
    topology: &str,
) {
    let p = policy(Algorithm::Gcra, 10, 1_000, None);
    for budget in [Duration::from_millis(200), Duration::from_secs(1)] {
        let guard = GuardedLimiter::builder(limiter.clone(), p.clone())
            .budget(budget)
            .circuit_breaker(CircuitBreaker::new(u32::MAX, Duration::from_secs(1)))
            .build();
        // Connected and the script loaded: what follows waits only for the reply.
        let warm = guard.check(client).await;
        assert!(warm.error().is_none(), "{topology}: {:?}", warm.error());
        pause_writes(&mut node, 5_000);
        let started = Instant::now();
        let decisions = guard.check(client).await;
        let took = started.elapsed();
        unpause(&mut node);
        println!("{topology}: budget {budget:?}, the failure policy answered after {took:?}");
        let error = decisions
            .error()
            .unwrap_or_else(|| panic!("{topology}: the failure policy answered: {decisions:?}"));
        assert!(error.is_timeout(), "{topology}, budget {budget:?}: {error}");
        assert!(
            took >= budget,
            "{topology}: answered after {took:?}, before the budget of {budget:?}"
        );
        assert!(took < budget + MARGIN, "{topology}: took {took:?}");
    }
}

#[tokio::test]
async fn a_paused_standalone_redis_costs_exactly_the_budget() {
    let server = RedisServer::start();
    let limiter = limiter(server.url());
    a_paused_redis_costs_exactly_the_budget(limiter, "c", server.connection(), "standalone").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cluster_primary_costs_exactly_the_budget() {
    let cluster = RedisCluster::start();
    let limiter = Limiter::new(
        RedisBackend::cluster(cluster.urls())
            .build()
            .expect("valid urls"),
    );
    let p = policy(Algorithm::Gcra, 10, 1_000, None);
    let port = cluster
        .primary_of(&limiter.keys().key(&p, "c"))
        .expect("a primary serves the key");
    a_paused_redis_costs_exactly_the_budget(limiter, "c", cluster.connection(port), "cluster")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_sentinel_primary_costs_exactly_the_budget() {
    let setup = RedisSentinel::start();
    let limiter = Limiter::new(
        RedisBackend::sentinel(setup.urls(), RedisSentinel::MASTER)
            .build()
            .expect("valid urls"),
    );
    let node = setup.primary().connection();
    a_paused_redis_costs_exactly_the_budget(limiter, "c", node, "sentinel").await;
}

/// A Redis that keeps timing out does not pile up sockets. A connection given up after a
/// timeout lingers, its sockets open so that what was sent on it still runs once the server
/// wakes (see `a_give_back_sent_again_gives_back_once`), but at most 16 of a backend's at once.
#[tokio::test]
async fn a_redis_that_keeps_timing_out_holds_at_most_16_lingering_connections() {
    let server = RedisServer::start();
    let limiter = Limiter::new(
        RedisBackend::builder(server.url())
            .budget(Duration::from_millis(50))
            .build()
            .expect("valid"),
    );
    let p = policy(Algorithm::Gcra, 10, 1_000, None);
    limiter.check(&alone(&p), "c").await.expect("connected");
    let mut admin = server.connection();
    pause_writes(&mut admin, 60_000);
    for _ in 0..40 {
        let err = limiter
            .check(&alone(&p), "c")
            .await
            .expect_err("the server is paused");
        assert!(err.is_timeout(), "{err}");
    }
    let connected = deadpool_redis::redis::cmd("CLIENT")
        .arg("LIST")
        .query::<String>(&mut admin)
        .expect("CLIENT LIST")
        .lines()
        .count();
    unpause(&mut admin);
    // The 16 lingering, the admin's, and the one in use unless the last check gave it up.
    assert!(
        (17..=18).contains(&connected),
        "{connected} connections after 40 timeouts"
    );
}
