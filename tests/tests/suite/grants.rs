//! Hot-key mode: a guard takes units beyond a request's cost where every policy has room and
//! spends them in process; what it admits never passes the limit, and what it holds unspent is
//! given back when the grant ends.

use std::time::Duration;

use redlimit::{Algorithm, Grants, GuardedLimiter, Limiter, Policy, PolicySet, Reason};
use redlimit_tests::{RedisServer, TestClock, script_calls};

use crate::support::{T0, at_ms};

fn granted(algorithm: Algorithm, limit: u64, grants: Grants) -> Policy {
    Policy::builder(format!("hot-{}", algorithm.tag()), algorithm)
        .limit(limit)
        .window(Duration::from_secs(60))
        .grants(grants)
        .build()
        .expect("valid")
}

fn guard(server: &RedisServer, set: PolicySet, clock: &TestClock, prefix: &str) -> GuardedLimiter {
    let limiter = Limiter::with_prefix(server.backend(), prefix).expect("prefix");
    GuardedLimiter::builder(limiter, set)
        .clock(clock.clock())
        .budget(Duration::from_secs(10))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_spends_grants_in_process_and_admits_exactly_its_limit() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    for algorithm in Algorithm::ALL {
        let clock = TestClock::at_millis(T0);
        // Grants live as long as the test: every unit granted is spent in process.
        let policy = granted(
            algorithm,
            40,
            Grants::up_to(8).life(Duration::from_secs(60)),
        );
        let guard = guard(&server, PolicySet::from(policy), &clock, algorithm.tag());
        let before = script_calls(&mut connection).commands;
        // At one instant nothing refills: exactly the limit passes, however the grants fall.
        let (mut admitted, mut attempts, mut in_process) = (0, 0, 0);
        while admitted < 40 && attempts < 4_000 {
            let decisions = guard.check("hot").await;
            attempts += 1;
            assert!(
                decisions.error().is_none(),
                "{algorithm}: {:?}",
                decisions.error()
            );
            if decisions.allowed() {
                admitted += 1;
                // Units a fetch under way took are not yet counted: never more than is left.
                let remaining = decisions[0].remaining;
                assert!(
                    remaining <= 40 - admitted,
                    "{algorithm}: {remaining} left after #{admitted} {:?}",
                    decisions[0].reason
                );
            }
            in_process += usize::from(decisions[0].reason == Reason::Grant);
        }
        assert_eq!(admitted, 40, "{algorithm}: all of the limit passes");
        for _ in 0..20 {
            assert!(
                !guard.check("hot").await.allowed(),
                "{algorithm}: never past the limit"
            );
        }
        let calls = script_calls(&mut connection).commands - before;
        // The first grant (8) at least was spent in process; each unit spent there is a call
        // saved.
        assert!(
            in_process >= 8,
            "{algorithm}: {in_process} of 40 decided in process"
        );
        let checks = attempts + 20;
        assert!(
            calls + 8 <= checks,
            "{algorithm}: {calls} script calls for {checks} checks"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_grant_holds_unspent_is_given_back_when_it_ends() {
    let server = RedisServer::start();
    let clock = TestClock::at_millis(T0);
    let life = Duration::from_millis(200);
    let policy = granted(Algorithm::FixedWindow, 100, Grants::up_to(30).life(life));
    let set = PolicySet::from(policy);
    let guard = guard(&server, set.clone(), &clock, "ends");
    let exact = Limiter::with_prefix(server.backend(), "ends").expect("prefix");
    let left = || async {
        let peek = exact.check(&set, "hot").cost(0).at(at_ms(T0)).await;
        peek.expect("a peek")[0].remaining
    };
    // The first check is exact; the second takes the most a grant holds beyond its cost.
    assert!(guard.check("hot").await.allowed());
    let second = guard.check("hot").await;
    assert_eq!((second[0].remaining, left().await), (98, 68));
    // Its life over, the 30 it holds go back, and only the two checks stay counted.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while left().await != 98 && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
    assert_eq!(left().await, 98);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_takes_no_more_than_every_policy_of_the_set_has_room_for() {
    let server = RedisServer::start();
    let clock = TestClock::at_millis(T0);
    let grants = Grants::up_to(8).life(Duration::from_secs(60));
    let wide = granted(Algorithm::FixedWindow, 40, grants);
    let narrow = granted(Algorithm::Gcra, 10, grants);
    let set = PolicySet::new([wide, narrow]).expect("valid");
    let guard = guard(&server, set.clone(), &clock, "narrow");
    let mut admitted = 0;
    for _ in 0..200 {
        admitted += u64::from(guard.check("hot").await.allowed());
    }
    assert_eq!(admitted, 10);
    // The wide policy gave what the narrow one admitted, and no more.
    let exact = Limiter::with_prefix(server.backend(), "narrow").expect("prefix");
    let peek = exact.check(&set, "hot").cost(0).at(at_ms(T0)).await;
    assert_eq!(peek.expect("a peek")[0].remaining, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_processes_on_one_hot_key_admit_no_more_than_its_limit() {
    let server = RedisServer::start();
    let mut connection = server.connection();
    let before = script_calls(&mut connection).commands;
    let (limit, checks) = (20_000_u64, 15_000_u64);
    let workers: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_hot_key_worker"))
                .args([
                    &server.url(),
                    "four",
                    &limit.to_string(),
                    &checks.to_string(),
                    "32",
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("the worker starts")
        })
        .collect();
    let (mut admitted, mut decided) = (0, 0);
    for worker in workers {
        let output = worker.wait_with_output().expect("the worker ends");
        assert!(
            output.status.success(),
            "a worker failed: {:?}",
            output.status
        );
        let text = String::from_utf8_lossy(&output.stdout);
        let counts: Vec<u64> = text
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let [yes, no] = counts[..] else {
            panic!("a worker printed {text:?}");
        };
        (admitted, decided) = (admitted + yes, decided + yes + no);
    }
    assert_eq!(decided, 4 * checks);
    // A fixed window's grant is spent within its window: the bound is the limit itself. The
    // other way, units held when the limit was reached go back unspent.
    assert!(
        admitted <= limit,
        "{admitted} admitted over a limit of {limit}"
    );
    assert!(
        admitted >= limit - 4 * 2 * 200,
        "{admitted} admitted of {limit}"
    );
    let calls = script_calls(&mut connection).commands - before;
    assert!(
        calls * 10 <= decided,
        "{calls} script calls for {decided} decisions"
    );
}
