//! Atomicity under concurrency: many processes' worth of limiters on one key.

use redlimit::{Algorithm, Limiter};
use redlimit_tests::RedisServer;

use crate::support::{T0, alone, at_ms, policy};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_limiters_of_sixty_four_tasks_admit_exactly_the_limit() {
    let server = RedisServer::start();
    exactly_the_limit(|| server.limiter()).await;
}

/// 4 limiters (separate pools, like separate app servers) × 64 tasks × 3 checks on one key with
/// limit 100 admit exactly 100, for every algorithm.
pub(crate) async fn exactly_the_limit(new_limiter: impl Fn() -> Limiter) {
    for algorithm in Algorithm::ALL {
        let burst = algorithm.has_burst().then_some(100);
        let p = policy(algorithm, 100, 3_600_000, burst);
        let limiters: Vec<Limiter> = (0..4).map(|_| new_limiter()).collect();
        let mut tasks = Vec::new();
        for limiter in &limiters {
            for _ in 0..64 {
                let (limiter, p) = (limiter.clone(), p.clone());
                tasks.push(tokio::spawn(async move {
                    let mut admitted = 0_u64;
                    for _ in 0..3 {
                        // One explicit instant: nothing refills and no window ends mid-test.
                        let d = limiter
                            .check(&alone(&p), "hot")
                            .at(at_ms(T0))
                            .await
                            .expect("check")[0]
                            .clone();
                        admitted += u64::from(d.allowed);
                    }
                    admitted
                }));
            }
        }
        let mut total = 0;
        for task in tasks {
            total += task.await.expect("task");
        }
        assert_eq!(total, 100, "{algorithm}: 768 checks on one key, limit 100");
    }
}
