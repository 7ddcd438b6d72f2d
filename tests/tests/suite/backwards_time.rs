//! Time that steps back (a skewed app-server clock, an NTP step, a failover to a primary whose
//! clock is behind) never admits more: a check stamped before the latest time seen passes only
//! if a peek at that latest time shows its cost available, and both backends decide alike.

use std::collections::HashMap;

use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};
use redlimit::{Algorithm, Decision, Limiter, MemoryBackend, Policy, Timestamp};
use redlimit_tests::RedisServer;

use crate::support::{T0, alone, at_ms, policy};

/// One check: its cost and its time, milliseconds from T0 (any order).
#[derive(Debug, Clone, Copy)]
struct Step {
    cost: u64,
    at_ms: u64,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    // Times wander over five windows of 60 s, forwards and back, never in a window's last
    // second: Redis counts a key's TTL in real time, so state must outlive the test's own run
    // for the two backends to be compared at explicit times.
    prop::collection::vec(
        (0_u64..4, 0_u64..5, 0_u64..59_000).prop_map(|(cost, window, offset)| Step {
            cost,
            at_ms: window * 60_000 + offset,
        }),
        1..50,
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

async fn decide(limiter: &Limiter, p: &Policy, cost: u64, ms: u64) -> Decision {
    limiter
        .check(&alone(p), "client")
        .cost(cost)
        .at(at_ms(T0 + ms))
        .await
        .expect("a decision")[0]
        .clone()
}

#[test]
fn a_check_back_in_time_never_passes_what_the_latest_time_would_refuse() {
    let server = RedisServer::start();
    let runtime = runtime();
    let case = std::cell::Cell::new(0_u64);
    // Every algorithm with a key of its own, then those a key group takes, in one.
    let groupable = [
        Algorithm::FixedWindow,
        Algorithm::FixedWindowAnchored,
        Algorithm::Gcra,
        Algorithm::TokenBucket,
    ];
    let cases = Algorithm::ALL
        .into_iter()
        .map(|algorithm| (algorithm, None))
        .chain(
            groupable
                .into_iter()
                .map(|algorithm| (algorithm, Some("g"))),
        );
    for (algorithm, group) in cases {
        let p = match group {
            None => policy(algorithm, 5, 60_000, algorithm.has_burst().then_some(5)),
            Some(group) => {
                let builder = Policy::builder(algorithm.name(), algorithm)
                    .limit(5)
                    .window(std::time::Duration::from_secs(60))
                    .key_group(group);
                let builder = if algorithm.has_burst() {
                    builder.burst(5)
                } else {
                    builder
                };
                builder.build().expect("a valid grouped policy")
            }
        };
        let what = format!("{algorithm} (key group {group:?})");
        let mut runner = TestRunner::new(Config {
            cases: 100,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&steps(), |steps| {
                case.set(case.get() + 1);
                let redis = Limiter::with_prefix(server.backend(), format!("back{}", case.get()))
                    .expect("prefix");
                let memory = Limiter::new(MemoryBackend::default());
                let mut latest: Option<u64> = None;
                // Fixed window: what each window admitted, by the window a check counted in.
                let mut per_window: HashMap<u64, u64> = HashMap::new();
                let mut counted_in: Option<u64> = None;
                for (i, step) in steps.iter().enumerate() {
                    let (on_redis, in_memory, peeks) = runtime.block_on(async {
                        let peeks = match latest {
                            Some(latest) if step.at_ms < latest => Some((
                                decide(&redis, &p, 0, latest).await,
                                decide(&memory, &p, 0, latest).await,
                            )),
                            _ => None,
                        };
                        (
                            decide(&redis, &p, step.cost, step.at_ms).await,
                            decide(&memory, &p, step.cost, step.at_ms).await,
                            peeks,
                        )
                    });
                    prop_assert_eq!(
                        (
                            on_redis.allowed,
                            on_redis.remaining,
                            on_redis.reset_after,
                            on_redis.retry_after
                        ),
                        (
                            in_memory.allowed,
                            in_memory.remaining,
                            in_memory.reset_after,
                            in_memory.retry_after
                        ),
                        "{}: step {} of {:?}",
                        what,
                        i,
                        steps
                    );
                    if let Some((redis_peek, memory_peek)) = peeks {
                        prop_assert_eq!(redis_peek.remaining, memory_peek.remaining);
                        if on_redis.allowed {
                            prop_assert!(
                                redis_peek.remaining >= step.cost,
                                "{}: step {} passed at {} ms what {} ms would refuse: {:?}",
                                what,
                                i,
                                step.at_ms,
                                latest.unwrap_or_default(),
                                steps
                            );
                        }
                    }
                    if algorithm == Algorithm::FixedWindow && on_redis.allowed && step.cost > 0 {
                        let window = (step.at_ms / 60_000).max(counted_in.unwrap_or(0));
                        counted_in = Some(window);
                        let admitted = per_window.entry(window).or_default();
                        *admitted += step.cost;
                        prop_assert!(
                            *admitted <= 5,
                            "window {} admitted {}: {:?}",
                            window,
                            admitted,
                            steps
                        );
                    }
                    latest = Some(latest.map_or(step.at_ms, |l| l.max(step.at_ms)));
                }
                Ok(())
            })
            .unwrap_or_else(|failure| panic!("{failure}"));
    }
}

/// The sequences that over-admitted before: limit 5 per 60 s, `T+1` cost 5, then `T`, `T+2`,
/// `T`, `T+3` cost 1 each: 9 admitted in 3 ms (anchored), 7 (sliding counter); 11 across a
/// window boundary (aligned). Now the first five are all.
#[tokio::test]
async fn the_reported_sequences_admit_the_limit_and_no_more() {
    let server = RedisServer::start();
    for (n, algorithm) in [
        Algorithm::FixedWindow,
        Algorithm::FixedWindowAnchored,
        Algorithm::SlidingWindowCounter,
    ]
    .into_iter()
    .enumerate()
    {
        let p = policy(algorithm, 5, 60_000, None);
        // Aligned windows: T + 1 is the first millisecond of a window, T the last of the one before.
        let t = 60_000 * 1_000 - 1;
        for limiter in [
            Limiter::with_prefix(server.backend(), format!("reported{n}")).expect("prefix"),
            Limiter::new(MemoryBackend::default()),
        ] {
            let mut admitted = 0;
            for (cost, ms) in [(5, t + 1), (1, t), (1, t + 2), (1, t), (1, t + 3)] {
                let at = Timestamp::from_millis(T0 + ms);
                if limiter
                    .check(&alone(&p), "c")
                    .cost(cost)
                    .at(at)
                    .await
                    .expect("check")[0]
                    .clone()
                    .allowed
                {
                    admitted += cost;
                }
            }
            assert_eq!(admitted, 5, "{algorithm}");
        }
    }
}
