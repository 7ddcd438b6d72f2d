//! Bans: more than `after` denials within `within` deny a client for a while, on every
//! instance, doubling on repeats up to a maximum; on Redis and in memory alike.

use crate::support::alone;
use std::{sync::Arc, time::Duration};

use redlimit::{
    Algorithm, Ban, ConfigError, GuardedLimiter, Limiter, Policy, RetryAfter, Timestamp,
};
use redlimit_tests::{RedisServer, command_calls, commands_sent, http_get, serve};

use crate::{
    observability::{decided, recorded, values},
    support::{T0, at_ms, both_backends, keyed_app},
};

const MINUTE: Duration = Duration::from_secs(60);

fn banning(max: Option<Duration>) -> Policy {
    let ban = Ban::new(3, MINUTE, 10 * MINUTE);
    let ban = match max {
        Some(max) => ban.max(max),
        None => ban,
    };
    Policy::builder("login", Algorithm::FixedWindow)
        .limit(2)
        .window(MINUTE)
        .ban(ban)
        .build()
        .expect("a policy")
}

/// The retry of one check at `at` (ms): `None` when allowed.
async fn retry_at(limiter: &Limiter, p: &Policy, at: u64) -> Option<u64> {
    let d = limiter
        .check(&alone(p), "c")
        .at(at_ms(at))
        .await
        .expect("check")[0]
        .clone();
    match d.retry_after {
        None => None,
        Some(RetryAfter::After(wait)) => Some(u64::try_from(wait.as_millis()).expect("small")),
        Some(other) => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fourth_denial_bans_for_ten_minutes_and_a_repeat_doubles_it() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let p = banning(Some(24 * 60 * MINUTE));
        let mut seen = Vec::new();
        for i in 0..6 {
            seen.push(retry_at(&limiter, &p, T0 + i * 1_000).await);
        }
        assert_eq!(
            seen,
            [
                None,
                None,
                Some(58_000),
                Some(57_000),
                Some(56_000),
                Some(600_000)
            ],
            "{backend}: two admitted, three denials let go, the fourth bans"
        );
        let banned_at = T0 + 5_000;
        // A new window would admit; the ban does not, and is not counted in it.
        assert_eq!(
            retry_at(&limiter, &p, T0 + 61_000).await,
            Some(banned_at + 600_000 - (T0 + 61_000)),
            "{backend}"
        );
        let during = limiter.check(&alone(&p), "c").at(at_ms(T0 + 62_000)).await;
        let during = &during.expect("check")[0];
        assert!(during.banned && !during.allowed, "{backend}: {during:?}");
        let free = banned_at + 600_000;
        assert_eq!(retry_at(&limiter, &p, free).await, None, "{backend}: over");
        // A repeat: the next four denials ban for twice as long.
        let mut second = None;
        for i in 1..=5 {
            second = retry_at(&limiter, &p, free + i).await;
        }
        assert_eq!(second, Some(1_200_000), "{backend}: doubled");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_max_every_ban_lasts_the_same_and_other_clients_are_not_banned() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let p = banning(None);
        let mut last = None;
        for i in 0..6 {
            last = retry_at(&limiter, &p, T0 + i).await;
        }
        assert_eq!(last, Some(600_000), "{backend}");
        let free = T0 + 5 + 600_000;
        for i in 0..6 {
            last = retry_at(&limiter, &p, free + i).await;
        }
        assert_eq!(last, Some(600_000), "{backend}: not doubled");
        let other = limiter.check(&alone(&p), "other").at(at_ms(T0 + 10)).await;
        assert!(other.expect("check").allowed(), "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_honours_a_ban_with_retry_after_of_the_ban() {
    let server = RedisServer::start();
    let p = banning(None);
    let clock = || Arc::new(|| Timestamp::from_millis(T0)) as redlimit::Clock;
    let guard = |limiter: Limiter| {
        GuardedLimiter::builder(limiter, p.clone())
            .budget(Duration::from_secs(5))
            .clock(clock())
            .build()
    };
    // Two instances, each on its own connections, served over HTTP; the second's metrics are
    // recorded.
    let one = serve(keyed_app(guard(server.limiter()))).await;
    let (second, snapshotter) = recorded(|| guard(server.limiter()));
    let two = serve(keyed_app(second)).await;
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(http_get(one, "/", &[("x-key", "k1")]).await.status);
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429]);
    let banned = http_get(two, "/", &[("x-key", "k1")]).await;
    assert_eq!(banned.status, 429, "the other instance honours it");
    let retry: u64 = banned
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After");
    assert!(retry >= 599, "Retry-After {retry}");
    // The block cache keeps the ban: no Redis command for the next requests there.
    let before = command_calls(&mut server.connection());
    for _ in 0..5 {
        assert_eq!(http_get(two, "/", &[("x-key", "k1")]).await.status, 429);
    }
    let sent = commands_sent(&before, &command_calls(&mut server.connection()));
    assert_eq!(sent.commands, 0, "answered by the local block cache");
    assert_eq!(http_get(two, "/", &[("x-key", "k2")]).await.status, 200);
    let all = values(&snapshotter);
    let decisions = |outcome, reason| decided(&all, "login", outcome, reason);
    assert_eq!(decisions("banned", "redis"), 1.0, "the ban, from Redis");
    assert_eq!(
        decisions("banned", "local_block"),
        5.0,
        "then from the block cache"
    );
    assert_eq!(decisions("limited", "redis"), 0.0);
    assert_eq!(decisions("allowed", "redis"), 1.0, "k2");
}

/// A denial counts towards a ban once a request: a check that a later policy's corrupt state
/// stops strikes nothing, so that its retries, and the retry once the state is repaired, do
/// not ban a client that was denied once. Before, each failed check struck: four of them banned
/// the client before its first denial was answered.
#[tokio::test]
async fn a_check_stopped_by_corrupt_state_strikes_nothing() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let p = banning(None);
    let last = crate::support::per_minute("last", 10);
    let set = crate::support::set_of(&[p.clone(), last.clone()]);
    let last_key = limiter.keys().key(&last, "c");
    strikes_nothing_when_stopped_at(&server, &limiter, &p, &set, &last_key).await;
}

/// The same where the check is stopped at its concurrency limit's lease set, which is decided
/// after the policies: before, its strikes stood.
#[tokio::test]
async fn a_check_stopped_by_its_corrupt_lease_set_strikes_nothing() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let p = banning(None);
    let in_flight = redlimit::ConcurrencyPolicy::builder("in-flight")
        .limit(5)
        .build()
        .expect("a valid concurrency policy");
    let set = alone(&p).with_concurrency(in_flight).expect("a valid set");
    // The lease set's key, made by a check a window before that takes a lease and gives it
    // back.
    let before = limiter.check(&set, "c").at(at_ms(T0 - 60_000)).await;
    drop(before.expect("a lease"));
    let keys: Vec<String> = deadpool_redis::redis::cmd("KEYS")
        .arg("*in-flight*")
        .query(&mut server.connection())
        .expect("KEYS");
    let [lease_key] = keys.as_slice() else {
        panic!("one lease set: {keys:?}");
    };
    strikes_nothing_when_stopped_at(&server, &limiter, &p, &set, lease_key).await;
}

/// The same where two policies that ban deny it and the second's count of denials holds a
/// value of another kind: before, the first's strike stood.
#[tokio::test]
async fn a_check_stopped_by_a_later_corrupt_count_of_denials_strikes_nothing() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let p = banning(None);
    let q = Policy::builder("signup", Algorithm::FixedWindow)
        .limit(2)
        .window(MINUTE)
        .ban(Ban::new(3, MINUTE, 10 * MINUTE))
        .build()
        .expect("a policy");
    let set = crate::support::set_of(&[p.clone(), q.clone()]);
    // The second denies too: its two admissions spent.
    assert_eq!(retry_at(&limiter, &q, T0).await, None);
    assert_eq!(retry_at(&limiter, &q, T0 + 1).await, None);
    // Its count of denials: its state key's `prefix:name:{client}:`, then `~strikes`.
    let state = limiter.keys().key(&q, "c");
    let tag_end = state.rfind("}:").expect("a hash tag") + 2;
    let strikes = format!("{}~strikes", &state[..tag_end]);
    strikes_nothing_when_stopped_at(&server, &limiter, &p, &set, &strikes).await;
}

/// Admits two checks of `p` (limit 2, banning after 3 denials), then checks `set` (holding `p`)
/// four times with `key` corrupt, each an error; once it is repaired, three denials ban no one
/// and the fourth bans.
async fn strikes_nothing_when_stopped_at(
    server: &RedisServer,
    limiter: &Limiter,
    p: &Policy,
    set: &redlimit::PolicySet,
    key: &str,
) {
    assert_eq!(retry_at(limiter, p, T0).await, None);
    assert_eq!(retry_at(limiter, p, T0 + 1).await, None);
    let mut connection = server.connection();
    let _: () = deadpool_redis::redis::pipe()
        .cmd("DEL")
        .arg(key)
        .cmd("SET")
        .arg(key)
        .arg("many")
        .query(&mut connection)
        .expect("SET");
    for i in 0..4 {
        let failed = limiter.check(set, "c").at(at_ms(T0 + 10 + i)).await;
        assert!(failed.expect_err("corrupt").is_corrupt_state());
    }
    let _: () = deadpool_redis::redis::cmd("DEL")
        .arg(key)
        .query(&mut connection)
        .expect("DEL");
    for i in 0..3 {
        let d = &limiter
            .check(set, "c")
            .at(at_ms(T0 + 20 + i))
            .await
            .expect("repaired")[0];
        assert!(
            !d.allowed && !d.banned,
            "denial {i} of three, not banned: {d:?}"
        );
    }
    let fourth = &limiter
        .check(&alone(p), "c")
        .at(at_ms(T0 + 30))
        .await
        .expect("check")[0];
    assert!(fourth.banned, "the fourth denial bans: {fourth:?}");
}

#[test]
fn bad_bans_are_refused_naming_the_field() {
    let build = |ban: Ban| {
        Policy::builder("p", Algorithm::Gcra)
            .limit(1)
            .window(MINUTE)
            .ban(ban)
            .build()
    };
    assert_eq!(
        build(Ban::new(3, Duration::ZERO, MINUTE)),
        Err(ConfigError::Zero {
            field: "ban.within"
        })
    );
    assert_eq!(
        build(Ban::new(3, MINUTE, Duration::from_micros(1_500))),
        Err(ConfigError::NotWholeMillis { field: "ban.for" })
    );
    assert!(matches!(
        build(Ban::new(3, MINUTE, 10 * MINUTE).max(MINUTE)),
        Err(ConfigError::Conflict {
            field: "ban.max",
            ..
        })
    ));
    let delayed = Policy::builder("p", Algorithm::Gcra)
        .limit(1)
        .window(MINUTE)
        .max_delay(Duration::from_secs(1))
        .ban(Ban::new(3, MINUTE, MINUTE))
        .build();
    assert!(matches!(
        delayed,
        Err(ConfigError::Conflict { field: "ban", .. })
    ));
}
