//! Concurrency limits: leases in Redis and in memory, across instances, expiring after a crash.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use redlimit::{ConcurrencyPolicy, Limiter, MemoryBackend, RetryAfter};
use redlimit_tests::RedisServer;

use crate::support::both_backends;

fn policy(name: &str, limit: u64, ttl: Duration) -> ConcurrencyPolicy {
    ConcurrencyPolicy::builder(name)
        .limit(limit)
        .lease_ttl(ttl)
        .build()
        .expect("a valid policy")
}

/// Acquires until granted, for at most `budget`: how long it took.
async fn acquired_within(limiter: &Limiter, p: &ConcurrencyPolicy, budget: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let (decision, lease) = limiter.acquire(p, "c").await.expect("acquire");
        if let Some(lease) = lease {
            assert!(decision.allowed);
            lease.release().await.expect("release");
            return started.elapsed();
        }
        assert!(
            started.elapsed() < budget,
            "no slot came free within {budget:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_the_limit_is_held_and_released_slots_come_free() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let p = policy("three", 3, Duration::from_secs(30));
        let mut held = Vec::new();
        for free in [2, 1, 0] {
            let (decision, lease) = limiter.acquire(&p, "c").await.expect("acquire");
            assert!(decision.allowed, "{backend}");
            assert_eq!(decision.remaining, free, "{backend}");
            held.push(lease.expect("a lease"));
        }
        let (full, none) = limiter.acquire(&p, "c").await.expect("acquire");
        assert!(!full.allowed && none.is_none(), "{backend}");
        let Some(RetryAfter::After(wait)) = full.retry_after else {
            panic!("{backend}: a wait");
        };
        assert!(wait <= Duration::from_secs(30), "{backend}: {wait:?}");
        assert!(
            limiter
                .acquire(&p, "other")
                .await
                .expect("acquire")
                .0
                .allowed,
            "per client"
        );
        assert!(held[0].renew().await.expect("renew"), "{backend}");
        held.remove(0).release().await.expect("release");
        assert!(
            limiter.acquire(&p, "c").await.expect("acquire").1.is_some(),
            "{backend}"
        );
        drop(held);
        // Dropped leases are given back (on Redis by a task): every slot comes free.
        acquired_within(
            &limiter,
            &policy("three", 3, Duration::from_secs(30)),
            Duration::from_secs(5),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leases_of_a_crashed_holder_expire_after_their_ttl() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let ttl = Duration::from_millis(300);
        let p = policy("crash", 2, ttl);
        for _ in 0..2 {
            let (_, lease) = limiter.acquire(&p, "c").await.expect("acquire");
            // A crashed process never releases.
            std::mem::forget(lease.expect("a lease"));
        }
        let (_, lease) = limiter.acquire(&p, "c").await.expect("acquire");
        assert!(lease.is_none(), "{backend}: both slots held");
        let took = acquired_within(&limiter, &p, Duration::from_secs(10)).await;
        println!("{backend}: a crashed holder's slot came free after {took:?} (TTL {ttl:?})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_never_hold_more_than_the_limit() {
    let server = RedisServer::start();
    let p = policy("five", 5, Duration::from_secs(30));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _instance in 0..4 {
        // Each instance has a connection of its own, as a process would.
        let limiter = server.limiter();
        for _ in 0..50 {
            let (limiter, p) = (limiter.clone(), p.clone());
            let (in_flight, most) = (Arc::clone(&in_flight), Arc::clone(&most));
            tasks.spawn(async move {
                let started = Instant::now();
                loop {
                    if let (_, Some(lease)) = limiter.acquire(&p, "c").await.expect("acquire") {
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        lease.release().await.expect("release");
                        return;
                    }
                    assert!(started.elapsed() < Duration::from_secs(60), "starved");
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
        }
    }
    let mut done = 0;
    while let Some(task) = tasks.join_next().await {
        task.expect("a task");
        done += 1;
    }
    assert_eq!(done, 200);
    let most = most.load(Ordering::SeqCst);
    assert!((1..=5).contains(&most), "{most} in flight at once");
    let memory = Limiter::new(MemoryBackend::default());
    assert!(memory.acquire(&p, "c").await.expect("acquire").0.allowed);
}

/// An app on its own Redis connection, 5 requests in flight at most, whose handler counts how
/// many run at once and sleeps 100 ms.
async fn instance(
    url: &str,
    in_flight: &Arc<AtomicUsize>,
    most: &Arc<AtomicUsize>,
) -> std::net::SocketAddr {
    use axum::{Router, routing::get};
    use redlimit::{Algorithm, GuardedLimiter, Policy, RedisBackend};
    use tower_redlimit::{Global, RateLimitLayer};

    let backend = RedisBackend::builder(url)
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let generous = Policy::builder("per-minute", Algorithm::Gcra)
        .limit(100_000)
        .window(Duration::from_secs(60))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(Limiter::new(backend), generous)
        .budget(Duration::from_secs(5))
        .build();
    let layer = RateLimitLayer::new(guard).key(Global).concurrency(policy(
        "five",
        5,
        Duration::from_secs(30),
    ));
    let (in_flight, most) = (Arc::clone(in_flight), Arc::clone(most));
    let handler = move || {
        let (in_flight, most) = (Arc::clone(&in_flight), Arc::clone(&most));
        async move {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(100)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            "ok"
        }
    };
    redlimit_tests::serve(Router::new().route("/", get(handler)).layer(layer)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_the_layer_four_instances_never_run_more_than_five_at_once() {
    let server = RedisServer::start();
    let (in_flight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut addresses = Vec::new();
    for _ in 0..4 {
        addresses.push(instance(&server.url(), &in_flight, &most).await);
    }
    let first = redlimit_tests::http_get(addresses[0], "/", &[]).await;
    let policy_header = first.header("ratelimit-policy").expect("RateLimit-Policy");
    assert!(
        policy_header.contains("\"five\";q=5;qu=\"concurrent-requests\""),
        "{policy_header}"
    );
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..200 {
        let address = addresses[i % 4];
        requests.spawn(async move {
            let started = Instant::now();
            let mut turned_away = 0;
            loop {
                let response = redlimit_tests::http_get(address, "/", &[]).await;
                if response.status == 200 {
                    return turned_away;
                }
                assert_eq!(response.status, 429, "{response:?}");
                assert!(response.header("retry-after").is_some());
                turned_away += 1;
                assert!(started.elapsed() < Duration::from_secs(120), "starved");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
    }
    let mut turned_away = 0;
    while let Some(request) = requests.join_next().await {
        turned_away += request.expect("a request task");
    }
    let most = most.load(Ordering::SeqCst);
    println!("200 served, at most {most} at once, {turned_away} turned away meanwhile");
    assert!((1..=5).contains(&most), "{most} in the handler at once");
    assert!(turned_away > 0, "the limit was reached");
}

/// A lease goes through the guard's circuit as a check does: once failures open it, acquires
/// are answered by the failure policy without asking the dead backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_answers_acquires_without_the_backend() {
    use redlimit::{CircuitBreaker, ErrorKind, FailurePolicy, GuardedLimiter, Reason};

    let server = RedisServer::start();
    let limiter = server.limiter();
    drop(server);
    let rate = crate::support::policy(redlimit::Algorithm::Gcra, 10, 1_000, None);
    let guard = GuardedLimiter::builder(limiter, rate)
        .failure(FailurePolicy::Open)
        .budget(Duration::from_secs(5))
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(600)))
        .build();
    let in_flight = policy("in-flight", 2, Duration::from_secs(30));
    let (first, _) = guard.acquire(&in_flight, "c").await;
    assert_eq!(first.reason, Reason::FailOpen);
    let failed =
        guard.stats().failed(ErrorKind::Backend) + guard.stats().failed(ErrorKind::Timeout);
    assert_eq!(failed, 1, "the dead backend was asked once");
    assert!(guard.breaker().is_open(), "one failure opens this circuit");
    for _ in 0..3 {
        let (decision, lease) = guard.acquire(&in_flight, "c").await;
        assert!(decision.allowed && lease.is_none());
        assert_eq!(decision.reason, Reason::FailOpen);
    }
    let after = guard.stats().failed(ErrorKind::Backend) + guard.stats().failed(ErrorKind::Timeout);
    assert_eq!(after, 1, "an open circuit asked the backend nothing more");
}

/// A request the concurrency limit refuses consumes no rate quota: limit 10 with one slot, one
/// request held in flight and one refused leave 9, on Redis and in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_refusal_spends_no_rate_quota() {
    use axum::{Router, body::Body, http::Request, routing::get};
    use redlimit::{Algorithm, GuardedLimiter, Policy};
    use tower::ServiceExt;
    use tower_redlimit::{Global, RateLimitLayer};

    let server = RedisServer::start();
    for (name, limiter) in both_backends(&server) {
        let per_minute = Policy::builder("per-minute", Algorithm::FixedWindow)
            .limit(10)
            .window(Duration::from_secs(60))
            .build()
            .expect("valid");
        let guard = GuardedLimiter::builder(limiter, per_minute)
            .budget(Duration::from_secs(5))
            .build();
        let (release, released) = tokio::sync::watch::channel(false);
        let (entered, mut in_flight) = tokio::sync::mpsc::unbounded_channel();
        let handler = move || {
            let (mut released, entered) = (released.clone(), entered.clone());
            async move {
                let _ = entered.send(());
                let _ = released.wait_for(|done| *done).await;
                "done"
            }
        };
        let layer = RateLimitLayer::new(guard.clone())
            .key(Global)
            .concurrency(policy("one-at-a-time", 1, Duration::from_secs(30)));
        let app = Router::new().route("/", get(handler)).layer(layer);
        let request = || Request::get("/").body(Body::empty()).expect("request");
        let held = tokio::spawn(app.clone().oneshot(request()));
        // In its handler, the first holds the one slot: the next is refused by the limit.
        in_flight.recv().await.expect("the first request is served");
        let refused = app.clone().oneshot(request()).await.expect("infallible");
        assert_eq!(refused.status(), 429, "{name}");
        let state = refused.headers()["ratelimit"]
            .to_str()
            .expect("text")
            .to_owned();
        release.send(true).expect("the handler waits");
        assert_eq!(
            held.await.expect("served").expect("infallible").status(),
            200
        );
        let left = guard.check("global").cost(0).await;
        println!("{name}: refused with {state}; {} left", left[0].remaining);
        assert!(state.contains("\"per-minute\";r=9;"), "{name}: {state}");
        assert_eq!(left[0].remaining, 9, "{name}: one served, one refused");
    }
}
