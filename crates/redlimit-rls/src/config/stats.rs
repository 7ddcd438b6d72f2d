//! A rule's counters under envoyproxy/ratelimit's names, as its Prometheus mapping exposes them
//! (`ratelimit_service_rate_limit_total_hits{domain, key1, key2}`, …), so that dashboards built
//! on that service carry over. Labels are the rule's place in the tree, never a client's value.

use metrics::{Counter, counter};

/// The share of a limit past which admitted hits count as near it: that service's default.
const NEAR_LIMIT_RATIO: f64 = 0.8;

/// One rule's counters, registered when the configuration is loaded.
#[derive(Debug)]
pub(crate) struct RuleStats {
    total_hits: Counter,
    over_limit: Counter,
    near_limit: Counter,
    within_limit: Counter,
    shadow_mode: Counter,
}

impl RuleStats {
    /// The counters of the rule at `path` (`domain.key1.key2…`): labelled by its domain and its
    /// first two levels.
    pub(crate) fn new(path: &str) -> Self {
        let mut levels = path.splitn(4, '.');
        let domain = levels.next().unwrap_or_default().to_owned();
        let key1 = levels.next().unwrap_or_default().to_owned();
        let key2 = levels.next().unwrap_or_default().to_owned();
        let labels = [("domain", domain), ("key1", key1), ("key2", key2)];
        let series = |name: &'static str| counter!(name, &labels);
        Self {
            total_hits: series("ratelimit_service_rate_limit_total_hits"),
            over_limit: series("ratelimit_service_rate_limit_over_limit"),
            near_limit: series("ratelimit_service_rate_limit_near_limit"),
            within_limit: series("ratelimit_service_rate_limit_within_limit"),
            shadow_mode: series("ratelimit_service_rate_limit_shadow_mode"),
        }
    }

    /// Counts `hits` of a check answered `denied` (`shadow`: let through), with `remaining` of
    /// `limit` left after it.
    pub(crate) fn count(&self, hits: u64, denied: bool, shadow: bool, remaining: u64, limit: u64) {
        self.total_hits.increment(hits);
        if denied {
            self.over_limit.increment(hits);
            if shadow {
                self.shadow_mode.increment(hits);
            }
            return;
        }
        self.within_limit.increment(hits);
        // Past the near-limit threshold: used beyond 80% of the limit.
        let used = limit.saturating_sub(remaining) as f64;
        if used > limit as f64 * NEAR_LIMIT_RATIO {
            self.near_limit.increment(hits);
        }
    }
}
