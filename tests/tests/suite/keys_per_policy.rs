//! A key per policy in one check: per IP and per API key, a tenant's budget and a key's, all or
//! nothing, on Redis (one script call) and in memory alike.

use std::time::Duration;

use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};
use redlimit::{
    Algorithm, ErrorKind, FailurePolicy, GuardedLimiter, KeyScheme, Limiter, MemoryBackend, Policy,
    PolicySet, RedisBackend, Timestamp,
};
use redlimit_tests::{RedisCluster, RedisServer, script_calls};

use crate::support::{T0, at_ms, both_backends, per_minute};

/// Per IP 5 a minute, per API key 3.
fn ip_and_key() -> PolicySet {
    PolicySet::new([per_minute("per-ip", 5), per_minute("per-key", 3)]).expect("a valid set")
}

/// The remaining of each policy for `keys`, and whether it was admitted.
async fn check(limiter: &Limiter, set: &PolicySet, keys: &[&str]) -> (bool, Vec<u64>) {
    let decisions = limiter
        .check(set, "")
        .keys(keys)
        .at(at_ms(T0))
        .await
        .expect("decided");
    (
        decisions.allowed(),
        decisions.iter().map(|d| d.remaining).collect(),
    )
}

#[tokio::test]
async fn a_denial_by_one_key_spends_nothing_of_the_others() {
    let server = RedisServer::start();
    let set = ip_and_key();
    for (name, limiter) in both_backends(&server) {
        let mut stats = server.connection();
        // The script loaded first (NOSCRIPT, then EVAL): what follows is at steady state.
        check(&limiter, &set, &["ip:warm", "key:warm"]).await;
        let before = script_calls(&mut stats).commands;
        for left in [2, 1, 0] {
            let (allowed, remaining) = check(&limiter, &set, &["ip:1", "key:k1"]).await;
            assert!(allowed, "{name}");
            assert_eq!(remaining, [left + 2, left], "{name}");
        }
        // The key's 4th: denied by the key, and the IP's quota is as it was.
        let (allowed, remaining) = check(&limiter, &set, &["ip:1", "key:k1"]).await;
        assert!(!allowed, "{name}");
        assert_eq!(remaining, [2, 0], "{name}: nothing taken");
        let (allowed, remaining) = check(&limiter, &set, &["ip:1", "key:k2"]).await;
        assert!(allowed, "{name}");
        assert_eq!(
            remaining,
            [1, 2],
            "{name}: the IP's count unchanged by the denial"
        );
        if name == "redis" {
            let calls = script_calls(&mut stats).commands - before;
            assert_eq!(calls, 5, "one script call per check");
        }
    }
}

#[tokio::test]
async fn one_request_id_covers_every_key_and_a_settle_every_key() {
    let server = RedisServer::start();
    let set = ip_and_key();
    for (name, limiter) in both_backends(&server) {
        for _ in 0..5 {
            let retried = limiter
                .check(&set, "")
                .keys(&["ip:9", "key:k9"])
                .once("request-1", Duration::from_secs(60))
                .at(at_ms(T0))
                .await
                .expect("decided");
            assert_eq!(
                retried.iter().map(|d| d.remaining).collect::<Vec<_>>(),
                [4, 2],
                "{name}: one of each consumed, however often it is sent"
            );
        }
        let reserved = limiter
            .check(&set, "")
            .keys(&["ip:9", "key:k9"])
            .cost(2)
            .reserve()
            .at(at_ms(T0))
            .await
            .expect("decided");
        assert_eq!(
            reserved.iter().map(|d| d.remaining).collect::<Vec<_>>(),
            [2, 0]
        );
        let settle = limiter.settle(&reserved, 0).at(at_ms(T0 + 1));
        assert!(settle.await.expect("settled"), "{name}");
        let (_, remaining) = check(&limiter, &set, &["ip:9", "key:k9"]).await;
        assert_eq!(remaining, [3, 1], "{name}: both given back, then one taken");
    }
}

#[tokio::test]
async fn keys_must_match_the_policies_and_may_live_in_several_cluster_slots() {
    let set = ip_and_key();
    let memory = Limiter::new(MemoryBackend::default());
    let error = memory
        .check(&set, "")
        .keys(&["ip:1"])
        .await
        .expect_err("one key for two policies");
    assert_eq!(error.kind(), ErrorKind::InvalidInput);
    assert!(error.to_string().contains("one key per policy"), "{error}");

    let cluster = RedisCluster::start();
    let limiter = Limiter::with_keys(
        RedisBackend::cluster(cluster.urls())
            .budget(Duration::from_secs(5))
            .build()
            .expect("valid urls"),
        KeyScheme::default().tenant_tags(),
    );
    // In two slots: a call per slot, all or nothing across them.
    assert_ne!(
        cluster.primary_of(&limiter.keys().key(&set[0], "ip:1")),
        cluster.primary_of(&limiter.keys().key(&set[1], "key:k1")),
    );
    let (allowed, remaining) = check(&limiter, &set, &["ip:1", "key:k1"]).await;
    assert!(allowed);
    assert_eq!(remaining, [4, 2]);
    // In one slot (one tenant tag): one call.
    let (allowed, remaining) = check(&limiter, &set, &["{acme}ip:1", "{acme}key:k1"]).await;
    assert!(allowed);
    assert_eq!(remaining, [4, 2]);
}

/// A tenant's budget shared by its keys and each key's own, decided together: random sequences
/// of (key, cost, time step) give the same decisions on Redis and in memory.
#[test]
fn a_tenant_budget_and_per_key_budgets_decide_the_same_on_redis_and_in_memory() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let tenant = |algorithm, limit| {
        Policy::builder("tenant", algorithm)
            .limit(limit)
            .window(Duration::from_millis(7_000))
            .build()
            .expect("valid")
    };
    let key = |algorithm, limit| {
        Policy::builder("key", algorithm)
            .limit(limit)
            .window(Duration::from_millis(1_500))
            .build()
            .expect("valid")
    };
    let algorithms = prop::sample::select(Algorithm::ALL.to_vec());
    let sets = (algorithms.clone(), 2_u64..20, algorithms, 1_u64..8).prop_map(
        move |(a, tenant_limit, b, key_limit)| {
            PolicySet::new([tenant(a, tenant_limit), key(b, key_limit)]).expect("a valid set")
        },
    );
    let steps = prop::collection::vec((0_u8..3, 0_u64..5, 0_u64..900_000), 1..50);
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0_u64);
    runner
        .run(&(sets, steps), |(set, steps)| {
            case.set(case.get() + 1);
            let redis = Limiter::with_prefix(server.backend(), format!("tk{}", case.get()))
                .expect("prefix");
            let memory = Limiter::new(MemoryBackend::default());
            let mut now = T0 * 1000;
            for (i, (key, cost, advance_us)) in steps.iter().enumerate() {
                now += advance_us;
                let key = format!("acme:key-{key}");
                let keys = ["acme", key.as_str()];
                let at = Timestamp::from_micros(now);
                let (on_redis, in_memory) = runtime.block_on(async {
                    let on_redis = redis.check(&set, "").keys(&keys).cost(*cost).at(at).await;
                    let in_memory = memory.check(&set, "").keys(&keys).cost(*cost).at(at).await;
                    (on_redis.expect("redis"), in_memory.expect("memory"))
                });
                prop_assert_eq!(on_redis.allowed(), in_memory.allowed(), "step {}", i);
                for (r, m) in on_redis.iter().zip(&in_memory) {
                    prop_assert_eq!(
                        (r.allowed, r.remaining, r.reset_after, r.retry_after),
                        (m.allowed, m.remaining, m.reset_after, m.retry_after),
                        "step {} of {:?}",
                        i,
                        set
                    );
                }
            }
            Ok(())
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
}

/// Through a guard: the same all-or-nothing, and its failure policy's local limiter checks each
/// key as its own.
#[tokio::test]
async fn a_guard_checks_keys_per_policy_and_its_local_fallback_too() {
    let server = RedisServer::start();
    let set = ip_and_key();
    let guard = GuardedLimiter::builder(server.limiter(), set.clone())
        .failure(FailurePolicy::local())
        .budget(Duration::from_secs(5))
        .build();
    for _ in 0..3 {
        assert!(guard.check("").keys(&["ip:3", "key:k3"]).await.allowed());
    }
    let denied = guard.check("").keys(&["ip:3", "key:k3"]).await;
    assert!(!denied.allowed());
    assert_eq!(denied[0].remaining, 2, "the IP's quota kept");
    let other = guard.check("").keys(&["ip:3", "key:k4"]).await;
    assert!(other.allowed());

    // Redis gone: the local limiter answers, per key as well.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let nowhere = Limiter::new(
        RedisBackend::builder(format!("redis://{closed}"))
            .build()
            .expect("valid"),
    );
    let local = GuardedLimiter::builder(nowhere, set)
        .failure(FailurePolicy::local())
        .build();
    for _ in 0..3 {
        assert!(local.check("").keys(&["ip:5", "key:k5"]).await.allowed());
    }
    let denied = local.check("").keys(&["ip:5", "key:k5"]).await;
    assert!(!denied.allowed(), "the local key limit");
    assert!(local.check("").keys(&["ip:5", "key:k6"]).await.allowed());
}

/// A `RateLimit` or `RateLimit-Policy` field read by an RFC 9651 parser: each list member's
/// string and its integer parameters, in order.
fn structured(field: &axum::http::HeaderValue) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(field.as_bytes())
        .parse()
        .unwrap_or_else(|error| panic!("{field:?} is not an RFC 9651 list: {error}"));
    list.into_iter()
        .map(|member| {
            let sfv::ListEntry::Item(item) = member else {
                panic!("an inner list in {field:?}")
            };
            let name = item.bare_item.as_string().expect("a string item").as_str();
            let params = item.params.iter().map(|(key, value)| {
                let value = value.as_integer().expect("an integer parameter");
                (key.as_str().to_owned(), i64::from(value))
            });
            (name.to_owned(), params.collect())
        })
        .collect()
}

/// One layer, per IP (5 a minute) and per API key (3 a minute), on one Redis: one script call
/// per request; a key's 4th request is denied and spends none of the IP's quota; both policies
/// in `RateLimit-Policy` and `RateLimit`; one `Idempotency-Key` sent 5 times consumes one of each.
#[tokio::test]
async fn one_layer_limits_per_ip_and_per_api_key_in_one_check() {
    use axum::{
        Router,
        body::Body,
        http::{HeaderName, Request},
        routing::get,
    };
    use tower::ServiceExt;
    use tower_redlimit::{HeaderKey, RateLimitLayer};

    let server = RedisServer::start();
    // Windows aligned to the clock: the waits are exact.
    let guard = GuardedLimiter::builder(server.limiter(), ip_and_key())
        .budget(Duration::from_secs(5))
        .clock(redlimit_tests::TestClock::at_millis(T0).clock())
        .build();
    let layer = RateLimitLayer::new(guard)
        .key(HeaderKey::new("x-ip").expect("valid"))
        .key_for("per-key", HeaderKey::new("x-api-key").expect("valid"))
        .expect("a policy of the set")
        .idempotency_key(HeaderName::from_static("idempotency-key"));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let send = async |key: &str, id: Option<&str>| {
        let mut request = Request::get("/")
            .header("x-ip", "10.0.0.1")
            .header("x-api-key", key);
        if let Some(id) = id {
            request = request.header("idempotency-key", id);
        }
        let request = request.body(Body::empty()).expect("a request");
        app.clone().oneshot(request).await.expect("infallible")
    };
    // The script loaded first: what follows is at steady state.
    assert_eq!(send("warm", None).await.status(), 200);
    let mut stats = server.connection();
    let before = script_calls(&mut stats).commands;
    for _ in 0..2 {
        assert_eq!(send("k1", None).await.status(), 200);
    }
    let third = send("k1", None).await;
    assert_eq!(third.status(), 200);
    assert_eq!(
        structured(&third.headers()["ratelimit-policy"]),
        [
            ("per-ip".into(), vec![("q".into(), 5), ("w".into(), 60)]),
            ("per-key".into(), vec![("q".into(), 3), ("w".into(), 60)]),
        ]
    );
    assert_eq!(
        structured(&third.headers()["ratelimit"]),
        [
            ("per-ip".into(), vec![("r".into(), 1), ("t".into(), 60)]),
            ("per-key".into(), vec![("r".into(), 0), ("t".into(), 60)]),
        ]
    );
    let fourth = send("k1", None).await;
    assert_eq!(fourth.status(), 429, "the key's 4th");
    assert!(
        fourth.headers()["ratelimit"]
            .to_str()
            .expect("text")
            .starts_with("\"per-ip\";r=1;"),
        "the denial spent none of the IP's quota"
    );
    assert_eq!(
        script_calls(&mut stats).commands - before,
        4,
        "one call per request"
    );
    for _ in 0..5 {
        let retried = send("k2", Some("order-7")).await;
        assert_eq!(retried.status(), 200);
        assert_eq!(
            retried.headers()["ratelimit"],
            "\"per-ip\";r=0;t=60, \"per-key\";r=2;t=60",
            "one of each, however often it is sent"
        );
    }
    let missing = app
        .clone()
        .oneshot(
            Request::get("/")
                .header("x-ip", "10.0.0.1")
                .body(Body::empty())
                .expect("a request"),
        )
        .await
        .expect("infallible");
    assert_eq!(missing.status(), 400, "no API key");
    let refused =
        RateLimitLayer::new(GuardedLimiter::builder(server.limiter(), ip_and_key()).build())
            .key_for("per-tenant", HeaderKey::new("x-tenant").expect("valid"));
    let error = refused.expect_err("no such policy");
    assert!(error.to_string().contains("per-tenant"), "{error}");
}

/// With Redis paused, one layer of two keys answers within one time budget, not one per key
/// (two stacked layers took two).
#[tokio::test]
async fn a_paused_redis_costs_a_layer_of_two_keys_one_budget() {
    use axum::{Router, body::Body, http::Request, routing::get};
    use tower::ServiceExt;
    use tower_redlimit::{HeaderKey, RateLimitLayer};

    // Long enough that a busy machine's scheduling stays well inside one more budget.
    const BUDGET: Duration = Duration::from_secs(3);
    let server = RedisServer::start();
    let guard = GuardedLimiter::builder(server.limiter(), ip_and_key())
        .budget(BUDGET)
        .build();
    let layer = RateLimitLayer::new(guard)
        .key(HeaderKey::new("x-ip").expect("valid"))
        .key_for("per-key", HeaderKey::new("x-api-key").expect("valid"))
        .expect("a policy of the set");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    let send = || {
        let request = Request::get("/")
            .header("x-ip", "10.0.0.1")
            .header("x-api-key", "k1")
            .body(Body::empty())
            .expect("a request");
        app.clone().oneshot(request)
    };
    // Connected and the script loaded: what follows waits only for the reply.
    assert_eq!(send().await.expect("infallible").status(), 200);
    let mut node = server.connection();
    redlimit_tests::pause_writes(&mut node, 10_000);
    let started = std::time::Instant::now();
    let answered = send().await.expect("infallible");
    let took = started.elapsed();
    redlimit_tests::unpause(&mut node);
    println!(
        "two keys, Redis paused: {} after {took:?} (budget {BUDGET:?})",
        answered.status()
    );
    assert!(took >= BUDGET, "answered after {took:?}, before the budget");
    assert!(
        took < 2 * BUDGET,
        "answered after {took:?}: one budget per key, not one per check"
    );
}
