use std::time::Duration;

use crate::{
    Backend, ConfigError, Decision, Error, ErrorKind, KeyScheme, MemoryBackend, Policy, Reason,
    RetryAfter, Timestamp, algorithm::Denial, backend::script::Answer,
};

/// Checks requests against policies, on a [`Backend`].
///
/// Cheap to clone: clones share the backend.
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
        let mut decisions = self
            .run(std::slice::from_ref(policy), client, cost, None)
            .await?;
        Ok(decisions.remove(0))
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
    ) -> Result<Vec<Decision>, Error> {
        self.run(policies, client, cost, None).await
    }

    /// As [`check_all`](Self::check_all), at an explicit time instead of the backend's clock:
    /// for tests and deterministic replays.
    ///
    /// # Errors
    /// As [`check_all`](Self::check_all).
    pub async fn check_at(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
        now: Timestamp,
    ) -> Result<Vec<Decision>, Error> {
        self.run(policies, client, cost, Some(now)).await
    }

    pub(crate) async fn run(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Result<Vec<Decision>, Error> {
        validate(policies)?;
        let redis = match &self.backend {
            Backend::Redis(redis) => redis,
            Backend::Memory(memory) => {
                return Ok(self.memory_run(memory, policies, client, cost, now));
            }
        };
        let keys: Vec<String> = policies.iter().map(|p| self.keys.key(p, client)).collect();
        let now_us = now.map(Timestamp::as_micros);
        // Boxed: the Redis future is large, and callers should not carry (and move) its space.
        let answers = Box::pin(redis.check(policies, &keys, cost, now_us)).await?;
        Ok(decisions(policies, answers, Reason::Redis))
    }

    /// The check of `policies`, which are valid (a [`GuardedLimiter`](crate::GuardedLimiter)'s
    /// are), decided without waiting when the backend can (memory); `None` when it must be asked
    /// over the network.
    pub(crate) fn run_now(
        &self,
        policies: &[Policy],
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Option<Vec<Decision>> {
        match &self.backend {
            Backend::Memory(memory) => Some(self.memory_run(memory, policies, client, cost, now)),
            Backend::Redis(_) => None,
        }
    }

    fn memory_run(
        &self,
        memory: &MemoryBackend,
        policies: &[Policy],
        client: &str,
        cost: u64,
        now: Option<Timestamp>,
    ) -> Vec<Decision> {
        let now_us = now.unwrap_or_else(Timestamp::now).as_micros();
        memory.check(
            &self.keys,
            client,
            policies,
            cost,
            now_us,
            |policy, answer| decision(policy, answer, Reason::Memory),
        )
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
    Ok(())
}

fn decisions(policies: &[Policy], answers: Vec<Answer>, reason: Reason) -> Vec<Decision> {
    policies
        .iter()
        .zip(answers)
        .map(|(policy, answer)| decision(policy, answer, reason))
        .collect()
}

fn decision(policy: &Policy, answer: Answer, reason: Reason) -> Decision {
    Decision {
        allowed: answer.denial.is_none(),
        limit: policy.limit(),
        remaining: answer.view.remaining,
        reset_after: Duration::from_millis(answer.view.reset_ms),
        retry_after: answer.denial.map(|denial| match denial {
            Denial::RetryAfterMs(ms) => RetryAfter::After(Duration::from_millis(ms)),
            Denial::Never => RetryAfter::Never,
        }),
        policy: policy.shared_name(),
        reason,
    }
}
