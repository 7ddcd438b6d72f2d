//! Under `maxmemory` with `noeviction`, no algorithm writes: a check that would write is an
//! error (the failure policy's to answer), and the state stays as it was.

use deadpool_redis::redis;
use redlimit::Algorithm;
use redlimit_tests::RedisServer;

use crate::support::{alone, at_ms, policy};

/// A key's whole state, to compare before and after.
fn dump(connection: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("DUMP").arg(key).query(connection).expect("DUMP")
}

#[tokio::test]
async fn out_of_memory_no_algorithm_writes_past_the_limit() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let limiter = server.limiter();
    let mut connection = server.connection();
    let policies: Vec<_> = Algorithm::ALL
        .into_iter()
        // An hour, so that no state expires during the test (a bucket's TTL is one refill).
        .map(|algorithm| policy(algorithm, 10, 3_600_000, None))
        .collect();
    // Every algorithm has state for "old" before memory runs out.
    for p in &policies {
        assert!(
            limiter.check(&alone(p), "old").await.expect("check")[0]
                .clone()
                .allowed
        );
    }
    // And a sliding log whose only entry has left the window: trimming it is a write that must
    // not open the door to the next ones.
    let log = &policies[2];
    assert_eq!(log.algorithm(), Algorithm::SlidingWindowLog);
    let two_hours_ago = redlimit::Timestamp::now().as_micros() / 1000 - 7_200_000;
    assert!(
        limiter
            .check(&alone(log), "stale")
            .at(at_ms(two_hours_ago))
            .await
            .expect("check")[0]
            .clone()
            .allowed
    );
    let stale_before = dump(&mut connection, &limiter.keys().key(log, "stale"));
    let before: Vec<_> = policies
        .iter()
        .map(|p| dump(&mut connection, &limiter.keys().key(p, "old")))
        .collect();
    let keys_before: u64 = redis::cmd("DBSIZE").query(&mut connection).expect("DBSIZE");
    // A large value, then a limit below what Redis now uses.
    let _: () = redis::cmd("SET")
        .arg("ballast")
        .arg(vec![b'x'; 8 << 20])
        .query(&mut connection)
        .expect("the ballast");
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg("4mb")
        .query(&mut connection)
        .expect("CONFIG SET maxmemory");
    for p in &policies {
        for client in ["old", "new", "stale"] {
            for _ in 0..5 {
                let err = limiter
                    .check(&alone(p), client)
                    .await
                    .expect_err("no admission without memory to record it");
                assert!(err.to_string().contains("OOM"), "{}: {err}", p.name());
            }
        }
    }
    let after: Vec<_> = policies
        .iter()
        .map(|p| dump(&mut connection, &limiter.keys().key(p, "old")))
        .collect();
    assert_eq!(before, after, "no state changed");
    assert_eq!(
        dump(&mut connection, &limiter.keys().key(log, "stale")),
        stale_before,
        "the expired entry is still there: nothing was written"
    );
    let keys_after: u64 = redis::cmd("DBSIZE").query(&mut connection).expect("DBSIZE");
    assert_eq!(
        keys_after,
        keys_before + 1,
        "no key but the ballast was added"
    );
}
