//! Per-client overrides: other numbers for one client of a policy, set at run time.

use std::time::Duration;

/// Other numbers for one client of a policy that [takes overrides](crate::PolicyBuilder::overrides),
/// set by [`Limiter::set_override`](crate::Limiter::set_override): a partner's higher quota, a
/// noisy client's lower one. What it leaves out is the policy's; a burst it leaves out follows
/// its limit. The client's state is read under these numbers while the override is in force,
/// and under the policy's again when it ends: what it used counts under both (an override with
/// another window counts under a key of that window).
///
/// ```
/// use std::time::Duration;
/// use redlimit::Override;
///
/// let partner = Override::default().limit(10_000).window(Duration::from_secs(60));
/// # let _ = partner;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Override {
    /// Requests per window; `None` keeps the policy's.
    pub limit: Option<u64>,
    /// The window; `None` keeps the policy's.
    pub window: Option<Duration>,
    /// For token bucket and GCRA; `None` follows the override's limit, or keeps the policy's
    /// burst when the limit is the policy's too.
    pub burst: Option<u64>,
}

impl Override {
    /// Requests per window.
    #[must_use]
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The window.
    #[must_use]
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// For token bucket and GCRA: how many at once.
    #[must_use]
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }
}
