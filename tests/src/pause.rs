//! Pausing a server's writes, as a failover does: its clients' scripts wait while reads, pings
//! and the cluster's own traffic are answered, so nothing fails over.

use deadpool_redis::redis;

/// Pauses the writes of the server `connection` reaches for `ms` milliseconds or until
/// [`unpause`] (`CLIENT PAUSE ms WRITE`).
pub fn pause_writes(connection: &mut redis::Connection, ms: u64) {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(connection)
        .expect("CLIENT PAUSE");
}

/// Ends a pause of the server `connection` reaches (`CLIENT UNPAUSE`).
pub fn unpause(connection: &mut redis::Connection) {
    let _: () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(connection)
        .expect("CLIENT UNPAUSE");
}
