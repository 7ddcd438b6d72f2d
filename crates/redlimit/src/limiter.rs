use std::{
    cmp::Ordering,
    fmt,
    future::{Future, IntoFuture},
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use crate::{
    Backend, CheckRequest, ConfigError, Decisions, Error, ErrorKind, KeyScheme, Override, Policy,
    PolicySet, SettleFuture, SettleRequest, Timestamp,
    backend::{Change, Query, Started},
    check_request::Options,
};

/// Checks requests against policies, on a [`Backend`].
///
/// Cheap to clone: clones share the backend. For a fixed set of policies behind a time budget
/// and a failure policy, wrap it in a [`GuardedLimiter`](crate::GuardedLimiter).
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryBackend::default());
/// let api = PolicySet::from(Policy::builder("api", Algorithm::SlidingWindowLog)
///     .limit(2)
///     .window(Duration::from_secs(60))
///     .build()?);
///
/// assert!(limiter.check(&api, "203.0.113.9").await?.allowed());
/// assert!(limiter.check(&api, "203.0.113.9").await?.allowed());
/// let third = limiter.check(&api, "203.0.113.9").await?;
/// assert!(!third.allowed());
/// assert_eq!(third[0].remaining, 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Limiter {
    backend: Backend,
    keys: KeyScheme,
}

impl Limiter {
    /// A limiter on `backend`, with keys prefixed `redlimit`.
    pub fn new(backend: impl Into<Backend>) -> Self {
        Self {
            backend: backend.into(),
            keys: KeyScheme::default(),
        }
    }

    /// A limiter on `backend` whose keys start with `prefix`.
    ///
    /// # Errors
    /// [`ConfigError::InvalidName`] for a prefix outside `A-Z a-z 0-9 _ - .`.
    pub fn with_prefix(
        backend: impl Into<Backend>,
        prefix: impl Into<String>,
    ) -> Result<Self, ConfigError> {
        Ok(Self {
            backend: backend.into(),
            keys: KeyScheme::new(prefix)?,
        })
    }

    /// A limiter on `backend` with the key scheme `keys`, such as one that
    /// [hashes client identifiers](KeyScheme::hash_clients).
    pub fn with_keys(backend: impl Into<Backend>, keys: KeyScheme) -> Self {
        Self {
            backend: backend.into(),
            keys,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The key scheme.
    pub fn keys(&self) -> &KeyScheme {
        &self.keys
    }

    /// A check of `set` (one policy converts with `PolicySet::from`) for `client`, of cost 1
    /// at the backend's clock unless the request says otherwise (see [`CheckRequest`]);
    /// awaited, one [`Decision`](crate::Decision) per policy, all or nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(MemoryBackend::default());
    /// let logins = PolicySet::from(Policy::builder("login", Algorithm::FixedWindow)
    ///     .limit(3)
    ///     .window(Duration::from_secs(60))
    ///     .build()?);
    ///
    /// let reserved = limiter.check(&logins, "alice").reserve().await?;
    /// assert_eq!(reserved[0].remaining, 2);
    /// // The password was right: this attempt does not count.
    /// assert!(limiter.settle(&reserved, 0).await?);
    /// assert_eq!(limiter.check(&logins, "alice").cost(0).await?[0].remaining, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// When awaited, see [`Error`]: the backend failed, timed out, or holds corrupt state for
    /// this client; [`ErrorKind::InvalidInput`] for a reservation of a policy in delay mode.
    pub fn check<'a>(&'a self, set: &'a PolicySet, client: &'a str) -> CheckRequest<'a, Self> {
        CheckRequest::new(self, set, client)
    }

    /// Settles the reservation `reserved` at its `actual` cost. Below what it took, the
    /// difference is given back: each policy only to the state it counted in (a window that
    /// has since ended is not credited to the next one), never below empty. Above it, the
    /// difference is taken now, atomically, even past the limit: the client's next checks wait
    /// until the quota has refilled (a fixed window: until it ends; a token bucket or GCRA:
    /// while the debt refills at the rate). Awaited, whether anything changed; a denied,
    /// failed-open or retried reservation took nothing and settles nothing. Settle a
    /// reservation once: a second settle would count it again.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(MemoryBackend::default());
    /// let tokens = PolicySet::from(Policy::builder("tokens", Algorithm::FixedWindow)
    ///     .limit(1_000)
    ///     .window(Duration::from_secs(60))
    ///     .build()?);
    ///
    /// // An estimate of 100 tokens; the model's answer used 250.
    /// let reserved = limiter.check(&tokens, "key-1").cost(100).reserve().await?;
    /// assert!(limiter.settle(&reserved, 250).await?);
    /// assert_eq!(limiter.check(&tokens, "key-1").cost(0).await?[0].remaining, 750);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// When awaited, as [`check`](Self::check).
    pub fn settle<'a>(&'a self, reserved: &'a Decisions, actual: u64) -> SettleRequest<'a, Self> {
        SettleRequest::new(self, reserved, actual)
    }

    /// Begins the check `set` of `client` with `options`.
    pub(crate) fn start(&self, set: &PolicySet, client: &str, options: &Options<'_>) -> Started {
        if let Some(keys) = options.keys.filter(|keys| keys.len() != set.len()) {
            return Started::Ready(Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "{} keys for a set of {} policies: one key per policy",
                    keys.len(),
                    set.len()
                ),
            )));
        }
        if options.give_back && (options.reserve || options.once.is_some()) {
            return Started::Ready(Err(Error::new(
                ErrorKind::InvalidInput,
                "a give-back is neither reserved nor counted once per request id",
            )));
        }
        if options.reserve && set.is_delayed() {
            return Started::Ready(Err(Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "policy {:?} is in delay mode and cannot be reserved",
                    set[0].name()
                ),
            )));
        }
        self.backend.start(Query {
            keys: &self.keys,
            set,
            client,
            options,
        })
    }

    pub(crate) async fn settled(
        &self,
        reserved: &Decisions,
        actual: u64,
        at: Option<Timestamp>,
    ) -> Result<bool, Error> {
        let Some(reservation) = reserved.reservation() else {
            return Ok(false);
        };
        let change = match actual.cmp(&reservation.cost) {
            Ordering::Less => Change::GiveBack(reservation.cost - actual),
            Ordering::Greater => Change::Charge(actual - reservation.cost),
            Ordering::Equal => return Ok(false),
        };
        let changed = self
            .backend
            .settle(&self.keys, reservation, change, at)
            .await?;
        Ok(changed > 0)
    }

    /// Checks `client` of `policy` by other numbers until `ttl` from now, for every instance
    /// on this backend at once: stored in Redis (in the client's slot) and read by each check
    /// in the same script call, or in this process for the memory backend. What the client used
    /// counts under the override's numbers, and under the policy's again when the override ends
    /// or is [cleared](Self::clear_override) (see [`Override`]). On Redis it then publishes an
    /// operator event, which lifts the client's local blocks at every instance (see
    /// [`BlockCache`](crate::BlockCache)); an error after the override was stored says so.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, Limiter, MemoryBackend, Override, Policy, PolicySet};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(MemoryBackend::default());
    /// let api = Policy::builder("api", Algorithm::Gcra)
    ///     .limit(10)
    ///     .window(Duration::from_secs(60))
    ///     .overrides(true)
    ///     .build()?;
    /// let day = Duration::from_secs(86_400);
    /// limiter.set_override(&api, "partner", Override::default().limit(1_000), day).await?;
    /// let set = PolicySet::from(api.clone());
    /// assert_eq!(limiter.check(&set, "partner").await?[0].limit, 1_000);
    /// assert_eq!(limiter.check(&set, "anyone").await?[0].limit, 10);
    /// assert!(limiter.clear_override(&api, "partner").await?);
    /// assert_eq!(limiter.check(&set, "partner").await?[0].limit, 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::InvalidInput`] for a policy that does not
    /// [take overrides](crate::PolicyBuilder::overrides) or numbers it cannot take (the message
    /// names the field) or a zero `ttl`; else as [`check`](Self::check).
    pub async fn set_override(
        &self,
        policy: &Policy,
        client: &str,
        numbers: Override,
        ttl: Duration,
    ) -> Result<(), Error> {
        takes_overrides(policy)?;
        if ttl.is_zero() {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "override: ttl must be more than zero",
            ));
        }
        let overridden = policy
            .overridden(&numbers)
            .map_err(|e| Error::new(ErrorKind::InvalidInput, format!("override: {e}")))?;
        self.backend
            .set_override(&self.keys, (policy, client), overridden, ttl)
            .await
    }

    /// Ends `client`'s override of `policy`: it is checked by the policy's own numbers again.
    /// Whether an override was in force. On Redis, like
    /// [`set_override`](Self::set_override), it then publishes an operator event.
    ///
    /// # Errors
    /// As [`set_override`](Self::set_override).
    pub async fn clear_override(&self, policy: &Policy, client: &str) -> Result<bool, Error> {
        takes_overrides(policy)?;
        self.backend
            .clear_override(&self.keys, policy, client)
            .await
    }
}

fn takes_overrides(policy: &Policy) -> Result<(), Error> {
    if policy.takes_overrides() {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::InvalidInput,
        format!(
            "policy {:?} does not take overrides (see PolicyBuilder::overrides)",
            policy.name()
        ),
    ))
}

/// The future of a [`CheckRequest`] on a [`Limiter`](crate::Limiter): decided already when
/// the backend is in process, else waiting for Redis's answer.
#[must_use = "a check does nothing unless awaited"]
pub struct CheckFuture {
    state: State,
}

enum State {
    Ready(Option<Result<Decisions, Error>>),
    Waiting(Pin<Box<dyn Future<Output = Result<Decisions, Error>> + Send>>),
}

impl Future for CheckFuture {
    type Output = Result<Decisions, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.state {
            State::Ready(decided) => {
                Poll::Ready(decided.take().expect("a check polled after it was decided"))
            }
            State::Waiting(answer) => answer.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for CheckFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckFuture").finish_non_exhaustive()
    }
}

impl<'a> IntoFuture for CheckRequest<'a, Limiter> {
    type Output = Result<Decisions, Error>;
    type IntoFuture = CheckFuture;

    fn into_future(self) -> CheckFuture {
        let state = match self.on.start(self.set, self.client, &self.options) {
            Started::Ready(decided) => State::Ready(Some(decided)),
            Started::Waiting(answer) => State::Waiting(answer),
        };
        CheckFuture { state }
    }
}

impl<'a> IntoFuture for SettleRequest<'a, Limiter> {
    type Output = Result<bool, Error>;
    type IntoFuture = SettleFuture<'a, Result<bool, Error>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.on.settled(self.reserved, self.actual, self.at))
    }
}
