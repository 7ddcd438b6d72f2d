use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time, in whole microseconds since the Unix epoch.
///
/// By default every check uses the backend's clock (Redis `TIME`, so app servers with skewed
/// clocks agree). Pass a `Timestamp` to [`CheckRequest::at`](crate::CheckRequest::at) to decide
/// at an explicit time instead: tests and deterministic replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros)
    }

    /// `millis` milliseconds after the Unix epoch (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1000))
    }

    /// This process's wall clock now.
    pub fn now() -> Self {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Self(u64::try_from(since.as_micros()).unwrap_or(u64::MAX))
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }
}

impl std::ops::Add<Duration> for Timestamp {
    type Output = Self;

    /// Later by `d` (saturating).
    fn add(self, d: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        )
    }
}
