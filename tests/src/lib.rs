//! Test harness: real `redis-server` processes on free loopback ports.
//!
//! Each [`RedisServer`] runs in its own temporary directory with persistence off, is ready when
//! it answers `PING`, and is killed and reaped when dropped. [`RedisCluster`] and
//! [`RedisSentinel`] build a Cluster (3 primaries, 3 replicas) and a Sentinel set-up (primary,
//! replica, 3 sentinels) from such servers. Without `redis-server` the tests fail with a message
//! saying how to install it; they never pass silently.

#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

mod cluster;
mod commands;
mod fake;
mod hot_key;
mod http;
mod pause;
mod pki;
mod sentinel;
mod server;

pub use self::{
    cluster::RedisCluster,
    commands::{CommandStat, Sent, command_calls, commands_sent, script_calls},
    fake::HugeReplyServer,
    hot_key::hammer_one_key,
    http::{HttpResponse, TestClock, http_get, serve},
    pause::{pause_writes, unpause},
    pki::Pki,
    sentinel::RedisSentinel,
    server::{RedisServer, flush_all, free_port, keys_without_ttl, redis_server_binary},
};
