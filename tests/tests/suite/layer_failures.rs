//! Failure policies through the layer: Redis killed, Redis silent, Redis back.

use std::{
    net::{SocketAddr, TcpListener},
    thread,
    time::{Duration, Instant},
};

use axum::{Extension, Router, routing::get};
use redlimit::{
    Algorithm, CircuitBreaker, Decisions, FailurePolicy, GuardedLimiter, Limiter, RedisBackend,
};
use redlimit_tests::{HttpResponse, RedisServer, free_port, http_get, serve};
use tower_redlimit::RateLimitLayer;

use crate::support::policy;

const BUDGET: Duration = Duration::from_millis(100);
/// Scheduling slack on a loaded 2-core machine; the budget is what is being tested.
const MARGIN: Duration = Duration::from_secs(2);
const COOLDOWN: Duration = Duration::from_millis(300);

async fn reason(decisions: Option<Extension<Decisions>>) -> String {
    decisions.map_or_else(
        || "none".to_owned(),
        |Extension(d)| d.most_restrictive().reason.as_str().to_owned(),
    )
}

async fn app_on(url: String, failure: FailurePolicy) -> SocketAddr {
    // The backend's own budget is larger: the layer's budget is the one under test.
    let backend = RedisBackend::builder(url)
        .budget(Duration::from_secs(1))
        .build()
        .expect("valid");
    let guard = GuardedLimiter::builder(
        Limiter::new(backend),
        policy(Algorithm::Gcra, 1_000, 60_000, None),
    )
    .failure(failure)
    .budget(BUDGET)
    .circuit_breaker(CircuitBreaker::new(3, COOLDOWN))
    .build();
    let layer = RateLimitLayer::new(guard);
    serve(Router::new().route("/", get(reason)).layer(layer)).await
}

fn policies() -> [(FailurePolicy, u16, &'static str); 3] {
    [
        (FailurePolicy::Open, 200, "fail_open"),
        (FailurePolicy::Closed, 503, ""),
        (FailurePolicy::local(), 200, "fallback"),
    ]
}

async fn timed_get(address: SocketAddr) -> (HttpResponse, Duration) {
    let started = Instant::now();
    let response = http_get(address, "/", &[]).await;
    (response, started.elapsed())
}

fn assert_failure_answer(
    response: &HttpResponse,
    took: Duration,
    status: u16,
    body: &str,
    what: &str,
) {
    assert!(took < BUDGET + MARGIN, "{what}: took {took:?}");
    assert_eq!(response.status, status, "{what}: {response:?}");
    // Only the local fallback checked a quota; open and closed answers advertise none.
    for header in ["ratelimit", "ratelimit-policy"] {
        assert_eq!(
            response.header(header).is_some(),
            body == "fallback",
            "{what}: {header} in {response:?}"
        );
    }
    if status == 200 {
        assert_eq!(response.body, body, "{what}: the reason is exposed");
    } else {
        assert!(
            response.header("retry-after").is_some(),
            "{what}: {response:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_gets_the_failure_policy_and_a_restarted_one_is_used_again() {
    for (failure, status, body) in policies() {
        let what = format!("{failure:?}");
        let port = free_port();
        let server = RedisServer::start_on_port(port);
        let address = app_on(server.url(), failure).await;
        assert_eq!(http_get(address, "/", &[]).await.body, "redis", "{what}");

        drop(server);
        // Through the failures that open the circuit and while it is open.
        for _ in 0..6 {
            let (response, took) = timed_get(address).await;
            assert_failure_answer(&response, took, status, body, &what);
        }

        let _back = RedisServer::start_on_port(port);
        let mut recovered = false;
        for _ in 0..50 {
            tokio::time::sleep(COOLDOWN / 3).await;
            let response = http_get(address, "/", &[]).await;
            if response.body == "redis" {
                recovered = true;
                break;
            }
        }
        assert!(
            recovered,
            "{what}: checks go to Redis again without a restart"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_never_answers_gets_the_failure_policy_within_the_budget() {
    for (failure, status, body) in policies() {
        let what = format!("{failure:?}");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("redis://{}", listener.local_addr().expect("address"));
        // Accepts connections, never answers; ends with the listener when the test is over.
        thread::spawn(move || {
            let held: Vec<_> = listener.incoming().take(32).collect();
            drop(held);
        });
        let address = app_on(url, failure).await;
        for _ in 0..6 {
            let (response, took) = timed_get(address).await;
            assert_failure_answer(&response, took, status, body, &what);
        }
    }
}
