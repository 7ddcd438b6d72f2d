//! Parity: random sequences of (client, cost, time step) give identical decisions on Redis and in
//! memory, for every algorithm alone and for pairs checked together.

use proptest::{
    prelude::*,
    test_runner::{Config, TestRunner},
};
use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, Timestamp};
use redlimit_tests::RedisServer;

use crate::support::{T0, policy, set_of};

#[derive(Debug, Clone)]
struct Step {
    client: u8,
    cost: u64,
    /// Microseconds since the previous step; sub-millisecond steps exercise GCRA's precision.
    advance_us: u64,
}

fn policy_for(algorithm: Algorithm) -> impl Strategy<Value = Policy> {
    (
        1_u64..12,
        prop::sample::select(vec![1_000_u64, 1_500, 7_000, 60_000]),
        1_u64..12,
    )
        .prop_map(move |(limit, window, burst)| {
            policy(
                algorithm,
                limit,
                window,
                algorithm.has_burst().then_some(burst),
            )
        })
}

fn steps(max_advance_us: u64) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            0_u8..3,
            0_u64..14,
            prop_oneof![0..2_000_u64, 0..max_advance_us],
        )
            .prop_map(|(client, cost, advance_us)| Step {
                client,
                cost,
                advance_us,
            }),
        1..60,
    )
}

fn run_parity(
    server: &RedisServer,
    runtime: &tokio::runtime::Runtime,
    policies: impl Strategy<Value = Vec<Policy>>,
) {
    run_parity_keyed(server, runtime, policies, &[]);
}

/// As [`run_parity`], each policy `i` checked under its client's key number `each[i]` (a
/// request's keys, one a policy) where `each` is not empty.
fn run_parity_keyed(
    server: &RedisServer,
    runtime: &tokio::runtime::Runtime,
    policies: impl Strategy<Value = Vec<Policy>>,
    each: &[usize],
) {
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0_u64);
    runner
        .run(&(policies, steps(90_000_000)), |(policies, steps)| {
            case.set(case.get() + 1);
            let redis = Limiter::with_prefix(server.backend(), format!("case{}", case.get()))
                .expect("prefix");
            let memory = Limiter::new(MemoryBackend::default());
            let mut now = T0 * 1000;
            for (i, step) in steps.iter().enumerate() {
                now += step.advance_us;
                let client = format!("c{}", step.client);
                let at = Timestamp::from_micros(now);
                let set = set_of(&policies);
                let keys: Vec<String> = each.iter().map(|k| format!("{client}-{k}")).collect();
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                let (on_redis, in_memory) = runtime.block_on(async {
                    let (on_redis, in_memory) = if keys.is_empty() {
                        (redis.check(&set, &client), memory.check(&set, &client))
                    } else {
                        (
                            redis.check(&set, "").keys(&keys),
                            memory.check(&set, "").keys(&keys),
                        )
                    };
                    let on_redis = on_redis.cost(step.cost).at(at).await;
                    let in_memory = in_memory.cost(step.cost).at(at).await;
                    (on_redis.expect("redis"), in_memory.expect("memory"))
                });
                for (r, m) in on_redis.iter().zip(&in_memory) {
                    prop_assert_eq!(
                        (r.allowed, r.remaining, r.reset_after, r.retry_after),
                        (m.allowed, m.remaining, m.reset_after, m.retry_after),
                        "step {} of {:?}: {:?}",
                        i,
                        policies,
                        step
                    );
                }
            }
            Ok(())
        })
        .unwrap_or_else(|failure| panic!("{failure}"));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn each_algorithm_decides_the_same_on_redis_and_in_memory() {
    let server = RedisServer::start();
    let runtime = runtime();
    for algorithm in Algorithm::ALL {
        run_parity(
            &server,
            &runtime,
            policy_for(algorithm).prop_map(|p| vec![p]),
        );
    }
}

#[test]
fn policies_checked_together_decide_the_same_on_redis_and_in_memory() {
    let server = RedisServer::start();
    let runtime = runtime();
    let pair = (0..6_usize, 0..6_usize)
        .prop_filter("two different algorithms", |(a, b)| a != b)
        .prop_flat_map(|(a, b)| (policy_for(Algorithm::ALL[a]), policy_for(Algorithm::ALL[b])))
        .prop_map(|(a, b)| vec![a, b]);
    run_parity(&server, &runtime, pair);
}

/// Fixed windows (aligned and anchored), GCRA and token buckets checked together, two or three of them and
/// the same algorithm twice (two GCRA intervals, two windows): Redis decides and takes each at
/// once, giving back what those before took when a later one denies. Decided as in memory,
/// where nothing is taken unless every policy admits.
#[test]
fn policies_that_take_at_once_checked_together_decide_the_same_on_redis_and_in_memory() {
    let server = RedisServer::start();
    let runtime = runtime();
    let member = |name| taking_at_once(name, None);
    let pair = (member("first"), member("second")).prop_map(|(a, b)| vec![a, b]);
    run_parity(&server, &runtime, pair);
    // Each run numbers its cases from 1: the pairs' state would be read as the threes'.
    redlimit_tests::flush_all(&mut server.connection());
    let three =
        (member("first"), member("second"), member("third")).prop_map(|(a, b, c)| vec![a, b, c]);
    run_parity(&server, &runtime, three);
}

/// A policy named `name` of an algorithm that decides and takes at once (a fixed window,
/// aligned or anchored, GCRA or a token bucket), in key group `group` if given.
fn taking_at_once(
    name: &'static str,
    group: Option<&'static str>,
) -> impl Strategy<Value = Policy> {
    (
        prop::sample::select(vec![
            Algorithm::FixedWindow,
            Algorithm::FixedWindowAnchored,
            Algorithm::Gcra,
            Algorithm::TokenBucket,
        ]),
        1_u64..12,
        prop::sample::select(vec![1_000_u64, 1_500, 7_000, 60_000]),
        1_u64..12,
    )
        .prop_map(move |(algorithm, limit, window, burst)| {
            let mut builder = Policy::builder(name, algorithm)
                .limit(limit)
                .window(std::time::Duration::from_millis(window));
            if algorithm.has_burst() {
                builder = builder.burst(burst);
            }
            if let Some(group) = group {
                builder = builder.key_group(group);
            }
            builder.build().expect("a policy")
        })
}

/// Policies of one key group keep a client's states in one key, each a record its algorithm
/// reads and writes as its own key: alone, two and three of them, decided as in memory.
#[test]
fn policies_of_one_key_group_decide_the_same_on_redis_and_in_memory() {
    let server = RedisServer::start();
    let runtime = runtime();
    let member = |name| taking_at_once(name, Some("g"));
    run_parity(&server, &runtime, member("alone").prop_map(|p| vec![p]));
    redlimit_tests::flush_all(&mut server.connection());
    let pair = (member("first"), member("second")).prop_map(|(a, b)| vec![a, b]);
    run_parity(&server, &runtime, pair);
    redlimit_tests::flush_all(&mut server.connection());
    let three =
        || (member("first"), member("second"), member("third")).prop_map(|(a, b, c)| vec![a, b, c]);
    run_parity(&server, &runtime, three());
    // Under two keys: a key of one and a key of two side by side (each key read once and
    // written once), then a key whose two are apart in the set.
    for each in [[0, 1, 1], [0, 1, 0]] {
        redlimit_tests::flush_all(&mut server.connection());
        run_parity_keyed(&server, &runtime, three(), &each);
    }
    // Beside a policy of a key of its own (per IP, then a key's two grouped policies).
    let mixed = || {
        (
            taking_at_once("own", None),
            member("second"),
            member("third"),
        )
            .prop_map(|(a, b, c)| vec![a, b, c])
    };
    for each in [&[][..], &[0, 1, 1]] {
        redlimit_tests::flush_all(&mut server.connection());
        run_parity_keyed(&server, &runtime, mixed(), each);
    }
}
