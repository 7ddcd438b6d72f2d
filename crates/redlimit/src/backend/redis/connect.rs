//! How a connection to one server is made and kept: no timer of its own, its replies bounded,
//! and checked with a `PING` before a pool hands it out again.

use deadpool_redis::redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisResult,
    aio::{ConnectionLike, MultiplexedConnection, PubSub},
};

use super::bounded::{Bounded, MAX_REPLY};

/// A timer that never ends before a caller's: a day. For the one library timer that cannot be
/// turned off, the Cluster client's connect timer.
#[cfg(feature = "cluster")]
pub(crate) const NO_TIMER: std::time::Duration = std::time::Duration::from_secs(86_400);

/// The settings of a connection without a timer of its own. redis-rs gives every connection a
/// 500 ms response timer and a 1 s connect timer unless told otherwise, which would cut short a
/// longer budget: each wait is timed by the caller's one timer instead, the check's budget or
/// the backend's.
pub(crate) fn untimed() -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_response_timeout(None)
        .set_connection_timeout(None)
}

/// A connection to the server `info` names, its replies bounded by [`MAX_REPLY`] over plain
/// TCP. Over TLS or a Unix socket redis-rs makes the stream itself, unbounded.
pub(crate) async fn connect(
    info: &ConnectionInfo,
    config: AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    let ConnectionAddr::Tcp(host, port) = info.addr() else {
        return deadpool_redis::redis::Client::open(info.clone())?
            .get_multiplexed_async_connection_with_config(&config)
            .await;
    };
    let stream = bounded_tcp(host, *port, info).await?;
    let (connection, driver) =
        MultiplexedConnection::new_with_config(info.redis_settings(), stream, config).await?;
    // The driver ends when the last clone of the connection is dropped.
    tokio::spawn(driver);
    Ok(connection)
}

/// A pub/sub connection to the server `info` names, its messages bounded as [`connect`]'s
/// replies are.
pub(crate) async fn pubsub(info: &ConnectionInfo) -> RedisResult<PubSub> {
    let ConnectionAddr::Tcp(host, port) = info.addr() else {
        return deadpool_redis::redis::Client::open(info.clone())?
            .get_async_pubsub()
            .await;
    };
    PubSub::new(info.redis_settings(), bounded_tcp(host, *port, info).await?).await
}

/// A TCP stream to `host:port` with `info`'s settings, its replies bounded by [`MAX_REPLY`].
async fn bounded_tcp(
    host: &str,
    port: u16,
    info: &ConnectionInfo,
) -> std::io::Result<Bounded<tokio::net::TcpStream>> {
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    stream.set_nodelay(info.tcp_settings().nodelay())?;
    Ok(Bounded::new(stream, MAX_REPLY))
}

/// Checks a pooled connection before it is handed out again: a `PING` with a number of its own
/// must come back as that number. For the pool managers of this crate.
pub(crate) async fn recycle_with_ping(
    conn: &mut impl ConnectionLike,
    pings: &std::sync::atomic::AtomicUsize,
) -> deadpool::managed::RecycleResult<deadpool_redis::redis::RedisError> {
    let ping = pings
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .to_string();
    let echoed: String = deadpool_redis::redis::cmd("PING")
        .arg(&ping)
        .query_async(conn)
        .await?;
    if echoed == ping {
        Ok(())
    } else {
        Err(deadpool::managed::RecycleError::message(
            "a PING answered something else",
        ))
    }
}
