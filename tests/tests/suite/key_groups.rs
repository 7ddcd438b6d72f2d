//! Key groups: the policies of one group keep a client's states in one Redis key. What is
//! refused when a policy is built, what Redis holds, and decisions under load and on
//! corrupt state (the parity suite checks every decision against the memory backend).

use std::time::Duration;

use deadpool_redis::redis;
use redlimit::{Algorithm, Ban, ConfigError, Grants, Policy, PolicyBuilder, PolicySet};
use redlimit_tests::RedisServer;

use crate::support::{T0, at_ms, set_of};

/// A policy named `name` of `algorithm`, `limit` a minute, in group `api`.
fn grouped(name: &str, algorithm: Algorithm, limit: u64) -> Policy {
    builder(name, algorithm, limit)
        .build()
        .expect("a valid grouped policy")
}

fn builder(name: &str, algorithm: Algorithm, limit: u64) -> PolicyBuilder {
    Policy::builder(name, algorithm)
        .limit(limit)
        .window(Duration::from_secs(60))
        .key_group("api")
}

#[test]
fn a_key_group_is_refused_where_one_key_cannot_keep_the_state() {
    for algorithm in [Algorithm::SlidingWindowLog, Algorithm::SlidingWindowCounter] {
        let err = builder("p", algorithm, 10).build().expect_err("refused");
        assert_eq!(
            err,
            ConfigError::NotApplicable {
                field: "key_group",
                algorithm: algorithm.name(),
            }
        );
    }
    let conflicts = [
        (
            builder("p", Algorithm::FixedWindow, 10).overrides(true),
            "overrides",
        ),
        (
            builder("p", Algorithm::FixedWindow, 10).ban(Ban::new(
                3,
                Duration::from_secs(60),
                Duration::from_secs(600),
            )),
            "ban",
        ),
        (
            builder("p", Algorithm::Gcra, 10).max_delay(Duration::from_millis(200)),
            "max_delay",
        ),
        (
            builder("p", Algorithm::TokenBucket, 10).grants(Grants::up_to(5)),
            "grants",
        ),
    ];
    for (builder, with) in conflicts {
        let err = builder.build().expect_err("refused");
        assert_eq!(
            err,
            ConfigError::Conflict {
                field: "key_group",
                with,
            }
        );
        assert!(err.to_string().contains("key_group"), "{err}");
    }
    let err = builder("p", Algorithm::FixedWindow, 500_000)
        .build()
        .expect_err("refused");
    assert_eq!(
        err,
        ConfigError::TooLarge {
            field: "limit",
            max: 499_999,
        }
    );
    let err = Policy::builder("p", Algorithm::Gcra)
        .limit(10)
        .window(Duration::from_secs(1))
        .key_group("no spaces")
        .build()
        .expect_err("refused");
    assert!(err.to_string().contains("key_group"), "{err}");
}

#[tokio::test]
async fn a_client_of_a_group_has_one_key_that_expires() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let set = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 100),
        grouped("per-second", Algorithm::Gcra, 50),
        grouped("bucket", Algorithm::TokenBucket, 80),
    ]);
    let decisions = limiter.check(&set, "alice").await.expect("check");
    assert!(decisions.allowed());
    let mut connection = server.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*alice*")
        .query(&mut connection)
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "one key for the client's group: {keys:?}");
    assert_eq!(keys[0], limiter.keys().key(&set[0], "alice"));
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query(&mut connection)
        .expect("PTTL");
    // Its fixed window's minute at most, doubled (a group's key lives at most twice as long as
    // its state matters).
    assert!(
        ttl_ms > 0 && ttl_ms <= 120_000,
        "the group's key expires: {ttl_ms}"
    );
}

/// A hot client checked by 4 limiters (separate pools, as separate app servers) of 64 tasks at
/// once: its checks batched into calls that read and write its key again and again, from four
/// connections, admit exactly the tighter limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hot_client_of_a_group_is_admitted_exactly_its_limit() {
    let server = RedisServer::start();
    let set = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 100),
        grouped("bucket", Algorithm::TokenBucket, 1_000),
    ]);
    let admitted = hot_admitted(&server, 4, 64, [&set, &set], T0 + 5).await;
    assert_eq!(admitted, 100, "768 checks of one client, limit 100");
    let after = server
        .limiter()
        .check(&set, "hot")
        .at(at_ms(T0 + 6))
        .await
        .expect("check");
    // Denied by the window; the bucket gave back nothing it did not take.
    assert_eq!((after.allowed(), after[1].remaining), (false, 900));
}

/// A group's policies beside a concurrency limit: leased and decided as a set of keys of their
/// own would be.
#[tokio::test]
async fn a_group_with_a_concurrency_limit_leases_its_slots() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let in_flight = redlimit::ConcurrencyPolicy::builder("in-flight")
        .limit(2)
        .build()
        .expect("a valid concurrency policy");
    let set = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 10),
        grouped("per-second", Algorithm::Gcra, 10),
    ])
    .with_concurrency(in_flight)
    .expect("a valid set");
    let first = limiter.check(&set, "dave").await.expect("check");
    let second = limiter.check(&set, "dave").await.expect("check");
    assert!(first.allowed() && second.allowed());
    let third = limiter.check(&set, "dave").await.expect("check");
    assert!(!third.allowed(), "two in flight");
    assert_eq!(
        third[0].remaining, 8,
        "a refused request spends no rate quota"
    );
    drop((first, second));
}

#[tokio::test]
async fn a_corrupt_group_key_is_an_error_for_its_client_only() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let set = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 10),
        grouped("per-second", Algorithm::Gcra, 10),
    ]);
    let key = limiter.keys().key(&set[0], "victim");
    let mut connection = server.connection();
    // Not a key group's length; then its length, of bytes that are no numbers (NaN).
    for value in [
        &b"garbage"[..],
        &[0; 8 + 32 + 1][..],
        &[0xff; 8 + 2 * 32][..],
    ] {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .query(&mut connection)
            .expect("SET");
        let err = limiter
            .check(&set, "victim")
            .await
            .expect_err("corrupt state must not decide");
        assert!(err.is_corrupt_state(), "{err}");
        assert!(
            err.to_string().contains(&key),
            "the message names the key: {err}"
        );
    }
    assert!(
        limiter
            .check(&set, "bystander")
            .await
            .expect("check")
            .allowed(),
        "another client decides"
    );
}

/// Inspecting a grouped policy reads its record and consumes nothing; a reset of it empties
/// the client's whole group.
#[tokio::test]
async fn inspect_reads_a_record_and_reset_empties_the_group() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let set = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 10),
        grouped("bucket", Algorithm::TokenBucket, 5),
    ]);
    for _ in 0..3 {
        assert!(limiter.check(&set, "carol").await.expect("check").allowed());
    }
    for p in set.iter() {
        for _ in 0..2 {
            let seen = limiter.inspect(p, "carol").await.expect("inspect");
            assert_eq!(seen.used(), 3, "{}: nothing consumed", p.name());
            assert!(seen.ttl.is_some_and(|ttl| !ttl.is_zero()), "{}", p.name());
        }
    }
    assert!(limiter.reset(&set[1], "carol").await.expect("reset"));
    for p in set.iter() {
        let seen = limiter.inspect(p, "carol").await.expect("inspect");
        assert_eq!(seen.used(), 0, "{}: the whole group is reset", p.name());
    }
}

/// On a Cluster a group key lives in its client's slot: clients spread over every primary are
/// each admitted exactly the tighter limit, and a check whose per-IP key and key group live in
/// two slots is all or nothing across them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_on_a_cluster_decide_in_each_clients_slot() {
    let cluster = redlimit_tests::RedisCluster::start();
    let backend = redlimit::RedisBackend::cluster(cluster.urls())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid urls");
    let limiter = redlimit::Limiter::new(backend);
    let set = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 10),
        grouped("bucket", Algorithm::TokenBucket, 100),
    ]);
    for client in 0..30 {
        let client = format!("client-{client}");
        let mut admitted = 0;
        for step in 0..12 {
            let decisions = limiter
                .check(&set, &client)
                .at(at_ms(T0 + step))
                .await
                .expect("check");
            admitted += usize::from(decisions.allowed());
        }
        assert_eq!(admitted, 10, "{client}");
    }
    // Per IP under a key of its own, a key's two policies in one group, in two slots.
    let per_ip = Policy::builder("per-ip", Algorithm::FixedWindow)
        .limit(100)
        .window(Duration::from_secs(60))
        .build()
        .expect("a valid policy");
    let mixed = set_of(&[
        per_ip,
        grouped("key-minute", Algorithm::FixedWindow, 3),
        grouped("key-bucket", Algorithm::Gcra, 100),
    ]);
    let keys = ["ip:10.0.0.1", "key:k1", "key:k1"];
    for step in 0..5 {
        let decisions = limiter
            .check(&mixed, "")
            .keys(&keys)
            .at(at_ms(T0 + step))
            .await
            .expect("check");
        assert_eq!(decisions.allowed(), step < 3, "step {step}");
    }
    let ip = limiter
        .check(&mixed, "")
        .keys(&["ip:10.0.0.1", "key:k2", "key:k2"])
        .at(at_ms(T0 + 9))
        .await
        .expect("check");
    assert_eq!(
        ip[0].remaining, 96,
        "the key's denials spent none of the IP's quota"
    );
}

/// A reservation of a group's policies is settled through their records: a refund gives back
/// what it took, a charge takes what the response said, on Redis as in memory.
#[tokio::test]
async fn reservations_of_a_group_settle_through_their_records() {
    let server = RedisServer::start();
    let set = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 10),
        grouped("bucket", Algorithm::TokenBucket, 10),
    ]);
    for (backend, limiter) in crate::support::both_backends(&server) {
        let reserve = |at| {
            let (limiter, set) = (limiter.clone(), set.clone());
            async move {
                limiter
                    .check(&set, "erin")
                    .cost(4)
                    .reserve()
                    .at(at_ms(at))
                    .await
                    .expect("reserve")
            }
        };
        let remaining = |d: &redlimit::Decisions| (d[0].remaining, d[1].remaining);
        let settle = |reserved, cost, at| {
            let limiter = limiter.clone();
            async move {
                let settled = limiter.settle(&reserved, cost).at(at_ms(at)).await;
                settled.expect("settle")
            }
        };
        let first = reserve(T0).await;
        assert_eq!(remaining(&first), (6, 6), "{backend}");
        assert!(settle(first, 0, T0 + 1).await, "{backend}: a refund");
        let second = reserve(T0 + 2).await;
        assert_eq!(
            remaining(&second),
            (6, 6),
            "{backend}: the refund gave back all 4"
        );
        assert!(settle(second, 7, T0 + 3).await, "{backend}: a charge");
        let after = limiter.check(&set, "erin").cost(0).at(at_ms(T0 + 4)).await;
        assert_eq!(
            remaining(&after.expect("check")),
            (3, 3),
            "{backend}: charged 7 in all"
        );
    }
}

/// What `limiters` limiters (separate pools, as separate app servers) of `tasks` tasks each, of
/// three checks of client "hot" at `at` apiece, admit in all: task t's check s is of
/// `sets[(t + s) % 2]`. Started at once, so that the checks batch into calls that read and
/// write the client's key again and again.
async fn hot_admitted(
    server: &RedisServer,
    limiters: usize,
    tasks: usize,
    sets: [&PolicySet; 2],
    at: u64,
) -> u64 {
    let mut running = Vec::new();
    for _ in 0..limiters {
        let limiter = server.limiter();
        for task in 0..tasks {
            let (limiter, sets) = (limiter.clone(), sets.map(PolicySet::clone));
            running.push(tokio::spawn(async move {
                let mut admitted = 0_u64;
                for step in 0..3 {
                    let decisions = limiter
                        .check(&sets[(task + step) % 2], "hot")
                        .at(at_ms(at))
                        .await;
                    admitted += u64::from(decisions.expect("check").allowed());
                }
                admitted
            }));
        }
    }
    let mut admitted = 0;
    for task in running {
        admitted += task.await.expect("task");
    }
    admitted
}

/// Checks of a set with a concurrency limit (decided through the records' virtual Redis) and
/// of the same policies without it (on the records' numbers), of one hot client in the same
/// calls, from 2 limiters: each way reads what the other wrote, so exactly the bucket's burst
/// is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn checks_through_both_ways_of_a_hot_client_share_its_records_within_a_call() {
    let server = RedisServer::start();
    let bucket = Policy::builder("bucket", Algorithm::TokenBucket)
        .limit(1)
        .window(Duration::from_secs(3_600))
        .burst(50)
        .key_group("api")
        .build()
        .expect("a valid policy");
    let plain = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 10_000),
        bucket,
    ]);
    let in_flight = redlimit::ConcurrencyPolicy::builder("in-flight")
        .limit(1_000)
        .build()
        .expect("a valid concurrency policy");
    let leased = plain
        .clone()
        .with_concurrency(in_flight)
        .expect("a valid set");
    let admitted = hot_admitted(&server, 2, 128, [&leased, &plain], T0).await;
    assert_eq!(admitted, 50, "768 checks of one client, a burst of 50");
}

/// A request id covers a group's check: its retries consume nothing more and get its answer.
#[tokio::test]
async fn retries_of_a_grouped_check_count_once() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let set = set_of(&[
        grouped("per-minute", Algorithm::FixedWindow, 10),
        grouped("per-second", Algorithm::Gcra, 10),
    ]);
    for _ in 0..3 {
        let decisions = limiter
            .check(&set, "frank")
            .once("order-7", Duration::from_secs(600))
            .at(at_ms(T0))
            .await
            .expect("check");
        assert_eq!((decisions[0].remaining, decisions[1].remaining), (9, 9));
    }
    let next = limiter.check(&set, "frank").at(at_ms(T0)).await;
    assert_eq!(
        next.expect("check")[0].remaining,
        8,
        "the retries took nothing"
    );
}
