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

use crate::{ConfigError, Decision, Error, Limiter, RetryAfter, config_error::validate_name};

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
/// ```
/// use std::time::Duration;
/// use redlimit::{ConcurrencyPolicy, Limiter, MemoryBackend};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryBackend::default());
/// let two = ConcurrencyPolicy::builder("in-flight").limit(2).build()?;
/// let (first, lease) = limiter.acquire(&two, "alice").await?;
/// assert!(first.allowed);
/// let (second, _held) = limiter.acquire(&two, "alice").await?;
/// assert_eq!(second.remaining, 0);
/// let (third, none) = limiter.acquire(&two, "alice").await?;
/// assert!(!third.allowed && none.is_none());
/// lease.expect("granted").release().await?;
/// assert!(limiter.acquire(&two, "alice").await?.0.allowed, "a slot came free");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct ConcurrencyPolicy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
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

/// A slot of a [`ConcurrencyPolicy`], held until [`release`](Self::release)d or dropped (a
/// dropped lease is given back by a task on the current tokio runtime; without one, it
/// expires after its TTL).
#[must_use = "a lease holds a slot until released or dropped"]
pub struct Lease {
    limiter: Limiter,
    key: String,
    id: String,
    ttl_ms: u64,
    held: bool,
    /// The task renewing it, with [`keep_alive`](Self::keep_alive).
    keeper: Option<tokio::task::AbortHandle>,
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// Extends the lease to a whole TTL from now, for a request that runs long; whether it was
    /// still held (`false`: it had expired, and its slot may be someone else's).
    ///
    /// # Errors
    /// As [`Limiter::check`].
    pub async fn renew(&self) -> Result<bool, Error> {
        renew(&self.limiter, &self.key, &self.id, self.ttl_ms).await
    }

    /// Keeps the lease alive while it is held, for requests that may run longer than its TTL:
    /// a task on the current tokio runtime renews it every third of its TTL until it is
    /// released or dropped (or found expired). Without a runtime, the lease is returned as is.
    pub fn keep_alive(mut self) -> Self {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self;
        };
        let (limiter, key, id, ttl_ms) = (
            self.limiter.clone(),
            self.key.clone(),
            self.id.clone(),
            self.ttl_ms,
        );
        let keeper = runtime.spawn(async move {
            let every = Duration::from_millis(ttl_ms.div_ceil(3));
            loop {
                tokio::time::sleep(every).await;
                // An error is retried at the next turn; an expired lease is not renewed.
                if let Ok(false) = renew(&limiter, &key, &id, ttl_ms).await {
                    return;
                }
            }
        });
        self.keeper = Some(keeper.abort_handle());
        self
    }

    /// Gives the slot back.
    ///
    /// # Errors
    /// As [`Limiter::check`]; the lease then expires after its TTL.
    pub async fn release(mut self) -> Result<(), Error> {
        self.held = false;
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
        release(&self.limiter, &self.key, &self.id).await
    }
}

async fn renew(limiter: &Limiter, key: &str, id: &str, ttl_ms: u64) -> Result<bool, Error> {
    limiter.backend().renew_lease(key, id, ttl_ms).await
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.abort();
        }
        if !self.held {
            return;
        }
        let (limiter, key, id) = (
            self.limiter.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.id),
        );
        if limiter.backend().release_lease_in_process(&key, &id) {
            // Done: nothing to wait for.
        } else if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // On failure the lease expires after its TTL.
                let _ = release(&limiter, &key, &id).await;
            });
        }
    }
}

async fn release(limiter: &Limiter, key: &str, id: &str) -> Result<(), Error> {
    limiter.backend().release_lease(key, id).await
}

/// A lease id unique to this process's run and never reused in it.
fn lease_id() -> String {
    static RUN: OnceLock<u64> = OnceLock::new();
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let run = RUN.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    format!("{run:016x}{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Limiter {
    /// Takes a slot of `policy` for `client` if fewer than its limit are held: the decision
    /// (`remaining`: the free slots after it; when denied, `retry_after`: 1 s, or when the
    /// earliest lease expires if sooner, since leases are usually given back long before) and
    /// the lease.
    /// On Redis, one script call that also reclaims expired leases.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn acquire(
        &self,
        policy: &ConcurrencyPolicy,
        client: &str,
    ) -> Result<(Decision, Option<Lease>), Error> {
        let inner = &policy.inner;
        let key = self.keys().named(&inner.name, &inner.key_suffix, client);
        let id = lease_id();
        let (acquired, reason) = self
            .backend()
            .acquire_lease(&key, inner.limit, inner.lease_ttl_ms, &id)
            .await?;
        let decision = Decision {
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
        };
        let lease = acquired.granted.then(|| Lease {
            limiter: self.clone(),
            key,
            id,
            ttl_ms: inner.lease_ttl_ms,
            held: true,
            keeper: None,
        });
        Ok((decision, lease))
    }
}
