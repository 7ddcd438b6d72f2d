//! Corrupt state is an error, never "allowed".

use deadpool_redis::redis;
use redlimit::{Algorithm, ErrorKind, Policy};
use redlimit_tests::RedisServer;

use crate::support::{T0, alone, at_ms, policy};

/// A fixed window's limit from which its state is a hash (below it, one string).
const HASHED_WINDOW: u64 = 500_000;

/// A policy of each algorithm, and each fixed window again with the hash state of a large limit.
fn policies() -> Vec<Policy> {
    let hashed = [Algorithm::FixedWindow, Algorithm::FixedWindowAnchored]
        .map(|algorithm| policy(algorithm, HASHED_WINDOW, 60_000, None));
    Algorithm::ALL
        .into_iter()
        .map(|algorithm| policy(algorithm, 10, 60_000, None))
        .chain(hashed)
        .collect()
}

/// Ways to spoil `p`'s key: a non-integer value, a missing field, the wrong type.
fn spoilers(p: &Policy, key: &str) -> Vec<redis::Cmd> {
    let algorithm = p.algorithm();
    let window = matches!(
        algorithm,
        Algorithm::FixedWindow | Algorithm::FixedWindowAnchored
    );
    let hashed = window && p.limit() >= HASHED_WINDOW;
    let set = |value: &str| redis::cmd("SET").arg(key).arg(value).clone();
    let hset = |fields: &[&str]| redis::cmd("HSET").arg(key).arg(fields).clone();
    let t0 = T0.to_string();
    let mut cmds = match algorithm {
        _ if hashed => vec![
            hset(&["s", &t0, "n", "many"]),
            hset(&["s", "-1", "n", "1"]),
            hset(&["n", "1"]),
        ],
        // One string of the window start and count (`start * 10^6 + count`): any integer of at
        // most 19 digits is state (a small one a window long gone), anything else is not.
        Algorithm::FixedWindow | Algorithm::FixedWindowAnchored => {
            vec![set("many"), set("-1"), set(""), set("99999999999999999999")]
        }
        Algorithm::SlidingWindowLog => vec![
            // Far enough ahead that no clock in this test trims it away.
            redis::cmd("ZADD")
                .arg(key)
                .arg("4000000000000.5")
                .arg("m")
                .clone(),
        ],
        // The text 'w:p:c' and the hash of versions before, read alike.
        Algorithm::SlidingWindowCounter => vec![
            set("1:0"),
            set("x:0:1"),
            set("1:0:-1"),
            set(&format!("1:0:{}", "9".repeat(20))),
            hset(&["w", "x", "p", "0", "c", "1"]),
            hset(&["w", "1", "p", "0"]),
        ],
        // Two big-endian 8-byte integers, or the text 'used:last' of versions before.
        Algorithm::TokenBucket => vec![
            set(&format!("1e3:{T0}")),
            set("5:12.5"),
            set("5"),
            set(&format!("99999999999999999999:{T0}")),
            // Packed, its tokens taken past 2^53.
            redis::cmd("SET")
                .arg(key)
                .arg(&[&[0, 0x40][..], &[0; 6], &T0.to_be_bytes()].concat()[..])
                .clone(),
        ],
        // Two big-endian 8-byte integers, or the text 'tat:interval' (us) of versions before.
        Algorithm::Gcra => vec![
            set("soon"),
            set(""),
            set("4000000000000000"),
            set("4000000000000000:0"),
            set("4000000000000000:x"),
            set("99999999999999999999:100000"),
            // Packed, its interval 0.
            redis::cmd("SET")
                .arg(key)
                .arg(&[&T0.to_be_bytes()[..], &[0; 8]].concat()[..])
                .clone(),
        ],
        _ => unreachable!("every algorithm is listed"),
    };
    // The wrong type for each: a list is none of the types redlimit writes.
    cmds.push(redis::cmd("RPUSH").arg(key).arg(1).clone());
    cmds.push(match algorithm {
        Algorithm::Gcra | Algorithm::TokenBucket => hset(&["tat", "1"]),
        // A fixed window reads the other form too (a limit changed across 10^6): spoiled there.
        _ if window && !hashed => hset(&["s", &t0, "n", "many"]),
        _ if window => set("many"),
        Algorithm::SlidingWindowCounter => redis::cmd("SADD").arg(key).arg(1).clone(),
        _ => set("1"),
    });
    cmds
}

/// Replaces whatever `key` holds with what `spoil` writes.
fn spoil_with(connection: &mut redis::Connection, key: &str, spoil: &redis::Cmd) {
    let _: () = redis::cmd("DEL").arg(key).query(connection).expect("DEL");
    let _: redis::Value = spoil.query(connection).expect("spoiling");
}

#[tokio::test]
async fn corrupt_values_and_wrong_types_are_errors_of_their_own_kind() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let mut connection = server.connection();
    for p in policies() {
        let (algorithm, key) = (p.algorithm(), limiter.keys().key(&p, "victim"));
        for spoil in spoilers(&p, &key) {
            spoil_with(&mut connection, &key, &spoil);
            for cost in [0, 1] {
                let result = limiter
                    .check(&alone(&p), "victim")
                    .cost(cost)
                    .at(at_ms(T0 + 10))
                    .await
                    .map(|d| d[0].clone());
                let err = result.expect_err("corrupt state must not decide");
                assert_eq!(err.kind(), ErrorKind::CorruptState, "{algorithm}: {err}");
                assert!(err.is_corrupt_state());
                assert!(
                    err.to_string().contains(&key),
                    "the message names the key: {err}"
                );
            }
            // Server time takes the same path.
            let err = limiter
                .check(&alone(&p), "victim")
                .await
                .expect_err("corrupt");
            assert!(err.is_corrupt_state(), "{algorithm}: {err}");
        }
        // A corrupt key spoils only its own client.
        assert!(
            limiter.check(&alone(&p), "bystander").await.expect("check")[0]
                .clone()
                .allowed
        );
    }
}

#[tokio::test]
async fn opted_in_corrupt_state_is_deleted_counted_and_checked_again() {
    let server = RedisServer::start();
    let backend = redlimit::RedisBackend::builder(server.url())
        .repair_corrupt_state(true)
        .budget(std::time::Duration::from_secs(5))
        .build()
        .expect("valid");
    let limiter = redlimit::Limiter::new(backend.clone());
    let mut connection = server.connection();
    let mut spoiled = 0;
    for p in policies() {
        let (algorithm, key) = (p.algorithm(), limiter.keys().key(&p, "victim"));
        for spoil in spoilers(&p, &key) {
            spoil_with(&mut connection, &key, &spoil);
            spoiled += 1;
            let decision = limiter
                .check(&alone(&p), "victim")
                .at(at_ms(T0 + 10))
                .await
                .expect("repaired, then decided")[0]
                .clone();
            assert!(decision.allowed, "{algorithm}: fresh state admits");
            assert_eq!(
                decision.remaining,
                p.limit() - 1,
                "{algorithm}: one request on fresh state"
            );
        }
    }
    assert_eq!(backend.repairs(), spoiled, "one repair per spoiled key");
}

/// A check whose later policy's state is corrupt takes nothing from the policies before it:
/// each failed attempt, and a repaired one checked again, leaves their quota as it was. The
/// later policy has a key of its own, or is in a key group.
#[tokio::test]
async fn a_corrupt_later_policy_leaves_the_earlier_ones_untaken() {
    let server = RedisServer::start();
    let repairing = redlimit::Limiter::new(
        redlimit::RedisBackend::builder(server.url())
            .repair_corrupt_state(true)
            .budget(std::time::Duration::from_secs(5))
            .build()
            .expect("valid"),
    );
    let mut connection = server.connection();
    for (taker, last) in crate::support::before_a_later_policy() {
        let first = taker.algorithm();
        let last = &last;
        let set = crate::support::set_of(&[taker.clone(), last.clone()]);
        let limiter = server.limiter();
        let client = format!("victim-{first}-{}", last.name());
        let spoiled = limiter.keys().key(last, &client);
        let spoil = redis::cmd("SET").arg(&spoiled).arg("many").clone();
        spoil_with(&mut connection, &spoiled, &spoil);
        let case = format!("{first}, then {}", last.name());
        for _ in 0..3 {
            let err = limiter.check(&set, &client).at(at_ms(T0 + 10)).await;
            assert!(err.expect_err("corrupt").is_corrupt_state(), "{case}");
        }
        let left = |decisions: redlimit::Decisions| decisions[0].remaining;
        let before = limiter
            .check(&alone(&taker), &client)
            .cost(0)
            .at(at_ms(T0 + 10))
            .await;
        assert_eq!(left(before.expect("a check")), 10, "{case}: none taken");
        let repaired = repairing.check(&set, &client).at(at_ms(T0 + 10)).await;
        let repaired = left(repaired.expect("repaired, then decided"));
        assert_eq!(repaired, 9, "{case}: taken once");
    }
}
