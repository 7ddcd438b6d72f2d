//! The local block cache never changes a decision: with and without it, the same checks give the
//! same answers, while denied floods stop costing Redis commands.

use redlimit::PolicySet;
use redlimit::{Algorithm, BlockCache, GuardedLimiter, Limiter, Reason};
use redlimit_tests::{RedisServer, TestClock};

use crate::support::{T0, policy};

fn guarded(
    server: &RedisServer,
    prefix: &str,
    algorithm: Algorithm,
    clock: &TestClock,
    cache: bool,
) -> GuardedLimiter {
    let limiter = Limiter::with_prefix(server.backend(), prefix).expect("prefix");
    let p = policy(algorithm, 5, 2_000, algorithm.has_burst().then_some(3));
    let second = redlimit::Policy::builder("daily", Algorithm::FixedWindow)
        .limit(20)
        .window(std::time::Duration::from_secs(10))
        .build()
        .expect("valid");
    GuardedLimiter::builder(limiter, PolicySet::new([p, second]).expect("valid"))
        .clock(clock.clock())
        .budget(crate::support::PATIENT)
        .block_cache(cache.then(|| BlockCache::new(1_000)))
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_checks_get_the_same_answers_with_and_without_the_cache() {
    let server = RedisServer::start();
    for algorithm in Algorithm::ALL {
        let clock = TestClock::at_millis(T0);
        let cached = guarded(
            &server,
            &format!("cached-{algorithm}"),
            algorithm,
            &clock,
            true,
        );
        let plain = guarded(
            &server,
            &format!("plain-{algorithm}"),
            algorithm,
            &clock,
            false,
        );
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut local_blocks = 0;
        for step in 0..2_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            // Mostly one hot client, costs 0 to 6, time creeping forward in small steps.
            let client = if seed % 10 < 8 {
                "hot".to_owned()
            } else {
                format!("c{}", seed % 7)
            };
            let cost = (seed >> 8) % 7;
            clock.advance_millis((seed >> 16) % 40);
            let with = cached.check(&client).cost(cost).await;
            let without = plain.check(&client).cost(cost).await;
            // The answer is the same; a denied check consumes nothing either way, so the state
            // on Redis stays the same too, and every later step is compared on equal terms.
            assert_eq!(
                with.allowed(),
                without.allowed(),
                "{algorithm}, step {step}: {client} cost {cost}"
            );
            if with[0].reason == Reason::LocalBlock {
                local_blocks += 1;
            }
        }
        assert!(
            local_blocks > 100,
            "{algorithm}: the cache answered {local_blocks} checks"
        );
    }
}
