use std::{fmt, str::FromStr, sync::Arc, time::Duration};

use crate::{
    Ban, Grants, Override,
    backend::redis::protocol::MAX_GROUPED_WINDOW_LIMIT,
    config_error::{ConfigError, validate_name},
};

/// Largest integer every script computes with: Lua numbers are doubles, exact up to 2^53.
pub(crate) const MAX_EXACT: u64 = 1 << 53;
/// GCRA keeps `burst × emission interval` in microseconds beside the current time; 2^50 µs is
/// about 35 years, which leaves room for the clock without leaving the exact range.
const MAX_GCRA_TOLERANCE_US: u64 = 1 << 50;
/// The longest [`PolicyBuilder::max_delay`]: a waiting request holds a connection and memory.
const MAX_DELAY_MS: u64 = 3_600_000;
/// The sliding log stores one sorted-set member per admitted request, and a check may add as
/// many as its cost (at most the limit) in one script run: 10,000 keeps that run to a few tens
/// of milliseconds and the key near 1.3 MB (a cost of 1,000,000 blocked Redis for 3–4 s).
pub(crate) const MAX_LOG_LIMIT: u64 = 10_000;

/// How a [`Policy`] counts. Each is exact integer arithmetic, the same on Redis and in memory.
///
/// The names (`fixed_window`, `gcra`, …) are what [`FromStr`] accepts and [`Algorithm::name`]
/// returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Counts in calendar-aligned windows (`floor(now / window)`). Up to twice the limit can pass
    /// across a window boundary.
    FixedWindow,
    /// Counts in a window that starts at the client's first request.
    FixedWindowAnchored,
    /// Remembers each admitted request: never more than `limit` in any span of `window`. Its
    /// limit is at most 10,000, so that one check's work in Redis stays bounded.
    SlidingWindowLog,
    /// Weighted estimate `previous × (1 − elapsed / window) + current`, in constant memory.
    SlidingWindowCounter,
    /// `limit` tokens per `window`, a bucket of `burst` tokens.
    TokenBucket,
    /// Generic cell rate algorithm: `limit` per `window` spaced evenly, `burst` at once.
    Gcra,
}

impl Algorithm {
    /// Every algorithm, in a stable order.
    pub const ALL: [Self; 6] = [
        Self::FixedWindow,
        Self::FixedWindowAnchored,
        Self::SlidingWindowLog,
        Self::SlidingWindowCounter,
        Self::TokenBucket,
        Self::Gcra,
    ];

    /// The algorithm's configuration name, such as `sliding_window_log`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::FixedWindow => "fixed_window",
            Self::FixedWindowAnchored => "fixed_window_anchored",
            Self::SlidingWindowLog => "sliding_window_log",
            Self::SlidingWindowCounter => "sliding_window_counter",
            Self::TokenBucket => "token_bucket",
            Self::Gcra => "gcra",
        }
    }

    /// Whether the algorithm takes a `burst` separate from its `limit`.
    pub const fn has_burst(self) -> bool {
        matches!(self, Self::TokenBucket | Self::Gcra)
    }

    /// The short tag used in Redis key names and as the scripts' name of the algorithm (`fw`,
    /// `gcra`, …).
    pub const fn tag(self) -> &'static str {
        match self {
            Self::FixedWindow => "fw",
            Self::FixedWindowAnchored => "fwa",
            Self::SlidingWindowLog => "swl",
            Self::SlidingWindowCounter => "swc",
            Self::TokenBucket => "tb",
            Self::Gcra => "gcra",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| ConfigError::UnknownValue {
                field: "algorithm",
                value: s.to_owned(),
            })
    }
}

/// A named limit: an algorithm and its numbers, validated when built.
///
/// Cheap to clone. The name appears in Redis keys and in the `RateLimit-Policy` header; changing
/// any number changes the policy's keys, so old state is never read with new meaning.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Policy};
///
/// // 5 login attempts a minute, all 5 may come at once, then one every 12 s.
/// let login = Policy::builder("login", Algorithm::Gcra)
///     .limit(5)
///     .window(Duration::from_secs(60))
///     .build()?;
/// assert_eq!(login.burst(), 5);
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    inner: Arc<PolicyInner>,
}

#[derive(Debug, PartialEq, Eq)]
struct PolicyInner {
    name: Arc<str>,
    algorithm: Algorithm,
    limit: u64,
    window_ms: u64,
    burst: u64,
    /// `algorithm:window:limit[:burst]`, the end of every key of this policy.
    key_suffix: String,
    /// A fingerprint of the name and numbers, for the memory backend's key ids.
    fingerprint: u128,
    /// Delay mode (GCRA only): the longest a request may wait for its slot; 0 rejects instead.
    max_delay_ms: u64,
    /// Whether checks read a per-client override (see `Limiter::set_override`).
    overridable: bool,
    /// Denied clients are banned for a while after repeated denials.
    ban: Option<Ban>,
    /// Hot-key mode: a guard takes several units at once and spends them in process.
    grants: Option<Grants>,
    /// The key group whose one key per client holds this policy's state among its members'.
    key_group: Option<Arc<str>>,
}

impl Policy {
    /// Starts a policy named `name` (1 to 64 of `A-Z a-z 0-9 _ - .`) using `algorithm`.
    pub fn builder(name: impl Into<String>, algorithm: Algorithm) -> PolicyBuilder {
        PolicyBuilder {
            name: name.into(),
            algorithm,
            limit: None,
            window: None,
            burst: None,
            max_delay: None,
            overridable: false,
            ban: None,
            grants: None,
            key_group: None,
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.inner.algorithm
    }

    /// How many requests (of cost 1) a client may make per window.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// The window length.
    pub fn window(&self) -> Duration {
        Duration::from_millis(self.inner.window_ms)
    }

    /// How many requests a fresh client may make at once: `burst` for token bucket and GCRA,
    /// `limit` for the others.
    pub fn burst(&self) -> u64 {
        self.inner.burst
    }

    /// The most a client may hold at once while `limit` is in force (a
    /// [`Decision`](crate::Decision)'s `limit`): the [`burst`](Self::burst) under the policy's
    /// own limit, else that limit (an override's). A decision's `remaining` never exceeds it.
    pub fn quota(&self, limit: u64) -> u64 {
        if limit == self.limit() {
            self.burst()
        } else {
            limit
        }
    }

    /// Delay mode: how long a request over the limit may wait for its slot instead of being
    /// denied; see [`PolicyBuilder::max_delay`].
    pub fn max_delay(&self) -> Option<Duration> {
        (self.inner.max_delay_ms > 0).then(|| Duration::from_millis(self.inner.max_delay_ms))
    }

    /// The ban after repeated denials, if any; see [`PolicyBuilder::ban`].
    pub fn ban(&self) -> Option<&Ban> {
        self.inner.ban.as_ref()
    }

    /// Hot-key mode, if on; see [`PolicyBuilder::grants`].
    pub fn grants(&self) -> Option<Grants> {
        self.inner.grants
    }

    /// Whether checks of this policy read a per-client override; see
    /// [`PolicyBuilder::overrides`].
    pub fn takes_overrides(&self) -> bool {
        self.inner.overridable
    }

    /// The key group the policy keeps its state in, if any; see [`PolicyBuilder::key_group`].
    pub fn key_group(&self) -> Option<&str> {
        self.inner.key_group.as_deref()
    }

    /// What names the policy's keys around the client: its name and key suffix, or its key
    /// group's name and `group` (no policy's suffix, which is `algorithm:window`).
    pub(crate) fn key_parts(&self) -> (&str, &str) {
        match self.key_group() {
            Some(group) => (group, "group"),
            None => (self.name(), self.key_suffix()),
        }
    }

    /// The id of the policy's record in its key group's key: 46 bits of its fingerprint (its
    /// name, algorithm and window), so that the script reads it exactly and writes it as 14
    /// digits at most.
    pub(crate) fn record_id(&self) -> u64 {
        u64::try_from(self.inner.fingerprint >> 82).unwrap_or(0)
    }

    /// The policy a client with override `numbers` is checked by: this one's name and
    /// algorithm, the override's numbers (what it leaves out, this policy's; a burst it leaves
    /// out follows its limit), and keys of its own.
    pub(crate) fn overridden(&self, numbers: &Override) -> Result<Self, ConfigError> {
        let limit = numbers.limit.unwrap_or(self.inner.limit);
        let mut builder = Self::builder(self.name(), self.algorithm())
            .limit(limit)
            .window(numbers.window.unwrap_or_else(|| self.window()));
        if self.algorithm().has_burst() {
            let burst = match (numbers.burst, numbers.limit) {
                (Some(burst), _) => burst,
                (None, Some(limit)) => limit,
                (None, None) => self.burst(),
            };
            builder = builder.burst(burst);
        } else if let Some(burst) = numbers.burst {
            // Refused by `build`, naming the field.
            builder = builder.burst(burst);
        }
        builder.build()
    }

    pub(crate) fn max_delay_ms(&self) -> u64 {
        self.inner.max_delay_ms
    }

    /// The largest cost one request can ever be granted. A larger cost is denied for good.
    pub fn capacity(&self) -> u64 {
        self.inner.burst
    }

    /// The name, shared with every decision of this policy.
    pub(crate) fn shared_name(&self) -> Arc<str> {
        Arc::clone(&self.inner.name)
    }

    pub(crate) fn key_suffix(&self) -> &str {
        &self.inner.key_suffix
    }

    pub(crate) fn fingerprint(&self) -> u128 {
        self.inner.fingerprint
    }

    pub(crate) fn window_ms(&self) -> u64 {
        self.inner.window_ms
    }

    /// GCRA's emission interval: the window divided by the limit, rounded up to a microsecond so
    /// that no more than `limit` pass per window.
    pub(crate) fn interval_us(&self) -> u64 {
        (self.inner.window_ms * 1000).div_ceil(self.inner.limit)
    }
}

/// Builds a [`Policy`]; see [`Policy::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct PolicyBuilder {
    name: String,
    algorithm: Algorithm,
    limit: Option<u64>,
    window: Option<Duration>,
    burst: Option<u64>,
    max_delay: Option<Duration>,
    overridable: bool,
    ban: Option<Ban>,
    grants: Option<Grants>,
    key_group: Option<String>,
}

impl PolicyBuilder {
    /// Keeps the policy's state for a client in one Redis key with the other policies of key
    /// group `group` (a name as a policy's): a check of several of them reads that key once
    /// and writes it once, where a key each cost each policy its own commands and its own
    /// entry in Redis's keyspace. Decisions are the same either way. Defaults to a key of its
    /// own.
    ///
    /// For a fixed window (aligned or anchored), GCRA or token bucket, without overrides, bans,
    /// delay mode or grants; a fixed window's limit stays below 500,000. A set may mix grouped
    /// policies with policies of keys of their own. Checked together, up to two of a group's
    /// policies under one key are decided on the key's records at once (an anchored window
    /// takes the slower way, through its own Lua); give each set of policies checked together a
    /// group of its own. A policy that joins a group (or leaves one) starts every client
    /// afresh, as a renamed policy does. Resetting a client of a grouped policy resets the
    /// client's whole group. See the features guide's section on key groups.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, Policy, PolicySet};
    ///
    /// let per_minute = Policy::builder("per-minute", Algorithm::FixedWindow)
    ///     .limit(100)
    ///     .window(Duration::from_secs(60))
    ///     .key_group("api")
    ///     .build()?;
    /// let per_second = Policy::builder("per-second", Algorithm::Gcra)
    ///     .limit(5)
    ///     .window(Duration::from_secs(1))
    ///     .key_group("api")
    ///     .build()?;
    /// let both = PolicySet::new([per_minute, per_second])?;
    /// assert_eq!(both[0].key_group(), Some("api"));
    /// # Ok::<(), redlimit::ConfigError>(())
    /// ```
    pub fn key_group(mut self, group: impl Into<String>) -> Self {
        self.key_group = Some(group.into());
        self
    }

    /// Hot-key mode: a guard on Redis takes several units at once and spends them in process,
    /// with the bound on accuracy [`Grants`] writes down. Defaults to none: every check is
    /// exact. Not with [`ban`](Self::ban) or [`max_delay`](Self::max_delay).
    pub fn grants(mut self, grants: Grants) -> Self {
        self.grants = Some(grants);
        self
    }

    /// Bans a client after repeated denials (see [`Ban`]): decided in the check's own script
    /// call (the one for several policies), which reads the client's ban and counts its
    /// denials. Defaults to none. Not with [`max_delay`](Self::max_delay).
    pub fn ban(mut self, ban: Ban) -> Self {
        self.ban = Some(ban);
        self
    }

    /// Whether checks read a per-client override, set at run time for every instance by
    /// [`Limiter::set_override`](crate::Limiter::set_override): in the same script call (the
    /// one for several policies), one `GET` more per check. Setting or clearing one lifts the
    /// client's local blocks at every instance (see
    /// [`BlockCache`](crate::BlockCache)), so it takes effect at every instance's next request.
    /// Defaults to `false`, which reads nothing. Not with [`max_delay`](Self::max_delay).
    pub fn overrides(mut self, overridable: bool) -> Self {
        self.overridable = overridable;
        self
    }

    /// Requests of cost 1 allowed per window. Required; at most 10,000 for the sliding log, and
    /// for the others as large as exact integer arithmetic allows (`build` names the bound).
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// The window, a whole number of milliseconds. Required.
    pub fn window(mut self, window: Duration) -> Self {
        self.window = Some(window);
        self
    }

    /// For token bucket and GCRA: how many requests a fresh client may make at once.
    /// Defaults to `limit`. Setting it for another algorithm is a [`ConfigError`].
    pub fn burst(mut self, burst: u64) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Delay mode, for GCRA: a request that would be denied but whose slot comes within
    /// `max_delay` is admitted with [`Decision::delay`](crate::Decision::delay) set, its slot
    /// reserved in the same atomic check (so concurrent waiters, in any process, get distinct
    /// slots), and the caller waits that long before serving it; the tower layer does.
    /// A request whose slot is further away is denied, its `retry_after` being when it would
    /// come within `max_delay`. A whole number of milliseconds, at most one hour. Defaults to
    /// none (deny). A policy in delay mode is checked alone, not with others.
    pub fn max_delay(mut self, max_delay: Duration) -> Self {
        self.max_delay = Some(max_delay);
        self
    }

    /// Validates the numbers and builds the policy.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field: a missing or zero limit or window, a window that is not
    /// whole milliseconds, a burst on an algorithm without one, or numbers so large that the
    /// integer arithmetic could not stay exact.
    pub fn build(self) -> Result<Policy, ConfigError> {
        validate_name("policy name", &self.name)?;
        let algorithm = self.algorithm;
        let limit = self.limit.ok_or(ConfigError::Missing { field: "limit" })?;
        let window = self
            .window
            .ok_or(ConfigError::Missing { field: "window" })?;
        if limit == 0 {
            return Err(ConfigError::Zero { field: "limit" });
        }
        if window.subsec_nanos() % 1_000_000 != 0 {
            return Err(ConfigError::NotWholeMillis { field: "window" });
        }
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(u64::MAX);
        if window_ms == 0 {
            return Err(ConfigError::Zero { field: "window" });
        }
        // Microseconds of the window must stay exact (GCRA works in them).
        let max_window_ms = MAX_EXACT / 1000;
        if window_ms > max_window_ms {
            return Err(ConfigError::TooLarge {
                field: "window",
                max: max_window_ms,
            });
        }
        let burst = match self.burst {
            Some(_) if !algorithm.has_burst() => {
                return Err(ConfigError::NotApplicable {
                    field: "burst",
                    algorithm: algorithm.name(),
                });
            }
            Some(0) => return Err(ConfigError::Zero { field: "burst" }),
            Some(burst) => burst,
            None => limit,
        };
        let max_limit = match algorithm {
            Algorithm::SlidingWindowLog => MAX_LOG_LIMIT,
            // Weighted counts and refills are kept as count × window.
            _ => MAX_EXACT / window_ms,
        };
        if limit > max_limit {
            return Err(ConfigError::TooLarge {
                field: "limit",
                max: max_limit,
            });
        }
        let max_burst = match algorithm {
            Algorithm::TokenBucket => MAX_EXACT / window_ms,
            Algorithm::Gcra => MAX_GCRA_TOLERANCE_US / (window_ms * 1000).div_ceil(limit),
            _ => u64::MAX,
        };
        if burst > max_burst {
            return Err(ConfigError::TooLarge {
                field: "burst",
                max: max_burst,
            });
        }
        let key_suffix = format!("{}:{window_ms}", algorithm.tag());
        let fingerprint = fingerprint(&[&self.name, &key_suffix]);
        let max_delay_ms = match self.max_delay {
            None => 0,
            Some(_) if algorithm != Algorithm::Gcra => {
                return Err(ConfigError::NotApplicable {
                    field: "max_delay",
                    algorithm: algorithm.name(),
                });
            }
            Some(delay) if delay.subsec_nanos() % 1_000_000 != 0 => {
                return Err(ConfigError::NotWholeMillis { field: "max_delay" });
            }
            Some(delay) => match u64::try_from(delay.as_millis()).unwrap_or(u64::MAX) {
                0 => return Err(ConfigError::Zero { field: "max_delay" }),
                ms if ms > MAX_DELAY_MS => {
                    return Err(ConfigError::TooLarge {
                        field: "max_delay",
                        max: MAX_DELAY_MS,
                    });
                }
                ms => ms,
            },
        };
        if self.overridable && max_delay_ms > 0 {
            return Err(ConfigError::Conflict {
                field: "overrides",
                with: "max_delay",
            });
        }
        if self.ban.is_some() && max_delay_ms > 0 {
            return Err(ConfigError::Conflict {
                field: "ban",
                with: "max_delay",
            });
        }
        if let Some(ban) = &self.ban {
            ban.millis()?;
        }
        let grants = match self.grants {
            Some(_) if self.ban.is_some() => {
                return Err(ConfigError::Conflict {
                    field: "grants",
                    with: "ban (every denial must reach the backend to count)",
                });
            }
            Some(_) if max_delay_ms > 0 => {
                return Err(ConfigError::Conflict {
                    field: "grants",
                    with: "max_delay",
                });
            }
            Some(grants) => Some(grants.validated(burst, window_ms)?),
            None => None,
        };
        let key_group = match self.key_group {
            Some(group) => {
                validate_name("key_group", &group)?;
                let grouped = [
                    (self.overridable, "overrides"),
                    (self.ban.is_some(), "ban"),
                    (max_delay_ms > 0, "max_delay"),
                    (grants.is_some(), "grants"),
                ];
                if let Some((_, with)) = grouped.into_iter().find(|(set, _)| *set) {
                    return Err(ConfigError::Conflict {
                        field: "key_group",
                        with,
                    });
                }
                match algorithm {
                    Algorithm::FixedWindow | Algorithm::FixedWindowAnchored
                        if limit >= MAX_GROUPED_WINDOW_LIMIT =>
                    {
                        return Err(ConfigError::TooLarge {
                            field: "limit",
                            max: MAX_GROUPED_WINDOW_LIMIT - 1,
                        });
                    }
                    Algorithm::SlidingWindowLog | Algorithm::SlidingWindowCounter => {
                        return Err(ConfigError::NotApplicable {
                            field: "key_group",
                            algorithm: algorithm.name(),
                        });
                    }
                    _ => Some(Arc::from(group)),
                }
            }
            None => None,
        };
        Ok(Policy {
            inner: Arc::new(PolicyInner {
                fingerprint,
                name: self.name.into(),
                algorithm,
                limit,
                window_ms,
                burst,
                key_suffix,
                max_delay_ms,
                overridable: self.overridable,
                ban: self.ban,
                grants,
                key_group,
            }),
        })
    }
}

/// 128 bits of the SHA-1 of `parts`, each ended by a byte no part holds.
pub(crate) fn fingerprint(parts: &[&str]) -> u128 {
    let mut sha1 = sha1_smol::Sha1::new();
    for part in parts {
        sha1.update(part.as_bytes());
        sha1.update(&[0xff]);
    }
    let digest = sha1.digest().bytes();
    let mut first = [0_u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_le_bytes(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn build(algorithm: Algorithm, limit: u64, window: Duration) -> Result<Policy, ConfigError> {
        Policy::builder("p", algorithm)
            .limit(limit)
            .window(window)
            .build()
    }

    #[test]
    fn names_round_trip() {
        for a in Algorithm::ALL {
            assert_eq!(a.name().parse::<Algorithm>(), Ok(a));
        }
        assert!(matches!(
            "leaky".parse::<Algorithm>(),
            Err(ConfigError::UnknownValue {
                field: "algorithm",
                ..
            })
        ));
    }

    #[test]
    fn rejects_bad_numbers_naming_the_field() {
        let min = Duration::from_secs(60);
        let cases = [
            (build(Algorithm::Gcra, 0, min), "limit must be at least 1"),
            (
                build(Algorithm::Gcra, 1, Duration::ZERO),
                "window must be at least 1",
            ),
            (
                build(Algorithm::Gcra, 1, Duration::from_micros(1500)),
                "window must be a whole number of milliseconds",
            ),
            (
                build(Algorithm::SlidingWindowLog, 10_001, min),
                "limit is too large (at most 10000)",
            ),
            (
                build(Algorithm::FixedWindow, u64::MAX, min),
                "limit is too large (at most 150119987579)",
            ),
            (
                build(Algorithm::TokenBucket, 1, Duration::from_secs(u64::MAX)),
                "window is too large (at most 9007199254740)",
            ),
        ];
        for (result, message) in cases {
            assert_eq!(result.map(|_| ()).unwrap_err().to_string(), message);
        }
    }

    #[test]
    fn burst_only_where_it_applies() {
        let err = Policy::builder("p", Algorithm::FixedWindow)
            .limit(1)
            .window(Duration::from_secs(1))
            .burst(3)
            .build()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "burst does not apply to the fixed_window algorithm"
        );
        let zero = Policy::builder("p", Algorithm::Gcra)
            .limit(1)
            .window(Duration::from_secs(1))
            .burst(0)
            .build();
        assert_eq!(zero, Err(ConfigError::Zero { field: "burst" }));
        let huge = Policy::builder("p", Algorithm::Gcra)
            .limit(1)
            .window(Duration::from_secs(86_400))
            .burst(u64::MAX)
            .build();
        assert!(matches!(
            huge,
            Err(ConfigError::TooLarge { field: "burst", .. })
        ));
    }

    #[test]
    fn rejects_names_that_could_break_keys() {
        for name in ["", "a b", "a{b}", "a:b", &"x".repeat(65)] {
            let err = Policy::builder(name, Algorithm::Gcra)
                .limit(1)
                .window(Duration::from_secs(1))
                .build()
                .unwrap_err();
            assert!(matches!(err, ConfigError::InvalidName { .. }), "{name}");
        }
    }

    #[test]
    fn missing_fields_are_named() {
        let err = Policy::builder("p", Algorithm::Gcra).limit(1).build();
        assert_eq!(err, Err(ConfigError::Missing { field: "window" }));
    }
}
