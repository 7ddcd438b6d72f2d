//! Test harness: real `redis-server` processes on free loopback ports.
//!
//! Each [`RedisServer`] runs in its own temporary directory with persistence off, is ready when
//! it answers `PING`, and is killed and reaped when dropped. Without `redis-server` the tests fail
//! with a message saying how to install it; they never pass silently.

use std::{
    fs,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

use deadpool_redis::redis;
use redlimit::{Limiter, RedisBackend};

/// How long a server may take to answer its first `PING`.
const READY_WITHIN: Duration = Duration::from_secs(10);

const INSTALL_HINT: &str = "redis-server is needed for redlimit's tests and was not found. \
Install it (Debian/Ubuntu: `apt-get install redis-server`; macOS: `brew install redis`), \
put it on PATH or set REDLIMIT_REDIS_SERVER to its path, or run `bash .ci/run`, which installs it.";

/// The `redis-server` binary: `$REDLIMIT_REDIS_SERVER`, else `redis-server` on `PATH`.
pub fn redis_server_binary() -> String {
    std::env::var("REDLIMIT_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// A running `redis-server`; killed and reaped on drop, its directory removed.
#[derive(Debug)]
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a standalone server, panicking with the server's log if it never becomes ready.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line settings such as `["--maxmemory", "1mb"]`.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::try_start(&redis_server_binary(), extra).unwrap_or_else(|message| panic!("{message}"))
    }

    /// Starts a server on a chosen port, such as one a limiter was already pointed at.
    pub fn start_on_port(port: u16) -> Self {
        Self::try_start_on(&redis_server_binary(), Some(port), &[])
            .unwrap_or_else(|message| panic!("{message}"))
    }

    /// Starts `binary` with `extra` settings; the error says what went wrong, with the log.
    pub fn try_start(binary: &str, extra: &[&str]) -> Result<Self, String> {
        Self::try_start_on(binary, None, extra)
    }

    fn try_start_on(binary: &str, port: Option<u16>, extra: &[&str]) -> Result<Self, String> {
        // A free port can be taken between our probe and the server's bind: try a few.
        let mut last_error = String::new();
        for _ in 0..3 {
            let port = port.unwrap_or_else(free_port);
            let dir = temp_dir();
            let mut child = spawn(binary, port, &dir, extra)?;
            match wait_ready(&mut child, port) {
                Ok(()) => return Ok(Self { child, port, dir }),
                Err(why) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = read_logs(&dir);
                    let _ = fs::remove_dir_all(&dir);
                    last_error = format!(
                        "redis-server on 127.0.0.1:{port} never became ready ({why}).\n--- its output ---\n{log}"
                    );
                    if !log.contains("Address already in use") {
                        break;
                    }
                }
            }
        }
        Err(last_error)
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain synchronous connection, for inspecting and corrupting state in tests.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|client| client.get_connection())
            .unwrap_or_else(|err| panic!("connecting to {}: {err}", self.url()))
    }

    /// A redlimit backend on this server with a generous time budget.
    pub fn backend(&self) -> RedisBackend {
        RedisBackend::builder(self.url())
            .timeout(Duration::from_secs(5))
            .build()
            .expect("a valid url")
    }

    /// A limiter on this server.
    pub fn limiter(&self) -> Limiter {
        Limiter::new(self.backend())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn spawn(binary: &str, port: u16, dir: &Path, extra: &[&str]) -> Result<Child, String> {
    let output = |name: &str| {
        fs::File::create(dir.join(name)).map_err(|err| format!("creating {name}: {err}"))
    };
    Command::new(binary)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .args(["--logfile", "redis.log"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(output("stdout.log")?)
        .stderr(output("stderr.log")?)
        .spawn()
        .map_err(|err| {
            let _ = fs::remove_dir_all(dir);
            if err.kind() == std::io::ErrorKind::NotFound {
                format!("{INSTALL_HINT} (tried to run {binary:?})")
            } else {
                format!("starting {binary:?}: {err}")
            }
        })
}

fn wait_ready(child: &mut Child, port: u16) -> Result<(), String> {
    let started = Instant::now();
    while started.elapsed() < READY_WITHIN {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!("it exited with {status}"));
        }
        if answers_ping(port) {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(20));
    }
    Err(format!("no PONG within {READY_WITHIN:?}"))
}

fn answers_ping(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut reply = [0_u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && &reply == b"+PONG\r\n"
}

fn read_logs(dir: &Path) -> String {
    ["redis.log", "stdout.log", "stderr.log"]
        .iter()
        .map(|name| {
            let text = fs::read_to_string(dir.join(name)).unwrap_or_default();
            format!("[{name}]\n{text}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("binding a loopback port")
}

fn temp_dir() -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "redlimit-test-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("creating a temporary directory");
    dir
}

/// Every key on the server whose time to live is missing (`PTTL` = -1).
pub fn keys_without_ttl(connection: &mut redis::Connection) -> (usize, Vec<String>) {
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter(connection)
        .expect("SCAN")
        .collect::<Result<_, _>>()
        .expect("SCAN reply");
    let mut immortal = Vec::new();
    for key in &keys {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(connection).expect("PTTL");
        if ttl == -1 {
            immortal.push(key.clone());
        }
    }
    (keys.len(), immortal)
}

/// A response read by [`http_get`].
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// Header names (lower case) and values, in order.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
}

impl HttpResponse {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A plain HTTP/1.1 `GET` over a fresh loopback connection, with extra request headers: enough
/// for tests to see exactly what a server sends, with no client library in between.
pub async fn http_get(address: SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .unwrap_or_else(|_| panic!("GET {path} from {address}: no response within 10 s"))
        .unwrap_or_else(|err| panic!("GET {path} from {address}: {err}"));
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("GET {path}: not an HTTP response: {text:?}"));
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    HttpResponse {
        status,
        headers,
        body: dechunk(body, head),
    }
}

/// Undoes chunked transfer coding, which hyper uses for bodies of unknown length.
fn dechunk(body: &str, head: &str) -> String {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_owned();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || tail.len() < size {
            break;
        }
        out.push_str(&tail[..size]);
        rest = tail[size..].trim_start_matches("\r\n");
    }
    out
}

/// Serves `router` on a free loopback port with the peer address recorded, until the test ends.
pub async fn serve(router: axum::Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding a loopback port");
    let address = listener.local_addr().expect("local address");
    let service = router.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    address
}

/// A clock for explicit check times that a test moves by hand.
#[derive(Debug, Clone)]
pub struct TestClock(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl TestClock {
    /// Starts at `millis` since the epoch.
    pub fn at_millis(millis: u64) -> Self {
        Self(std::sync::Arc::new(std::sync::atomic::AtomicU64::new(
            millis,
        )))
    }

    /// Moves the clock `millis` later.
    pub fn advance_millis(&self, millis: u64) {
        self.0.fetch_add(millis, Ordering::SeqCst);
    }

    /// The clock in the form redlimit takes.
    pub fn clock(&self) -> redlimit::Clock {
        let millis = std::sync::Arc::clone(&self.0);
        std::sync::Arc::new(move || redlimit::Timestamp::from_millis(millis.load(Ordering::SeqCst)))
    }
}

/// Deletes every key on the server.
pub fn flush_all(connection: &mut redis::Connection) {
    let _: () = redis::cmd("FLUSHALL").query(connection).expect("FLUSHALL");
}
