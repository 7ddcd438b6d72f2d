//! Where state lives.

mod connection;
mod key_table;
mod memory;
mod redis;
pub(crate) mod script;

pub use self::{
    memory::{MemoryBackend, MemoryBackendBuilder},
    redis::{RedisBackend, RedisBackendBuilder},
};

/// Where a [`Limiter`](crate::Limiter) keeps its state.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// A Redis server shared by every instance of the application.
    Redis(RedisBackend),
    /// This process's memory.
    Memory(MemoryBackend),
}

impl From<RedisBackend> for Backend {
    fn from(backend: RedisBackend) -> Self {
        Self::Redis(backend)
    }
}

impl From<MemoryBackend> for Backend {
    fn from(backend: MemoryBackend) -> Self {
        Self::Memory(backend)
    }
}
