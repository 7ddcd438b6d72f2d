//! An operator's view of the limiter's state: inspect a client, reset it, scan a policy's keys.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use crate::{Decision, Error, ErrorKind, Limiter, Policy, backend::Target};

/// What a limiter holds for one client under one policy, read without consuming; see
/// [`Limiter::inspect`].
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryBackend::default());
/// let policy = Policy::builder("api", Algorithm::FixedWindow)
///     .limit(2)
///     .window(Duration::from_secs(60))
///     .build()?;
/// limiter.check(&PolicySet::from(policy.clone()), "alice").await.map(|d| d[0].clone())?;
/// let seen = limiter.inspect(&policy, "alice").await?;
/// assert!(seen.decision.allowed, "one more would pass");
/// assert_eq!(seen.decision.remaining, 1, "nothing was consumed by looking");
/// assert!(seen.ttl.is_some());
/// assert!(seen.state.contains(&("n".to_owned(), "1".to_owned())));
/// assert!(limiter.reset(&policy, "alice").await?);
/// assert_eq!(limiter.inspect(&policy, "alice").await?.decision.remaining, 2);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// The Redis key the state lives under (on the memory backend, the key it would have).
    pub key: String,
    /// The decision a request of cost 1 would get now. Nothing is consumed: `remaining` and
    /// `reset_after` are the quota as it is.
    pub decision: Decision,
    /// How long the stored state lives on; `None` when there is none.
    pub ttl: Option<Duration>,
    /// The stored state, as field and value pairs named as in Redis: `s` and `n` for a fixed
    /// window, `entries` for a sliding log, `w`, `p` and `c` for a sliding counter, `t` and `l`
    /// for a token bucket, `tat` for GCRA. Empty when there is none.
    pub state: Vec<(String, String)>,
    /// The most the client may hold at once: a token bucket's or GCRA's burst, else the limit
    /// (an override's limit while one is in force), so that `remaining` never exceeds it.
    pub quota: u64,
}

impl Inspection {
    /// The client as its key holds it: escaped text, or a hash (see
    /// [`KeyScheme`](crate::KeyScheme)).
    pub fn client(&self) -> &str {
        self.key
            .split_once('{')
            .and_then(|(_, rest)| rest.split_once('}'))
            .map_or("", |(tag, _)| tag)
    }

    /// How much of the [`quota`](Self::quota) is in use: the quota less what remains.
    pub fn used(&self) -> u64 {
        self.quota.saturating_sub(self.decision.remaining)
    }
}

/// The keys of one policy found by [`Limiter::scan`], each inspected.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Scan {
    /// One per key found, in key order.
    pub keys: Vec<Inspection>,
    /// How many `SCAN` calls it took, over every primary.
    pub calls: u64,
    /// Whether the scan went through every key; `false` when it stopped at its bound.
    pub complete: bool,
}

/// The keys a scan found, the `SCAN` calls it made, and whether it saw every key.
type ScanReply = Result<(Vec<String>, u64, bool), Error>;

/// Keys inspected at once during a scan, over the shared connection.
const INSPECTED_AT_ONCE: usize = 256;

impl Limiter {
    /// What `policy` holds for `client`: the stored state, its time to live, and the decision a
    /// request of cost 1 would get now, without consuming anything. On Redis, one script call
    /// that writes nothing. For a client with an override in force (see
    /// [`set_override`](Self::set_override)), the key and numbers of the override.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn inspect(&self, policy: &Policy, client: &str) -> Result<Inspection, Error> {
        inspect(self, policy, Target::Client(client)).await
    }

    /// Deletes what `policy` holds for `client`, giving it a full quota; whether there was
    /// anything. Other policies and clients are untouched. For a client with an override in
    /// force, its state under the override too; the override stays until
    /// [`clear_override`](Self::clear_override). On Redis it then publishes an operator event,
    /// which lifts the client's local blocks at every instance (see
    /// [`BlockCache`](crate::BlockCache)); an error after the deletion says so.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn reset(&self, policy: &Policy, client: &str) -> Result<bool, Error> {
        self.backend().reset(self.keys(), policy, client).await
    }

    /// Finds `policy`'s keys by `SCAN` (never `KEYS`) on every primary, at most `max_calls`
    /// calls per primary of 1,000 keys looked at each, and inspects each key found. For
    /// operators' tools: the busiest clients, the distribution of usage.
    ///
    /// # Errors
    /// As [`check`](Self::check); [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput)
    /// on the memory backend, which keeps no key names.
    pub async fn scan(&self, policy: &Policy, max_calls: u64) -> Result<Scan, Error> {
        // Erased: the scan's future nests so deeply that laying out a caller's future would pass
        // the compiler's default query depth.
        let scan: Pin<Box<dyn Future<Output = ScanReply> + Send + '_>> =
            Box::pin(self.backend().scan(self.keys(), policy, max_calls));
        let (names, calls, complete) = scan.await?;
        let policy = Arc::new(policy.clone());
        let mut keys = Vec::with_capacity(names.len());
        for chunk in names.chunks(INSPECTED_AT_ONCE) {
            let mut reads = tokio::task::JoinSet::new();
            for (at, key) in chunk.iter().enumerate() {
                let (this, policy, key) = (self.clone(), Arc::clone(&policy), key.clone());
                reads.spawn(async move {
                    let target = Target::Key(key);
                    (at, inspect(&this, &policy, target).await)
                });
            }
            let mut read: Vec<(usize, Inspection)> = Vec::with_capacity(chunk.len());
            while let Some(joined) = reads.join_next().await {
                let (at, inspection) = joined.map_err(|e| {
                    Error::new(ErrorKind::Backend, format!("an inspection failed: {e}"))
                })?;
                read.push((at, inspection?));
            }
            read.sort_unstable_by_key(|(at, _)| *at);
            keys.extend(read.into_iter().map(|(_, inspection)| inspection));
        }
        Ok(Scan {
            keys,
            calls,
            complete,
        })
    }
}

async fn inspect(
    limiter: &Limiter,
    policy: &Policy,
    target: Target<'_>,
) -> Result<Inspection, Error> {
    let (key, decision, inspected) = limiter
        .backend()
        .inspect(limiter.keys(), policy, target)
        .await?;
    let quota = policy.quota(decision.limit);
    Ok(Inspection {
        key,
        decision,
        ttl: inspected.ttl_ms.map(Duration::from_millis),
        state: inspected.state,
        quota,
    })
}
