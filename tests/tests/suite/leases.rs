//! Concurrency limits as members of a policy set: leases in Redis and in memory, across
//! instances, expiring after a crash, held by the response body.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use redlimit::{
    Algorithm, ConcurrencyPolicy, Decision, Decisions, Limiter, MemoryBackend, Policy, PolicySet,
    RetryAfter,
};
use redlimit_tests::RedisServer;

use crate::support::both_backends;

fn policy(name: &str, limit: u64, ttl: Duration) -> ConcurrencyPolicy {
    ConcurrencyPolicy::builder(name)
        .limit(limit)
        .lease_ttl(ttl)
        .build()
        .expect("a valid policy")
}

/// A generous rate limit with `concurrency` as a member.
fn set(concurrency: ConcurrencyPolicy) -> PolicySet {
    let generous = Policy::builder("per-minute", Algorithm::Gcra)
        .limit(100_000)
        .window(Duration::from_secs(60))
        .build()
        .expect("valid");
    PolicySet::from(generous)
        .with_concurrency(concurrency)
        .expect("a valid set")
}

/// A check of `set` for `client`: its decisions, which hold the lease when granted.
async fn acquire(limiter: &Limiter, set: &PolicySet, client: &str) -> Decisions {
    limiter.check(set, client).await.expect("a check")
}

/// The concurrency limit's decision: the last.
fn lease_decision(decisions: &Decisions) -> &Decision {
    decisions.last().expect("a decision")
}

/// Checks until granted, for at most `budget`: how long it took.
async fn acquired_within(limiter: &Limiter, p: &PolicySet, budget: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let decisions = acquire(limiter, p, "c").await;
        if decisions.lease().is_some() {
            assert!(decisions.allowed());
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
        let p = set(policy("three", 3, Duration::from_secs(30)));
        let mut held = Vec::new();
        for free in [2, 1, 0] {
            let decisions = acquire(&limiter, &p, "c").await;
            assert!(decisions.allowed(), "{backend}");
            assert_eq!(lease_decision(&decisions).remaining, free, "{backend}");
            assert!(decisions.lease().is_some(), "{backend}");
            held.push(decisions);
        }
        let full = acquire(&limiter, &p, "c").await;
        assert!(!full.allowed() && full.lease().is_none(), "{backend}");
        assert!(
            full[0].allowed,
            "{backend}: refused by the concurrency limit alone"
        );
        let Some(RetryAfter::After(wait)) = lease_decision(&full).retry_after else {
            panic!("{backend}: a wait");
        };
        assert!(wait <= Duration::from_secs(30), "{backend}: {wait:?}");
        assert!(acquire(&limiter, &p, "other").await.allowed(), "per client");
        let lease = held[0].lease().expect("a lease");
        assert!(lease.renew().await.expect("renew"), "{backend}");
        drop(held.remove(0));
        // Dropped leases are given back (on Redis by a task): the slot comes free.
        held.push(acquire_eventually(&limiter, &p).await);
        drop(held);
        acquired_within(&limiter, &p, Duration::from_secs(5)).await;
    }
}

/// The decisions of a check granted a lease within 5 s.
async fn acquire_eventually(limiter: &Limiter, p: &PolicySet) -> Decisions {
    let started = Instant::now();
    loop {
        let decisions = acquire(limiter, p, "c").await;
        if decisions.lease().is_some() {
            return decisions;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no slot came free"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leases_of_a_crashed_holder_expire_after_their_ttl() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let ttl = Duration::from_millis(300);
        let p = set(policy("crash", 2, ttl));
        for _ in 0..2 {
            let decisions = acquire(&limiter, &p, "c").await;
            assert!(decisions.lease().is_some(), "{backend}");
            // A crashed process never releases.
            std::mem::forget(decisions);
        }
        let decisions = acquire(&limiter, &p, "c").await;
        assert!(decisions.lease().is_none(), "{backend}: both slots held");
        let took = acquired_within(&limiter, &p, Duration::from_secs(10)).await;
        println!("{backend}: a crashed holder's slot came free after {took:?} (TTL {ttl:?})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_never_hold_more_than_the_limit() {
    let server = RedisServer::start();
    let p = set(policy("five", 5, Duration::from_secs(30)));
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
                    let decisions = acquire(&limiter, &p, "c").await;
                    if decisions.lease().is_some() {
                        let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        in_flight.fetch_sub(1, Ordering::SeqCst);
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
    assert!(acquire(&memory, &p, "c").await.allowed());
}

/// An app on its own Redis connection, 5 requests in flight at most, whose handler counts how
/// many run at once and sleeps 100 ms.
async fn instance(
    url: &str,
    in_flight: &Arc<AtomicUsize>,
    most: &Arc<AtomicUsize>,
) -> std::net::SocketAddr {
    use axum::{Router, routing::get};
    use redlimit::{GuardedLimiter, RedisBackend};
    use tower_redlimit::{Global, RateLimitLayer};

    let backend = RedisBackend::builder(url)
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let five = set(policy("five", 5, Duration::from_secs(30)));
    let guard = GuardedLimiter::builder(Limiter::new(backend), five)
        .budget(Duration::from_secs(5))
        .build();
    let layer = RateLimitLayer::new(guard).key(Global);
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

/// A lease goes through the guard's circuit as any check does: once failures open it, checks
/// are answered by the failure policy without asking the dead backend, and hold no lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_circuit_answers_acquires_without_the_backend() {
    use redlimit::{CircuitBreaker, ErrorKind, FailurePolicy, GuardedLimiter, Reason};

    let server = RedisServer::start();
    let limiter = server.limiter();
    drop(server);
    let in_flight = set(policy("in-flight", 2, Duration::from_secs(30)));
    let guard = GuardedLimiter::builder(limiter, in_flight)
        .failure(FailurePolicy::Open)
        .budget(Duration::from_secs(5))
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(600)))
        .build();
    let first = guard.check("c").await;
    assert_eq!(first[0].reason, Reason::FailOpen);
    let failed =
        guard.stats().failed(ErrorKind::Backend) + guard.stats().failed(ErrorKind::Timeout);
    assert_eq!(failed, 1, "the dead backend was asked once");
    assert!(guard.breaker().is_open(), "one failure opens this circuit");
    for _ in 0..3 {
        let decisions = guard.check("c").await;
        assert!(decisions.allowed() && decisions.lease().is_none());
        assert_eq!(decisions[0].reason, Reason::FailOpen);
    }
    let after = guard.stats().failed(ErrorKind::Backend) + guard.stats().failed(ErrorKind::Timeout);
    assert_eq!(after, 1, "an open circuit asked the backend nothing more");
}

/// A request the concurrency limit refuses consumes no rate quota: limit 10 with one slot, one
/// request held in flight and one refused leave 9, on Redis and in memory; on Redis, one script
/// call per request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_refusal_spends_no_rate_quota() {
    use axum::{Router, body::Body, http::Request, routing::get};
    use redlimit::GuardedLimiter;
    use tower::ServiceExt;
    use tower_redlimit::{Global, RateLimitLayer};

    let server = RedisServer::start();
    for (name, limiter) in both_backends(&server) {
        let per_minute = Policy::builder("per-minute", Algorithm::FixedWindowAnchored)
            .limit(10)
            .window(Duration::from_secs(60))
            .build()
            .expect("valid");
        let one_at_a_time = PolicySet::from(per_minute)
            .with_concurrency(policy("one-at-a-time", 1, Duration::from_secs(30)))
            .expect("a valid set");
        let guard = GuardedLimiter::builder(limiter, one_at_a_time)
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
        let layer = RateLimitLayer::new(guard.clone()).key(Global);
        let app = Router::new().route("/", get(handler)).layer(layer);
        let request = || Request::get("/").body(Body::empty()).expect("request");
        // The function library is loaded (a first FCALL finds no function, loads it and calls
        // again).
        let _ = guard.check("warm-up").cost(0).await;
        let calls_before = redlimit_tests::script_calls(&mut server.connection()).commands;
        let held = tokio::spawn(app.clone().oneshot(request()));
        // In its handler, the first holds the one slot: the next is refused by the limit.
        in_flight.recv().await.expect("the first request is served");
        let refused = app.clone().oneshot(request()).await.expect("infallible");
        assert_eq!(refused.status(), 429, "{name}");
        let state = refused.headers()["ratelimit"]
            .to_str()
            .expect("text")
            .to_owned();
        let calls = redlimit_tests::script_calls(&mut server.connection()).commands - calls_before;
        release.send(true).expect("the handler waits");
        assert_eq!(
            held.await.expect("served").expect("infallible").status(),
            200
        );
        if name == "redis" {
            assert_eq!(calls, 2, "one script call for each of the two requests");
        }
        let left = guard.check("global").cost(0).await;
        println!("{name}: refused with {state}; {} left", left[0].remaining);
        assert!(state.contains("\"per-minute\";r=9;"), "{name}: {state}");
        assert_eq!(left[0].remaining, 9, "{name}: one served, one refused");
    }
}

/// A response body that streams what its sender sends, and ends only when the sender is gone.
struct Streaming(tokio::sync::mpsc::UnboundedReceiver<bytes::Bytes>);

impl http_body::Body for Streaming {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|chunk| Ok(http_body::Frame::data(chunk))))
    }
}

/// An app whose requests share one slot: `/stream` answers a body that sends `first` and then
/// waits (its sender kept in `senders`), `/` answers at once.
fn streaming_app(
    limiter: Limiter,
) -> (
    axum::Router,
    Arc<std::sync::Mutex<Vec<tokio::sync::mpsc::UnboundedSender<bytes::Bytes>>>>,
) {
    use axum::{Router, body::Body, routing::get};
    use redlimit::GuardedLimiter;
    use tower_redlimit::{Global, RateLimitLayer};

    let one = set(policy("one-at-a-time", 1, Duration::from_secs(30)));
    let guard = GuardedLimiter::builder(limiter, one)
        .budget(Duration::from_secs(5))
        .build();
    let senders = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = Arc::clone(&senders);
    let stream = move || {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        sender
            .send(bytes::Bytes::from_static(b"first"))
            .expect("open");
        kept.lock().expect("not poisoned").push(sender);
        async move { Body::new(Streaming(receiver)) }
    };
    let app = Router::new()
        .route("/stream", get(stream))
        .route("/", get(|| async { "ok" }))
        .layer(RateLimitLayer::new(guard).key(Global));
    (app, senders)
}

/// Requests `/` from `app` until one is served, for at most 5 s.
async fn served_within(app: &axum::Router) {
    use tower::ServiceExt;

    let started = Instant::now();
    loop {
        let request = axum::http::Request::get("/")
            .body(axum::body::Body::empty())
            .expect("request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        if response.status() == 200 {
            return;
        }
        assert_eq!(response.status(), 429);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the slot never came free"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A streamed response holds its lease past its head, until its body is dropped mid-stream,
/// on Redis and in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_held_until_the_response_body_is_dropped() {
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let server = RedisServer::start();
    for (name, limiter) in both_backends(&server) {
        let (app, senders) = streaming_app(limiter);
        let request = |path| {
            axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .expect("request")
        };
        let streaming = app
            .clone()
            .oneshot(request("/stream"))
            .await
            .expect("infallible");
        assert_eq!(streaming.status(), 200, "{name}");
        let mut body = streaming.into_body();
        let frame = body.frame().await.expect("a frame").expect("infallible");
        assert_eq!(frame.into_data().expect("data"), "first");
        let meanwhile = app.clone().oneshot(request("/")).await.expect("infallible");
        assert_eq!(meanwhile.status(), 429, "{name}: the body still streams");
        assert_eq!(senders.lock().expect("not poisoned").len(), 1);
        drop(body);
        served_within(&app).await;
    }
}

/// A client that goes away mid-stream gives its lease back: the server drops the body.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_given_back_when_the_client_disconnects() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let server = RedisServer::start();
    let (app, _senders) = streaming_app(server.limiter());
    let address = redlimit_tests::serve(app.clone()).await;
    let mut client = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!("GET /stream HTTP/1.1\r\nHost: {address}\r\n\r\n");
    client
        .write_all(request.as_bytes())
        .await
        .expect("a request");
    let mut received = Vec::new();
    let mut buffer = [0; 1024];
    let read = async {
        while !String::from_utf8_lossy(&received).contains("first") {
            let n = client.read(&mut buffer).await.expect("a read");
            assert!(n > 0, "the server closed the stream");
            received.extend_from_slice(&buffer[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the first chunk within 10 s");
    let meanwhile = redlimit_tests::http_get(address, "/", &[]).await;
    assert_eq!(meanwhile.status, 429, "the stream holds the one slot");
    drop(client);
    served_within(&app).await;
}
