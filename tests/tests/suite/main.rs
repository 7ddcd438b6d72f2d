//! Every test that needs a real redis-server. One binary, so the suite links once.

mod backwards_time;
mod block_cache;
mod cluster;
mod concurrency;
mod corrupt;
mod delay;
mod failover;
mod harness;
mod inspect;
mod layer_axum;
mod layer_failures;
mod layer_headers;
mod leases;
mod lists;
mod multi_policy;
mod observability;
mod oom;
mod parity;
mod pitfalls;
mod round_trips;
mod secrets;
mod sentinel;
mod support;
mod timeouts;
mod tls;
mod vectors;
