//! Per-client usage of one route, summarized: what `redlimit suggest` prints.

use serde::Serialize;

/// The distribution of per-client usage in one route's live keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Distribution {
    /// Clients with live state.
    pub(crate) clients: usize,
    /// Median usage per window.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// The busiest client's usage.
    pub(crate) max: u64,
    /// The share of clients a request would be denied for right now.
    pub(crate) limited_share: f64,
    /// `p99 × headroom`, rounded up: a limit that the busiest 1% of clients would just reach.
    pub(crate) suggested_limit: u64,
}

impl Distribution {
    /// Summarizes `used` (one value per client), of which `limited` are at their limit;
    /// `None` for no client.
    pub(crate) fn of(mut used: Vec<u64>, limited: usize, headroom: f64) -> Option<Self> {
        if used.is_empty() {
            return None;
        }
        used.sort_unstable();
        let p99 = percentile(&used, 99);
        Some(Self {
            clients: used.len(),
            p50: percentile(&used, 50),
            p90: percentile(&used, 90),
            p99,
            max: used[used.len() - 1],
            #[allow(clippy::cast_precision_loss)]
            limited_share: limited as f64 / used.len() as f64,
            suggested_limit: suggested(p99, headroom),
        })
    }
}

/// The nearest-rank percentile of `sorted` (ascending, not empty): the smallest value that at
/// least `p`% of the values are at or below.
fn percentile(sorted: &[u64], p: usize) -> u64 {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// `p99 × headroom` rounded up, at least 1.
fn suggested(p99: u64, headroom: f64) -> u64 {
    // Usages are request counts, far below 2^53: exact as doubles.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let limit = (p99 as f64 * headroom).ceil() as u64;
    limit.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<u64> = (1..=100).collect();
        let d = Distribution::of(values, 3, 1.5).expect("clients");
        assert_eq!((d.p50, d.p90, d.p99, d.max), (50, 90, 99, 100));
        assert_eq!(d.suggested_limit, 149);
        assert!((d.limited_share - 0.03).abs() < 1e-9);
        let one = Distribution::of(vec![7], 0, 1.0).expect("a client");
        assert_eq!(
            (one.p50, one.p99, one.max, one.suggested_limit),
            (7, 7, 7, 7)
        );
        assert_eq!(Distribution::of(Vec::new(), 0, 1.5), None);
        assert_eq!(suggested(0, 2.0), 1);
    }
}
