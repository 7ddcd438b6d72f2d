//! Distributed rate limiting on Redis: atomic Lua scripts, one round trip per check, six
//! algorithms, and the same arithmetic in process when there is no Redis.
//!
//! A [`Policy`] says how many requests a client may make, with which [`Algorithm`]; a
//! [`Limiter`] checks a request against one or several policies on a [`Backend`] and returns a
//! [`Decision`] per policy ([`Decisions`] for several). On the [`RedisBackend`] every check is
//! one `FCALL` of a Lua function that reads Redis's clock, so many app servers share one limit
//! exactly; the [`MemoryBackend`] runs the same integer arithmetic in process. A
//! [`GuardedLimiter`] adds what production needs around it: a time budget, a
//! [`FailurePolicy`] for when Redis fails, a [`CircuitBreaker`], a [`BlockCache`] that keeps
//! floods of denied requests off Redis, and [`Stats`].
//!
//! For operators: a [`GuardedLimiter`] reports every decision through the
//! [`metrics`](https://docs.rs/metrics) facade and a `tracing` span per check (see its
//! [metrics table](GuardedLimiter#metrics)), and can run in [shadow](GuardBuilder::shadow)
//! (dry-run) mode; [`Limiter::inspect`], [`Limiter::reset`] and [`Limiter::scan`] read, clear and
//! survey clients' state.
//!
//! Policies that fit real APIs: a client can be given other numbers at run time by every
//! instance at once ([`Limiter::set_override`], for policies built with
//! [`overrides`](PolicyBuilder::overrides)), banned after repeated denials ([`Ban`]), counted
//! only when its response says so ([`CheckRequest::reserve`] and [`Limiter::settle`]), and counted
//! once per request id when it retries ([`CheckRequest::once`]); each is decided in the check's
//! own script call, and a policy without them pays nothing for them.
//!
//! To limit an HTTP or gRPC service, put a guarded limiter in
//! [tower-redlimit](https://docs.rs/tower-redlimit)'s `RateLimitLayer`.
//!
//! # First use
//!
//! ```
//! use std::time::Duration;
//! use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet, RetryAfter};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! // Point this at Redis with `RedisBackend::builder("redis://127.0.0.1:6379").build()?`.
//! let limiter = Limiter::new(MemoryBackend::default());
//! let per_second = Policy::builder("per-second", Algorithm::Gcra)
//!     .limit(10)
//!     .window(Duration::from_secs(1))
//!     .build()?;
//! let per_day = Policy::builder("per-day", Algorithm::FixedWindow)
//!     .limit(1_000)
//!     .window(Duration::from_secs(86_400))
//!     .build()?;
//!
//! // Both policies in one round trip; if either denies, neither consumes.
//! let decisions = limiter.check(&PolicySet::new([per_second, per_day].iter().cloned()).expect("a valid set"), "api-key-42").await?;
//! if decisions.allowed() {
//!     // serve the request
//! } else if let Some(RetryAfter::After(wait)) = decisions.retry_after() {
//!     println!("try again in {wait:?}");
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! # Algorithms
//!
//! All arithmetic is on integers below 2^53, where Lua's numbers are exact; a policy whose
//! numbers would leave that range is refused when built. `limit` is per `window`; `burst`
//! (token bucket and GCRA, default `limit`) is how many a fresh client may send at once.
//!
//! | algorithm | state per client | guarantee |
//! |---|---|---|
//! | [`FixedWindow`](Algorithm::FixedWindow) | window start, count | at most `limit` per calendar-aligned window; up to 2 × `limit` across a boundary |
//! | [`FixedWindowAnchored`](Algorithm::FixedWindowAnchored) | window start, count | as above, the window opening at the client's first request |
//! | [`SlidingWindowLog`](Algorithm::SlidingWindowLog) | one entry per admitted request | at most `limit` in any span of `window`; memory O(limit) |
//! | [`SlidingWindowCounter`](Algorithm::SlidingWindowCounter) | window index, two counts | a weighted estimate of the sliding window, O(1) memory |
//! | [`TokenBucket`](Algorithm::TokenBucket) | tokens, last refill | `limit` per `window` sustained, `burst` at once |
//! | [`Gcra`](Algorithm::Gcra) | theoretical arrival time | `limit` per `window` evenly spaced, `burst` at once |
//!
//! Every decision reports `remaining`, `reset_after` and, when denied, `retry_after`: the wait
//! until a request of the same cost could pass, or [`RetryAfter::Never`] when the cost is more
//! than the policy ever grants. Cost 0 peeks. A denied request consumes nothing.
//!
//! # On Redis
//!
//! - **Atomic.** Check and update are one script: concurrent checks from many processes never
//!   admit more than the limit.
//! - **A TTL on every write, in the same script**; a fixed window's is set when its counter is
//!   created and never extended, so no key lives forever and no window is stretched.
//! - **Redis's clock** (`TIME`), so app servers with skewed clocks agree;
//!   [`CheckRequest::at`] takes an explicit [`Timestamp`] for tests and replays.
//! - **Cluster-ready keys**, `prefix:policy:{client}:algorithm:numbers` (see [`KeyScheme`]):
//!   the client is the hash tag, so all policies of one client are in one slot; client text is
//!   escaped, or hashed when long; changing a policy's numbers changes its keys.
//! - **Corrupt state is an error** ([`ErrorKind::CorruptState`]), never "allowed".
//! - **One command per decision**: `FCALL` of a function of one library holding every
//!   algorithm, loaded (`FUNCTION LOAD`) where a node lacks it; where the server refuses
//!   functions (its ACL, a proxy), `EVALSHA` of the same checks as scripts, retried with `EVAL` on
//!   `NOSCRIPT`. Over a shared multiplexed connection; every wait is bounded by the backend's
//!   budget ([`RedisBackendBuilder::budget`]).
//!
//! # Features
//!
//! - `cluster`: [`RedisBackend::cluster`], a Redis Cluster.
//! - `sentinel`: [`RedisBackend::sentinel`], a Sentinel-managed primary.
//! - `tls`: `rediss://` URLs through rustls (the ring provider, the system's roots; no OpenSSL),
//!   and for a standalone server a private CA
//!   ([`RedisBackendBuilder::tls_root_ca`]) or a client certificate
//!   ([`RedisBackendBuilder::tls_client_certificate`]).
#![cfg_attr(docsrs, feature(doc_cfg))]

/// Guides: longer reads than the items' own docs, each with doctested examples.
pub mod guide {
    #[doc = include_str!("docs/algorithms.md")]
    pub mod algorithms {}
    #[doc = include_str!("docs/features.md")]
    pub mod features {}
    #[doc = include_str!("docs/production.md")]
    pub mod production {}
    #[doc = include_str!("docs/operations.md")]
    pub mod operations {}
}

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The Lua source of the script that the Redis backend runs with `EVALSHA` (where the server
/// refuses its function library, whose `FCALL` runs the same check) for any check that
/// the smaller script of one algorithm ([`script_of`]) cannot run: every algorithm, one entry
/// point, any requests of any policies. Its `KEYS` and `ARGV` are described at the head of
/// `lua/protocol.lua`: the time in microseconds (or empty for Redis `TIME`), the number of
/// policy sets, then per set its number of policies and per policy its algorithm, limit, window
/// in milliseconds, burst and flags; then to the end, per request, its cost and its head (its
/// flags plus `SET_STEP`, a local at the script's head, times its set's number, from 1; with
/// the flag `REPEAT` a head stands for a run of requests alike but for their keys, and the
/// run's length follows); [`check_command`] writes them. Reply: one MessagePack array of
/// integers, per request four per policy (allowed 1/0, remaining, reset ms, retry ms or -1, or
/// -2 for never). For preloading with `SCRIPT LOAD` where the server refuses functions, or for
/// measuring against.
pub const SCRIPT: &str = backend::redis::CHECK;

/// The Lua source of the script the Redis backend runs for a check of `policies` for one client:
/// the small script of the policy's algorithm for one policy that takes no overrides and bans
/// no one, else [`SCRIPT`]. For preloading with `SCRIPT LOAD` where the server refuses functions,
/// or for measuring against.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Policy};
///
/// let minute = Policy::builder("minute", Algorithm::FixedWindow)
///     .limit(100)
///     .window(Duration::from_secs(60))
///     .build()?;
/// let lean = redlimit::script_of(std::slice::from_ref(&minute));
/// assert!(lean.len() < redlimit::SCRIPT.len());
/// assert!(lean.contains("local function fixed_window("));
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
pub fn script_of(policies: &[Policy]) -> &'static str {
    backend::redis::protocol::source_of(policies)
}

/// The `EVALSHA` command the Redis backend sends, where the server refuses its function library
/// (whose `FCALL` carries the same keys and arguments), for a check of cost 1 of `policies` for
/// each of `clients` at Redis `TIME`, in one call as a batch of them is, its keys named by `keys`:
/// the script named by `sha1` (that of [`script_of`]`(policies)` for one client, else
/// [`SCRIPT`]), its `KEYS` and its `ARGV` as `lua/protocol.lua` reads them. For replaying checks
/// through another client, or measuring against; its reply is one MessagePack array of integers,
/// per check four per policy (allowed 1/0, remaining, reset ms, retry ms or -1, or -2 for never).
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, KeyScheme, Policy};
///
/// let minute = Policy::builder("minute", Algorithm::FixedWindow)
///     .limit(100)
///     .window(Duration::from_secs(60))
///     .build()?;
/// let keys = KeyScheme::new("app")?;
/// let command = redlimit::check_command(&keys, std::slice::from_ref(&minute), &["alice"], "0123");
/// let args: Vec<_> = command.args_iter().collect();
/// // EVALSHA, the SHA1, one key, the key, then the arguments.
/// assert_eq!(args.len(), 4 + 10);
/// // Checks of three clients: their three keys, and the arguments once more (the count of a run).
/// let batch = redlimit::check_command(&keys, std::slice::from_ref(&minute), &["a", "b", "c"], "");
/// assert_eq!(batch.args_iter().count(), 3 + 3 + 10 + 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_command(
    keys: &KeyScheme,
    policies: &[Policy],
    clients: &[&str],
    sha1: &str,
) -> deadpool_redis::redis::Cmd {
    let requests: Vec<_> = clients
        .iter()
        .map(|client| backend::redis::protocol::Request::new(policies, client))
        .collect();
    backend::redis::protocol::encode(keys, None, &requests).command("EVALSHA", sha1)
}

/// The deadpool-redis this crate is built with, for [`RedisBackend::from_pool`].
pub use deadpool_redis;

mod algorithm;
mod backend;
mod ban;
mod check_request;
mod client_id;
mod concurrency;
mod config_error;
mod decision;
mod decisions;
mod error;
mod grants;
mod guard;
mod inspection;
mod key;
mod key_table;
mod limiter;
mod overrides;
mod policy;
mod policy_set;
mod redact;
mod timestamp;

pub use self::{
    backend::{Backend, MemoryBackend, MemoryBackendBuilder, RedisBackend, RedisBackendBuilder},
    ban::Ban,
    check_request::{CheckRequest, SettleFuture, SettleRequest},
    concurrency::{ConcurrencyPolicy, ConcurrencyPolicyBuilder, Lease},
    config_error::ConfigError,
    decision::{Decision, Reason, RetryAfter},
    decisions::Decisions,
    error::{Error, ErrorKind},
    grants::Grants,
    guard::{
        BlockCache, Check, CircuitBreaker, Clock, FailurePolicy, GuardBuilder, GuardedLimiter,
        Stats,
    },
    inspection::{Inspection, Scan},
    key::KeyScheme,
    limiter::{CheckFuture, Limiter},
    overrides::Override,
    policy::{Algorithm, Policy, PolicyBuilder},
    policy_set::PolicySet,
    redact::redacted_url,
    timestamp::Timestamp,
};
