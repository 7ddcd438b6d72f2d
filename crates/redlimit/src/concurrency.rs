//! Concurrency limits: at most N requests in flight per client, as leases that expire.

use std::{
    collections::hash_map::RandomState,
    fmt,
    hash::BuildHasher,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use crate::{
    Backend, ConfigError, Decision, Error, KeyScheme, Reason, RetryAfter, backend::Acquired,
    config_error::validate_name,
};

/// When a denied request may try again: leases are usually given back long before they expire,
/// so the earliest expiry is only an upper bound.
const POLITE_RETRY: Duration = Duration::from_secs(1);
/// The most leases one client may hold: each is a member of a sorted set in Redis.
const MAX_LIMIT: u64 = 10_000;
/// The longest lease: a crashed process's slots come free within it.
const MAX_LEASE_TTL_MS: u64 = 86_400_000;

/// At most `limit` requests in flight per client, each holding a [`Lease`] that expires after
/// `lease_ttl` unless renewed, so a process that crashed while holding leases frees their slots
/// within that time.
///
/// A member of a [`PolicySet`](crate::PolicySet) ([`with_concurrency`](crate::PolicySet::with_concurrency)):
/// a check takes a lease only when every rate policy admits, and its policies take only when
/// the lease is granted, in one step. The admitted check's [`Decisions`](crate::Decisions) hold
/// the lease; it is given back when the last of them is dropped.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, ConcurrencyPolicy, Limiter, MemoryBackend, Policy, PolicySet};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryBackend::default());
/// let per_minute = Policy::builder("per-minute", Algorithm::FixedWindow)
///     .limit(10)
///     .window(Duration::from_secs(60))
///     .build()?;
/// let one_at_once = ConcurrencyPolicy::builder("in-flight").limit(1).build()?;
/// let set = PolicySet::from(per_minute).with_concurrency(one_at_once)?;
/// let first = limiter.check(&set, "alice").await?;
/// assert!(first.allowed() && first.lease().is_some());
/// let second = limiter.check(&set, "alice").await?;
/// assert!(!second.allowed());
/// assert_eq!(second[0].remaining, 9, "the refused request spent no rate quota");
/// drop(first);
/// assert!(limiter.check(&set, "alice").await?.allowed(), "the slot came free");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConcurrencyPolicy {
    inner: Arc<Inner>,
}

#[derive(Debug, PartialEq, Eq)]
struct Inner {
    name: Arc<str>,
    limit: u64,
    lease_ttl_ms: u64,
    key_suffix: String,
}

impl ConcurrencyPolicy {
    /// Starts a policy named `name` (1 to 64 of `A-Z a-z 0-9 _ - .`).
    pub fn builder(name: impl Into<String>) -> ConcurrencyPolicyBuilder {
        ConcurrencyPolicyBuilder {
            name: name.into(),
            limit: None,
            lease_ttl: Duration::from_secs(30),
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// How many requests of one client may be in flight at once.
    pub fn limit(&self) -> u64 {
        self.inner.limit
    }

    /// How long a lease lives unless renewed.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.inner.lease_ttl_ms)
    }

    pub(crate) fn lease_ttl_ms(&self) -> u64 {
        self.inner.lease_ttl_ms
    }

    /// The key of `client`'s lease set.
    pub(crate) fn key(&self, keys: &KeyScheme, client: &str) -> String {
        keys.named(&self.inner.name, &self.inner.key_suffix, client)
    }

    /// The decision of a check's lease: `remaining` the free slots after it; when refused,
    /// `retry_after` 1 s, or when the earliest lease expires if sooner, since leases are
    /// usually given back long before.
    pub(crate) fn decision(&self, acquired: Acquired, reason: Reason) -> Decision {
        let inner = &self.inner;
        Decision {
            allowed: acquired.granted,
            limit: inner.limit,
            remaining: acquired.free,
            reset_after: Duration::ZERO,
            retry_after: (!acquired.granted).then(|| {
                RetryAfter::After(Duration::from_millis(acquired.wait_ms).min(POLITE_RETRY))
            }),
            delay: Duration::ZERO,
            policy: Arc::clone(&inner.name),
            reason,
            banned: false,
            window: Duration::ZERO,
            burst: inner.limit,
            overridden: false,
        }
    }
}

/// Builds a [`ConcurrencyPolicy`]; see [`ConcurrencyPolicy::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ConcurrencyPolicyBuilder {
    name: String,
    limit: Option<u64>,
    lease_ttl: Duration,
}

impl ConcurrencyPolicyBuilder {
    /// Requests in flight at once per client. Required; at most 10,000.
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }

    /// How long a lease lives unless renewed ([`Lease::renew`]): a request running longer
    /// should renew it, and a crashed process's leases are reclaimed after it. Whole
    /// milliseconds, at most a day. Defaults to 30 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// Validates and builds the policy.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field.
    pub fn build(self) -> Result<ConcurrencyPolicy, ConfigError> {
        validate_name("policy name", &self.name)?;
        let limit = self.limit.ok_or(ConfigError::Missing { field: "limit" })?;
        if limit == 0 {
            return Err(ConfigError::Zero { field: "limit" });
        }
        if limit > MAX_LIMIT {
            return Err(ConfigError::TooLarge {
                field: "limit",
                max: MAX_LIMIT,
            });
        }
        if !self.lease_ttl.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(ConfigError::NotWholeMillis { field: "lease_ttl" });
        }
        let lease_ttl_ms = u64::try_from(self.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        if lease_ttl_ms == 0 {
            return Err(ConfigError::Zero { field: "lease_ttl" });
        }
        if lease_ttl_ms > MAX_LEASE_TTL_MS {
            return Err(ConfigError::TooLarge {
                field: "lease_ttl",
                max: MAX_LEASE_TTL_MS,
            });
        }
        Ok(ConcurrencyPolicy {
            inner: Arc::new(Inner {
                key_suffix: "cc".to_owned(),
                name: self.name.into(),
                limit,
                lease_ttl_ms,
            }),
        })
    }
}

/// A slot of a [`ConcurrencyPolicy`], held by the [`Decisions`](crate::Decisions) of the
/// check that took it and given back when the last of them is dropped (by a task on the
/// current tokio runtime for a lease on Redis; without one, it expires after its TTL).
pub struct Lease {
    backend: Backend,
    key: String,
    id: String,
    ttl_ms: u64,
    /// The task renewing it, once [`keep_alive`](Self::keep_alive) started one.
    keeper: OnceLock<tokio::task::AbortHandle>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// Lease `id` in the set at `key`, taken on `backend` for `ttl_ms`.
    pub(crate) fn new(backend: Backend, key: String, id: String, ttl_ms: u64) -> Self {
        Self {
            backend,
            key,
            id,
            ttl_ms,
            keeper: OnceLock::new(),
        }
    }

    /// Extends the lease to a whole TTL from now, for a request that runs long; whether it was
    /// still held (`false`: it had expired, and its slot may be someone else's).
    ///
    /// # Errors
    /// As [`Limiter::check`](crate::Limiter::check).
    pub async fn renew(&self) -> Result<bool, Error> {
        self.backend
            .renew_lease(&self.key, &self.id, self.ttl_ms)
            .await
    }

    /// Keeps the lease alive while it is held, for requests that may run longer than its TTL
    /// (a response that streams): a task on the current tokio runtime renews it every third
    /// of its TTL until it is given back (or found expired). Once per lease; without a
    /// runtime, nothing.
    pub fn keep_alive(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.keeper.get().is_some() {
            return;
        }
        let (backend, key, id, ttl_ms) = (
            self.backend.clone(),
            self.key.clone(),
            self.id.clone(),
            self.ttl_ms,
        );
        let keeper = runtime.spawn(async move {
            let every = Duration::from_millis(ttl_ms.div_ceil(3));
            loop {
                tokio::time::sleep(every).await;
                // An error is retried at the next turn; an expired lease is not renewed.
                if let Ok(false) = backend.renew_lease(&key, &id, ttl_ms).await {
                    return;
                }
            }
        });
        if let Err(keeper) = self.keeper.set(keeper.abort_handle()) {
            keeper.abort();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(keeper) = self.keeper.get() {
            keeper.abort();
        }
        let (backend, key, id) = (
            self.backend.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.id),
        );
        if backend.release_lease_in_process(&key, &id) {
            // Done: nothing to wait for.
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // On failure the lease expires after its TTL.
                let _ = backend.release_lease(&key, &id).await;
            });
        }
    }
}

/// A lease id unique to this process's run and never reused in it.
pub(crate) fn lease_id() -> String {
    static RUN: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let run = RUN.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    format!("{run:016x}{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}
