//! What an operator sees: the metrics of a known sequence, and shadow mode. The check spans are
//! in their own binary (`tests/spans.rs`).

use std::time::Duration;

use metrics_util::{
    CompositeKey, MetricKind,
    debugging::{DebugValue, DebuggingRecorder, Snapshotter},
};
use redlimit::{
    Algorithm, CircuitBreaker, ConcurrencyPolicy, FailurePolicy, GuardedLimiter, Reason,
};
use redlimit_tests::RedisServer;

use crate::support::{keyed_app, policy, send};

/// A guard whose series count into a recorder of its own (a guard registers them with the
/// recorder in force when it is built), and that recorder's snapshots.
pub(crate) fn recorded<T>(build: impl FnOnce() -> T) -> (T, Snapshotter) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    (metrics::with_local_recorder(&recorder, build), snapshotter)
}

/// One value per series: counters and gauges as numbers, histograms as their sample count.
pub(crate) fn values(snapshotter: &Snapshotter) -> Vec<(CompositeKey, f64)> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            (key, value)
        })
        .collect()
}

/// How many decisions of `policy` were counted as `outcome` by `reason`.
pub(crate) fn decided(
    all: &[(CompositeKey, f64)],
    policy: &str,
    outcome: &str,
    reason: &str,
) -> f64 {
    let labels = [("policy", policy), ("outcome", outcome), ("reason", reason)];
    value(all, "redlimit_decisions_total", &labels)
}

/// The value of the series `name` whose labels are exactly `labels`; 0 when never registered.
pub(crate) fn value(all: &[(CompositeKey, f64)], name: &str, labels: &[(&str, &str)]) -> f64 {
    let matching: Vec<f64> = all
        .iter()
        .filter(|(key, _)| {
            let key = key.key();
            let mut have: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
            let mut want = labels.to_vec();
            have.sort_unstable();
            want.sort_unstable();
            key.name() == name && have == want
        })
        .map(|(_, v)| *v)
        .collect();
    assert!(matching.len() <= 1, "{name} {labels:?} is one series");
    matching.first().copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_counter_of_a_known_sequence_has_its_exact_value() {
    let server = RedisServer::start();
    // The guard's series and the layer's, with one recorder.
    let (app, snapshotter) = recorded(|| {
        let guard = GuardedLimiter::builder(
            server.limiter(),
            policy(Algorithm::FixedWindowAnchored, 5, 3_600_000, None),
        )
        .failure(FailurePolicy::Open)
        .budget(Duration::from_secs(5))
        .circuit_breaker(CircuitBreaker::new(1, Duration::from_secs(3_600)))
        .build();
        keyed_app(guard)
    });

    // Limit 5, near the limit at 1 remaining or less (20%).
    assert_eq!(
        send(&app, "/fail", "alice").await,
        500,
        "allowed, remaining 4"
    );
    for _ in 0..2 {
        assert_eq!(send(&app, "/", "alice").await, 200, "allowed, 3 then 2");
    }
    for _ in 0..2 {
        assert_eq!(
            send(&app, "/", "alice").await,
            200,
            "near the limit, 1 then 0"
        );
    }
    assert_eq!(send(&app, "/", "alice").await, 429, "limited by Redis");
    assert_eq!(
        send(&app, "/", "alice").await,
        429,
        "limited by the block cache"
    );
    drop(server);
    assert_eq!(send(&app, "/", "bob").await, 200, "Redis down: fail open");
    assert_eq!(send(&app, "/", "bob").await, 200, "circuit open: fail open");

    let all = values(&snapshotter);
    let decisions = |outcome, reason| decided(&all, "fixed_window_anchored", outcome, reason);
    assert_eq!(decisions("allowed", "redis"), 3.0);
    assert_eq!(decisions("near_limit", "redis"), 2.0);
    assert_eq!(decisions("limited", "redis"), 1.0);
    assert_eq!(decisions("limited", "local_block"), 1.0);
    assert_eq!(decisions("allowed", "fail_open"), 2.0);
    let decided: f64 = all
        .iter()
        .filter(|(k, _)| k.key().name() == "redlimit_decisions_total")
        .map(|(_, v)| v)
        .sum();
    assert_eq!(decided, 9.0, "one decision per request, no more");

    let errors = |kind: &str| {
        value(
            &all,
            "redlimit_backend_errors_total",
            &[("policy", "fixed_window_anchored"), ("kind", kind)],
        )
    };
    assert_eq!(errors("backend") + errors("timeout"), 1.0, "{all:?}");
    assert_eq!(errors("corrupt_state") + errors("invalid_input"), 0.0);
    let guard_series = [("policy", "fixed_window_anchored")];
    assert_eq!(
        value(&all, "redlimit_service_failures_total", &guard_series),
        1.0
    );
    assert_eq!(
        value(&all, "redlimit_check_duration_seconds", &guard_series),
        7.0,
        "six round trips answered, one failed; none for the block or the open circuit"
    );
    assert_eq!(
        value(
            &all,
            "redlimit_circuit_open",
            &[("policy", "fixed_window_anchored"), ("circuit", "0")]
        ),
        1.0
    );
    for (key, _) in &all {
        assert_eq!(
            key.kind() == MetricKind::Histogram,
            key.key().name() == "redlimit_check_duration_seconds"
        );
        assert!(
            key.key().labels().all(|l| !l.value().contains("alice")),
            "never the client in a label: {key:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_lets_would_be_denials_pass_and_counts_them() {
    let server = RedisServer::start();
    let (guard, snapshotter) = recorded(|| {
        GuardedLimiter::builder(
            server.limiter(),
            policy(Algorithm::SlidingWindowLog, 3, 60_000, None),
        )
        .shadow(true)
        .build()
    });
    let stats = guard.clone();
    let app = keyed_app(guard);
    for _ in 0..10 {
        assert_eq!(send(&app, "/", "alice").await, 200);
    }
    let all = values(&snapshotter);
    let count = |outcome, reason| decided(&all, "sliding_window_log", outcome, reason);
    assert_eq!(count("limited", "shadow"), 7.0);
    assert_eq!(
        count("allowed", "redis") + count("near_limit", "redis"),
        3.0
    );
    assert_eq!(stats.stats().decided(Reason::Shadow), 7);
}

/// A concurrency limit's decisions are counted under its own name, with the set's others.
#[tokio::test]
async fn concurrency_decisions_are_counted_under_the_concurrency_policy() {
    let server = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _in_force = metrics::set_default_local_recorder(&recorder);
    // Limit 2: near the limit at 0 remaining (20% of 2, rounded down).
    let two = ConcurrencyPolicy::builder("in-flight")
        .limit(2)
        .build()
        .expect("a valid policy");
    let set =
        redlimit::PolicySet::from(policy(Algorithm::FixedWindowAnchored, 100, 3_600_000, None))
            .with_concurrency(two)
            .expect("a valid set");
    let guard = GuardedLimiter::builder(server.limiter(), set)
        .failure(FailurePolicy::Closed)
        .budget(Duration::from_secs(5))
        .build();

    let first = guard.check("alice").await;
    let second = guard.check("alice").await;
    let third = guard.check("alice").await;
    assert!(first.allowed() && second.allowed() && !third.allowed() && third.lease().is_none());
    drop(server);
    let down = guard.check("bob").await;
    assert_eq!(down[1].reason, Reason::FailClosed);

    let all = values(&snapshotter);
    let decisions = |outcome, reason| decided(&all, "in-flight", outcome, reason);
    assert_eq!(decisions("allowed", "redis"), 1.0);
    assert_eq!(decisions("near_limit", "redis"), 1.0);
    assert_eq!(decisions("limited", "redis"), 1.0);
    assert_eq!(decisions("limited", "fail_closed"), 1.0);
    let series: Vec<_> = all
        .iter()
        .filter(|(key, _)| key.key().labels().any(|l| l.value() == "in-flight"))
        .collect();
    let total: f64 = series.iter().map(|(_, v)| v).sum();
    assert_eq!(total, 4.0, "one decision per check: {series:?}");
    assert!(
        series.iter().all(|(key, _)| key
            .key()
            .labels()
            .all(|l| l.value() != "local_block" && l.value() != "shadow")),
        "leases are never cached locally nor shadowed: {series:?}"
    );
}
