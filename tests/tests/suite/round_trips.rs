//! One Redis command per decision at steady state, counted by the server.

use std::collections::HashMap;

use deadpool_redis::redis;
use redlimit::Algorithm;
use redlimit_tests::{CommandStat, RedisServer, command_calls, commands_sent};

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

/// How many times the commands `names` ran between two [`command_calls`] snapshots.
fn ran(
    before: &HashMap<String, CommandStat>,
    after: &HashMap<String, CommandStat>,
    names: &[&str],
) -> u64 {
    let calls = |stats: &HashMap<String, CommandStat>, name: &str| {
        stats.get(name).map_or(0, |stat| stat.calls)
    };
    names
        .iter()
        .map(|name| calls(after, name) - calls(before, name))
        .sum()
}

#[tokio::test]
async fn a_gcra_or_token_bucket_admission_within_the_rate_is_one_command_of_state() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let limiter = server.limiter();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let set = alone(&policy(algorithm, 100, 60_000, None));
        limiter.check(&set, "warm").await.expect("check");
        // Clients without state, one call each: written by the one command that reads them.
        let before = command_calls(&mut admin);
        for client in 0..20 {
            let decisions = limiter
                .check(&set, &format!("fresh-{client}"))
                .await
                .expect("check");
            assert!(decisions.allowed(), "{algorithm:?}");
        }
        let after = command_calls(&mut admin);
        let (sets, gets) = (
            ran(&before, &after, &["set"]),
            ran(&before, &after, &["get"]),
        );
        assert_eq!((sets, gets), (20, 0), "{algorithm:?}: {after:?}");

        // One client checked 40 times at once, in few calls: after a call's first check of it,
        // the others read what the call wrote (a limit of 100 a minute leaves state owed between
        // checks, so each call's first check reads and writes).
        let before = command_calls(&mut admin);
        let checks: Vec<_> = (0..40)
            .map(|_| {
                let (limiter, set) = (limiter.clone(), set.clone());
                tokio::spawn(async move { limiter.check(&set, "hot").await.expect("check") })
            })
            .collect();
        for check in checks {
            assert!(check.await.expect("a task").allowed(), "{algorithm:?}");
        }
        let after = command_calls(&mut admin);
        let calls = ran(&before, &after, &["evalsha", "eval"]);
        let (sets, gets) = (
            ran(&before, &after, &["set"]),
            ran(&before, &after, &["get"]),
        );
        println!("{algorithm:?}: 40 checks of one client in {calls} calls: {sets} SET, {gets} GET");
        assert!(
            calls * 2 < 40,
            "{algorithm:?}: 40 checks took {calls} calls"
        );
        assert!(
            sets + gets <= 40 + calls,
            "{algorithm:?}: 40 checks in {calls} calls ran {sets} SET and {gets} GET"
        );
    }
}
