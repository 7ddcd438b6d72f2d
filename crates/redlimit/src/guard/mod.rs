//! What stands between a request and the backend: a time budget, a failure policy (fail open,
//! fail closed, or a local fallback), a circuit breaker, a local block cache, and counters of
//! every outcome. [`GuardedLimiter`] holds them together.

mod block_cache;
mod breakers;
mod builder;
mod check;
mod circuit_breaker;
mod error_log;
mod failure_policy;
mod grant_table;
mod guarded_limiter;
mod metrics;
mod parts;
mod stats;
#[cfg(test)]
mod tests;

pub use self::{
    block_cache::BlockCache, builder::GuardBuilder, check::Check, circuit_breaker::CircuitBreaker,
    failure_policy::FailurePolicy, guarded_limiter::GuardedLimiter, parts::Clock, stats::Stats,
};
