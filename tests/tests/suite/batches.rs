//! Batches: checks that arrive while calls are in flight are decided together in one call, each
//! exactly as it would be decided alone at that time, one after another.

use std::{cell::Cell, sync::Arc, time::Duration};

use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};
use redlimit::{Algorithm, Ban, Decisions, Limiter, Override, Policy, PolicySet};
use redlimit_tests::{RedisServer, script_calls};

use crate::support::{T0, at_ms, policy, set_of};

/// One check of a random sequence.
#[derive(Debug, Clone)]
struct Step {
    set: usize,
    client: u8,
    cost: u64,
    /// A request id from a small pool, so retries happen.
    once: Option<u8>,
    reserve: bool,
}

/// Every algorithm alone, two policies together, one taking overrides, one that bans.
fn sets() -> Vec<PolicySet> {
    let mut sets: Vec<PolicySet> = Algorithm::ALL
        .iter()
        .map(|&a| set_of(&[policy(a, 4, 60_000, a.has_burst().then_some(5))]))
        .collect();
    sets.push(set_of(&[
        policy(Algorithm::FixedWindow, 5, 60_000, None),
        Policy::builder("per_hour", Algorithm::TokenBucket)
            .limit(7)
            .window(Duration::from_secs(3_600))
            .build()
            .expect("a policy"),
    ]));
    sets.push(set_of(&[overridable()]));
    sets.push(set_of(&[Policy::builder(
        "banning",
        Algorithm::FixedWindow,
    )
    .limit(2)
    .window(Duration::from_secs(60))
    .ban(Ban::new(
        1,
        Duration::from_secs(60),
        Duration::from_secs(600),
    ))
    .build()
    .expect("a policy")]));
    sets
}

fn overridable() -> Policy {
    Policy::builder("overridable", Algorithm::Gcra)
        .limit(3)
        .window(Duration::from_secs(60))
        .overrides(true)
        .build()
        .expect("a policy")
}

fn steps(sets: usize) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0..sets,
            0_u8..3,
            0_u64..3,
            prop::option::weighted(0.3, 0_u8..3),
            any::<bool>(),
            1_u8..5,
        )
            .prop_map(|(set, client, cost, once, reserve, times)| {
                (0..times)
                    .map(|i| Step {
                        set,
                        // Clients take turns in a run, so it holds several keys or one key twice.
                        client: (client + i) % 3,
                        cost,
                        once,
                        reserve,
                    })
                    .collect::<Vec<_>>()
            }),
        1..24,
    )
    // Steps come in runs of one set and cost, as a batch of one route's checks does: the
    // wire sends a run of checks without flags as one head and its length.
    .prop_map(|runs| runs.concat())
    .prop_filter("two checks or more", |steps| steps.len() >= 2)
}

/// `step` at `at_ms`, awaited.
async fn check(limiter: &Limiter, sets: &[PolicySet], step: &Step, at: u64) -> Decisions {
    let client = format!("c{}", step.client);
    let mut check = limiter
        .check(&sets[step.set], &client)
        .cost(step.cost)
        .at(at_ms(at));
    let id = step.once.map(|id| format!("id{id}"));
    if let Some(id) = &id {
        check = check.once(id, Duration::from_secs(60));
    }
    if step.reserve {
        check = check.reserve();
    }
    check.await.expect("check")
}

/// The same override of client `c1` at both; and a check of every set by a client no step
/// uses, so that the batched run's connection is up and its scripts loaded before the steps:
/// its first checks (sent at once, each in a call of its own) then reach Redis in the order
/// they were started, rather than in the order a connection or a `SCRIPT LOAD` lets them.
async fn prepare(limiter: &Limiter, sets: &[PolicySet]) {
    limiter
        .set_override(
            &overridable(),
            "c1",
            Override::default().limit(6),
            Duration::from_secs(600),
        )
        .await
        .expect("an override");
    for set in 0..sets.len() {
        let warm = Step {
            set,
            client: 9,
            cost: 1,
            once: None,
            reserve: false,
        };
        check(limiter, sets, &warm, T0).await;
    }
}

fn scripts_run(server: &RedisServer) -> u64 {
    scripts_run_on(&mut server.connection())
}

/// The script calls a server has run so far.
fn scripts_run_on(connection: &mut deadpool_redis::redis::Connection) -> u64 {
    script_calls(connection).commands
}

#[test]
fn a_batch_decides_each_check_as_one_by_one_at_its_time() {
    // One thread: the checks are started in order and reach the backend in that order, so
    // the first ones go at once and the rest wait, then go together.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (batched, alone) = (RedisServer::start(), RedisServer::start());
    let sets = Arc::new(sets());
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let (batched_calls, checks) = (Cell::new(0), Cell::new(0));
    runner
        .run(&steps(sets.len()), |steps| {
            runtime.block_on(async {
                for server in [&batched, &alone] {
                    let _: () = deadpool_redis::redis::cmd("FLUSHALL")
                        .query(&mut server.connection())
                        .expect("FLUSHALL");
                }
                let (together, one_by_one) = (batched.limiter(), alone.limiter());
                prepare(&together, &sets).await;
                prepare(&one_by_one, &sets).await;
                let before = scripts_run(&batched);
                let tasks: Vec<_> = steps
                    .iter()
                    .map(|step| {
                        let (limiter, sets, step) =
                            (together.clone(), Arc::clone(&sets), step.clone());
                        tokio::spawn(async move { check(&limiter, &sets, &step, T0).await })
                    })
                    .collect();
                let mut decided = Vec::new();
                for task in tasks {
                    decided.push(task.await.expect("a task"));
                }
                batched_calls.set(batched_calls.get() + scripts_run(&batched) - before);
                checks.set(checks.get() + steps.len() as u64);
                for (i, (step, batched)) in steps.iter().zip(decided).enumerate() {
                    let alone = check(&one_by_one, &sets, step, T0).await;
                    prop_assert_eq!(
                        batched.iter().collect::<Vec<_>>(),
                        alone.iter().collect::<Vec<_>>(),
                        "step {} of {:?}",
                        i,
                        steps
                    );
                }
                Ok(())
            })
        })
        .expect("batches decide as one by one");
    let (batched_calls, checks) = (batched_calls.get(), checks.get());
    assert!(
        batched_calls * 2 < checks,
        "batched: {batched_calls} script calls for {checks} checks"
    );
}

#[tokio::test]
async fn corrupt_state_fails_only_its_own_check_in_a_batch() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    let set = Arc::new(set_of(&[policy(Algorithm::Gcra, 10, 60_000, Some(10))]));
    spoil(&server, &limiter, &set, 7..8);
    for (i, outcome) in check_sixteen(&limiter, &set).await.iter().enumerate() {
        match outcome {
            Err(err) => assert!(i == 7 && err.is_corrupt_state(), "c{i}: {err}"),
            // Counted once: the writes of the checks decided before c7 stand and are not
            // taken again when the batch is sent again.
            Ok(decisions) => assert!(
                i != 7 && decisions.allowed() && decisions[0].remaining == 9,
                "c{i}: {decisions:?}"
            ),
        }
    }
}

/// GCRA's and the token bucket's writes are kept to the call's end (a hot client's written
/// once), and a batch that stops at a corrupt client still writes them: the hot client's checks
/// before the stop are counted once each, for both algorithms.
#[tokio::test]
async fn a_hot_clients_writes_stand_when_its_batch_stops_at_corrupt_state() {
    let server = RedisServer::start();
    let limiter = server.limiter();
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let set = Arc::new(set_of(&[policy(algorithm, 10, 3_600_000, Some(10))]));
        spoil(&server, &limiter, &set, 9..10);
        // c0 (sent at once), then hot, hot, hot, c9 (corrupt), hot, hot: all but c0 go in one
        // batch, which stops at c9; the two after it are sent again alone.
        let clients: [&'static str; 7] = ["c0", "hot", "hot", "hot", "c9", "hot", "hot"];
        let tasks: Vec<_> = clients
            .into_iter()
            .map(|client| {
                let (limiter, set) = (limiter.clone(), Arc::clone(&set));
                tokio::spawn(async move { limiter.check(&set, client).at(at_ms(T0)).await })
            })
            .collect();
        let mut hot = 0;
        for (client, task) in clients.iter().zip(tasks) {
            let outcome = task.await.expect("a task");
            match *client {
                "c9" => assert!(outcome.expect_err("corrupt").is_corrupt_state()),
                "hot" => hot += u64::from(outcome.expect("a check").allowed()),
                _ => assert!(outcome.expect("a check").allowed()),
            }
        }
        assert_eq!(hot, 5, "{algorithm}");
        let after = limiter.check(&set, "hot").cost(0).at(at_ms(T0)).await;
        assert_eq!(
            after.expect("a check")[0].remaining,
            5,
            "{algorithm}: each of the five counted once"
        );
    }
}

#[tokio::test]
async fn repairing_a_batch_deletes_only_the_corrupt_clients_state() {
    let server = RedisServer::start();
    let backend = redlimit::RedisBackend::builder(server.url())
        .repair_corrupt_state(true)
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid");
    let limiter = Limiter::new(backend.clone());
    let set = Arc::new(set_of(&[policy(Algorithm::Gcra, 10, 60_000, Some(10))]));
    for outcome in check_sixteen(&limiter, &set).await {
        assert_eq!(outcome.expect("a check")[0].remaining, 9);
    }
    // The first half spoiled: a batch holding both halves starts with a corrupt client.
    spoil(&server, &limiter, &set, 0..8);
    for (i, outcome) in check_sixteen(&limiter, &set).await.into_iter().enumerate() {
        let remaining = outcome.expect("repaired or decided")[0].remaining;
        assert_eq!(remaining, if i < 8 { 9 } else { 8 }, "c{i}");
    }
    assert_eq!(backend.repairs(), 8, "one repair per spoiled client");
}

/// Writes a value that is no state into the keys of clients `c{i}` for `spoiled`.
fn spoil(server: &RedisServer, limiter: &Limiter, set: &PolicySet, spoiled: std::ops::Range<u8>) {
    for i in spoiled {
        let _: () = deadpool_redis::redis::cmd("SET")
            .arg(limiter.keys().key(&set[0], &format!("c{i}")))
            .arg("not a time")
            .query(&mut server.connection())
            .expect("SET");
    }
}

/// Checks clients c0 to c15 at once on the test's one thread, so that all but the first wait
/// and go together, in order.
async fn check_sixteen(
    limiter: &Limiter,
    set: &Arc<PolicySet>,
) -> Vec<Result<Decisions, redlimit::Error>> {
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let (limiter, set) = (limiter.clone(), Arc::clone(set));
            tokio::spawn(async move { limiter.check(&set, &format!("c{i}")).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("a task"));
    }
    outcomes
}

/// 256 concurrent checks of one hot client, limit 100: exactly 100 admitted, in fewer script
/// calls than checks; `calls` reads the servers' script calls so far.
async fn hot_client_batches(limiter: &Limiter, calls: impl Fn() -> u64) {
    let set = Arc::new(set_of(&[policy(
        Algorithm::FixedWindow,
        100,
        3_600_000,
        None,
    )]));
    let before = calls();
    let tasks: Vec<_> = (0..256)
        .map(|_| {
            let (limiter, set) = (limiter.clone(), Arc::clone(&set));
            tokio::spawn(async move { limiter.check(&set, "hot").at(at_ms(T0)).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += u64::from(task.await.expect("a task").expect("a check").allowed());
    }
    let sent = calls() - before;
    assert_eq!(admitted, 100);
    assert!(sent < 128, "{sent} script calls for 256 checks");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_hot_client_is_batched_on_its_slot() {
    let cluster = redlimit_tests::RedisCluster::start();
    let backend = redlimit::RedisBackend::cluster(cluster.urls())
        .budget(Duration::from_secs(5))
        .build()
        .expect("valid urls");
    hot_client_batches(&Limiter::new(backend), || {
        cluster
            .primaries()
            .into_iter()
            .map(|port| scripts_run_on(&mut cluster.connection(port)))
            .sum()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_through_sentinel_are_batched() {
    let setup = redlimit_tests::RedisSentinel::start();
    let backend =
        redlimit::RedisBackend::sentinel(setup.urls(), redlimit_tests::RedisSentinel::MASTER)
            .budget(Duration::from_secs(5))
            .build()
            .expect("valid urls");
    hot_client_batches(&Limiter::new(backend), || scripts_run(setup.primary())).await;
}
