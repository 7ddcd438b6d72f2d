//! Delay mode: requests over the limit wait for a reserved slot instead of being denied.

use redlimit::PolicySet;
use std::{
    convert::Infallible,
    future::Future,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    task::Poll,
    time::{Duration, Instant},
};

use axum::http::{Request, Response};
use axum::{Router, routing::get};
use bytes::Bytes;
use redlimit::{
    Algorithm, ConfigError, GuardedLimiter, Limiter, MemoryBackend, Policy, RedisBackend,
    RetryAfter,
};
use redlimit_tests::{RedisServer, TestClock, http_get, serve};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_redlimit::{Global, RateLimitLayer};

use crate::support::{T0, alone, at_ms, both_backends};

/// GCRA, 10 per second, a burst of 10, in delay mode with `max_delay`.
fn delayed(name: &str, max_delay: Duration) -> Policy {
    Policy::builder(name, Algorithm::Gcra)
        .limit(10)
        .window(Duration::from_secs(1))
        .max_delay(max_delay)
        .build()
        .expect("a valid policy")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_reserved_one_interval_apart_on_redis_and_in_memory() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for (max_delay_ms, admitted) in [(2_000_u64, 30_u64), (1_000, 20)] {
            let policy = delayed(
                &format!("d{max_delay_ms}"),
                Duration::from_millis(max_delay_ms),
            );
            for i in 0..admitted {
                let d = limiter
                    .check(&alone(&policy), "c")
                    .at(at_ms(T0))
                    .await
                    .expect("check")[0]
                    .clone();
                assert!(d.allowed, "{backend} {max_delay_ms}: #{i}");
                let wait = i.saturating_sub(9) * 100;
                assert_eq!(d.delay, Duration::from_millis(wait), "{backend} #{i}");
            }
            let over = limiter
                .check(&alone(&policy), "c")
                .at(at_ms(T0))
                .await
                .expect("check")[0]
                .clone();
            assert!(!over.allowed, "{backend} {max_delay_ms}");
            assert_eq!(over.delay, Duration::ZERO);
            assert_eq!(
                over.retry_after,
                Some(RetryAfter::After(Duration::from_millis(100))),
                "{backend}: until its slot is within max_delay"
            );
        }
    }
}

#[tokio::test]
async fn delay_mode_is_gcra_alone_within_an_hour() {
    let builder = |algorithm| {
        Policy::builder("p", algorithm)
            .limit(10)
            .window(Duration::from_secs(1))
    };
    let not_gcra = builder(Algorithm::TokenBucket)
        .max_delay(Duration::from_secs(1))
        .build();
    assert!(matches!(
        not_gcra,
        Err(ConfigError::NotApplicable {
            field: "max_delay",
            ..
        })
    ));
    for (delay, field) in [
        (Duration::ZERO, "max_delay"),
        (Duration::from_secs(7_200), "max_delay"),
    ] {
        let err = builder(Algorithm::Gcra)
            .max_delay(delay)
            .build()
            .expect_err("bad");
        assert!(err.to_string().contains(field), "{err}");
    }
    let other = builder(Algorithm::FixedWindow).build().expect("valid");
    let pair = [delayed("d", Duration::from_secs(1)), other.clone()];
    assert!(matches!(
        PolicySet::new(pair),
        Err(ConfigError::Conflict {
            field: "max_delay",
            ..
        })
    ));
}

/// An app on its own Redis connection whose handler records when it runs, deciding at the
/// times `clock` gives.
async fn instance(
    url: &str,
    policy: &Policy,
    clock: &TestClock,
    served: &Arc<Mutex<Vec<Instant>>>,
) -> std::net::SocketAddr {
    let backend = RedisBackend::builder(url)
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(Limiter::new(backend), policy.clone())
        .budget(Duration::from_secs(5))
        .clock(clock.clock())
        .build();
    let served = Arc::clone(served);
    let handler = move || {
        let served = Arc::clone(&served);
        async move {
            served
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Instant::now());
            "ok"
        }
    };
    let layer = RateLimitLayer::new(guard).key(Global);
    serve(Router::new().route("/", get(handler)).layer(layer)).await
}

/// 30 requests at once, alternating between two instances sharing Redis: their statuses and
/// Retry-After values, and when the handler ran. Every check is decided at one explicit time,
/// so how the requests happen to arrive on a busy machine cannot change which slots they get;
/// the waits are real.
async fn thirty_at_once(
    server: &RedisServer,
    policy: &Policy,
) -> (Vec<(u16, Option<String>)>, Vec<Instant>) {
    let served = Arc::new(Mutex::new(Vec::new()));
    let clock = TestClock::at_millis(T0);
    let a = instance(&server.url(), policy, &clock, &served).await;
    let b = instance(&server.url(), policy, &clock, &served).await;
    let requests: Vec<_> = (0..30)
        .map(|i| {
            let address = if i % 2 == 0 { a } else { b };
            tokio::spawn(async move { http_get(address, "/", &[]).await })
        })
        .collect();
    let mut answers = Vec::new();
    for request in requests {
        let response = request.await.expect("a request task");
        answers.push((
            response.status,
            response.header("retry-after").map(str::to_owned),
        ));
    }
    let mut times = served
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    times.sort_unstable();
    (answers, times)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thirty_at_once_pass_spread_by_their_slots_across_two_instances() {
    let server = RedisServer::start();
    let (answers, times) = thirty_at_once(&server, &delayed("two-s", Duration::from_secs(2))).await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
    assert_eq!(times.len(), 30);
    for (i, first) in times.iter().enumerate() {
        let in_a_second = times[i..]
            .iter()
            .take_while(|t| t.duration_since(*first) < Duration::from_secs(1))
            .count();
        assert!(
            in_a_second <= 20,
            "{in_a_second} served within 1 s of #{i}: burst 10 + 10"
        );
    }
    let spread = times[29].duration_since(times[0]);
    assert!(
        spread >= Duration::from_millis(1_900),
        "the last waited for its slot: {spread:?}"
    );

    let (answers, times) = thirty_at_once(&server, &delayed("one-s", Duration::from_secs(1))).await;
    let served = answers.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!((served, times.len()), (20, 20), "{answers:?}");
    for (status, retry) in &answers {
        if *status != 200 {
            assert_eq!(*status, 429);
            let retry: u64 = retry
                .as_deref()
                .expect("Retry-After")
                .parse()
                .expect("seconds");
            assert!(retry >= 1, "{retry}");
        }
    }
}

#[tokio::test]
async fn waiters_whose_clients_go_away_stop_at_once_and_are_never_served() {
    let policy = Policy::builder("slow", Algorithm::Gcra)
        .limit(1)
        .window(Duration::from_secs(10))
        .burst(1)
        .max_delay(Duration::from_secs(3_600))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(Limiter::new(MemoryBackend::default()), policy).build();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let inner = service_fn(move |_: Request<()>| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(Bytes::new())) }
    });
    let layer = RateLimitLayer::new(guard).key(Global).max_waiting(100);
    let mut service = layer.layer(inner);
    let first = service
        .ready()
        .await
        .expect("ready")
        .call(Request::new(()))
        .await;
    assert_eq!(
        first.expect("infallible").status(),
        200,
        "the burst is served at once"
    );

    let mut waiting = Vec::new();
    for _ in 0..100 {
        let mut future = Box::pin(service.ready().await.expect("ready").call(Request::new(())));
        // Polled once: checked, its slot reserved, now waiting.
        std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await;
        waiting.push(future);
    }
    assert_eq!(layer.waiting(), 100);
    let full = service
        .ready()
        .await
        .expect("ready")
        .call(Request::new(()))
        .await;
    let full = full.expect("infallible");
    assert_eq!(full.status(), 429, "every place to wait is taken");
    assert!(full.headers().contains_key("retry-after"));

    let gone = Instant::now();
    drop(waiting);
    let took = gone.elapsed();
    assert_eq!(layer.waiting(), 0, "dropping a waiter gives its place back");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no waiter reached the service"
    );
    println!("100 waiters dropped in {took:?}");
}
