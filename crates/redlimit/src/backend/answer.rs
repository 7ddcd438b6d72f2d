//! What a backend answers for one policy, on Redis and in memory alike.

use crate::algorithm::{Denial, View};

/// One policy's answer from the script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) view: View,
    pub(crate) denial: Option<Denial>,
    /// Delay mode: how long an admitted request waits for its slot, in milliseconds.
    pub(crate) delay_ms: u64,
    /// Denied by a ban.
    pub(crate) banned: bool,
}

impl Answer {
    pub(crate) const fn denied(view: View, denial: Denial) -> Self {
        Self {
            view,
            denial: Some(denial),
            delay_ms: 0,
            banned: false,
        }
    }

    /// Denied by a ban that ends in `left_ms`.
    pub(crate) const fn banned(view: View, left_ms: u64) -> Self {
        Self {
            view,
            denial: Some(Denial::RetryAfterMs(left_ms)),
            delay_ms: 0,
            banned: true,
        }
    }

    pub(crate) const fn allowed(view: View, delay_ms: u64) -> Self {
        Self {
            view,
            denial: None,
            delay_ms,
            banned: false,
        }
    }
}

/// What the inspect script read: the decision of its cost (the quota as it is, nothing
/// consumed), the key's time to live, and its state as field, value pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Inspected {
    pub(crate) answer: Answer,
    pub(crate) ttl_ms: Option<u64>,
    pub(crate) state: Vec<(String, String)>,
    /// The limit in force and the key read, when an override named others than the policy's.
    pub(crate) overridden: Option<(u64, String)>,
}
