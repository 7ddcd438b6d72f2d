//! Shared helpers: policies, a fixed start time, and both backends side by side.

use std::time::Duration;

use redlimit::{Algorithm, Decision, Limiter, MemoryBackend, Policy, RetryAfter, Timestamp};
use redlimit_tests::RedisServer;

/// A start time aligned to 1 s, 10 s and 60 s windows (milliseconds since the epoch).
pub(crate) const T0: u64 = 1_699_999_980_000;

pub(crate) fn policy(
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: Option<u64>,
) -> Policy {
    let builder = Policy::builder(algorithm.name(), algorithm)
        .limit(limit)
        .window(Duration::from_millis(window_ms));
    match burst {
        Some(burst) => builder.burst(burst),
        None => builder,
    }
    .build()
    .expect("a valid policy")
}

/// A limiter on the server and one in memory, named for assertion messages.
pub(crate) fn both_backends(server: &RedisServer) -> [(&'static str, Limiter); 2] {
    [
        ("redis", server.limiter()),
        ("memory", Limiter::new(MemoryBackend::default())),
    ]
}

/// `-1` when allowed, `-2` when never, else the retry wait in ms: compact for tables.
pub(crate) fn retry_code(decision: &Decision) -> i64 {
    match decision.retry_after {
        None => -1,
        Some(RetryAfter::Never) => -2,
        Some(RetryAfter::After(wait)) => i64::try_from(wait.as_millis()).expect("small"),
        Some(_) => unreachable!("no other retry kind"),
    }
}

pub(crate) fn at_ms(ms: u64) -> Timestamp {
    Timestamp::from_millis(ms)
}
