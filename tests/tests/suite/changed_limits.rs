//! A changed limit keeps the state: a client's state is named by policy, algorithm and window,
//! and read under the numbers in force, for every algorithm on Redis and in memory.

use redlimit::{Algorithm, Limiter, Policy};
use redlimit_tests::RedisServer;

use crate::support::{T0, alone, at_ms, both_backends, policy};

const WINDOW: u64 = 60_000;

/// How many of `n` checks of `client` at `from`, `from + 1`, … ms pass.
async fn passed(limiter: &Limiter, p: &Policy, client: &str, from: u64, n: u64) -> u64 {
    let mut passed = 0;
    for i in 0..n {
        let d = limiter
            .check(&alone(p), client)
            .at(at_ms(from + i))
            .await
            .expect("check");
        passed += u64::from(d.allowed());
    }
    passed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_limit_admits_the_difference_and_a_lowered_one_what_is_left() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in Algorithm::ALL {
            let name = format!("{backend} {}", algorithm.name());
            let (five, ten) = (
                policy(algorithm, 5, WINDOW, None),
                policy(algorithm, 10, WINDOW, None),
            );
            let raised = format!("raised {}", algorithm.name());
            assert_eq!(passed(&limiter, &five, &raised, T0, 6).await, 5, "{name}");
            assert_eq!(
                passed(&limiter, &ten, &raised, T0 + 10, 7).await,
                5,
                "{name}: raised to 10 after 5 of 5, 5 more in the same window, then denied"
            );
            let lowered = format!("lowered {}", algorithm.name());
            assert_eq!(passed(&limiter, &ten, &lowered, T0, 4).await, 4, "{name}");
            assert_eq!(
                passed(&limiter, &five, &lowered, T0 + 10, 3).await,
                1,
                "{name}: lowered from 10 to 5 after 4, 1 more"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_burst_keeps_the_state() {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        for algorithm in [Algorithm::TokenBucket, Algorithm::Gcra] {
            let name = format!("{backend} {}", algorithm.name());
            let (small, large) = (
                policy(algorithm, 5, WINDOW, Some(5)),
                policy(algorithm, 5, WINDOW, Some(8)),
            );
            assert_eq!(passed(&limiter, &small, "c", T0, 6).await, 5, "{name}");
            assert_eq!(
                passed(&limiter, &large, "c", T0 + 10, 4).await,
                3,
                "{name}: the burst raised by 3 has room for 3"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fixed_window_keeps_its_count_across_both_forms_of_its_state() {
    // Below 500,000 a fixed window is one string, from there on a hash: a limit changed
    // across it reads the other form.
    let server = RedisServer::start();
    let limiter = server.limiter();
    for algorithm in [Algorithm::FixedWindow, Algorithm::FixedWindowAnchored] {
        let name = algorithm.name();
        let (small, large) = (
            policy(algorithm, 10, WINDOW, None),
            policy(algorithm, 2_000_000, WINDOW, None),
        );
        let client = name;
        assert_eq!(passed(&limiter, &small, client, T0, 4).await, 4, "{name}");
        let d = limiter
            .check(&alone(&large), client)
            .at(at_ms(T0 + 10))
            .await
            .expect("check");
        assert_eq!(d[0].remaining, 2_000_000 - 5, "{name}: 4 counted, then 1");
        assert_eq!(
            passed(&limiter, &small, client, T0 + 20, 6).await,
            5,
            "{name}: back under 10, 5 counted"
        );
        // A count taken past 999,999 by a settle turns the string into a hash.
        let reserved = limiter
            .check(&alone(&large), client)
            .reserve()
            .at(at_ms(T0 + 30))
            .await
            .expect("reserve");
        assert!(
            limiter
                .settle(&reserved, 1_500_001)
                .at(at_ms(T0 + 31))
                .await
                .expect("settle"),
            "{name}"
        );
        let d = limiter
            .check(&alone(&large), client)
            .cost(0)
            .at(at_ms(T0 + 40))
            .await
            .expect("peek");
        assert_eq!(
            d[0].remaining,
            2_000_000 - 1_500_011,
            "{name}: 10, then 1,500,001"
        );
        let d = limiter
            .check(&alone(&small), client)
            .at(at_ms(T0 + 50))
            .await
            .expect("check");
        assert!(!d.allowed(), "{name}: the hash read under a limit of 10");
    }
}
