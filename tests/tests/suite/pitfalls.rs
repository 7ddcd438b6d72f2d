//! The classic pitfalls of Redis rate limiters: TTL set once, no immortal key, window-boundary bursts.

use std::time::Duration;

use deadpool_redis::redis;
use redlimit::{Algorithm, Limiter, Timestamp};
use redlimit_tests::{RedisServer, keys_without_ttl};

use crate::support::{T0, alone, at_ms, policy, set_of};

fn pttl(connection: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(connection).expect("PTTL")
}

#[tokio::test]
async fn fixed_window_ttl_is_set_on_the_first_hit_and_never_extended() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let mut connection = server.connection();
    for algorithm in [Algorithm::FixedWindow, Algorithm::FixedWindowAnchored] {
        let p = policy(algorithm, 100, 60_000, None);
        let key = limiter.keys().key(&p, "client");
        assert_eq!(
            pttl(&mut connection, &key),
            -2,
            "no key before the first hit"
        );
        let mut last = i64::MAX;
        for hit in 0..5 {
            assert!(
                limiter.check(&alone(&p), "client").await.expect("check")[0]
                    .clone()
                    .allowed
            );
            let ttl = pttl(&mut connection, &key);
            assert!(ttl > 0 && ttl <= 60_000, "{algorithm} hit {hit}: {ttl}");
            // Each later hit leaves the TTL where time took it: it only falls.
            assert!(
                ttl < last,
                "{algorithm} hit {hit}: TTL went from {last} to {ttl}"
            );
            last = ttl;
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    }
}

#[tokio::test]
async fn no_key_is_ever_left_without_a_ttl() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let policies: Vec<_> = [
        (Algorithm::FixedWindow, None),
        (Algorithm::FixedWindowAnchored, None),
        (Algorithm::SlidingWindowLog, None),
        (Algorithm::SlidingWindowCounter, None),
        (Algorithm::TokenBucket, Some(4)),
        (Algorithm::Gcra, Some(4)),
    ]
    .into_iter()
    .map(|(algorithm, burst)| policy(algorithm, 5, 2_000, burst))
    .collect();
    // A small deterministic generator: mixed algorithms, single and combined policies, costs
    // from peeks to impossible, server time and explicit times moving forward.
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |bound: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % bound
    };
    let mut clock = T0;
    let mut checks = 0;
    while checks < 10_000 {
        let client = format!("client-{}", next(50));
        let cost = next(7);
        let first = usize::try_from(next(6)).expect("small");
        let count = 1 + usize::try_from(next(2)).expect("small");
        let chosen: Vec<_> = policies
            .iter()
            .cycle()
            .skip(first)
            .take(count)
            .cloned()
            .collect();
        clock += next(400);
        let result = if next(2) == 0 {
            limiter.check(&set_of(&chosen), &client).cost(cost).await
        } else {
            limiter
                .check(&set_of(&chosen), &client)
                .cost(cost)
                .at(at_ms(clock))
                .await
        };
        result.expect("check");
        checks += 1;
    }
    let (total, immortal) = keys_without_ttl(&mut server.connection());
    assert!(total > 100, "the checks wrote keys: {total}");
    assert!(immortal.is_empty(), "keys without a TTL: {immortal:?}");
}

async fn admitted(limiter: &Limiter, p: &redlimit::Policy, at: Timestamp, tries: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..tries {
        let decision = limiter
            .check(&alone(p), "c")
            .at(at)
            .await
            .map(|d| d[0].clone());
        admitted += u64::from(decision.expect("check").allowed);
    }
    admitted
}

#[tokio::test]
async fn aligned_window_admits_twice_the_limit_across_a_boundary_the_log_never_does() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let fixed = policy(Algorithm::FixedWindow, 5, 10_000, None);
    let log = policy(Algorithm::SlidingWindowLog, 5, 10_000, None);
    // 5 in the last millisecond of a window, 5 more in the first of the next.
    let end = at_ms(T0 + 9_999);
    let start = at_ms(T0 + 10_000);
    let fixed_total =
        admitted(&limiter, &fixed, end, 5).await + admitted(&limiter, &fixed, start, 5).await;
    let log_total =
        admitted(&limiter, &log, end, 5).await + admitted(&limiter, &log, start, 5).await;
    assert_eq!(
        fixed_total, 10,
        "the fixed window's boundary burst: 2 × limit within 2 ms"
    );
    assert_eq!(
        log_total, 5,
        "the sliding log holds the limit across the boundary"
    );
}

#[tokio::test]
async fn sliding_log_never_admits_more_than_the_limit_in_any_window() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let (limit, window) = (7_u64, 1_000_u64);
    let log = policy(Algorithm::SlidingWindowLog, limit, window, None);
    let mut admitted_at = Vec::new();
    let mut clock = T0;
    let mut seed: u64 = 88_172_645_463_325_252;
    for _ in 0..3_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        clock += seed % 120;
        let cost = 1 + (seed >> 20) % 3;
        let d = limiter
            .check(&alone(&log), "c")
            .cost(cost)
            .at(at_ms(clock))
            .await
            .expect("check")[0]
            .clone();
        if d.allowed {
            admitted_at.extend(std::iter::repeat_n(
                clock,
                usize::try_from(cost).expect("small"),
            ));
        }
    }
    assert!(
        admitted_at.len() > 1_000,
        "the test exercised the limit: {}",
        admitted_at.len()
    );
    // For every admitted time t, the span (t - window, t] holds at most `limit`.
    let mut oldest = 0;
    for (newest, &t) in admitted_at.iter().enumerate() {
        while admitted_at[oldest] + window <= t {
            oldest += 1;
        }
        let in_window = newest - oldest + 1;
        assert!(
            in_window <= 7,
            "{in_window} admitted in the window ending at {t}"
        );
    }
}
