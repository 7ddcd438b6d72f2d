//! State written by earlier versions: a sliding counter kept as a hash (`w`, `p`, `c`), or as the
//! text `w:p:c` that replaced it, is read as the packed string that replaced both (three
//! big-endian 8-byte integers), decides alike, and is rewritten packed by the next admission,
//! keeping its deadline; a token bucket kept as the text `used:last`, or GCRA as `tat:interval`,
//! likewise (two integers); a sliding log's entries named `time:number` beside the entries named
//! by their time's 6 bytes that replaced them.

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

#[tokio::test]
async fn a_sliding_log_of_entries_named_as_text_is_read_alike_beside_the_new_ones() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let mut connection = server.connection();
    let p = policy(Algorithm::SlidingWindowLog, 10, 60_000, None);
    let key = limiter.keys().key(&p, "old");
    let at = T0 + 30_000;
    // Three admissions of a version before, 30, 20 and 10 s ago.
    for (n, ago) in [30_000, 20_000, 10_000].into_iter().enumerate() {
        let time = at - ago;
        let _: () = redis::cmd("ZADD")
            .arg(&key)
            .arg(time)
            .arg(format!("{time}:{n}"))
            .query(&mut connection)
            .expect("ZADD");
    }
    let _: () = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(90_000)
        .query(&mut connection)
        .expect("PEXPIRE");
    let check = |ms: u64, cost: u64| {
        let (limiter, set) = (limiter.clone(), alone(&p));
        async move {
            limiter
                .check(&set, "old")
                .cost(cost)
                .at(at_ms(ms))
                .await
                .expect("decided")[0]
                .clone()
        }
    };
    // The newest is a text entry 10 s old: the whole window is back 50 s from now.
    let peek = check(at, 0).await;
    assert_eq!((peek.remaining, peek.reset_after.as_millis()), (7, 50_000));
    // Two admissions, written as the new entries, counted with the old.
    assert_eq!(check(at, 1).await.remaining, 6);
    assert_eq!(check(at + 1, 1).await.remaining, 5);
    // The newest is now a new entry, read back: taken at `at + 1`, back 60 s after it.
    let peek = check(at + 5_000, 0).await;
    assert_eq!((peek.remaining, peek.reset_after.as_millis()), (5, 55_001));
    let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .query(&mut connection)
        .expect("ZRANGE");
    let stamp = |ms: u64| ms.to_be_bytes()[2..].to_vec();
    assert_eq!(
        members[3..],
        [
            [stamp(at), b"3".to_vec()].concat(),
            [stamp(at + 1), b"4".to_vec()].concat()
        ],
        "each the time's 6 bytes and its number"
    );
}
