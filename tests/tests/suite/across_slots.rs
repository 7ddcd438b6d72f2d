//! A check whose keys live in different slots of a Redis Cluster (an IP's and an API key's,
//! untagged): all or nothing across slots, under load and with a primary killed mid-run.

use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use redlimit::{Limiter, Policy, PolicySet, RedisBackend};
use redlimit_tests::RedisCluster;

use crate::support::{T0, at_ms, per_minute};

const IPS: usize = 40;
const KEYS: usize = 80;
const REQUESTS: usize = 10_000;
const IP_LIMIT: u64 = 60;
const KEY_LIMIT: u64 = 40;

fn ip_and_key() -> PolicySet {
    PolicySet::new([
        per_minute("per-ip", IP_LIMIT),
        per_minute("per-key", KEY_LIMIT),
    ])
    .expect("a valid set")
}

/// The policy counting `client` (an IP or an API key) and its limit.
fn policy_of(client: &str) -> (Policy, u64) {
    if client.starts_with("ip:") {
        (per_minute("per-ip", IP_LIMIT), IP_LIMIT)
    } else {
        (per_minute("per-key", KEY_LIMIT), KEY_LIMIT)
    }
}

/// The `r`th request's IP and API key: each IP sends 250 over every key, each key 125 from
/// every IP; sent about in order, the first 60 keys' limits deny and every IP's does.
fn clients_of(r: usize) -> (String, String) {
    (
        format!("ip:{}", r % IPS),
        format!("key:{}", (r / IPS) % KEYS),
    )
}

fn limiter(cluster: &RedisCluster, budget: Duration) -> Limiter {
    Limiter::new(
        RedisBackend::cluster(cluster.urls())
            .budget(budget)
            .build()
            .expect("valid urls"),
    )
}

/// What one request was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Admitted,
    /// Refused, by the IP's limit, the key's, or both.
    Refused {
        by_ip: bool,
        by_key: bool,
    },
    Failed,
    /// Not answered within the budget: whether its slots' takes ran is unknown to it, so
    /// what a take that ran holds is not given back.
    Lost,
}

/// Sends the `REQUESTS` checks from `workers` tasks at a time (all of them at once when
/// `workers` is `REQUESTS`), all at one explicit time, so the window never turns; `answered`
/// counts them as they are answered. Each request's clients and outcome.
async fn run(
    limiter: &Limiter,
    workers: usize,
    answered: &Arc<AtomicUsize>,
) -> Vec<(usize, Outcome)> {
    let set = ip_and_key();
    let next = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (limiter, set) = (limiter.clone(), set.clone());
            let (next, answered) = (Arc::clone(&next), Arc::clone(answered));
            tokio::spawn(async move {
                let mut outcomes = Vec::new();
                // Bounded: each worker takes requests until all are taken.
                loop {
                    let r = next.fetch_add(1, Ordering::SeqCst);
                    if r >= REQUESTS {
                        return outcomes;
                    }
                    let (ip, key) = clients_of(r);
                    let decided = limiter
                        .check(&set, "")
                        .keys(&[&ip, &key])
                        .at(at_ms(T0))
                        .await;
                    let outcome = match decided {
                        Ok(decisions) if decisions.allowed() => Outcome::Admitted,
                        Ok(decisions) => Outcome::Refused {
                            by_ip: !decisions[0].allowed,
                            by_key: !decisions[1].allowed,
                        },
                        Err(error) if error.is_timeout() => Outcome::Lost,
                        Err(_) => Outcome::Failed,
                    };
                    answered.fetch_add(1, Ordering::SeqCst);
                    outcomes.push((r, outcome));
                }
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(REQUESTS);
    for task in tasks {
        outcomes.extend(task.await.expect("a worker"));
    }
    outcomes
}

/// How many requests each client (IP or key) had with the outcome `wanted`.
fn per_client(outcomes: &[(usize, Outcome)], wanted: Outcome) -> HashMap<String, u64> {
    let mut counted = HashMap::new();
    for &(r, outcome) in outcomes {
        let (ip, key) = clients_of(r);
        for client in [ip, key] {
            *counted.entry(client).or_default() += u64::from(outcome == wanted);
        }
    }
    counted
}

/// How much of `client`'s quota its counter says was used, read by a peek (cost 0).
async fn used(limiter: &Limiter, client: &str) -> u64 {
    let (policy, limit) = policy_of(client);
    let peeked = limiter
        .check(&PolicySet::from(policy), client)
        .cost(0)
        .at(at_ms(T0))
        .await
        .unwrap_or_else(|error| panic!("{client}'s counter: {error}"));
    limit - peeked[0].remaining
}

/// Asserts that `client`'s `admitted` requests are within its limit, and its counter holds
/// exactly what they took: nothing of a refused or failed request.
async fn assert_exact(limiter: &Limiter, client: &str, admitted: u64) {
    let limit = policy_of(client).1;
    assert!(
        admitted <= limit,
        "{client}: {admitted} admitted, above {limit}"
    );
    assert_eq!(
        used(limiter, client).await,
        admitted,
        "{client}: its counter is what its admitted requests took"
    );
}

/// Asserts that `client`'s counter holds what its `admitted` requests took, and of its `lost`
/// requests (unanswered within the budget) at most what each could have taken: nothing of a
/// refused request or one that failed with an answer.
async fn assert_within(limiter: &Limiter, client: &str, admitted: u64, lost: u64) {
    let used = used(limiter, client).await;
    assert!(
        (admitted..=admitted + lost).contains(&used) && used <= policy_of(client).1,
        "{client}: {used} used, for {admitted} admitted and {lost} unanswered"
    );
}

/// The Redis key of `client`'s counter.
fn key_of(limiter: &Limiter, client: &str) -> String {
    limiter.keys().key(&policy_of(client).0, client)
}

/// 10,000 concurrent requests of 40 IPs and 160 API keys on a 3-primary Cluster, each checked
/// by its IP's limit and its key's in one check whose two keys mostly live on two primaries:
/// no counter goes above its limit, and each counter is exactly what its admitted requests
/// took, so every refused request (refused by either) left every counter as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_holds_across_slots_over_ten_thousand_concurrent_requests() {
    let cluster = RedisCluster::start();
    let limiter = limiter(&cluster, Duration::from_secs(30));
    let apart = (0..REQUESTS.min(IPS * KEYS))
        .filter(|&r| {
            let (ip, key) = clients_of(r);
            cluster.primary_of(&key_of(&limiter, &ip))
                != cluster.primary_of(&key_of(&limiter, &key))
        })
        .take(100)
        .count();
    assert_eq!(
        apart, 100,
        "the two keys of most checks live on two primaries"
    );

    let outcomes = run(&limiter, REQUESTS, &Arc::new(AtomicUsize::new(0))).await;
    assert_eq!(outcomes.len(), REQUESTS);
    let failed = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Failed | Outcome::Lost))
        .count();
    assert_eq!(failed, 0, "every check decided");
    let admitted = per_client(&outcomes, Outcome::Admitted);
    let total: usize = outcomes
        .iter()
        .filter(|(_, o)| *o == Outcome::Admitted)
        .count();
    println!("{total} of {REQUESTS} admitted across slots");
    for (client, &count) in &admitted {
        assert_exact(&limiter, client, count).await;
    }
    let refused = |ip: bool, key: bool| {
        let wanted = Outcome::Refused {
            by_ip: ip,
            by_key: key,
        };
        outcomes.iter().filter(|(_, o)| *o == wanted).count()
    };
    let (by_ip, by_key) = (refused(true, false), refused(false, true));
    println!("refused by the IP's limit alone {by_ip}, by the key's alone {by_key}");
    assert!(by_ip > 0 && by_key > 0, "each limit refused on its own");
}

/// The same load from 64 tasks, with a primary killed after 1,000 answers (its replica
/// promoted later): the checks that need it fail, the others go on being decided, and every
/// counter on the live primaries stays what its admitted requests took, within its limit: a
/// check refused or failed on one slot gave back what the others took. A check left
/// unanswered within its budget (a client that stalls in the failover, until it is replaced)
/// cannot know whether its takes ran: each may hold its cost, and no more. (The killed
/// primary's own counters are what its replica received; replication is asynchronous, so
/// they are not asserted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_leaves_live_counters_exact_but_for_unanswered_checks() {
    let cluster = RedisCluster::start_configured(&["--cluster-require-full-coverage", "no"]);
    let limiter = limiter(&cluster, Duration::from_secs(5));
    let mut primaries: HashMap<String, Option<u16>> = HashMap::new();
    let ips = (0..IPS).map(|i| format!("ip:{i}"));
    for client in ips.chain((0..KEYS).map(|k| format!("key:{k}"))) {
        let primary = cluster.primary_of(&key_of(&limiter, &client));
        primaries.insert(client, primary);
    }
    let dying = primaries["ip:0"].expect("a primary");
    let answered = Arc::new(AtomicUsize::new(0));
    let killer = {
        let answered = Arc::clone(&answered);
        tokio::task::spawn_blocking(move || {
            let mut cluster = cluster;
            // Bounded: the load is answered within minutes, or the test has failed anyway.
            let started = std::time::Instant::now();
            while answered.load(Ordering::SeqCst) < 1_000
                && started.elapsed() < Duration::from_secs(120)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            cluster.kill(dying);
            cluster
        })
    };
    let outcomes = run(&limiter, 64, &answered).await;
    let _cluster = killer.await.expect("the kill");
    let count = |wanted| outcomes.iter().filter(|(_, o)| *o == wanted).count();
    let (admitted, failed, lost) = (
        count(Outcome::Admitted),
        count(Outcome::Failed),
        count(Outcome::Lost),
    );
    let refused = REQUESTS - admitted - failed - lost;
    println!(
        "primary killed mid-run: {admitted} admitted, {refused} refused, {failed} failed, \
         {lost} unanswered within the budget"
    );
    assert!(failed + lost > 0, "the killed primary's checks failed");
    let admitted_after = outcomes
        .iter()
        .filter(|&&(r, outcome)| {
            let (ip, key) = clients_of(r);
            r > 1_500
                && outcome == Outcome::Admitted
                && primaries[&ip] != Some(dying)
                && primaries[&key] != Some(dying)
        })
        .count();
    assert!(admitted_after > 0, "the live primaries kept admitting");
    let admitted = per_client(&outcomes, Outcome::Admitted);
    let lost = per_client(&outcomes, Outcome::Lost);
    let mut live = 0;
    for (client, &count) in &admitted {
        if primaries[client] == Some(dying) {
            continue;
        }
        live += 1;
        assert_within(&limiter, client, count, lost[client]).await;
    }
    assert!(live > 50, "{live} of 120 counters on the live primaries");
}

/// A reservation across slots is settled in each slot, at the time its primary took; one
/// request id covers both slots, and its retry shows the settled numbers.
#[tokio::test]
async fn a_reservation_and_a_request_id_cover_every_slot() {
    let cluster = RedisCluster::start();
    let limiter = limiter(&cluster, Duration::from_secs(5));
    let set = ip_and_key();
    let keys = ["ip:1", "key:1"];
    assert_ne!(
        cluster.primary_of(&key_of(&limiter, keys[0])),
        cluster.primary_of(&key_of(&limiter, keys[1])),
        "two primaries"
    );
    let check = || {
        limiter
            .check(&set, "")
            .keys(&keys)
            .cost(10)
            .once("order-1", Duration::from_secs(60))
            .reserve()
            .at(at_ms(T0))
    };
    let remaining = |decisions: &redlimit::Decisions| -> Vec<u64> {
        decisions.iter().map(|d| d.remaining).collect()
    };
    let first = check().await.expect("decided");
    assert!(first.allowed());
    assert_eq!(remaining(&first), [IP_LIMIT - 10, KEY_LIMIT - 10]);
    let retry = check().await.expect("decided");
    assert_eq!(remaining(&retry), remaining(&first), "counted once");
    let settled = limiter.settle(&first, 4).at(at_ms(T0)).await;
    assert!(settled.expect("settled"), "6 given back");
    assert_eq!(used(&limiter, keys[0]).await, 4);
    assert_eq!(used(&limiter, keys[1]).await, 4);
    let replayed = check().await.expect("decided");
    assert_eq!(
        remaining(&replayed),
        [IP_LIMIT - 4, KEY_LIMIT - 4],
        "a retry shows the settled numbers"
    );
}

/// A concurrency limit in a set whose keys live in two slots: its lease is decided with the
/// first key's group, a refusal by either group leaves the other's counter and the lease as
/// they were, and a lease is given back when its check's decisions are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_across_slots_is_all_or_nothing() {
    use std::time::Instant;

    let cluster = RedisCluster::start();
    let limiter = limiter(&cluster, Duration::from_secs(5));
    let one = redlimit::ConcurrencyPolicy::builder("in-flight")
        .limit(1)
        .build()
        .expect("a valid policy");
    let set = ip_and_key().with_concurrency(one).expect("a valid set");
    let check = |keys: [&'static str; 2], cost: u64| {
        let limiter = limiter.clone();
        let set = set.clone();
        async move {
            limiter
                .check(&set, "")
                .keys(&keys)
                .cost(cost)
                .at(at_ms(T0))
                .await
                .expect("decided")
        }
    };
    assert_ne!(
        cluster.primary_of(&key_of(&limiter, "ip:1")),
        cluster.primary_of(&key_of(&limiter, "key:1")),
        "two primaries"
    );
    let first = check(["ip:1", "key:1"], 1).await;
    assert!(first.allowed() && first.lease().is_some());
    let refused = check(["ip:1", "key:2"], 1).await;
    assert!(!refused.allowed() && refused.lease().is_none());
    assert!(!refused[2].allowed, "refused by the concurrency limit");
    assert_eq!(used(&limiter, "ip:1").await, 1, "the refusal took nothing");
    assert_eq!(used(&limiter, "key:2").await, 0, "the refusal took nothing");
    drop(first);
    // Given back by a task: the next check is admitted once it ran.
    let admitted_within = |keys: [&'static str; 2]| {
        let check = &check;
        async move {
            let started = Instant::now();
            loop {
                let decisions = check(keys, 1).await;
                if decisions.allowed() {
                    return decisions;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "no slot came free"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    let third = admitted_within(["ip:1", "key:3"]).await;
    assert_eq!(used(&limiter, "ip:1").await, 2);
    drop(third);
    // A check of cost 0 takes nothing and says whether a slot is free.
    let slot_free_within = || {
        let check = &check;
        async move {
            let started = Instant::now();
            while !check(["ip:9", "key:9"], 0).await[2].allowed {
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "the lease stayed held"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    slot_free_within().await;
    // Refused by the key's group alone (40 more than key:1's 39 left): the IP group took its
    // cost and the lease, and gives both back.
    let by_key = check(["ip:3", "key:1"], KEY_LIMIT).await;
    assert!(!by_key.allowed() && by_key.lease().is_none());
    assert!(!by_key[1].allowed && by_key[0].allowed && by_key[2].allowed);
    assert_eq!(
        used(&limiter, "ip:3").await,
        0,
        "the IP group's take was given back"
    );
    slot_free_within().await;
}

/// A give-back whose answer does not come within the budget is sent again, and gives back once
/// however many of its sends run. The key's primary is paused (`CLIENT PAUSE WRITE`) from after
/// its take until after every send of the give-back timed out, then woken: all the sends run
/// then, and a give-back sent again without its token would give back more than was taken.
/// Each step waits on the one before it, not on a clock: the pauses end when the test says;
/// every check is at one explicit time, so no window turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_sent_again_gives_back_once() {
    let cluster = RedisCluster::start();
    // Each send of the give-back waits a second (the backend's budget); the check itself waits
    // as long as its guard's.
    let limiter = limiter(&cluster, Duration::from_secs(1));
    let guard = redlimit::GuardedLimiter::builder(limiter.clone(), ip_and_key())
        .budget(Duration::from_secs(60))
        .build();
    let keys = ["ip:1", "key:1"];
    let (ip, key) = (
        cluster
            .primary_of(&key_of(&limiter, keys[0]))
            .expect("a primary"),
        cluster
            .primary_of(&key_of(&limiter, keys[1]))
            .expect("a primary"),
    );
    assert_ne!(ip, key, "two primaries");
    // The IP has used its whole limit.
    let (ip_policy, _) = policy_of(keys[0]);
    let spent = limiter
        .check(&PolicySet::from(ip_policy), keys[0])
        .cost(IP_LIMIT)
        .at(at_ms(T0))
        .await
        .expect("decided");
    assert!(spent.allowed());
    // The key's 3 as 4 settled at 3: the settle script is loaded on its primary, so that every
    // send of the give-back runs (a send that met NOSCRIPT after its caller stopped waiting
    // would not be sent again as EVAL).
    let (key_policy, _) = policy_of(keys[1]);
    let reserved = limiter
        .check(&PolicySet::from(key_policy), keys[1])
        .cost(4)
        .reserve()
        .at(at_ms(T0))
        .await
        .expect("decided");
    assert!(
        limiter
            .settle(&reserved, 3)
            .at(at_ms(T0))
            .await
            .expect("settled")
    );
    assert_eq!(used(&limiter, keys[1]).await, 3);
    let calls = |port: u16| {
        redlimit_tests::command_calls(&mut cluster.connection(port))
            .get("evalsha")
            .map_or(0, |stat| stat.calls)
    };
    let pause = |port: u16| redlimit_tests::pause_writes(&mut cluster.connection(port), 60_000);
    let unpause = |port: u16| redlimit_tests::unpause(&mut cluster.connection(port));
    // The IP's take waits until the key's primary is paused; the key's runs at once.
    pause(ip);
    let check = {
        let guard = guard.clone();
        tokio::spawn(async move { guard.check("").keys(&keys).at(at_ms(T0)).await })
    };
    // Bounded: the key's take runs within the guard's budget, or the check has failed.
    let started = std::time::Instant::now();
    while used(&limiter, keys[1]).await != 4 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the key's take never ran"
        );
        tokio::task::yield_now().await;
    }
    let before = calls(key);
    pause(key);
    unpause(ip);
    // The IP refuses; the give-back's three sends each time out against the paused primary.
    let refused = check.await.expect("a task");
    assert!(!refused.allowed() && !refused[0].allowed && refused[1].allowed);
    unpause(key);
    // Woken, the primary runs each send on the connection it went by, in the order it wakes
    // paused clients, which a read on another connection may overtake: read once one has run
    // (bounded, as the wait for the key's take).
    let started = std::time::Instant::now();
    while calls(key) == before {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no send of the give-back ran"
        );
        tokio::task::yield_now().await;
    }
    assert_eq!(used(&limiter, keys[1]).await, 3, "given back once");
    let sends = calls(key) - before;
    // Three sends, of which a loaded client may drop one unsent once its caller stopped
    // waiting: two that ran are what the token is for.
    assert!(
        sends >= 2,
        "the give-back ran more than once: {sends} calls"
    );
    assert_eq!(used(&limiter, keys[0]).await, IP_LIMIT);
}
