//! Shared helpers: policies, a fixed start time, and both backends side by side.

use std::{
    io::Write,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use axum::{
    Router,
    body::Body,
    http::{Request, StatusCode},
    routing::get,
};
use redlimit::{
    Algorithm, Decision, GuardedLimiter, Limiter, MemoryBackend, Policy, PolicySet, RetryAfter,
    Timestamp,
};
use redlimit_tests::RedisServer;
use tower::ServiceExt;
use tower_redlimit::{HeaderKey, RateLimitLayer};

/// A start time aligned to 1 s, 10 s and 60 s windows (milliseconds since the epoch).
pub(crate) const T0: u64 = 1_699_999_980_000;

/// The budget of a guard on Redis in a test that is not about the budget: seconds, so that a
/// slow reply on a busy machine is not answered by the failure policy (the guard's default,
/// 50 ms, once made a block-cache comparison read a fail-open as a difference).
pub(crate) const PATIENT: Duration = Duration::from_secs(5);

/// `policies`, checked together.
pub(crate) fn set_of(policies: &[Policy]) -> PolicySet {
    PolicySet::new(policies.iter().cloned()).expect("a valid set")
}

/// A fixed window of `limit` a minute named `name`.
pub(crate) fn per_minute(name: &str, limit: u64) -> Policy {
    Policy::builder(name, Algorithm::FixedWindow)
        .limit(limit)
        .window(Duration::from_secs(60))
        .build()
        .expect("a valid policy")
}

/// The cases of a request stopped by a later policy's corrupt state: each of a fixed window,
/// GCRA and a token bucket of 10 a minute first, then a fixed window of its own key ("last") or
/// GCRA in a key group ("grouped"), both 10 a minute; the later one's key is the one spoiled.
pub(crate) fn before_a_later_policy() -> Vec<(Policy, Policy)> {
    let grouped = Policy::builder("grouped", Algorithm::Gcra)
        .limit(10)
        .window(Duration::from_secs(60))
        .key_group("g")
        .build()
        .expect("a valid policy");
    let lasts = [per_minute("last", 10), grouped];
    [
        Algorithm::FixedWindow,
        Algorithm::Gcra,
        Algorithm::TokenBucket,
    ]
    .into_iter()
    .flat_map(|first| {
        lasts
            .iter()
            .map(move |last| (policy(first, 10, 60_000, None), last.clone()))
    })
    .collect()
}

/// `policy` as a set of its own, for a check of it alone.
pub(crate) fn alone(policy: &Policy) -> PolicySet {
    PolicySet::from(policy.clone())
}

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

/// Every log line written while it is the default subscriber.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `/` answers 200, `/fail` 500; every route is limited by `guard`, keyed by `x-key`.
pub(crate) fn keyed_app(guard: GuardedLimiter) -> Router {
    let layer = RateLimitLayer::new(guard).key(HeaderKey::new("x-key").expect("a header name"));
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/fail", get(|| async { StatusCode::INTERNAL_SERVER_ERROR }))
        .layer(layer)
}

pub(crate) async fn send(app: &Router, path: &str, key: &str) -> StatusCode {
    let request = Request::get(path)
        .header("x-key", key)
        .body(Body::empty())
        .expect("a request");
    app.clone()
        .oneshot(request)
        .await
        .expect("infallible")
        .status()
}
