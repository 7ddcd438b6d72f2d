use std::time::Duration;

use crate::{
    Backend, ConfigError, Decision, Decisions, Error, ErrorKind, KeyScheme, Override, Policy,
    Timestamp,
    backend::{Extras, Once, Started},
};

/// Checks requests against policies, on a [`Backend`].
///
/// Cheap to clone: clones share the backend. For a fixed set of policies behind a time budget
/// and a failure policy, wrap it in a [`GuardedLimiter`](crate::GuardedLimiter).
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryBackend::default());
/// let policy = Policy::builder("api", Algorithm::SlidingWindowLog)
///     .limit(2)
///     .window(Duration::from_secs(60))
///     .build()?;
///
/// assert!(limiter.check(&policy, "203.0.113.9", 1).await?.allowed);
/// assert!(limiter.check(&policy, "203.0.113.9", 1).await?.allowed);
/// let third = limiter.check(&policy, "203.0.113.9", 1).await?;
/// assert!(!third.allowed);
/// assert_eq!(third.remaining, 0);
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

    /// Checks one request of `cost` by `client` against `policy`, consuming if allowed.
    /// Cost 0 peeks: it reports the quota without consuming.
    ///
    /// # Errors
    /// See [`Error`]: the backend failed, timed out, or holds corrupt state for this client.
    pub async fn check(&self, policy: &Policy, client: &str, cost: u64) -> Result<Decision, Error> {
        self.one(policy, client, cost, None).await
    }

    /// As [`check`](Self::check), at an explicit time instead of the backend's clock: for tests
    /// and deterministic replays.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn check_at(
        &self,
        policy: &Policy,
        client: &str,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decision, Error> {
        self.one(policy, client, cost, Some(now)).await
    }

    /// Checks several policies for one client in one round trip, all-or-nothing: the request is
    /// allowed only if every policy allows it, and if any denies, none consumes.
    ///
    /// Returns one decision per policy, in order. A policy that would have admitted the request
    /// reports `allowed` with its unchanged quota when another policy denied.
    ///
    /// # Errors
    /// As [`check`](Self::check), and [`ErrorKind::InvalidInput`] for no policy or two policies
    /// with the same name.
    pub async fn check_all(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
    ) -> Result<Decisions, Error> {
        self.all(policies, client, cost, None).await
    }

    /// As [`check_all`](Self::check_all), at an explicit time instead of the backend's clock.
    ///
    /// # Errors
    /// As [`check_all`](Self::check_all).
    pub async fn check_all_at(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
        now: Timestamp,
    ) -> Result<Decisions, Error> {
        self.all(policies, client, cost, Some(now)).await
    }

    /// As [`check_all`](Self::check_all), counted once per request `id` (an
    /// `Idempotency-Key`): a retry within `window` (at most 24 hours) gets the first check's
    /// decisions and consumes nothing more, decided in the same script call, so a retry whose
    /// first reply was lost is not counted twice.
    ///
    /// # Errors
    /// As [`check_all`](Self::check_all).
    pub async fn check_once(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
        id: &str,
        window: Duration,
    ) -> Result<Decisions, Error> {
        validate(policies)?;
        let extras = Extras {
            once: Some(Once::new(id, window)),
            reserve: false,
        };
        self.started(policies, client, cost, None, &extras).await
    }

    /// As [`check_all`](Self::check_all), keeping what an admitted check took refundable: for a
    /// request that should count only if its response says so (a failed login, say), give it
    /// back with [`refund`](Self::refund) once the response does not. On Redis it is one
    /// script call, like a check (the script for several policies, whose reply says when it
    /// took); policies in delay mode cannot be reserved.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// let limiter = Limiter::new(MemoryBackend::default());
    /// let logins = [Policy::builder("login", Algorithm::FixedWindow)
    ///     .limit(3)
    ///     .window(Duration::from_secs(60))
    ///     .build()?];
    ///
    /// let reserved = limiter.reserve(&logins, "alice", 1).await?;
    /// assert_eq!(reserved[0].remaining, 2);
    /// // The password was right: this attempt does not count.
    /// assert!(limiter.refund(&logins, &reserved, 1).await?);
    /// assert_eq!(limiter.check_all(&logins, "alice", 0).await?[0].remaining, 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    ///
    /// # Errors
    /// As [`check_all`](Self::check_all), and [`ErrorKind::InvalidInput`] for a policy in delay
    /// mode.
    pub async fn reserve(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
    ) -> Result<Decisions, Error> {
        self.reserve_at(policies, client, cost, None).await
    }

    /// As [`reserve`](Self::reserve), at an explicit time instead of the backend's clock.
    ///
    /// # Errors
    /// As [`reserve`](Self::reserve).
    pub async fn reserve_at(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<Decisions, Error> {
        validate_reservation(policies)?;
        let extras = Extras {
            once: None,
            reserve: true,
        };
        self.started(policies, client, cost, now, &extras).await
    }

    /// Gives back `cost` (at most what it took) of what the reservation `reserved` of
    /// `policies` took: each policy only to the state it counted in (a window that has since
    /// ended is not credited to the next one), never below empty. Whether anything was given
    /// back; a denied or failed-open reservation took nothing and gives nothing. Refund a
    /// reservation once: a second refund would give back what other requests took.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn refund(
        &self,
        policies: &[Policy],
        reserved: &Decisions,
        cost: u64,
    ) -> Result<bool, Error> {
        self.refund_at(policies, reserved, cost, None).await
    }

    /// As [`refund`](Self::refund), at an explicit time instead of the backend's clock.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn refund_at(
        &self,
        policies: &[Policy],
        reserved: &Decisions,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<bool, Error> {
        let Some(reservation) = reserved.reservation() else {
            return Ok(false);
        };
        let cost = cost.min(reservation.cost);
        if cost == 0 {
            return Ok(false);
        }
        validate_reservation(policies)?;
        let refunded = self
            .backend
            .refund(&self.keys, policies, reservation, cost, now)
            .await?;
        Ok(refunded > 0)
    }

    /// Checks `client` of `policy` by other numbers until `ttl` from now, for every instance
    /// on this backend at once: stored in Redis (in the client's slot) and read by each check
    /// in the same script call, or in this process for the memory backend. The client is then
    /// counted under keys of its own (see [`Override`]); its state under the policy's numbers is
    /// there again when the override ends or is [cleared](Self::clear_override).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redlimit::{Algorithm, Limiter, MemoryBackend, Override, Policy};
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
    /// assert_eq!(limiter.check(&api, "partner", 1).await?.limit, 1_000);
    /// assert_eq!(limiter.check(&api, "anyone", 1).await?.limit, 10);
    /// assert!(limiter.clear_override(&api, "partner").await?);
    /// assert_eq!(limiter.check(&api, "partner", 1).await?.limit, 10);
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
    /// Whether an override was in force.
    ///
    /// # Errors
    /// As [`set_override`](Self::set_override).
    pub async fn clear_override(&self, policy: &Policy, client: &str) -> Result<bool, Error> {
        takes_overrides(policy)?;
        self.backend
            .clear_override(&self.keys, policy, client)
            .await
    }

    async fn one(
        &self,
        policy: &Policy,
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<Decision, Error> {
        let decisions =
            run(self
                .backend
                .start(&self.keys, policy, client, cost, now, &Extras::default()))
            .await?;
        let only = decisions.into_iter().next();
        Ok(only.unwrap_or_else(|| unreachable!("one decision per policy")))
    }

    async fn all(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<Decisions, Error> {
        validate(policies)?;
        self.started(policies, client, cost, now, &Extras::default())
            .await
    }

    /// A valid check of `policies` with `extras`, begun and awaited.
    async fn started(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
        extras: &Extras,
    ) -> Result<Decisions, Error> {
        run(self
            .backend
            .start(&self.keys, policies, client, cost, now, extras))
        .await
    }
}

async fn run(started: Started) -> Result<Decisions, Error> {
    match started {
        Started::Ready(decided) => decided,
        Started::Waiting(answer) => answer.await,
    }
}

fn validate(policies: &[Policy]) -> Result<(), Error> {
    if policies.is_empty() {
        return Err(Error::new(ErrorKind::InvalidInput, "no policy to check"));
    }
    // Checks name few policies: comparing pairs costs less than hashing.
    let twice = policies
        .iter()
        .enumerate()
        .find(|(i, p)| policies[..*i].iter().any(|q| q.name() == p.name()));
    if let Some((_, twice)) = twice {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("policy {:?} is checked twice", twice.name()),
        ));
    }
    if let Some(delayed) = policies.iter().find(|p| p.max_delay().is_some())
        && policies.len() > 1
    {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "policy {:?} is in delay mode and is checked alone",
                delayed.name()
            ),
        ));
    }
    Ok(())
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

/// A valid check that a refund can give back: no policy in delay mode (whose slot a later
/// request may already wait for).
fn validate_reservation(policies: &[Policy]) -> Result<(), Error> {
    validate(policies)?;
    match policies.iter().find(|p| p.max_delay().is_some()) {
        Some(delayed) => Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "policy {:?} is in delay mode and cannot be reserved",
                delayed.name()
            ),
        )),
        None => Ok(()),
    }
}
