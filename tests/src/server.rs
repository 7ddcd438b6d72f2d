//! One `redis-server` process on a free loopback port.

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
        Self::start_on_port_with(port, &[])
    }

    /// Starts a server on a chosen port with extra command-line settings.
    pub fn start_on_port_with(port: u16, extra: &[&str]) -> Self {
        Self::launch(&[&redis_server_binary()], Some(port), None, extra)
            .unwrap_or_else(|message| panic!("{message}"))
    }

    /// Starts a Sentinel on a chosen port whose configuration file holds `config`.
    pub fn start_sentinel(port: u16, config: &str) -> Self {
        Self::launch(&[&redis_server_binary()], Some(port), Some(config), &[])
            .unwrap_or_else(|message| panic!("{message}"))
    }

    /// Starts `binary` with `extra` settings; the error says what went wrong, with the log.
    pub fn try_start(binary: &str, extra: &[&str]) -> Result<Self, String> {
        Self::launch(&[binary], None, None, extra)
    }

    /// Starts the server under a program that runs it, such as `["valgrind",
    /// "--tool=callgrind"]`: `wrapper`, then the server's binary and its settings.
    pub fn try_start_under(wrapper: &[&str], extra: &[&str]) -> Result<Self, String> {
        let binary = redis_server_binary();
        let program: Vec<&str> = wrapper.iter().copied().chain([binary.as_str()]).collect();
        Self::launch(&program, None, None, extra)
    }

    /// Runs `program` (a command line ending with the server's binary) on a free port.
    fn launch(
        program: &[&str],
        port: Option<u16>,
        sentinel: Option<&str>,
        extra: &[&str],
    ) -> Result<Self, String> {
        // A free port can be taken between our probe and the server's bind: try a few.
        let mut last_error = String::new();
        for _ in 0..3 {
            let port = port.unwrap_or_else(free_port);
            let dir = temp_dir();
            let mut child = spawn(program, port, &dir, sentinel, extra)?;
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

    /// Kills the process now (as a crash would), keeping the guard for its log.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        read_logs(&self.dir)
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
            .budget(Duration::from_secs(5))
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

fn spawn(
    program: &[&str],
    port: u16,
    dir: &Path,
    sentinel: Option<&str>,
    extra: &[&str],
) -> Result<Child, String> {
    let output = |name: &str| {
        fs::File::create(dir.join(name)).map_err(|err| format!("creating {name}: {err}"))
    };
    let (binary, rest) = program.split_first().ok_or("no program to run")?;
    let mut command = Command::new(binary);
    command.args(rest);
    if let Some(config) = sentinel {
        // Sentinel rewrites its configuration file, so it must be a file of its own.
        let path = dir.join("sentinel.conf");
        fs::write(&path, config).map_err(|err| format!("writing sentinel.conf: {err}"))?;
        command.arg(path).arg("--sentinel");
    }
    command
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
    // A server with a password answers `-NOAUTH …`: it is up all the same.
    let mut reply = [0_u8; 7];
    stream.write_all(b"PING\r\n").is_ok()
        && stream.read_exact(&mut reply).is_ok()
        && (&reply == b"+PONG\r\n" || reply.starts_with(b"-NOAUTH"))
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
///
/// Drawn from 15000–22999, below the kernel's ephemeral range (32768 and up on Linux), so an
/// outgoing connection cannot take it between this probe and the server's bind; a cluster node's
/// bus port (port + 10000) stays below that range too. No port is handed out twice in one
/// process, so two servers started by one test run never race for the same port.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // A start that differs per process, then a walk over the whole range (97 is prime to it).
    let seed = std::process::id().wrapping_mul(2_654_435_761);
    let span = 8_000_u32;
    for step in 0..span {
        let port = u16::try_from(15_000 + (seed.wrapping_add(step * 97)) % span).unwrap_or(15_000);
        if !given.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free loopback port in 15000-22999")
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

/// Deletes every key on the server.
pub fn flush_all(connection: &mut redis::Connection) {
    let _: () = redis::cmd("FLUSHALL").query(connection).expect("FLUSHALL");
}

/// Polls `done` until it holds; after `within`, panics naming `what` with the logs of `servers`.
pub(crate) fn settle(
    what: &str,
    within: Duration,
    servers: &[RedisServer],
    done: impl Fn() -> bool,
) {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > within {
            let logs: Vec<String> = servers.iter().map(RedisServer::log).collect();
            panic!("waited {within:?} for {what}. Logs:\n{}", logs.join("\n"));
        }
        thread::sleep(Duration::from_millis(100));
    }
}
