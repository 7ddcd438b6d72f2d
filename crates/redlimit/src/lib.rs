//! Distributed rate limiting on Redis.
//!
//! A [`Policy`] says how many requests a client may make, with which [`Algorithm`]; a
//! [`Limiter`] checks a request against one or several policies and returns a [`Decision`] per
//! policy. On the [`RedisBackend`] every check is one atomic Lua script, one round trip, with
//! Redis's clock; the [`MemoryBackend`] runs the same integer arithmetic in process.
//!
//! ```
//! use std::time::Duration;
//! use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, RetryAfter};
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
//! let decisions = limiter.check_all(&[per_second, per_day], "api-key-42", 1).await?;
//! if decisions.allowed() {
//!     // serve the request
//! } else if let Some(RetryAfter::After(wait)) = decisions.retry_after() {
//!     println!("try again in {wait:?}");
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

/// The Lua source of the check script that the Redis backend runs with `EVALSHA`: every
/// algorithm, one entry point. `KEYS`: one key per policy (see [`KeyScheme`]); `ARGV`: the time
/// in microseconds or empty for Redis `TIME`, the cost, then per policy its algorithm tag,
/// limit, window in milliseconds and burst. For preloading with `SCRIPT LOAD`, or for measuring
/// against.
pub const SCRIPT: &str = backend::script::SOURCE;

mod algorithm;
mod backend;
mod client_id;
mod config_error;
mod decision;
mod decisions;
mod error;
mod guard;
mod key;
mod key_table;
mod limiter;
mod policy;
mod timestamp;

pub use self::{
    backend::{Backend, MemoryBackend, MemoryBackendBuilder, RedisBackend, RedisBackendBuilder},
    config_error::ConfigError,
    decision::{Decision, Reason, RetryAfter},
    decisions::Decisions,
    error::{Error, ErrorKind},
    guard::{BlockCache, Check, CircuitBreaker, Clock, FailurePolicy, GuardedLimiter, Stats},
    key::KeyScheme,
    limiter::Limiter,
    policy::{Algorithm, Policy, PolicyBuilder},
    timestamp::Timestamp,
};
