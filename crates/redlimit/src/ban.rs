//! Bans: a client denied again and again is denied outright for a while.

use std::time::Duration;

use crate::ConfigError;

/// After more than `after` denials within `within`, a client is denied for `duration` without
/// being counted, by every instance (the ban lives in Redis with its TTL, and a guard's local
/// block cache keeps it too); with [`max`](Self::max), each repeat doubles the ban up to that
/// maximum. Set on a policy with [`PolicyBuilder::ban`](crate::PolicyBuilder::ban); counted
/// and decided in the check's own script call.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Ban, Policy};
///
/// let minute = Duration::from_secs(60);
/// // The 6th denial within a minute bans for 15 minutes, then 30, 60, … up to a day.
/// let ban = Ban::new(5, minute, 15 * minute).max(24 * 60 * minute);
/// let login = Policy::builder("login", Algorithm::Gcra)
///     .limit(5)
///     .window(minute)
///     .ban(ban)
///     .build()?;
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ban {
    after: u64,
    within: Duration,
    duration: Duration,
    max: Option<Duration>,
}

/// The longest ban, and the longest span denials are counted over: 30 days.
const LONGEST: Duration = Duration::from_secs(30 * 86_400);

impl Ban {
    /// More than `after` denials within `within` ban for `duration`.
    pub fn new(after: u64, within: Duration, duration: Duration) -> Self {
        Self {
            after,
            within,
            duration,
            max: None,
        }
    }

    /// Each repeat doubles the ban, up to `max`; repeats are remembered for `max` after a ban
    /// ends. Defaults to none: every ban lasts `duration`.
    #[must_use]
    pub fn max(mut self, max: Duration) -> Self {
        self.max = Some(max);
        self
    }

    /// How many denials within [`within`](Self::within) are let go before a ban.
    pub fn after(&self) -> u64 {
        self.after
    }

    /// The span denials are counted over.
    pub fn within(&self) -> Duration {
        self.within
    }

    /// How long a first ban lasts.
    pub fn duration(&self) -> Duration {
        self.duration
    }

    /// The longest a repeated ban lasts, if bans escalate.
    pub fn max_duration(&self) -> Option<Duration> {
        self.max
    }

    /// The numbers as the scripts take them, in milliseconds: after, within, for, max (0: no
    /// escalation); or the field at fault.
    pub(crate) fn millis(&self) -> Result<[u64; 4], ConfigError> {
        let ms = |field: &'static str, d: Duration| {
            if !d.subsec_nanos().is_multiple_of(1_000_000) {
                return Err(ConfigError::NotWholeMillis { field });
            }
            if d.is_zero() {
                return Err(ConfigError::Zero { field });
            }
            if d > LONGEST {
                return Err(ConfigError::TooLarge {
                    field,
                    max: u64::try_from(LONGEST.as_millis()).unwrap_or(u64::MAX),
                });
            }
            Ok(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        };
        let within = ms("ban.within", self.within)?;
        let duration = ms("ban.for", self.duration)?;
        let max = match self.max {
            None => 0,
            Some(max) if max < self.duration => {
                return Err(ConfigError::Conflict {
                    field: "ban.max",
                    with: "a ban.for longer than it",
                });
            }
            Some(max) => ms("ban.max", max)?,
        };
        if self.after > 1_000_000 {
            return Err(ConfigError::TooLarge {
                field: "ban.after",
                max: 1_000_000,
            });
        }
        Ok([self.after, within, duration, max])
    }
}
