//! Operator events: a reset or an override must reach every instance at once, though each may
//! hold a local block for the client (a guard's block cache).
//!
//! [`Limiter::reset`](crate::Limiter::reset), `set_override` and `clear_override` publish an event
//! on the channel `prefix:~events` (plain pub/sub: a Cluster forwards it to every node). A backend
//! whose guards keep blocks listens on one connection of its own and counts what it hears: a
//! block recorded before the latest event is not used, so the client's next check goes to Redis.
//! While the listener is not subscribed (Redis restarting, a failover) blocks are used for at
//! most [`DEAF_BLOCK_US`] after they were recorded, even once it listens (an event may have been
//! missed before), and once it listens again after listening every block recorded before is
//! dropped, since an event may have been missed meanwhile. Its first subscription drops
//! nothing: blocks recorded while it connects, a flood at start, stay local.

use std::{
    sync::{
        Arc, Mutex, PoisonError, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use deadpool_redis::redis::{self, ConnectionInfo, Value};
use futures_util::StreamExt;

use super::Inner;

/// How long a block is used while no listener hears events: the longest a reset can be hidden.
pub(crate) const DEAF_BLOCK_US: u64 = 1_000_000;

/// How long the listener waits for an event before it checks that the connection is alive.
const IDLE: Duration = Duration::from_secs(1);

/// How long to wait before connecting again.
const RECONNECT: Duration = Duration::from_millis(200);

/// What a backend has heard: how many events (a block recorded under an older count is not
/// used), whether it listens now, and the channels to listen on.
#[derive(Debug, Default)]
pub(crate) struct Events {
    generation: AtomicU64,
    listening: AtomicBool,
    /// Whether a listener ever heard events: only after that can blocks recorded while it
    /// listened have missed an event.
    listened: AtomicBool,
    started: AtomicBool,
    channels: Mutex<Vec<String>>,
}

/// The events heard when a block was looked up or recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Heard {
    /// How many events were heard.
    pub(crate) generation: u64,
    /// Whether a listener hears events now.
    pub(crate) listening: bool,
}

impl Events {
    /// What was heard so far.
    pub(crate) fn heard(&self) -> Heard {
        Heard {
            generation: self.generation.load(Ordering::Acquire),
            listening: self.listening.load(Ordering::Acquire),
        }
    }

    /// Whether a listener hears events now.
    pub(crate) fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    fn hear(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    fn set_listening(&self, listening: bool) {
        // Events may have been missed while deaf: blocks recorded while listening before are
        // dropped (those recorded deaf last at most `DEAF_BLOCK_US` anyway).
        if listening && self.listened.swap(true, Ordering::AcqRel) {
            self.hear();
        }
        self.listening.store(listening, Ordering::Release);
    }

    /// How many channels to listen on.
    fn channel_count(&self) -> usize {
        self.channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// The channels to listen on from the `from`th on.
    fn channels_from(&self, from: usize) -> Vec<String> {
        let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
        channels
            .get(from..)
            .map(<[String]>::to_vec)
            .unwrap_or_default()
    }
}

/// Where the listener subscribes: the standalone server, any of a Cluster's nodes (each hears
/// every event), or the primary Sentinel names; nothing for a pool the application built. No
/// `Debug`: its settings may hold a password or a private key.
#[derive(Clone)]
pub(super) enum Subscriber {
    None,
    Nodes(Vec<ConnectionInfo>),
    #[cfg(feature = "sentinel")]
    Sentinel(super::sentinels::Sentinels),
}

impl Subscriber {
    /// A client for the `attempt`th try, or `None` when there is nowhere to listen.
    async fn client(&self, attempt: usize) -> Option<redis::Client> {
        match self {
            Self::None => None,
            Self::Nodes(nodes) => {
                let node = nodes.get(attempt % nodes.len().max(1))?;
                redis::Client::open(node.clone()).ok()
            }
            #[cfg(feature = "sentinel")]
            Self::Sentinel(sentinels) => sentinels.client().ok()?.async_get_client().await.ok(),
        }
    }
}

/// Listens on `channel` for `inner`'s backend, starting its listener if this is called inside
/// a Tokio runtime (else at the first [`start`] that is).
pub(super) fn listen(inner: &Arc<Inner>, channel: &str) {
    {
        let mut channels = inner
            .events
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if !channels.iter().any(|c| c == channel) {
            channels.push(channel.to_owned());
        }
    }
    start(inner);
}

/// Starts `inner`'s listener unless it runs or there is no Tokio runtime here: one atomic load
/// once it runs.
pub(super) fn start(inner: &Arc<Inner>) {
    if inner.events.started.load(Ordering::Acquire) {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if !inner.events.started.swap(true, Ordering::AcqRel) {
        runtime.spawn(run(Arc::downgrade(inner)));
    }
}

/// The listener: subscribes, counts every event, and connects again whenever the connection
/// fails, until the backend is dropped.
async fn run(backend: Weak<Inner>) {
    for attempt in 0.. {
        let Some(subscriber) = backend.upgrade().map(|inner| inner.subscriber.clone()) else {
            return;
        };
        let connected = match subscriber.client(attempt).await {
            Some(client) => {
                let connect = super::connect::pubsub(client.get_connection_info());
                tokio::time::timeout(IDLE, connect).await
            }
            None => return,
        };
        if let Ok(Ok(pubsub)) = connected
            && !listen_on(&backend, pubsub).await
        {
            return;
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

/// Hears events on `pubsub` until it fails (`true`: connect again) or the backend is dropped
/// (`false`).
async fn listen_on(backend: &Weak<Inner>, pubsub: redis::aio::PubSub) -> bool {
    let (mut sink, mut stream) = pubsub.split();
    let mut subscribed = 0;
    let alive = loop {
        let Some(inner) = backend.upgrade() else {
            return false;
        };
        for channel in inner.events.channels_from(subscribed) {
            if sink.subscribe(&channel).await.is_err() {
                break;
            }
            subscribed += 1;
        }
        if subscribed == 0 || subscribed < inner.events.channel_count() {
            break true;
        }
        if !inner.events.is_listening() {
            inner.events.set_listening(true);
            tracing::debug!("listening for operator events");
        }
        drop(inner);
        match tokio::time::timeout(IDLE, stream.next()).await {
            Ok(Some(message)) => {
                let Some(inner) = backend.upgrade() else {
                    return false;
                };
                inner.events.hear();
                tracing::debug!(
                    event = %String::from_utf8_lossy(message.get_payload_bytes()),
                    "operator event"
                );
            }
            Ok(None) => break true,
            // Quiet: make sure the connection still answers.
            Err(_) => {
                let ping = tokio::time::timeout(IDLE, sink.ping::<Value>()).await;
                if !matches!(ping, Ok(Ok(_))) {
                    break true;
                }
            }
        }
    };
    if let Some(inner) = backend.upgrade() {
        inner.events.set_listening(false);
        tracing::debug!("operator events unheard until the listener connects again");
    }
    alive
}
