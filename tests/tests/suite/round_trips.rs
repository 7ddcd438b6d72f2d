//! One Redis command per decision at steady state, counted by the server.

use std::collections::HashMap;

use deadpool_redis::redis;
use redlimit::Algorithm;
use redlimit_tests::{RedisServer, command_calls, commands_sent};

use crate::support::{T0, alone, at_ms, policy, set_of};

#[tokio::test]
async fn a_thousand_checks_cost_at_most_a_thousand_and_ten_commands() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut admin)
        .expect("RESETSTAT");
    // A fresh limiter: its first connection, script load and NOSCRIPT retry are in the count.
    let limiter = server.limiter();
    let policies: Vec<_> = Algorithm::ALL
        .into_iter()
        .map(|algorithm| policy(algorithm, 50, 60_000, None))
        .collect();
    for i in 0..1_000_usize {
        // One policy or two together, every algorithm, server time and explicit times.
        let first = i % 6;
        let chosen = &policies[first..(first + 1 + i % 2).min(6)];
        let client = format!("client-{}", i % 37);
        if i % 3 == 0 {
            limiter
                .check(&set_of(chosen), &client)
                .await
                .expect("check");
        } else {
            let at = at_ms(T0 + u64::try_from(i).expect("small"));
            limiter
                .check(&set_of(chosen), &client)
                .at(at)
                .await
                .expect("check");
        }
    }
    let calls = command_calls(&mut admin);
    let evalsha = calls.get("evalsha").map_or(0, |stat| stat.calls);
    let sent = commands_sent(&HashMap::new(), &calls).commands;
    assert!(evalsha >= 1_000, "every check is an EVALSHA: {calls:?}");
    assert!(
        sent <= 1_010,
        "1 000 checks sent {sent} commands: {calls:?}"
    );
    println!("1 000 checks: {sent} commands sent, {evalsha} of them EVALSHA");
}

#[tokio::test]
async fn a_flushed_script_cache_is_reloaded_on_noscript() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let p = policy(Algorithm::TokenBucket, 3, 60_000, None);
    assert!(
        limiter.check(&alone(&p), "c").await.expect("check")[0]
            .clone()
            .allowed
    );
    let mut admin = server.connection();
    // What a restart or a failover to a replica without the script looks like to a client.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut admin)
        .expect("SCRIPT FLUSH");
    let decision = limiter.check(&alone(&p), "c").await.expect("reloaded")[0].clone();
    assert_eq!(decision.remaining, 1);
}
