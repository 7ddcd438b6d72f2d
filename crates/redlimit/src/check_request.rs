use std::{fmt, future::Future, pin::Pin, time::Duration};

use crate::{Decisions, PolicySet, Timestamp};

/// One check of a [`PolicySet`] for one client, built as a value and decided when awaited.
///
/// Made by [`Limiter::check`](crate::Limiter::check) (awaited: `Result<Decisions, Error>`) or
/// [`GuardedLimiter::check`](crate::GuardedLimiter::check) (awaited: [`Decisions`], whatever
/// the backend does). Its options compose: a request of cost 3, counted once per request id,
/// reserved for a settle, at an explicit time, is one check and, on Redis, one script call.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet, Timestamp};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryBackend::default());
/// let uploads = PolicySet::from(
///     Policy::builder("uploads", Algorithm::TokenBucket)
///         .limit(10)
///         .window(Duration::from_secs(60))
///         .build()?,
/// );
/// let at = Timestamp::from_millis(1_700_000_000_000);
/// let first = limiter
///     .check(&uploads, "alice")
///     .cost(3)
///     .once("request-7f3a", Duration::from_secs(60))
///     .at(at)
///     .await?;
/// assert_eq!(first[0].remaining, 7);
/// // The same request id again: the first answer, nothing more consumed.
/// let retry = limiter.check(&uploads, "alice").cost(3).once("request-7f3a", Duration::from_secs(60)).at(at).await?;
/// assert_eq!(retry[0].remaining, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[must_use = "a check does nothing unless awaited"]
pub struct CheckRequest<'a, On> {
    pub(crate) on: &'a On,
    pub(crate) set: &'a PolicySet,
    pub(crate) client: &'a str,
    pub(crate) options: Options<'a>,
}

/// What a check asks for besides its policies and client; each builder method of
/// [`CheckRequest`] sets one field.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Options<'a> {
    pub(crate) cost: u64,
    /// An explicit time instead of the backend's clock.
    pub(crate) at: Option<Timestamp>,
    /// A request id whose retries within the window (ms) are answered once.
    pub(crate) once: Option<(&'a str, u64)>,
    /// Whether an admitted check is reserved, for a settle.
    pub(crate) reserve: bool,
    /// One client key per policy of the set, instead of the check's one client for all.
    pub(crate) keys: Option<&'a [&'a str]>,
    /// The check's one time budget, from its guard; `None`: the backend's.
    pub(crate) budget: Option<Duration>,
    /// A guard's grant: the most an admitted check takes beyond its cost, where every policy
    /// has room, to be spent locally (see [`PolicyBuilder::grants`](crate::PolicyBuilder::grants)).
    pub(crate) grant: Option<u64>,
    /// Gives the cost back instead of taking it.
    pub(crate) give_back: bool,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Self {
            cost: 1,
            at: None,
            once: None,
            reserve: false,
            keys: None,
            budget: None,
            grant: None,
            give_back: false,
        }
    }
}

/// A check's per-policy keys, owned: for a future or a reservation that outlives the check.
pub(crate) type OwnedKeys = Box<[Box<str>]>;

/// Owned copies of a check's per-policy `keys`.
pub(crate) fn owned_keys(keys: Option<&[&str]>) -> Option<OwnedKeys> {
    keys.map(|keys| keys.iter().map(|&key| key.into()).collect())
}

/// Owned per-policy keys as a check takes them (borrow the result with `as_deref`).
pub(crate) fn borrowed_keys(keys: Option<&OwnedKeys>) -> Option<Vec<&str>> {
    keys.map(|keys| keys.iter().map(|key| &**key).collect())
}

/// The longest a request id's first answer is remembered.
const MAX_ONCE_WINDOW: Duration = Duration::from_secs(86_400);

impl<'a, On> CheckRequest<'a, On> {
    pub(crate) fn new(on: &'a On, set: &'a PolicySet, client: &'a str) -> Self {
        Self {
            on,
            set,
            client,
            options: Options::default(),
        }
    }

    /// How much the request consumes. Defaults to 1; 0 peeks: it reports the quota and
    /// consumes nothing.
    pub fn cost(mut self, cost: u64) -> Self {
        self.options.cost = cost;
        self
    }

    /// Decides at `time` instead of the backend's clock (Redis `TIME`): for tests and
    /// deterministic replays. Defaults to the backend's clock.
    pub fn at(mut self, time: Timestamp) -> Self {
        self.options.at = Some(time);
        self
    }

    /// Counts the request once per request `id` (an `Idempotency-Key`): a retry within
    /// `window` (1 ms to 24 hours, clamped) gets the first check's decisions and consumes
    /// nothing more, decided in the same script call, so a retry whose first reply was lost is
    /// not counted twice. A retry's decisions are never reserved: the first request's settle
    /// settles what was taken. Defaults to none.
    pub fn once(mut self, id: &'a str, window: Duration) -> Self {
        let window = window.clamp(Duration::from_millis(1), MAX_ONCE_WINDOW);
        let window_ms = u64::try_from(window.as_millis()).unwrap_or(1);
        self.options.once = Some((id, window_ms));
        self
    }

    /// Keeps what an admitted check takes reserved, to be settled at the cost its response
    /// says: a request that should count only if its response says so (a failed login, say)
    /// is settled at 0 when it does not, a metered one at what it used (see
    /// [`Limiter::settle`](crate::Limiter::settle)). A policy in delay mode cannot be reserved (the check fails with
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput)). Defaults to a plain check.
    pub fn reserve(mut self) -> Self {
        self.options.reserve = true;
        self
    }

    /// Gives the check's cost back to each policy instead of taking it: a refund of requests
    /// counted earlier (Envoy's negative hits), to the state in force now (a fixed window's
    /// current count, a bucket's tokens), never past what a policy holds (a count never below
    /// 0, a bucket never above full). Decided in one script call; each decision is allowed and
    /// reports the quota after the refund. The check fails with
    /// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) with a request id or a
    /// reservation. Defaults to taking.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet, Timestamp};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let api = PolicySet::from(
    ///     Policy::builder("api", Algorithm::FixedWindow)
    ///         .limit(10)
    ///         .window(Duration::from_secs(60))
    ///         .build()?,
    /// );
    /// let limiter = Limiter::new(MemoryBackend::default());
    /// let at = Timestamp::from_millis(1_700_000_000_000);
    /// limiter.check(&api, "alice").cost(4).at(at).await?;
    /// let refunded = limiter.check(&api, "alice").cost(3).give_back().at(at).await?;
    /// assert_eq!(refunded[0].remaining, 9);
    /// // Never past what it holds: the window's count does not go below 0.
    /// let more = limiter.check(&api, "alice").cost(5).give_back().at(at).await?;
    /// assert_eq!(more[0].remaining, 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn give_back(mut self) -> Self {
        self.options.give_back = true;
        self
    }

    /// Checks each policy of the set under its own client key, `keys[i]` for the set's `i`th
    /// policy, instead of the check's one client for all: per IP and per API key, a tenant's
    /// budget and a key's, in one check, all or nothing (if any policy denies, none consumes),
    /// with one request id, one reservation and, on one Redis server, one script call. The
    /// check fails with [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) unless
    /// there is one key per policy. On a Redis Cluster, keys in one slot are one call (with
    /// [`KeyScheme::tenant_tags`](crate::KeyScheme::tenant_tags), keys written `{acme}ip:10.0.0.1`
    /// and `{acme}key:k7` are); keys in several slots are a call per slot, sent at once, and
    /// the slots that took give back when another denies (see [the features
    /// guide](crate::guide::features)). A guard keeps no local block for such a check.
    /// Defaults to the check's client for every policy.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let per_ip = Policy::builder("per-ip", Algorithm::FixedWindow)
    ///     .limit(5)
    ///     .window(Duration::from_secs(60))
    ///     .build()?;
    /// let per_key = Policy::builder("per-key", Algorithm::FixedWindow)
    ///     .limit(1)
    ///     .window(Duration::from_secs(60))
    ///     .build()?;
    /// let both = PolicySet::new([per_ip, per_key])?;
    /// let limiter = Limiter::new(MemoryBackend::default());
    /// let first = limiter.check(&both, "").keys(&["ip:10.0.0.1", "key:k1"]).await?;
    /// assert!(first.allowed());
    /// // The key's second request is denied, and spends none of the IP's quota.
    /// let second = limiter.check(&both, "").keys(&["ip:10.0.0.1", "key:k1"]).await?;
    /// assert!(!second.allowed());
    /// let other = limiter.check(&both, "").keys(&["ip:10.0.0.1", "key:k2"]).await?;
    /// assert_eq!((other.allowed(), other[0].remaining), (true, 3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn keys(mut self, keys: &'a [&'a str]) -> Self {
        self.options.keys = Some(keys);
        self
    }
}

impl<On> fmt::Debug for CheckRequest<'_, On> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The client may be an API key: never shown.
        f.debug_struct("CheckRequest")
            .field("policies", &self.set)
            .field("cost", &self.options.cost)
            .field("at", &self.options.at)
            .field("once", &self.options.once.is_some())
            .field("reserve", &self.options.reserve)
            .field("keys", &self.options.keys.map(<[&str]>::len))
            .field("give_back", &self.options.give_back)
            .finish_non_exhaustive()
    }
}

/// The settling of an admitted reservation at its actual cost, decided when awaited: made by
/// [`Limiter::settle`](crate::Limiter::settle) (awaited: `Result<bool, Error>`) or
/// [`GuardedLimiter::settle`](crate::GuardedLimiter::settle) (awaited: `bool`); the answer is
/// whether anything was given back or charged.
#[must_use = "a settle does nothing unless awaited"]
pub struct SettleRequest<'a, On> {
    pub(crate) on: &'a On,
    pub(crate) reserved: &'a Decisions,
    pub(crate) actual: u64,
    pub(crate) at: Option<Timestamp>,
}

impl<'a, On> SettleRequest<'a, On> {
    pub(crate) fn new(on: &'a On, reserved: &'a Decisions, actual: u64) -> Self {
        Self {
            on,
            reserved,
            actual,
            at: None,
        }
    }

    /// Settles as of `time` instead of the backend's clock: for tests and replays (a window
    /// that ended before `time` is not credited). Defaults to the backend's clock.
    pub fn at(mut self, time: Timestamp) -> Self {
        self.at = Some(time);
        self
    }
}

impl<On> fmt::Debug for SettleRequest<'_, On> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettleRequest")
            .field("actual", &self.actual)
            .field("at", &self.at)
            .finish_non_exhaustive()
    }
}

/// A boxed future of a settle: settles are rare (only responses whose cost differs from the
/// reservation), so one allocation each costs nothing that matters.
pub type SettleFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
