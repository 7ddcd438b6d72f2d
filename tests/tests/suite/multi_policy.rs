//! Several policies checked together: one round trip, all-or-nothing.

use redlimit::{Algorithm, ConfigError, Limiter, PolicySet, Reason};
use redlimit_tests::RedisServer;

use crate::support::{T0, alone, at_ms, both_backends, policy, set_of};

#[tokio::test]
async fn first_exhausted_policy_denies_and_nothing_is_consumed() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        all_or_nothing(&limiter, backend).await;
    }
}

/// 2 per second and 5 per minute on one client: whichever is exhausted denies, and a denied
/// check consumes from neither.
pub(crate) async fn all_or_nothing(limiter: &Limiter, backend: &str) {
    let per_second = policy(Algorithm::FixedWindow, 2, 1_000, None);
    let per_minute = policy(Algorithm::SlidingWindowLog, 5, 60_000, None);
    let both = [per_second, per_minute];
    let check = |t: u64, cost: u64| {
        let limiter = limiter.clone();
        let both = both.clone();
        async move {
            limiter
                .check(&set_of(&both), "client")
                .cost(cost)
                .at(at_ms(T0 + t))
                .await
                .expect("check")
        }
    };
    let d = check(0, 2).await;
    assert!(d.iter().all(|d| d.allowed), "{backend}: {d:?}");
    assert_eq!((d[0].remaining, d[1].remaining), (0, 3), "{backend}");

    // The per-second policy denies; the per-minute one would admit but must not consume.
    let d = check(500, 1).await;
    assert!(!d[0].allowed && d[1].allowed, "{backend}: {d:?}");
    assert_eq!((d[0].remaining, d[1].remaining), (0, 3), "{backend}");
    let d = check(600, 1).await;
    assert_eq!(
        d[1].remaining, 3,
        "{backend}: denied checks consumed nothing"
    );

    // A new second: both admit, and both consume.
    let d = check(1_000, 2).await;
    assert!(d.iter().all(|d| d.allowed), "{backend}: {d:?}");
    assert_eq!((d[0].remaining, d[1].remaining), (0, 1), "{backend}");

    // Now the per-minute policy is the one that denies; the per-second one keeps its quota.
    let d = check(2_000, 2).await;
    assert!(d[0].allowed && !d[1].allowed, "{backend}: {d:?}");
    let d = check(2_000, 0).await;
    assert_eq!((d[0].remaining, d[1].remaining), (2, 1), "{backend}");
    assert!(
        d.iter()
            .all(|d| d.reason == Reason::Redis || d.reason == Reason::Memory)
    );
}

#[test]
fn bad_policy_sets_are_refused_when_built() {
    let p = policy(Algorithm::Gcra, 1, 1_000, None);
    let none = PolicySet::new([]).expect_err("no policy");
    assert_eq!(none, ConfigError::Missing { field: "policies" });
    let twice = PolicySet::new([p.clone(), p]).expect_err("same policy twice");
    assert_eq!(twice.to_string(), "policies has \"gcra\" twice");
}

#[tokio::test]
async fn server_time_is_used_by_default() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let p = policy(Algorithm::FixedWindowAnchored, 2, 60_000, None);
    let first = limiter.check(&alone(&p), "c").await.expect("check")[0].clone();
    assert_eq!(first.reason, Reason::Redis);
    assert!(first.allowed);
    assert_eq!(first.remaining, 1);
    // The window was stamped with Redis TIME: it started within the last minute of server time.
    let mut connection = server.connection();
    let (seconds, _micros): (u64, u64) = deadpool_redis::redis::cmd("TIME")
        .query(&mut connection)
        .expect("TIME");
    let key = limiter.keys().key(&p, "c");
    // At server time the state is the short form: the window start's remainder by 8 * 10^9 ms,
    // then the count in six digits, below 2^53 so that INCRBY's reply is exact.
    let state: u64 = deadpool_redis::redis::cmd("GET")
        .arg(&key)
        .query(&mut connection)
        .expect("GET");
    assert!(state < 1 << 53, "short form: {state}");
    assert_eq!(state % 1_000_000, 1, "one request counted");
    let seen = limiter.inspect(&p, "c").await.expect("inspect");
    let start: u64 = seen
        .state
        .iter()
        .find(|(field, _)| field == "s")
        .map(|(_, s)| s.parse().expect("a start"))
        .expect("s");
    assert_eq!(start % 8_000_000_000, state / 1_000_000, "read back whole");
    assert!(start <= seconds * 1000 + 1000 && start + 60_000 > seconds * 1000);
}
