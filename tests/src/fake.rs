//! A hand-written server on loopback that speaks enough RESP to misbehave on purpose, for the
//! faults a real redis-server will not produce.

use std::{
    io::{self, BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    thread,
};

/// A server answering `OK` to every command but checks (`FCALL`, `EVALSHA`, `EVAL`), which it answers
/// with a bulk string of a gigabyte, sent until the client hangs up. It serves connections on a
/// thread each until dropped with the test process.
#[derive(Debug)]
pub struct HugeReplyServer {
    url: String,
}

/// The size the huge reply says it has, and at most sends.
const HUGE: usize = 1 << 30;

impl HugeReplyServer {
    /// Starts serving on a free loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let url = format!("redis://{}", listener.local_addr().expect("an address"));
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                thread::spawn(move || serve(stream));
            }
        });
        Self { url }
    }

    /// Its URL.
    pub fn url(&self) -> &str {
        &self.url
    }
}

/// Answers `stream`'s commands until it fails or closes.
fn serve(stream: TcpStream) -> io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    loop {
        let command = read_command(&mut reader)?;
        let name = command.first().map(|name| name.to_ascii_uppercase());
        if matches!(name.as_deref(), Some(b"FCALL" | b"EVALSHA" | b"EVAL")) {
            writer.write_all(format!("${HUGE}\r\n").as_bytes())?;
            let chunk = vec![b'a'; 1 << 16];
            for _ in 0..HUGE / chunk.len() {
                writer.write_all(&chunk)?;
            }
            writer.write_all(b"\r\n")?;
        } else {
            writer.write_all(b"+OK\r\n")?;
        }
    }
}

/// One command: an array of bulk strings.
fn read_command(reader: &mut impl BufRead) -> io::Result<Vec<Vec<u8>>> {
    let count = read_length(reader, b'*')?;
    (0..count)
        .map(|_| {
            let len = read_length(reader, b'$')?;
            let mut argument = vec![0; len + 2];
            reader.read_exact(&mut argument)?;
            argument.truncate(len);
            Ok(argument)
        })
        .collect()
}

/// A header line `{kind}{length}\r\n`'s length.
fn read_length(reader: &mut impl BufRead, kind: u8) -> io::Result<usize> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    line.trim_end()
        .strip_prefix(char::from(kind))
        .and_then(|n| n.parse().ok())
        .filter(|&n| n <= 1 << 20)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a command"))
}
