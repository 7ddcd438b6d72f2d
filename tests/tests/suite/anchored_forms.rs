//! An anchored window's two string forms: at Redis TIME its head is the start's remainder by
//! 8 * 10^9 ms (short enough that one INCRBY counts an admission exactly), at a client's time
//! the start itself. Either is read under the other clock, a short start ahead of the clock
//! counts in its window, and a reservation made in the short form is given back to it.

use deadpool_redis::redis;
use redlimit::{Algorithm, Decision, Limiter, Policy};
use redlimit_tests::RedisServer;

use crate::support::{alone, at_ms, policy, retry_code};

/// The short form's span: a start's remainder by it is the short head (ms).
const SPAN: u64 = 8_000_000_000;
/// A string state is its head times this plus its count.
const PACK: u64 = 1_000_000;

/// Redis's clock now, in ms.
fn server_ms(connection: &mut redis::Connection) -> u64 {
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(connection).expect("TIME");
    seconds * 1000 + micros / 1000
}

fn state(connection: &mut redis::Connection, key: &str) -> u64 {
    redis::cmd("GET").arg(key).query(connection).expect("GET")
}

/// Writes a short window starting at `start` (ms) holding `n`, for two minutes.
fn put_short(connection: &mut redis::Connection, key: &str, start: u64, n: u64) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg((start % SPAN) * PACK + n)
        .arg("PX")
        .arg(120_000)
        .query(connection)
        .expect("SET");
}

async fn at_server_time(limiter: &Limiter, p: &Policy, client: &str) -> Decision {
    limiter.check(&alone(p), client).await.expect("a decision")[0].clone()
}

async fn at_time(limiter: &Limiter, p: &Policy, client: &str, ms: u64) -> Decision {
    limiter
        .check(&alone(p), client)
        .at(at_ms(ms))
        .await
        .expect("a decision")[0]
        .clone()
}

#[tokio::test]
async fn each_form_is_counted_under_the_other_clock() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let mut connection = server.connection();
    let p = policy(Algorithm::FixedWindowAnchored, 5, 60_000, None);

    // Made at a client's time (the start whole), then checked at server time.
    let now = server_ms(&mut connection);
    for _ in 0..3 {
        assert!(at_time(&limiter, &p, "whole", now).await.allowed);
    }
    let key = limiter.keys().key(&p, "whole");
    assert_eq!(
        state(&mut connection, &key),
        now * PACK + 3,
        "the start whole"
    );
    let admitted = [
        at_server_time(&limiter, &p, "whole").await,
        at_server_time(&limiter, &p, "whole").await,
    ];
    assert!(admitted.iter().all(|d| d.allowed));
    assert_eq!(admitted[1].remaining, 0);
    let denied = at_server_time(&limiter, &p, "whole").await;
    assert!(!denied.allowed, "five in the window already");
    assert_eq!(
        state(&mut connection, &key),
        now * PACK + 5,
        "the denial gave back"
    );

    // Made at server time (short), then checked at a client's time near it.
    for _ in 0..3 {
        assert!(at_server_time(&limiter, &p, "short").await.allowed);
    }
    let key = limiter.keys().key(&p, "short");
    let short = state(&mut connection, &key);
    assert!(short < SPAN * PACK + PACK, "short: {short}");
    let now = server_ms(&mut connection);
    assert!(at_time(&limiter, &p, "short", now).await.allowed);
    let last = at_time(&limiter, &p, "short", now).await;
    assert!(last.allowed);
    assert_eq!(last.remaining, 0);
    assert!(!at_time(&limiter, &p, "short", now).await.allowed);
    assert_eq!(state(&mut connection, &key), short + 2, "still short");
}

#[tokio::test]
async fn a_short_start_ahead_of_the_clock_counts_in_its_window_and_an_ended_one_restarts() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let mut connection = server.connection();
    let p = policy(Algorithm::FixedWindowAnchored, 5, 60_000, None);
    let (ahead, ended) = (
        limiter.keys().key(&p, "ahead"),
        limiter.keys().key(&p, "ended"),
    );
    let now = server_ms(&mut connection);
    // As a primary whose clock was 30 s ahead left it: full, starting 30 s from now.
    put_short(&mut connection, &ahead, now + 30_000, 5);
    // A window that began 61 s ago (its key not yet expired).
    put_short(&mut connection, &ended, now - 61_000, 5);

    let denied = at_server_time(&limiter, &p, "ahead").await;
    assert!(!denied.allowed, "a stepped-back clock admits no more");
    let wait = retry_code(&denied);
    assert!(
        (85_000..=90_000).contains(&wait),
        "the window ends 90 s from the state's now: {wait}"
    );
    let fresh = at_server_time(&limiter, &p, "ended").await;
    assert!(fresh.allowed);
    assert_eq!(fresh.remaining, 4, "a new window, this check its first");
    assert_eq!(state(&mut connection, &ended) % PACK, 1);
}

#[tokio::test]
async fn a_reservation_in_the_short_form_is_given_back() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let mut connection = server.connection();
    let p = policy(Algorithm::FixedWindowAnchored, 2, 60_000, None);
    let key = limiter.keys().key(&p, "c");
    let reserved = limiter
        .check(&alone(&p), "c")
        .reserve()
        .await
        .expect("reserve");
    assert!(reserved.allowed());
    assert!(at_server_time(&limiter, &p, "c").await.allowed);
    let short = state(&mut connection, &key);
    assert!(short < SPAN * PACK + PACK, "short: {short}");
    assert_eq!(short % PACK, 2);
    assert!(limiter.settle(&reserved, 0).await.expect("settle"));
    assert_eq!(state(&mut connection, &key) % PACK, 1, "given back");
    assert!(at_server_time(&limiter, &p, "c").await.allowed);
    assert!(!at_server_time(&limiter, &p, "c").await.allowed);
}
