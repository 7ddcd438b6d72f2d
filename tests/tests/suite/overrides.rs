//! Per-client overrides: other numbers for one client, set at run time, read by every instance
//! in the check's own script call; on Redis and in memory alike.

use std::time::Duration;

use redlimit::{Algorithm, ConfigError, ErrorKind, Limiter, Override, Policy};
use redlimit_tests::{RedisServer, command_calls, commands_sent};

use crate::support::{T0, alone, at_ms, both_backends, set_of};

const DAY: Duration = Duration::from_secs(86_400);

fn overridable(algorithm: Algorithm, limit: u64) -> Policy {
    Policy::builder(algorithm.name(), algorithm)
        .limit(limit)
        .window(Duration::from_secs(3_600))
        .overrides(true)
        .build()
        .expect("a policy")
}

/// How many of `n` checks at T0 + 1000 + i pass, and the limit they report.
async fn admitted(limiter: &Limiter, p: &Policy, client: &str, from: u64, n: u64) -> (u64, u64) {
    let mut passed = 0;
    let mut limit = 0;
    for i in 0..n {
        let d = limiter
            .check(&alone(p), client)
            .at(at_ms(T0 + from + i))
            .await
            .expect("check")[0]
            .clone();
        passed += u64::from(d.allowed);
        limit = d.limit;
    }
    (passed, limit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_changes_one_clients_numbers_until_cleared() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in Algorithm::ALL {
            let p = overridable(algorithm, 2);
            let name = format!("{backend} {}", algorithm.name());
            assert_eq!(admitted(&limiter, &p, "c", 0, 3).await, (2, 2), "{name}");
            limiter
                .set_override(&p, "c", Override::default().limit(5), DAY)
                .await
                .expect("set");
            assert_eq!(
                admitted(&limiter, &p, "c", 10, 6).await,
                (3, 5),
                "{name}: the override's numbers, counted in the same state (2 used)"
            );
            assert_eq!(
                admitted(&limiter, &p, "other", 20, 3).await,
                (2, 2),
                "{name}: other clients keep the policy"
            );
            assert!(
                limiter.clear_override(&p, "c").await.expect("clear"),
                "{name}"
            );
            assert!(
                !limiter.clear_override(&p, "c").await.expect("clear"),
                "{name}"
            );
            assert_eq!(
                admitted(&limiter, &p, "c", 30, 1).await,
                (0, 2),
                "{name}: back on the policy's numbers and state"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_instance_sees_an_override_at_once_in_one_command_per_check() {
    let server = RedisServer::start();
    // Two instances: separate backends, separate connections.
    let (one, two) = (server.limiter(), server.limiter());
    let p = [
        overridable(Algorithm::Gcra, 1),
        Policy::builder("daily", Algorithm::FixedWindow)
            .limit(1_000)
            .window(DAY)
            .build()
            .expect("a policy"),
    ];
    for limiter in [&one, &two] {
        let d = limiter
            .check(&set_of(&p), "k1")
            .at(at_ms(T0))
            .await
            .expect("check");
        assert_eq!(d[0].limit, 1);
    }
    one.set_override(&p[0], "k1", Override::default().limit(3).burst(3), DAY)
        .await
        .expect("set");
    let before = command_calls(&mut server.connection());
    let mut passed = 0;
    for (i, limiter) in [&two, &one, &two, &one].into_iter().enumerate() {
        let d = limiter
            .check(&set_of(&p), "k1")
            .at(at_ms(T0 + 1 + i as u64))
            .await
            .expect("check");
        assert_eq!(d[0].limit, 3, "instance {i} reads the override");
        passed += u64::from(d.allowed());
    }
    let sent = commands_sent(&before, &command_calls(&mut server.connection()));
    assert_eq!(passed, 2, "the override's 3, 1 already used, then denied");
    assert_eq!(sent.commands, 4, "one command per check");
    two.clear_override(&p[0], "k1").await.expect("clear");
    let d = one
        .check(&set_of(&p), "k1")
        .at(at_ms(T0 + 10))
        .await
        .expect("check");
    assert_eq!(
        (d[0].limit, d.allowed()),
        (1, false),
        "cleared for every instance"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_work_with_request_ids_and_refunds() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let p = [overridable(Algorithm::SlidingWindowLog, 1)];
        limiter
            .set_override(&p[0], "c", Override::default().limit(4), DAY)
            .await
            .expect("set");
        for _ in 0..3 {
            let d = limiter
                .check(&set_of(&p), "c")
                .once("req-1", DAY)
                .await
                .expect("check");
            assert_eq!((d[0].limit, d[0].remaining), (4, 3), "{backend}");
        }
        let reserved = limiter
            .check(&set_of(&p), "c")
            .reserve()
            .await
            .expect("reserve");
        assert_eq!(reserved[0].remaining, 2, "{backend}");
        assert!(
            limiter.settle(&reserved, 0).await.expect("settle"),
            "{backend}: the refund finds the override's key"
        );
        let peek = limiter
            .check(&alone(&p[0]), "c")
            .cost(0)
            .await
            .expect("peek")[0]
            .clone();
        assert_eq!(peek.remaining, 3, "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_overrides_are_refused_naming_the_field() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        let plain = Policy::builder("plain", Algorithm::Gcra)
            .limit(1)
            .window(Duration::from_secs(1))
            .build()
            .expect("a policy");
        let error = limiter
            .set_override(&plain, "c", Override::default().limit(5), DAY)
            .await
            .expect_err("not overridable");
        assert_eq!(error.kind(), ErrorKind::InvalidInput, "{backend}");
        assert!(
            error.to_string().contains("overrides"),
            "{backend}: {error}"
        );
        let window = overridable(Algorithm::FixedWindow, 1);
        for (numbers, field) in [
            (Override::default().burst(5), "burst"),
            (Override::default().limit(0), "limit"),
            (Override::default().window(Duration::ZERO), "window"),
        ] {
            let error = limiter
                .set_override(&window, "c", numbers, DAY)
                .await
                .expect_err("refused");
            assert!(error.to_string().contains(field), "{backend}: {error}");
        }
    }
    let delayed = Policy::builder("delayed", Algorithm::Gcra)
        .limit(1)
        .window(Duration::from_secs(1))
        .max_delay(Duration::from_secs(1))
        .overrides(true)
        .build();
    assert!(matches!(
        delayed,
        Err(ConfigError::Conflict {
            field: "overrides",
            ..
        })
    ));
}

/// An operator inspecting or resetting an overridden client sees the override's key and numbers;
/// the override itself stays until cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_reset_see_the_override_in_force() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        // Anchored: its window starts at the first request, so no boundary falls mid-test.
        let p = overridable(Algorithm::FixedWindowAnchored, 2);
        limiter
            .set_override(&p, "c", Override::default().limit(5), DAY)
            .await
            .expect("set");
        for _ in 0..2 {
            assert!(
                limiter.check(&alone(&p), "c").await.expect("check")[0]
                    .clone()
                    .allowed
            );
        }
        let seen = limiter.inspect(&p, "c").await.expect("inspect");
        assert_eq!(
            (seen.decision.limit, seen.decision.remaining, seen.used()),
            (5, 3, 2),
            "{backend}: the override's numbers and state"
        );
        assert!(
            seen.state.contains(&("n".to_owned(), "2".to_owned())),
            "{backend}: {seen:?}"
        );
        let other = limiter.inspect(&p, "other").await.expect("inspect");
        assert_eq!(other.decision.limit, 2, "{backend}: others keep the policy");

        assert!(limiter.reset(&p, "c").await.expect("reset"), "{backend}");
        let fresh = limiter.inspect(&p, "c").await.expect("inspect");
        assert_eq!(
            (
                fresh.decision.limit,
                fresh.decision.remaining,
                fresh.key.as_str()
            ),
            (5, 5, seen.key.as_str()),
            "{backend}: reset, the override still in force"
        );
        assert!(limiter.clear_override(&p, "c").await.expect("clear"));
        let own = limiter.inspect(&p, "c").await.expect("inspect");
        assert_eq!(own.decision.limit, 2, "{backend}");
        assert_eq!(
            own.key, seen.key,
            "{backend}: one state under either numbers"
        );
    }
}

/// A decision carries the numbers in force: the policy's (not overridden), or the client's
/// override's limit, window and burst (overridden), on Redis and in memory alike; a once-reply
/// replays them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_carry_the_numbers_in_force() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in Algorithm::ALL {
            let p = overridable(algorithm, 2);
            let name = format!("{backend} {}", algorithm.name());
            let set = alone(&p);
            let check = |client: &'static str, id: &'static str| {
                limiter
                    .check(&set, client)
                    .once(id, Duration::from_secs(60))
                    .at(at_ms(T0 + 1_000))
            };
            let plain = check("c", "r1").await.expect("check")[0].clone();
            assert_eq!(
                (plain.limit, plain.window, plain.burst, plain.overridden),
                (2, Duration::from_secs(3_600), p.burst(), false),
                "{name}"
            );
            let numbers = if matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra) {
                Override::default()
                    .limit(50)
                    .window(Duration::from_secs(60))
                    .burst(7)
            } else {
                Override::default()
                    .limit(50)
                    .window(Duration::from_secs(60))
            };
            limiter
                .set_override(&p, "c", numbers, DAY)
                .await
                .expect("set");
            for _ in 0..2 {
                let d = check("c", "r2").await.expect("check")[0].clone();
                let burst = if matches!(algorithm, Algorithm::TokenBucket | Algorithm::Gcra) {
                    7
                } else {
                    50
                };
                assert_eq!(
                    (d.limit, d.window, d.burst, d.overridden),
                    (50, Duration::from_secs(60), burst, true),
                    "{name}: the override's numbers, replayed alike"
                );
            }
        }
    }
}

/// A request id's reply remembered before replies carried the window and burst in force (the
/// limit alone) still replays: with the limit it remembered and the policy's window and burst.
#[tokio::test]
async fn a_reply_remembered_with_the_limit_alone_still_replays() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let p = overridable(Algorithm::FixedWindow, 2);
    limiter
        .set_override(&p, "c", Override::default().limit(50), DAY)
        .await
        .expect("set");
    let set = alone(&p);
    let check = || {
        limiter
            .check(&set, "c")
            .once("r9", Duration::from_secs(60))
            .at(at_ms(T0 + 1_000))
    };
    let first = check().await.expect("check")[0].clone();
    assert_eq!((first.limit, first.remaining), (50, 49));
    // The remembered reply, rewritten as a reply without the window and burst was.
    let mut redis = server.connection();
    let keys: Vec<String> = deadpool_redis::redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis)
        .expect("KEYS");
    let mut rewritten = 0;
    for key in keys {
        let Ok(value) = deadpool_redis::redis::cmd("GET")
            .arg(&key)
            .query::<String>(&mut redis)
        else {
            continue;
        };
        let numbers: Vec<&str> = value.split(',').collect();
        if numbers.len() == 7 && numbers[4..] == ["50", "3600000", "50"] {
            let old = numbers[..5].join(",");
            let _: () = deadpool_redis::redis::cmd("SET")
                .arg(&key)
                .arg(old)
                .query(&mut redis)
                .expect("SET");
            rewritten += 1;
        }
    }
    assert_eq!(rewritten, 1, "the request id's reply");
    let replayed = check().await.expect("replayed")[0].clone();
    assert_eq!(
        (
            replayed.limit,
            replayed.remaining,
            replayed.window,
            replayed.burst
        ),
        (50, 49, Duration::from_secs(3_600), 2)
    );
    assert!(replayed.overridden);
}
