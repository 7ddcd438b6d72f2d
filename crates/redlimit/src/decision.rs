use std::{sync::Arc, time::Duration};

/// The answer to one check of one policy.
///
/// For a check of several policies together, each policy gets its own `Decision` and the request
/// passes only if every one of them is `allowed`; see [`Limiter::check`](crate::Limiter::check).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Decision {
    /// Whether this policy admits the request.
    pub allowed: bool,
    /// The policy's limit (requests of cost 1 per window).
    pub limit: u64,
    /// How many more requests of cost 1 would be admitted right now, after this one.
    pub remaining: u64,
    /// How long until the client's whole quota is available again if it sends nothing more;
    /// zero when it already is. Whole milliseconds.
    pub reset_after: Duration,
    /// Set only when denied (or, with [`Reason::Shadow`], when it would have been): how long until a request of the same cost could pass, or
    /// [`RetryAfter::Never`] when the cost is larger than the policy ever grants.
    pub retry_after: Option<RetryAfter>,
    /// Delay mode (see [`PolicyBuilder::max_delay`](crate::PolicyBuilder::max_delay)): how
    /// long an admitted request must wait for its slot before it is served; zero otherwise.
    pub delay: Duration,
    /// The policy's name.
    pub policy: Arc<str>,
    /// Which path decided.
    pub reason: Reason,
    /// Denied because the client is banned after repeated denials (see
    /// [`Ban`](crate::Ban)); `retry_after` is when the ban ends.
    pub banned: bool,
    /// The window in force: the policy's, or the client's override's
    /// ([`Override`](crate::Override)); zero for a concurrency limit.
    pub window: Duration,
    /// The burst in force (what a fresh client may take at once: a token bucket's or GCRA's
    /// burst, the limit for the others): the policy's, or the client's override's.
    pub burst: u64,
    /// Whether a per-client override put other numbers in force (`limit`, `window`, `burst`)
    /// than the policy's.
    pub overridden: bool,
}

/// When a denied request could be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RetryAfter {
    /// After this long (whole milliseconds, rounded up).
    After(Duration),
    /// Never: the cost exceeds the policy's capacity.
    Never,
}

/// Which path produced a [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Reason {
    /// Decided by a script on Redis.
    Redis,
    /// Decided by the in-process memory backend, configured as the backend.
    Memory,
    /// Denied locally, without a Redis command, because the key is known to be blocked.
    LocalBlock,
    /// Allowed because the backend failed and the failure policy is to fail open.
    FailOpen,
    /// Denied because the backend failed and the failure policy is to fail closed.
    FailClosed,
    /// Decided by the local in-memory limiter standing in for a failed backend.
    Fallback,
    /// Would have been denied, and allowed because the guard is in shadow (dry-run) mode; see
    /// [`GuardBuilder::shadow`](crate::GuardBuilder::shadow). `remaining`, `reset_after`
    /// and `retry_after` are the denial's.
    Shadow,
    /// Allowed in process from units this instance took from Redis in advance (hot-key mode;
    /// see [`Grants`](crate::Grants)).
    Grant,
}

impl Reason {
    /// A short lower-case name, for logs and metrics labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Redis => "redis",
            Self::Memory => "memory",
            Self::LocalBlock => "local_block",
            Self::FailOpen => "fail_open",
            Self::FailClosed => "fail_closed",
            Self::Fallback => "fallback",
            Self::Shadow => "shadow",
            Self::Grant => "grant",
        }
    }

    /// How many reasons there are.
    pub(crate) const COUNT: usize = 8;

    /// A distinct index below [`COUNT`](Self::COUNT), for tables of counters.
    pub(crate) const fn index(self) -> usize {
        match self {
            Self::Redis => 0,
            Self::Memory => 1,
            Self::LocalBlock => 2,
            Self::FailOpen => 3,
            Self::FailClosed => 4,
            Self::Fallback => 5,
            Self::Shadow => 6,
            Self::Grant => 7,
        }
    }
}
