//! Retries counted once: a request id's first decision answers its retries, in the same script
//! call on Redis, and in memory alike.

use redlimit::PolicySet;
use std::time::{Duration, Instant};

use redlimit::{Algorithm, Limiter, Policy};
use redlimit_tests::RedisServer;

use crate::support::{alone, both_backends, policy, set_of};

const HOUR: Duration = Duration::from_secs(3_600);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_request_id_consumes_once_and_gets_the_same_decision() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let p = [policy(Algorithm::FixedWindowAnchored, 3, 3_600_000, None)];
        let mut seen = Vec::new();
        for _ in 0..5 {
            let d = limiter
                .check(&set_of(&p), "c")
                .once("req-1", HOUR)
                .await
                .expect("check");
            seen.push((d.allowed(), d[0].remaining));
        }
        assert_eq!(
            seen,
            [(true, 2); 5],
            "{backend}: one consumed, the same answer"
        );
        let plain = limiter.check(&alone(&p[0]), "c").await.expect("check")[0].clone();
        assert_eq!(
            plain.remaining, 1,
            "{backend}: the retries consumed nothing"
        );
        limiter.check(&alone(&p[0]), "c").await.expect("check");
        for _ in 0..3 {
            let denied = limiter
                .check(&set_of(&p), "c")
                .once("req-2", HOUR)
                .await
                .expect("check");
            assert!(!denied.allowed(), "{backend}: a denial is remembered too");
        }
        let other = limiter
            .check(&set_of(&p), "c")
            .once("req-1", HOUR)
            .await
            .expect("check");
        assert!(other.allowed(), "{backend}: req-1 still answers as first");
        // Several policies, one script call.
        let pair = [
            policy(Algorithm::Gcra, 10, 60_000, None),
            policy(Algorithm::SlidingWindowLog, 10, 60_000, None),
        ];
        for _ in 0..4 {
            let d = limiter
                .check(&set_of(&pair), "d")
                .once("req-3", HOUR)
                .await
                .expect("check");
            assert_eq!((d[0].remaining, d[1].remaining), (9, 9), "{backend}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_window_the_same_id_counts_again() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let p = [policy(Algorithm::FixedWindowAnchored, 10, 3_600_000, None)];
        let window = Duration::from_millis(200);
        let first = limiter
            .check(&set_of(&p), "c")
            .once("r", window)
            .await
            .expect("check");
        assert_eq!(first[0].remaining, 9, "{backend}");
        let started = Instant::now();
        loop {
            let again = limiter
                .check(&set_of(&p), "c")
                .once("r", window)
                .await
                .expect("check");
            if again[0].remaining == 8 {
                break;
            }
            assert_eq!(
                again[0].remaining, 9,
                "{backend}: the first answer while remembered"
            );
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{backend}: never forgotten"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_of_one_request_consume_once() {
    let server = RedisServer::start();
    // A fixed window opened by the first request: nothing refills while the test runs, and no
    // aligned boundary falls inside it.
    let p = Policy::builder("once", Algorithm::FixedWindowAnchored)
        .limit(100)
        .window(HOUR)
        .build()
        .expect("valid");
    let mut tasks = tokio::task::JoinSet::new();
    for instance in 0..4 {
        let limiter: Limiter = server.limiter();
        for _ in 0..16 {
            let (limiter, p) = (limiter.clone(), p.clone());
            tasks.spawn(async move {
                let d = limiter
                    .check(
                        &PolicySet::new(std::slice::from_ref(&p).iter().cloned())
                            .expect("a valid set"),
                        "c",
                    )
                    .once("the-one", HOUR)
                    .await
                    .expect("check");
                (instance, d[0].remaining)
            });
        }
    }
    while let Some(done) = tasks.join_next().await {
        let (_, remaining) = done.expect("a task");
        assert_eq!(remaining, 99, "every retry sees the first decision");
    }
    let seen = server.limiter().inspect(&p, "c").await.expect("inspect");
    assert_eq!(seen.used(), 1, "64 concurrent retries consumed one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_counts_an_idempotency_key_once_until_its_window_ends() {
    use axum::{Router, http::HeaderName, routing::get};
    use redlimit::GuardedLimiter;
    use redlimit_tests::{http_get, serve};
    use tower_redlimit::{Global, RateLimitLayer};

    let server = RedisServer::start();
    let guard = GuardedLimiter::builder(
        server.limiter(),
        policy(Algorithm::FixedWindowAnchored, 3, 3_600_000, None),
    )
    .budget(crate::support::PATIENT)
    .build();
    let layer = RateLimitLayer::new(guard)
        .key(Global)
        .idempotency_key(HeaderName::from_static("idempotency-key"))
        .idempotency_window(Duration::from_millis(300));
    let address = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    )
    .await;
    let state = |response: &redlimit_tests::HttpResponse| {
        response.header("ratelimit").unwrap_or_default().to_owned()
    };
    let mut seen = Vec::new();
    for _ in 0..5 {
        let response = http_get(address, "/", &[("idempotency-key", "order-7")]).await;
        assert_eq!(response.status, 200);
        seen.push(state(&response));
    }
    assert!(
        seen.iter().all(|s| s.contains(";r=2;")),
        "one consumed: {seen:?}"
    );
    let plain = http_get(address, "/", &[]).await;
    assert!(state(&plain).contains(";r=1;"), "{plain:?}");
    let started = Instant::now();
    loop {
        let again = http_get(address, "/", &[("idempotency-key", "order-7")]).await;
        if state(&again).contains(";r=0;") {
            break;
        }
        assert!(state(&again).contains(";r=2;"), "{again:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never counted again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
