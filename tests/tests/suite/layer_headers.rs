//! The layer through a real TCP listener and real Redis: exact headers, several policies, and
//! client keys that a spoofed header cannot change.

use axum::{Extension, Router, routing::get};
use redlimit::PolicySet;
use redlimit::{Algorithm, Decisions, GuardedLimiter, Limiter, Policy};
use redlimit_tests::{RedisServer, TestClock, http_get, serve};
use tower_redlimit::{ClientIp, HeaderStyle, RateLimitLayer};

use crate::support::{T0, policy};

async fn reason(decisions: Option<Extension<Decisions>>) -> String {
    decisions.map_or_else(
        || "none".to_owned(),
        |Extension(d)| d.most_restrictive().reason.as_str().to_owned(),
    )
}

fn app(layer: RateLimitLayer) -> Router {
    Router::new().route("/", get(reason)).layer(layer)
}

/// Per algorithm (limit 3, window 60 s, burst 3, all at T0): the `RateLimit` value of the 1st and
/// 3rd requests, then the 4th request's `RateLimit` and `Retry-After`.
const EXPECTED: [(Algorithm, &str, &str, &str, &str); 6] = [
    (
        Algorithm::FixedWindow,
        "r=2;t=60",
        "r=0;t=60",
        "r=0;t=60",
        "60",
    ),
    (
        Algorithm::FixedWindowAnchored,
        "r=2;t=60",
        "r=0;t=60",
        "r=0;t=60",
        "60",
    ),
    (
        Algorithm::SlidingWindowLog,
        "r=2;t=60",
        "r=0;t=60",
        "r=0;t=60",
        "60",
    ),
    // The 3 weigh on through the next window; 1 more fits once 1/3 of them has decayed there.
    (
        Algorithm::SlidingWindowCounter,
        "r=2;t=120",
        "r=0;t=120",
        "r=0;t=80",
        "80",
    ),
    // One token (or one GCRA interval) every 20 s.
    (
        Algorithm::TokenBucket,
        "r=2;t=20",
        "r=0;t=60",
        "r=0;t=20",
        "20",
    ),
    (Algorithm::Gcra, "r=2;t=20", "r=0;t=60", "r=0;t=20", "20"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_values_on_the_first_nth_and_one_over_the_limit_are_exact() {
    let server = RedisServer::start();
    for (algorithm, first, third, fourth, retry) in EXPECTED {
        let p = policy(algorithm, 3, 60_000, None);
        let name = p.name().to_owned();
        let guard = GuardedLimiter::builder(server.limiter(), p)
            .clock(TestClock::at_millis(T0).clock())
            .budget(crate::support::PATIENT)
            .build();
        let layer = RateLimitLayer::new(guard).headers(HeaderStyle::IetfAndLegacy);
        let address = serve(app(layer)).await;
        let mut responses = Vec::new();
        for _ in 0..4 {
            responses.push(http_get(address, "/", &[]).await);
        }
        let policy_header = format!("\"{name}\";q=3;w=60");
        for (i, response) in responses.iter().enumerate() {
            assert_eq!(
                response.header("ratelimit-policy"),
                Some(policy_header.as_str()),
                "{name} #{}",
                i + 1
            );
            assert_eq!(response.header("x-ratelimit-limit"), Some("3"), "{name}");
        }
        let state = |i: usize| responses[i].header("ratelimit").map(str::to_owned);
        assert_eq!(state(0), Some(format!("\"{name}\";{first}")), "{name} 1st");
        assert_eq!(state(2), Some(format!("\"{name}\";{third}")), "{name} 3rd");
        assert_eq!(state(3), Some(format!("\"{name}\";{fourth}")), "{name} 4th");
        assert_eq!(
            responses[0].header("x-ratelimit-remaining"),
            Some("2"),
            "{name}"
        );
        assert_eq!(
            responses[2].header("x-ratelimit-remaining"),
            Some("0"),
            "{name}"
        );
        let statuses: Vec<u16> = responses.iter().map(|r| r.status).collect();
        assert_eq!(statuses, [200, 200, 200, 429], "{name}");
        assert_eq!(responses[0].body, "redis", "the handler sees the decision");
        assert_eq!(responses[3].header("retry-after"), Some(retry), "{name}");
        assert!(
            fourth.ends_with(&format!(";t={retry}")),
            "{name}: a denial's t is its Retry-After"
        );
        assert_eq!(responses[0].header("retry-after"), None, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_exhausted_policy_denies_and_the_others_keep_their_quota() {
    let server = RedisServer::start();
    let clock = TestClock::at_millis(T0);
    let per_second = Policy::builder("per-second", Algorithm::FixedWindow)
        .limit(2)
        .window(std::time::Duration::from_secs(1))
        .build()
        .expect("valid");
    let per_minute = policy(Algorithm::SlidingWindowLog, 5, 60_000, None);
    let guard = GuardedLimiter::builder(
        server.limiter(),
        PolicySet::new([per_second, per_minute]).expect("guard"),
    )
    .clock(clock.clock())
    .budget(crate::support::PATIENT)
    .build();
    let layer = RateLimitLayer::new(guard);
    let address = serve(app(layer)).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let r = http_get(address, "/", &[]).await;
        seen.push((
            r.status,
            r.header("ratelimit").unwrap_or_default().to_owned(),
        ));
    }
    clock.advance_millis(1_000);
    let r = http_get(address, "/", &[]).await;
    seen.push((
        r.status,
        r.header("ratelimit").unwrap_or_default().to_owned(),
    ));
    let expected = [
        (
            200,
            "\"per-second\";r=1;t=1, \"sliding_window_log\";r=4;t=60",
        ),
        (
            200,
            "\"per-second\";r=0;t=1, \"sliding_window_log\";r=3;t=60",
        ),
        (
            429,
            "\"per-second\";r=0;t=1, \"sliding_window_log\";r=3;t=60",
        ),
        (
            429,
            "\"per-second\";r=0;t=1, \"sliding_window_log\";r=3;t=60",
        ),
        (
            200,
            "\"per-second\";r=1;t=1, \"sliding_window_log\";r=2;t=60",
        ),
    ];
    let expected: Vec<(u16, String)> = expected
        .iter()
        .map(|(s, h)| (*s, (*h).to_owned()))
        .collect();
    assert_eq!(seen, expected);
}

async fn statuses(address: std::net::SocketAddr, forwarded: &[&str]) -> Vec<u16> {
    let mut statuses = Vec::new();
    for value in forwarded {
        statuses.push(
            http_get(address, "/", &[("x-forwarded-for", value)])
                .await
                .status,
        );
    }
    statuses
}

fn limited_app(server: &RedisServer, key: ClientIp, prefix: &str) -> Router {
    let limiter = Limiter::with_prefix(server.backend(), prefix).expect("prefix");
    let guard = GuardedLimiter::builder(limiter, policy(Algorithm::FixedWindow, 2, 60_000, None))
        .clock(TestClock::at_millis(T0).clock())
        .budget(crate::support::PATIENT)
        .build();
    let layer = RateLimitLayer::new(guard).key(key);
    app(layer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_changes_nothing() {
    let server = RedisServer::start();
    // The loopback peer is not a trusted proxy here.
    let untrusted = ClientIp::behind_proxies(["10.0.0.0/8"]).expect("valid");
    let address = serve(limited_app(&server, untrusted, "untrusted")).await;
    let got = statuses(address, &["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"]).await;
    assert_eq!(
        got,
        [200, 200, 429, 429],
        "every spoofed value is the same client"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_rightmost_untrusted_address_is_the_key() {
    let server = RedisServer::start();
    let trusted = ClientIp::behind_proxies(["127.0.0.0/8", "10.0.0.0/8"]).expect("valid");
    let address = serve(limited_app(&server, trusted, "trusted")).await;
    // The leftmost entries are whatever the client wrote; the proxy appended 203.0.113.1.
    let same_client = [
        "6.6.6.6, 203.0.113.1",
        "7.7.7.7, 203.0.113.1, 10.0.0.5",
        "203.0.113.1",
    ];
    assert_eq!(statuses(address, &same_client).await, [200, 200, 429]);
    assert_eq!(
        statuses(address, &["6.6.6.6, 203.0.113.2"]).await,
        [200],
        "another client"
    );
    // Malformed chains fall back to the nearest trusted hop: answered, never a panic or a 500.
    let malformed = ["", ",", "unknown", "[::1", "1.2.3.4:99999", "\u{e9}"];
    for status in statuses(address, &malformed).await {
        assert!(status == 200 || status == 429, "{status}");
    }
}

/// A policy whose burst is not its limit states the burst as its quota, over the time the whole
/// burst takes to refill, so that `r` never exceeds `q`: GCRA and a token bucket of 10 per
/// second with a burst of 20, 25 requests 10 ms apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_the_stated_quota_and_remaining_never_exceeds_it() {
    let server = RedisServer::start();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let p = Policy::builder("burst", algorithm)
            .limit(10)
            .window(std::time::Duration::from_secs(1))
            .burst(20)
            .build()
            .expect("valid");
        let clock = TestClock::at_millis(T0);
        let limiter =
            Limiter::with_prefix(server.backend(), format!("burst-{algorithm}")).expect("prefix");
        let guard = GuardedLimiter::builder(limiter, p)
            .clock(clock.clock())
            .budget(crate::support::PATIENT)
            .build();
        let layer = RateLimitLayer::new(guard).headers(HeaderStyle::IetfAndLegacy);
        let address = serve(app(layer)).await;
        let mut statuses = Vec::new();
        for _ in 0..25 {
            let response = http_get(address, "/", &[]).await;
            assert_eq!(
                response.header("ratelimit-policy"),
                Some("\"burst\";q=20;w=2"),
                "{algorithm}"
            );
            assert_eq!(response.header("x-ratelimit-limit"), Some("20"));
            let state = response.header("ratelimit").expect("RateLimit");
            let remaining: u64 = state
                .split(';')
                .find_map(|part| part.strip_prefix("r="))
                .and_then(|r| r.parse().ok())
                .expect("r");
            assert!(remaining <= 20, "{algorithm}: {state}");
            statuses.push(response.status);
            clock.advance_millis(10);
        }
        // 20 at once, then one more for each 100 ms gone by (240 ms: 2).
        let admitted = statuses.iter().filter(|&&s| s == 200).count();
        assert_eq!(admitted, 22, "{algorithm}: {statuses:?}");
    }
}

/// A client with an override sees the numbers in force in its headers, read from its decisions
/// alone: the override's limit, window and burst (`q=7;w=…` of a token bucket's burst of 7 over
/// 70 a minute), on Redis and in memory; other clients see the policy's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_shows_its_own_window_and_burst_in_the_headers() {
    use std::time::Duration;

    use redlimit::Override;
    use tower_redlimit::HeaderKey;

    let server = RedisServer::start();
    for (backend, limiter) in crate::support::both_backends(&server) {
        let p = Policy::builder("p", Algorithm::TokenBucket)
            .limit(3)
            .window(Duration::from_secs(3_600))
            .overrides(true)
            .build()
            .expect("a policy");
        limiter
            .set_override(
                &p,
                "vip",
                Override::default()
                    .limit(70)
                    .window(Duration::from_secs(60))
                    .burst(7),
                Duration::from_secs(600),
            )
            .await
            .expect("set");
        let guard = GuardedLimiter::builder(limiter, p)
            .budget(crate::support::PATIENT)
            .build();
        let layer = RateLimitLayer::new(guard).key(HeaderKey::new("x-client").expect("valid"));
        let address = serve(app(layer)).await;
        let vip = http_get(address, "/", &[("x-client", "vip")]).await;
        // A burst of 7 refills in 7 × 60 s / 70 = 6 s.
        assert_eq!(
            vip.header("ratelimit-policy"),
            Some("\"p\";q=7;w=6"),
            "{backend}: {vip:?}"
        );
        let other = http_get(address, "/", &[("x-client", "other")]).await;
        assert_eq!(
            other.header("ratelimit-policy"),
            Some("\"p\";q=3;w=3600"),
            "{backend}: {other:?}"
        );
    }
}
