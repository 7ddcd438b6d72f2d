//! Exact vectors written from the algorithms' definitions (DESIGN.md), run with explicit times on
//! real Redis and in memory. Each row: time after T0 (ms), cost, then the expected allowed,
//! remaining, reset (ms) and retry (ms; -1 allowed, -2 never).

use redlimit::{Algorithm, Limiter};
use redlimit_tests::RedisServer;

use crate::support::{T0, alone, at_ms, both_backends, policy, retry_code};

type Row = (u64, u64, bool, u64, u64, i64);

/// A policy and the rows it must produce from a fresh start.
pub(crate) struct Table {
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: Option<u64>,
    rows: &'static [Row],
}

/// Runs `table` on `limiter` for a client of its own.
pub(crate) async fn check_table(limiter: &Limiter, backend: &str, table: &Table) {
    let (algorithm, limit) = (table.algorithm, table.limit);
    let policy = policy(algorithm, limit, table.window_ms, table.burst);
    let client = format!("{algorithm}-{}-{limit}", table.window_ms);
    for (step, &(t, cost, allowed, remaining, reset, retry)) in table.rows.iter().enumerate() {
        let decision = limiter
            .check(&alone(&policy), &client)
            .cost(cost)
            .at(at_ms(T0 + t))
            .await
            .expect("check")[0]
            .clone();
        let got = (
            decision.allowed,
            decision.remaining,
            u64::try_from(decision.reset_after.as_millis()).expect("small"),
            retry_code(&decision),
        );
        assert_eq!(
            got,
            (allowed, remaining, reset, retry),
            "{algorithm} on {backend}, step {} (t={t}, cost={cost})",
            step + 1
        );
        assert_eq!(decision.limit, limit);
    }
}

/// Every table, then the all-or-nothing scenario of several policies, on `limiter`: what each
/// other topology must answer exactly as a standalone server does.
pub(crate) async fn exact_answers(limiter: &Limiter, backend: &str) {
    for table in TABLES {
        check_table(limiter, backend, table).await;
    }
    crate::multi_policy::all_or_nothing(limiter, backend).await;
}

async fn run(table: &Table) {
    let server = RedisServer::start();
    for (backend, limiter) in both_backends(&server) {
        check_table(&limiter, backend, table).await;
    }
}

// limit 3 per 10 s, windows start at multiples of 10 s.
const FIXED_WINDOW_ALIGNED: Table = Table {
    algorithm: Algorithm::FixedWindow,
    limit: 3,
    window_ms: 10_000,
    burst: None,
    rows: &[
        (0, 1, true, 2, 10_000, -1),
        (1_000, 1, true, 1, 9_000, -1),
        (2_000, 0, true, 1, 8_000, -1),     // a peek consumes nothing
        (3_000, 2, false, 1, 7_000, 7_000), // denied: the 1 left stays
        (3_000, 1, true, 0, 7_000, -1),
        (9_999, 1, false, 0, 1, 1),
        (9_999, 4, false, 0, 1, -2),      // more than the limit: never
        (10_000, 3, true, 0, 10_000, -1), // a new window: the whole limit again
        (19_999, 1, false, 0, 1, 1),
        (25_000, 0, true, 3, 0, -1),
    ],
};

#[tokio::test]
async fn fixed_window_aligned() {
    run(&FIXED_WINDOW_ALIGNED).await;
}

// limit 3 per 10 s, the window opens at the first hit (t = 500).
const FIXED_WINDOW_ANCHORED: Table = Table {
    algorithm: Algorithm::FixedWindowAnchored,
    limit: 3,
    window_ms: 10_000,
    burst: None,
    rows: &[
        (500, 1, true, 2, 10_000, -1),
        (9_000, 2, true, 0, 1_500, -1),
        (10_000, 1, false, 0, 500, 500), // an aligned window would have reset here
        (10_499, 0, true, 0, 1, -1),
        (10_500, 1, true, 2, 10_000, -1),
        (10_600, 5, false, 2, 9_900, -2),
    ],
};

#[tokio::test]
async fn fixed_window_anchored() {
    run(&FIXED_WINDOW_ANCHORED).await;
}

// limit 3 in any 10 s; an entry at t counts while t > now - 10 s.
const SLIDING_WINDOW_LOG: Table = Table {
    algorithm: Algorithm::SlidingWindowLog,
    limit: 3,
    window_ms: 10_000,
    burst: None,
    rows: &[
        (0, 1, true, 2, 10_000, -1),
        (4_000, 1, true, 1, 10_000, -1),
        (6_000, 1, true, 0, 10_000, -1),
        (9_000, 1, false, 0, 7_000, 1_000), // the entry at 0 leaves at 10 000
        (10_000, 1, true, 0, 10_000, -1),
        (10_000, 2, false, 0, 10_000, 6_000), // entries at 4 000 and 6 000 must leave
        (14_000, 0, true, 1, 6_000, -1),
        (14_000, 4, false, 1, 6_000, -2),
        (30_000, 0, true, 3, 0, -1),
    ],
};

#[tokio::test]
async fn sliding_window_log() {
    run(&SLIDING_WINDOW_LOG).await;
}

// limit 10 per 10 s; estimate = prev × (10 000 − elapsed) / 10 000 + curr.
const SLIDING_WINDOW_COUNTER: Table = Table {
    algorithm: Algorithm::SlidingWindowCounter,
    limit: 10,
    window_ms: 10_000,
    burst: None,
    rows: &[
        (0, 4, true, 6, 20_000, -1),
        (5_000, 6, true, 0, 15_000, -1),
        // next window, elapsed 2 000: 10 × 0.8 = 8 used.
        (12_000, 1, true, 1, 18_000, -1),
        // 8 + 1 + 2 > 10; at elapsed 3 000: 10 × 0.7 + 1 + 2 = 10.
        (12_000, 2, false, 1, 18_000, 1_000),
        (13_000, 2, true, 0, 17_000, -1),
        // 10 more only fit once this window's 3 stop weighing: at t = 30 000.
        (13_000, 10, false, 0, 17_000, 17_000),
        (13_000, 11, false, 0, 17_000, -2),
        // window 2, elapsed 5 000: 3 × 0.5 = 1.5 used.
        (25_000, 0, true, 8, 5_000, -1),
    ],
};

#[tokio::test]
async fn sliding_window_counter() {
    run(&SLIDING_WINDOW_COUNTER).await;
}

// 5 tokens per 10 s (one per 2 s), a bucket of 3.
const TOKEN_BUCKET: Table = Table {
    algorithm: Algorithm::TokenBucket,
    limit: 5,
    window_ms: 10_000,
    burst: Some(3),
    rows: &[
        (0, 1, true, 2, 2_000, -1),
        (0, 2, true, 0, 6_000, -1),
        (1_000, 1, false, 0, 5_000, 1_000), // half a token so far
        (2_000, 1, true, 0, 6_000, -1),
        (2_000, 4, false, 0, 6_000, -2), // more than the bucket holds
        (3_000, 0, true, 0, 5_000, -1),
        (20_000, 0, true, 3, 0, -1),
    ],
};

#[tokio::test]
async fn token_bucket() {
    run(&TOKEN_BUCKET).await;
}

// DESIGN.md's example: limit 5, window 60 s, burst 5 admits 5 at once, then one every 12 s.
const GCRA: Table = Table {
    algorithm: Algorithm::Gcra,
    limit: 5,
    window_ms: 60_000,
    burst: Some(5),
    rows: &[
        (0, 1, true, 4, 12_000, -1),
        (0, 1, true, 3, 24_000, -1),
        (0, 1, true, 2, 36_000, -1),
        (0, 1, true, 1, 48_000, -1),
        (0, 1, true, 0, 60_000, -1),
        (0, 1, false, 0, 60_000, 12_000),
        (11_999, 1, false, 0, 48_001, 1),
        (12_000, 1, true, 0, 60_000, -1),
        (12_000, 6, false, 0, 60_000, -2),
        (36_000, 2, true, 0, 60_000, -1),
        (200_000, 0, true, 5, 0, -1),
    ],
};

#[tokio::test]
async fn gcra() {
    run(&GCRA).await;
}

// 3 per second: an interval of 333 334 µs, rounded up so no more than 3 pass per second.
const GCRA_KEEPS_SUB_MILLISECOND_INTERVALS_EXACT: Table = Table {
    algorithm: Algorithm::Gcra,
    limit: 3,
    window_ms: 1_000,
    burst: Some(1),
    rows: &[
        (0, 1, true, 0, 334, -1),
        (333, 1, false, 0, 1, 1),
        (334, 1, true, 0, 334, -1),
        (667, 1, false, 0, 1, 1),
        (668, 1, true, 0, 334, -1),
    ],
};

#[tokio::test]
async fn gcra_keeps_sub_millisecond_intervals_exact() {
    run(&GCRA_KEEPS_SUB_MILLISECOND_INTERVALS_EXACT).await;
}

/// Every table, for running on other topologies.
pub(crate) const TABLES: [&Table; 7] = [
    &FIXED_WINDOW_ALIGNED,
    &FIXED_WINDOW_ANCHORED,
    &SLIDING_WINDOW_LOG,
    &SLIDING_WINDOW_COUNTER,
    &TOKEN_BUCKET,
    &GCRA,
    &GCRA_KEEPS_SUB_MILLISECOND_INTERVALS_EXACT,
];
