//! Inspect, reset and scan on every topology and on memory: reading writes nothing, resetting
//! gives a full quota, scanning finds every key.

use std::time::Duration;

use redlimit::{Algorithm, Limiter, MemoryBackend, RedisBackend, RetryAfter};
use redlimit_tests::{RedisCluster, RedisSentinel, RedisServer};

use crate::support::{alone, policy};

fn limiter(backend: RedisBackend) -> Limiter {
    Limiter::new(backend)
}

/// Every algorithm at limit 3: after 2 requests an inspection sees 1 left, twice (it consumed
/// nothing); after the 3rd a cost-1 request would be denied; a reset gives the quota back.
async fn inspect_and_reset(name: &str, limiter: &Limiter) {
    for algorithm in Algorithm::ALL {
        let p = policy(algorithm, 3, 60_000, None);
        let what = format!("{name} {algorithm}");
        let client = "client {1}";
        for _ in 0..2 {
            assert!(
                limiter.check(&alone(&p), client).await.expect("check")[0]
                    .clone()
                    .allowed
            );
        }
        for _ in 0..2 {
            let seen = limiter.inspect(&p, client).await.expect("inspect");
            assert!(seen.decision.allowed, "{what}");
            assert_eq!(seen.decision.remaining, 1, "{what}: nothing consumed");
            assert_eq!(seen.used(), 2, "{what}");
            let ttl = seen.ttl.expect("a TTL");
            // The sliding counter keeps the previous window's count: two windows.
            assert!(
                ttl > Duration::ZERO && ttl <= Duration::from_secs(120),
                "{what}"
            );
            // Named alike on every backend, whatever form Redis keeps it in.
            let mut fields: Vec<&str> = seen.state.iter().map(|(f, _)| f.as_str()).collect();
            fields.sort_unstable();
            let expected: &[&str] = match algorithm {
                Algorithm::FixedWindow | Algorithm::FixedWindowAnchored => &["n", "s"],
                Algorithm::SlidingWindowLog => &["entries"],
                Algorithm::SlidingWindowCounter => &["c", "p", "w"],
                Algorithm::TokenBucket => &["l", "u"],
                _ => &["interval", "tat"],
            };
            assert_eq!(fields, expected, "{what}");
            if matches!(expected, ["n", "s"]) {
                assert!(
                    seen.state.contains(&("n".to_owned(), "2".to_owned())),
                    "{what}: {:?}",
                    seen.state
                );
            }
            assert_eq!(seen.client(), "client%20%7B1%7D", "{what}: the escaped tag");
        }
        assert!(
            limiter.check(&alone(&p), client).await.expect("check")[0]
                .clone()
                .allowed
        );
        let full = limiter.inspect(&p, client).await.expect("inspect");
        assert!(!full.decision.allowed, "{what}: a 4th would be denied");
        assert!(
            matches!(full.decision.retry_after, Some(RetryAfter::After(_))),
            "{what}"
        );
        assert!(limiter.reset(&p, client).await.expect("reset"), "{what}");
        assert!(!limiter.reset(&p, client).await.expect("reset"), "{what}");
        let fresh = limiter.inspect(&p, client).await.expect("inspect");
        assert_eq!(fresh.decision.remaining, 3, "{what}");
        assert_eq!((fresh.ttl, fresh.state.len()), (None, 0), "{what}");
        let other = policy(algorithm, 4, 60_000, None);
        assert!(
            limiter.check(&alone(&other), client).await.expect("check")[0]
                .clone()
                .allowed
        );
        assert!(
            limiter.check(&alone(&p), client).await.expect("check")[0]
                .clone()
                .allowed,
            "{what}: counts again from zero"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_reset_on_redis_and_memory() {
    let server = RedisServer::start();
    inspect_and_reset("redis", &server.limiter()).await;
    inspect_and_reset("memory", &Limiter::new(MemoryBackend::default())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_reset_on_a_cluster_and_through_sentinel() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::cluster(cluster.urls())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    inspect_and_reset("cluster", &limiter(backend)).await;
    drop(cluster);
    let sentinel = RedisSentinel::start();
    let backend = RedisBackend::sentinel(sentinel.urls(), RedisSentinel::MASTER)
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    inspect_and_reset("sentinel", &limiter(backend)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_of_a_cluster_finds_every_key_on_every_primary() {
    let cluster = RedisCluster::start();
    let backend = RedisBackend::cluster(cluster.urls())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let limiter = limiter(backend);
    let p = policy(Algorithm::FixedWindowAnchored, 10, 3_600_000, None);
    // Another window: a limit alone does not name other keys.
    let unrelated = policy(Algorithm::FixedWindowAnchored, 10, 1_800_000, None);
    for client in 0..300_u64 {
        for _ in 0..=(client % 5) {
            limiter
                .check(&alone(&p), &format!("c{client}"))
                .await
                .expect("check");
        }
        limiter.check(&alone(&unrelated), "x").await.expect("check");
    }
    let scan = limiter.scan(&p, 100).await.expect("scan");
    assert!(scan.complete);
    assert_eq!(scan.keys.len(), 300);
    assert!(
        scan.calls >= 3,
        "one scan per primary at least: {}",
        scan.calls
    );
    let used: u64 = scan.keys.iter().map(redlimit::Inspection::used).sum();
    assert_eq!(used, (0..300).map(|c| c % 5 + 1).sum::<u64>());
    let memory = Limiter::new(MemoryBackend::default());
    let refused = memory
        .scan(&p, 1)
        .await
        .expect_err("memory has no key names");
    assert!(refused.to_string().contains("nothing to scan"), "{refused}");
}

/// A burst above the limit is the quota an inspection counts use against: 15 of a burst of 20
/// used, not "0 of 10" with 5 over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn use_is_counted_against_the_burst() {
    let server = RedisServer::start();
    let limiters = [
        ("redis", limiter(server.backend())),
        ("memory", Limiter::new(MemoryBackend::default())),
    ];
    for (name, limiter) in limiters {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
            // One request back every 6 s: none within the test.
            let p = policy(algorithm, 10, 60_000, Some(20));
            for _ in 0..15 {
                assert!(limiter.check(&alone(&p), "c").await.expect("check")[0].allowed);
            }
            let seen = limiter.inspect(&p, "c").await.expect("inspect");
            assert_eq!(seen.quota, 20, "{name} {algorithm}");
            assert!(
                (14..=15).contains(&seen.used()),
                "{name} {algorithm}: used {} of {}, remaining {}",
                seen.used(),
                seen.quota,
                seen.decision.remaining
            );
        }
    }
}
