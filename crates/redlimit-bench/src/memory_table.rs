//! Redis bytes per tracked key: the sliding log's growth with its limit.

use redlimit::PolicySet;
use redlimit::{Algorithm, Timestamp};

use crate::decisions::{admin, bytes_per_key, policy, redis_limiter};

/// `MEMORY USAGE` of one sliding-log key filled to its limit, for several limits.
pub(crate) async fn sliding_log_growth(url: &str) -> Vec<(u64, f64)> {
    let mut admin = admin(url);
    let limiter = redis_limiter(url, "growth");
    let now = Timestamp::now();
    let mut rows = Vec::new();
    for limit in [10, 100, 1_000, 10_000] {
        let p = policy(Algorithm::SlidingWindowLog, limit);
        let client = format!("full-{limit}");
        let decision = limiter
            .check(&PolicySet::from(p.clone()), &client)
            .cost(limit)
            .at(now)
            .await
            .map(|d| d[0].clone())
            .expect("filling the log");
        assert!(decision.allowed && decision.remaining == 0);
        let key = limiter.keys().key(&p, &client);
        if let Some(bytes) = bytes_per_key(&mut admin, std::iter::once(key)) {
            rows.push((limit, bytes));
        }
    }
    rows
}
