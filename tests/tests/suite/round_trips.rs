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
    let fcall = calls.get("fcall").map_or(0, |stat| stat.calls);
    let sent = commands_sent(&HashMap::new(), &calls).commands;
    assert!(fcall >= 1_000, "every check is an FCALL: {calls:?}");
    assert!(
        sent <= 1_010,
        "1 000 checks sent {sent} commands: {calls:?}"
    );
    println!("1 000 checks: {sent} commands sent, {fcall} of them FCALL");
}

#[tokio::test]
async fn a_flushed_function_library_or_script_cache_is_loaded_again() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let p = policy(Algorithm::TokenBucket, 4, 60_000, None);
    assert!(
        limiter.check(&alone(&p), "c").await.expect("check")[0]
            .clone()
            .allowed
    );
    let mut admin = server.connection();
    // What a restart without persistence looks like to a client: no function, then no script
    // either.
    for (flush, remaining) in [("FUNCTION", 2), ("SCRIPT", 1)] {
        let _: () = redis::cmd(flush)
            .arg("FLUSH")
            .query(&mut admin)
            .expect("FLUSH");
        let before = command_calls(&mut admin);
        let decision = limiter.check(&alone(&p), "c").await.expect("loaded again")[0].clone();
        assert_eq!(decision.remaining, remaining, "after {flush} FLUSH");
        let after = command_calls(&mut admin);
        assert_eq!(
            ran(&before, &after, &["function|load"]),
            u64::from(flush == "FUNCTION"),
            "after {flush} FLUSH: {after:?}"
        );
    }
}

/// A server whose ACL refuses the limiter `FCALL`: checks go as scripts, from the first.
#[tokio::test]
async fn a_server_refusing_functions_is_sent_scripts() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-fcall")
        .query(&mut admin)
        .expect("ACL SETUSER");
    let limiter = server.limiter();
    let p = policy(Algorithm::Gcra, 3, 60_000, None);
    let before = command_calls(&mut admin);
    for remaining in [2, 1, 0] {
        let decision = limiter.check(&alone(&p), "c").await.expect("check")[0].clone();
        assert_eq!(decision.remaining, remaining);
    }
    let after = command_calls(&mut admin);
    // Counted with a failure of its own where one met NOSCRIPT.
    assert!(
        ran(&before, &after, &["evalsha"]) >= 3,
        "each check a script: {after:?}"
    );
}

/// The functions outlive a call, and so would what a call keeps of the keys it wrote (GCRA's and
/// the token bucket's, for a client checked again in one call): a key changed between calls is
/// read as it now is.
#[tokio::test]
async fn what_a_call_wrote_is_read_again_by_the_next() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let limiter = server.limiter();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let p = policy(algorithm, 3, 60_000, None);
        for remaining in [2, 1] {
            let decision = limiter.check(&alone(&p), "c").await.expect("check")[0].clone();
            assert_eq!(decision.remaining, remaining, "{algorithm:?}");
        }
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut admin).expect("KEYS");
        let _: () = redis::cmd("DEL").arg(&keys).query(&mut admin).expect("DEL");
        let decision = limiter.check(&alone(&p), "c").await.expect("check")[0].clone();
        assert_eq!(
            decision.remaining, 2,
            "{algorithm:?}: the key deleted between calls"
        );
    }
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
        let calls = ran(&before, &after, &["fcall", "evalsha", "eval"]);
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

#[tokio::test]
async fn a_sliding_counter_admission_in_its_own_window_is_written_in_place() {
    let server = RedisServer::start();
    let mut admin = server.connection();
    let limiter = server.limiter();
    let p = policy(Algorithm::SlidingWindowCounter, 100, 60_000, None);
    let set = alone(&p);
    let key = limiter.keys().key(&p, "client");
    let at = T0 - T0 % 60_000 + 10_000;
    let pttl = |admin: &mut redis::Connection| -> i64 {
        redis::cmd("PTTL").arg(&key).query(admin).expect("PTTL")
    };
    // A new window's first admission sets the key and its deadline, the end of the next window.
    let before = command_calls(&mut admin);
    limiter
        .check(&set, "client")
        .at(at_ms(at))
        .await
        .expect("check");
    let after = command_calls(&mut admin);
    assert_eq!(ran(&before, &after, &["set", "setrange"]), 1);
    let deadline = pttl(&mut admin);
    // Later ones in that window write over the state in place, keeping the deadline.
    let before = command_calls(&mut admin);
    for n in 1..=3 {
        let decisions = limiter
            .check(&set, "client")
            .at(at_ms(at + n))
            .await
            .expect("check");
        assert_eq!(decisions[0].remaining, 100 - 1 - n);
    }
    let after = command_calls(&mut admin);
    assert_eq!(
        (
            ran(&before, &after, &["setrange"]),
            ran(&before, &after, &["set"])
        ),
        (3, 0),
        "{after:?}"
    );
    let kept = pttl(&mut admin);
    assert!(
        kept <= deadline && kept > deadline - 60_000,
        "its deadline kept: {deadline} then {kept}"
    );
    let value: Vec<u8> = redis::cmd("GET").arg(&key).query(&mut admin).expect("GET");
    assert_eq!(value.len(), 24, "still three packed integers");
}
