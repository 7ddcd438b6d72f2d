//! Commands sent as `redis-benchmark -c 64 -P 16` sends them: 64 connections driven from one
//! thread, each writing 16 commands and then reading their 16 replies, over and over. The
//! commands are built beforehand by redlimit's own encoder, so that what a check names is what
//! the backend sends: `redis-benchmark` draws each `__rand_int__` of a command apart, which made
//! a key group's policies, which name one key, name a client's each.

use std::sync::Arc;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// Connections, each its own stream of commands.
const CONNECTIONS: usize = 64;
/// Commands a connection writes before it reads their replies.
const PIPELINE: usize = 16;
/// Bytes a connection reads at most at once.
const READ_AHEAD: usize = 64 * 1024;

/// Sends `calls` commands to `addr` (`host:port`), taking them in turn from `pool` (each a
/// packed command; every connection starts at another place in it). Panics, naming the reply,
/// at the first error Redis answers.
pub(crate) fn send(addr: &str, pool: &Arc<[Vec<u8>]>, calls: usize) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for connection in 0..CONNECTIONS {
            // The calls spread over the connections, the first ones taking the remainder.
            let share = calls / CONNECTIONS + usize::from(connection < calls % CONNECTIONS);
            let start = connection * pool.len() / CONNECTIONS;
            let (addr, pool) = (addr.to_owned(), Arc::clone(pool));
            tasks.spawn(async move { drive(&addr, &pool, start, share).await });
        }
        while let Some(done) = tasks.join_next().await {
            if let Err(message) = done.expect("a connection's task ends") {
                panic!("saturate: {message}");
            }
        }
    });
}

/// One connection's `share` of the calls, from `pool[start]` on.
async fn drive(addr: &str, pool: &[Vec<u8>], start: usize, share: usize) -> Result<(), String> {
    if share == 0 {
        return Ok(());
    }
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|error| format!("connecting to {addr}: {error}"))?;
    stream
        .set_nodelay(true)
        .map_err(|error| error.to_string())?;
    let (mut written, mut next) = (Vec::new(), start);
    let mut read = Replies::default();
    let mut left = share;
    while left > 0 {
        let now = left.min(PIPELINE);
        written.clear();
        for _ in 0..now {
            written.extend_from_slice(&pool[next % pool.len()]);
            next += 1;
        }
        stream
            .write_all(&written)
            .await
            .map_err(|error| format!("writing: {error}"))?;
        read.wait_for(&mut stream, now).await?;
        left -= now;
    }
    Ok(())
}

/// What a connection has read and not yet taken as replies.
#[derive(Default)]
struct Replies {
    buffer: Vec<u8>,
    at: usize,
}

impl Replies {
    /// Reads until `count` whole replies have come, none of them an error.
    async fn wait_for(&mut self, stream: &mut TcpStream, count: usize) -> Result<(), String> {
        let mut got = 0;
        while got < count {
            match reply_len(&self.buffer[self.at..])? {
                Some(len) => {
                    self.at += len;
                    got += 1;
                }
                None => {
                    self.buffer.drain(..self.at);
                    self.at = 0;
                    // Room for many replies a read: a Vec grows by 64 bytes a read otherwise.
                    self.buffer.reserve(READ_AHEAD);
                    let read = stream
                        .read_buf(&mut self.buffer)
                        .await
                        .map_err(|error| format!("reading: {error}"))?;
                    if read == 0 {
                        return Err("Redis closed the connection".to_owned());
                    }
                }
            }
        }
        Ok(())
    }
}

/// The length of the RESP2 reply at the head of `bytes`, `None` while it is incomplete; an
/// error reply is an error.
fn reply_len(bytes: &[u8]) -> Result<Option<usize>, String> {
    let Some(end) = memchr::memmem::find(bytes, b"\r\n") else {
        return Ok(None);
    };
    let line = &bytes[1..end];
    let number = || -> Result<i64, String> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| format!("a malformed reply: {:?}", String::from_utf8_lossy(line)))
    };
    let head = end + 2;
    match bytes.first() {
        Some(b'+' | b':') => Ok(Some(head)),
        Some(b'-') => Err(format!(
            "Redis answered an error: {}",
            String::from_utf8_lossy(line)
        )),
        Some(b'$') => {
            // A null (-1) is its line alone.
            let whole = usize::try_from(number()?).map_or(head, |len| head + len + 2);
            Ok((bytes.len() >= whole).then_some(whole))
        }
        Some(b'*') => {
            let mut whole = head;
            for _ in 0..number()?.max(0) {
                match reply_len(&bytes[whole..])? {
                    Some(len) => whole += len,
                    None => return Ok(None),
                }
            }
            Ok(Some(whole))
        }
        _ => Err(format!("a reply of an unknown type: {:?}", bytes.first())),
    }
}

#[cfg(test)]
mod tests {
    use super::reply_len;

    #[test]
    fn replies_are_measured_whole_or_not_at_all() {
        assert_eq!(reply_len(b":12\r\n:3"), Ok(Some(5)));
        assert_eq!(reply_len(b"$3\r\nabc\r\n"), Ok(Some(9)));
        assert_eq!(reply_len(b"$3\r\nab"), Ok(None));
        assert_eq!(reply_len(b"$-1\r\n"), Ok(Some(5)));
        assert_eq!(reply_len(b"*2\r\n:1\r\n$1\r\nx\r\n"), Ok(Some(15)));
        assert_eq!(reply_len(b"*2\r\n:1\r\n"), Ok(None));
        assert_eq!(reply_len(b":1"), Ok(None));
        assert!(reply_len(b"-ERR no\r\n").is_err());
    }
}
