//! Replies of bounded size. redis-rs buffers a reply whole, however large it says it is: a
//! server (or anything answering on its port) that sends a gigabyte would take a gigabyte of
//! memory and the time to read it. No answer of this protocol is larger than [`MAX_REPLY`],
//! so the stream under each connection counts every reply's bytes as they arrive and fails
//! the connection, before redis-rs sees the bytes, at a reply that says or proves it is
//! larger: its checks fail at once (a backend error) and the next takes a fresh connection.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The largest reply read: far above the largest answer of this protocol (a `SCAN` page of a
/// thousand keys, a batch of checks), far below what would hurt an application's memory.
pub(crate) const MAX_REPLY: u64 = 4 << 20;

/// A stream whose replies may be at most `max` bytes each.
#[derive(Debug)]
pub(super) struct Bounded<S> {
    stream: S,
    replies: Replies,
}

impl<S> Bounded<S> {
    pub(super) fn new(stream: S, max: u64) -> Self {
        Self {
            stream,
            replies: Replies::new(max),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Bounded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = read
            && let Err(error) = this.replies.read(&buf.filled()[before..])
        {
            buf.set_filled(before);
            return Poll::Ready(Err(error));
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Bounded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Where the reader is in the stream of RESP replies, and how large the current one is so far.
/// Only lengths are read: a type byte, a header line, a blob's bytes skipped.
#[derive(Debug)]
struct Replies {
    max: u64,
    /// Bytes of the current reply so far.
    used: u64,
    /// Values still to come before the current reply is whole; 0 between replies.
    pending: u64,
    at: At,
}

#[derive(Debug, Clone, Copy)]
enum At {
    /// In a header line: its type byte once read, and its number so far.
    Line { kind: Option<u8>, number: Number },
    /// In a blob: how many bytes of it (with its closing CRLF) are left.
    Blob(u64),
}

#[derive(Debug, Clone, Copy, Default)]
struct Number {
    value: u64,
    negative: bool,
    invalid: bool,
}

impl At {
    const START: Self = Self::Line {
        kind: None,
        number: Number {
            value: 0,
            negative: false,
            invalid: false,
        },
    };
}

impl Replies {
    fn new(max: u64) -> Self {
        Self {
            max,
            used: 0,
            pending: 0,
            at: At::START,
        }
    }

    /// Reads `bytes`, the next bytes of the stream: an error once a reply is, or says it is,
    /// larger than the bound.
    fn read(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while let Some((&byte, rest)) = bytes.split_first() {
            if let At::Blob(left) = self.at {
                let skipped = usize::try_from(left).map_or(bytes.len(), |l| l.min(bytes.len()));
                let (_, rest) = bytes.split_at(skipped);
                bytes = rest;
                self.count(skipped as u64)?;
                self.at = At::Blob(left - skipped as u64);
                if left == skipped as u64 {
                    self.at = At::START;
                    self.one_value_done();
                }
                continue;
            }
            bytes = rest;
            self.line(byte)?;
            self.count(1)?;
        }
        Ok(())
    }

    /// Reads `byte` of a header line.
    fn line(&mut self, byte: u8) -> io::Result<()> {
        let At::Line { kind, mut number } = self.at else {
            return Ok(());
        };
        let Some(kind) = kind else {
            if self.pending == 0 {
                // A new reply begins.
                self.pending = 1;
                self.used = 0;
            }
            self.at = At::Line {
                kind: Some(byte),
                number,
            };
            return Ok(());
        };
        match byte {
            b'\n' => return self.header(kind, number),
            b'\r' => {}
            b'-' if number.value == 0 => number.negative = true,
            b'0'..=b'9' => {
                number.value = number
                    .value
                    .saturating_mul(10)
                    .saturating_add(u64::from(byte - b'0'));
            }
            _ => number.invalid = true,
        }
        self.at = At::Line {
            kind: Some(kind),
            number,
        };
        Ok(())
    }

    /// A header line of `kind` with `number` has ended.
    fn header(&mut self, kind: u8, number: Number) -> io::Result<()> {
        self.at = At::START;
        let sized = matches!(kind, b'$' | b'=' | b'!' | b'*' | b'~' | b'>' | b'%' | b'|');
        if !sized || number.negative {
            // A simple value, or a null blob or aggregate.
            self.one_value_done();
            return Ok(());
        }
        if number.invalid {
            return Err(refused("a length that is not a number (a streamed reply?)"));
        }
        let left = self.max.saturating_sub(self.used);
        match kind {
            b'$' | b'=' | b'!' => {
                let blob = number.value.saturating_add(2);
                if blob > left {
                    return Err(too_large(self.max));
                }
                self.at = At::Blob(blob);
            }
            _ => {
                // Each value takes at least 3 bytes ("_\r\n"): a count beyond what is left
                // is refused before anything is allocated for it.
                let values = match kind {
                    b'%' | b'|' => number.value.saturating_mul(2),
                    _ => number.value,
                };
                if values.saturating_mul(3) > left {
                    return Err(too_large(self.max));
                }
                // An attribute comes before the value it describes: it is not that value.
                if kind != b'|' {
                    self.pending -= 1;
                }
                self.pending += values;
            }
        }
        Ok(())
    }

    fn one_value_done(&mut self) {
        self.pending = self.pending.saturating_sub(1);
    }

    fn count(&mut self, bytes: u64) -> io::Result<()> {
        self.used += bytes;
        if self.used > self.max {
            return Err(too_large(self.max));
        }
        Ok(())
    }
}

fn too_large(max: u64) -> io::Error {
    refused(&format!("a reply larger than {max} bytes"))
}

fn refused(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("redis sent {what}, more than any answer of redlimit's can be: connection dropped"),
    )
}

#[cfg(test)]
mod tests {
    use super::Replies;

    /// Whether `stream` is read without error, fed whole and a byte at a time.
    fn reads(stream: &[u8], max: u64) -> bool {
        let whole = Replies::new(max).read(stream).is_ok();
        let mut bytewise = Replies::new(max);
        let each = stream.chunks(1).all(|byte| bytewise.read(byte).is_ok());
        assert_eq!(whole, each, "{}", String::from_utf8_lossy(stream));
        whole
    }

    #[test]
    fn answers_of_every_type_are_read_and_each_reply_counted_alone() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR something went wrong\r\n",
            b":-42\r\n",
            b"$5\r\nhello\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*3\r\n:1\r\n$2\r\nab\r\n*2\r\n_\r\n#t\r\n",
            b"%1\r\n+key\r\n,1.5\r\n",
            b"|1\r\n+ttl\r\n:3\r\n$3\r\nabc\r\n",
            b">2\r\n+message\r\n$0\r\n\r\n",
            b"~2\r\n(12345678901234567890\r\n=7\r\ntxt:abc\r\n",
        ];
        for reply in replies {
            assert!(reads(reply, 64), "{}", String::from_utf8_lossy(reply));
        }
        // Many replies, each within the bound, in one stream: each is counted alone.
        let stream: Vec<u8> = replies
            .iter()
            .copied()
            .cycle()
            .take(1_000)
            .flatten()
            .copied()
            .collect();
        assert!(reads(&stream, 64));
    }

    #[test]
    fn a_reply_larger_than_the_bound_is_refused_from_its_header() {
        assert!(reads(b"$58\r\n", 64));
        assert!(
            !reads(b"$1000000000\r\n", 64),
            "a blob said to be too large"
        );
        assert!(!reads(b"*1000000000\r\n", 1 << 20), "a count too large");
        assert!(!reads(b"%400000000\r\n", 1 << 20), "a map too large");
        // An array of small values that, added up, is too large.
        let mut many = b"*100\r\n".to_vec();
        many.extend(b":1234567\r\n".repeat(100));
        assert!(reads(&many, 2_000));
        assert!(!reads(&many, 500));
        // A line that never ends.
        assert!(!reads(&[b'+'; 100], 64));
        assert!(!reads(b"$?\r\n", 64), "a streamed blob");
    }
}
