//! Hot-key mode: a guard takes units beyond a request's cost where every policy has room and
//! spends them in process; what it admits never passes the limit, and what it holds unspent is
//! given back when the grant ends.

use std::time::Duration;

use redlimit::{Algorithm, Grants, GuardedLimiter, Limiter, Policy, PolicySet, Reason};
use redlimit_tests::{RedisServer, TestClock, script_calls};

use crate::support::T0;

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
