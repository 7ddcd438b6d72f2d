//! State written by earlier versions: a sliding counter kept as a hash (`w`, `p`, `c`), or as the
//! text `w:p:c` that replaced it, is read as the packed string that replaced both (three
//! big-endian 8-byte integers), decides alike, and is rewritten packed by the next admission,
//! keeping its deadline; a token bucket kept as the text `used:last`, or GCRA as `tat:interval`,
//! likewise (two integers).

use deadpool_redis::redis;
use redlimit::Algorithm;
use redlimit_tests::RedisServer;

use crate::support::{T0, alone, at_ms, policy};

#[tokio::test]
async fn a_sliding_counter_kept_as_a_hash_or_text_is_read_alike_and_rewritten_packed() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let mut connection = server.connection();
    // 10 a minute; at T0 + 30 s into its window, 6 counted in the previous window and 2 in this
    // one: 6 * 30 / 60 + 2 = 5 weighed, 5 left.
    let p = policy(Algorithm::SlidingWindowCounter, 10, 60_000, None);
    let index = T0 / 60_000;
    let at = index * 60_000 + 30_000;
    let key = limiter.keys().key(&p, "old");
    let string = limiter.keys().key(&p, "new");
    let _: () = redis::cmd("HSET")
        .arg(&key)
        .arg(&["w", &index.to_string(), "p", "6", "c", "2"][..])
        .query(&mut connection)
        .expect("HSET");
    let _: () = redis::cmd("SET")
        .arg(&string)
        .arg(format!("{index}:6:2"))
        .query(&mut connection)
        .expect("SET");
    for k in [&key, &string] {
        let _: () = redis::cmd("PEXPIRE")
            .arg(k)
            .arg(90_000)
            .query(&mut connection)
            .expect("PEXPIRE");
    }
    for client in ["old", "new"] {
        let decided = limiter
            .check(&alone(&p), client)
            .at(at_ms(at))
            .await
            .expect("decided");
        assert!(decided[0].allowed, "{client}");
        assert_eq!(
            decided[0].remaining, 4,
            "{client}: 5 left before it, 4 after"
        );
    }
    for k in [&key, &string] {
        let kind: String = redis::cmd("TYPE")
            .arg(k)
            .query(&mut connection)
            .expect("TYPE");
        assert_eq!(kind, "string", "rewritten by the admission");
        assert_eq!(
            packed_numbers(&mut connection, k),
            [index, 6, 3],
            "rewritten packed"
        );
        let ttl: i64 = redis::cmd("PTTL")
            .arg(k)
            .query(&mut connection)
            .expect("PTTL");
        assert!(ttl > 80_000 && ttl <= 90_000, "its deadline kept: {ttl}");
    }
}

/// A key's value as big-endian 8-byte integers.
fn packed_numbers(connection: &mut redis::Connection, key: &str) -> Vec<u64> {
    let value: Vec<u8> = redis::cmd("GET").arg(key).query(connection).expect("GET");
    value
        .chunks(8)
        .map(|n| u64::from_be_bytes(n.try_into().expect("8 bytes")))
        .collect()
}

#[tokio::test]
async fn a_token_bucket_or_gcra_kept_as_text_is_read_alike_and_rewritten_packed() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let mut connection = server.connection();
    let at = T0 + 30_000;
    let at_us = at * 1000;
    // 10 a minute, 10 at once: 4 owed at `at`, so 6 left before a check and 5 after it. A
    // bucket keeps the tokens taken times the window, and the last refill (ms); GCRA its TAT
    // and the interval that reached it (us).
    let interval = 6_000_000;
    let forms = [
        (
            Algorithm::TokenBucket,
            format!("{}:{at}", 4 * 60_000),
            [5 * 60_000, at],
            [6 * 60_000, at],
        ),
        (
            Algorithm::Gcra,
            format!("{}:{interval}", at_us + 4 * interval),
            [at_us + 5 * interval, interval],
            [at_us + 6 * interval, interval],
        ),
    ];
    for (algorithm, text, first, second) in forms {
        let p = policy(algorithm, 10, 60_000, None);
        let key = limiter.keys().key(&p, "old");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(text)
            .arg("PX")
            .arg(90_000)
            .query(&mut connection)
            .expect("SET");
        for (remaining, packed) in [(5, first), (4, second)] {
            let decided = limiter
                .check(&alone(&p), "old")
                .at(at_ms(at))
                .await
                .expect("decided");
            assert!(decided[0].allowed, "{algorithm:?}");
            assert_eq!(decided[0].remaining, remaining, "{algorithm:?}");
            assert_eq!(
                packed_numbers(&mut connection, &key),
                packed,
                "{algorithm:?}: rewritten packed, then read so"
            );
        }
    }
}
