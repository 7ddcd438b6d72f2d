//! Requests per second of an axum hello-world, bare and behind the layer, with a load generator
//! on loopback keep-alive connections.

use std::{convert::Infallible, net::SocketAddr, sync::Arc, time::Instant};

use axum::{
    Router, ServiceExt,
    extract::Request,
    http::StatusCode,
    middleware::Next,
    response::{IntoResponse, Response},
    routing::get,
};
use deadpool_redis::redis;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use redlimit::{Algorithm, GuardedLimiter, Limiter, MemoryBackend, Policy, PolicySet};
use redlimit_tests::{command_calls, commands_sent};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::Mutex,
};
use tower::{Layer, Service};
use tower_governor::{GovernorLayer, governor::GovernorConfigBuilder};
use tower_redlimit::{HeaderKey, HeaderStyle, RateLimitLayer};

use crate::{
    Settings,
    client_header::ClientHeader,
    decisions::{NAIVE_SCRIPT, admin, naive_key, policy, redis_limiter},
    drive::{Schedule, round_order},
    report::{Row, Tally},
};

/// The app every contender serves, its handlers made routes once (as `axum::serve` does with a
/// `Router`), not on every request.
fn hello() -> Router {
    Router::new()
        .route("/", get(|| async { "hello" }))
        .with_state(())
}

/// The limit every layered contender applies: fixed window, 100 per 60 s, per `x-client`.
fn limit(limiter: Limiter) -> RateLimitLayer {
    let guard = GuardedLimiter::builder(limiter, policy(Algorithm::FixedWindow, 100))
        .budget(std::time::Duration::from_secs(2))
        .build();
    RateLimitLayer::new(guard).key(HeaderKey::new("x-client").expect("a valid header"))
}

/// Per client and per API key in one layer (`x-client`, `x-key`), each a fixed window of 100
/// per 60 s: one check of two keys per request.
fn limit_two_keys(limiter: Limiter) -> RateLimitLayer {
    let per_key = Policy::builder("per_key", Algorithm::FixedWindow)
        .limit(100)
        .window(std::time::Duration::from_secs(60))
        .build()
        .expect("a valid policy");
    let set = PolicySet::new([policy(Algorithm::FixedWindow, 100), per_key]).expect("a valid set");
    let guard = GuardedLimiter::builder(limiter, set)
        .budget(std::time::Duration::from_secs(2))
        .build();
    RateLimitLayer::new(guard)
        .key(HeaderKey::new("x-client").expect("a valid header"))
        .key_for("per_key", HeaderKey::new("x-key").expect("a valid header"))
        .expect("a policy of the set")
}

/// Serves the apps on the server runtime; returns their names and addresses, and the handle
/// of the metrics recorder the last contender counts into.
///
/// `http_memory` and `http_redis` put the layer in front of the router, as a limit on the whole
/// app is applied, so they measure the limiter. `http_memory_routes` adds it with
/// `Router::layer`, which wraps and boxes every route once more: axum's cost of any layer on top.
/// Every guard registers its metrics with the recorder in force when it is built: those built
/// before the Prometheus recorder is installed count into no recorder (the facade's no-op),
/// `http_memory_metrics`, built after, into it.
pub(crate) fn start_servers(
    server: &tokio::runtime::Runtime,
    url: &str,
) -> (Vec<(&'static str, SocketAddr)>, PrometheusHandle) {
    let memory = || Limiter::new(MemoryBackend::default());
    let mut servers = vec![
        ("http_bare", serve(server, hello())),
        ("http_memory", serve(server, limit(memory()).layer(hello()))),
        (
            "http_redis",
            serve(server, limit(redis_limiter(url, "http")).layer(hello())),
        ),
        (
            "http_memory_no_headers",
            serve(
                server,
                limit(memory()).headers(HeaderStyle::None).layer(hello()),
            ),
        ),
        ("http_governor", serve(server, governor(hello()))),
        ("http_naive_redis", serve(server, naive_redis(server, url))),
        (
            "http_memory_two_keys",
            serve(server, limit_two_keys(memory()).layer(hello())),
        ),
        (
            "http_memory_legacy",
            serve(
                server,
                limit(memory()).headers(HeaderStyle::Legacy).layer(hello()),
            ),
        ),
        (
            "http_memory_routes",
            serve(server, hello().layer(limit(memory()))),
        ),
    ];
    let recorder = PrometheusBuilder::new()
        .install_recorder()
        .expect("no other metrics recorder in the bench");
    servers.push((
        "http_memory_metrics",
        serve(server, limit(memory()).layer(hello())),
    ));
    (servers, recorder)
}

/// The decisions `recorder` counted, from its Prometheus exposition.
pub(crate) fn decisions_recorded(recorder: &PrometheusHandle) -> u64 {
    recorder
        .render()
        .lines()
        .filter(|line| line.starts_with("redlimit_decisions_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// What a user writes by hand instead of a limiter on Redis: a middleware that sends the naive
/// script (`INCR`, `EXPIRE` on the first hit) by `EVALSHA` for each request on one multiplexed
/// redis-rs connection, in front of the router, and answers 429 past 100 per window: the raw
/// client's cost beside the layer's.
fn naive_redis(
    server: &tokio::runtime::Runtime,
    url: &str,
) -> impl Service<Request, Response = Response, Error = Infallible, Future: Send>
+ Clone
+ Send
+ Sync
+ 'static {
    let sha1: Arc<str> = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(NAIVE_SCRIPT)
        .query::<String>(&mut admin(url))
        .expect("SCRIPT LOAD")
        .into();
    // Made on the server's runtime, so its connection's task runs on the server's threads,
    // where the layer's do.
    let conn = server.block_on(async {
        redis::Client::open(url)
            .expect("a valid url")
            .get_multiplexed_async_connection()
            .await
            .expect("a raw connection")
    });
    let naive = move |request: Request, next: Next| {
        let (mut conn, sha1) = (conn.clone(), Arc::clone(&sha1));
        async move {
            let Some(client) = request
                .headers()
                .get("x-client")
                .and_then(|value| value.to_str().ok())
            else {
                return StatusCode::BAD_REQUEST.into_response();
            };
            let count: u64 = redis::cmd("EVALSHA")
                .arg(&*sha1)
                .arg(1)
                .arg(naive_key(client))
                .arg(60)
                .query_async(&mut conn)
                .await
                .expect("naive EVALSHA");
            if count > 100 {
                return StatusCode::TOO_MANY_REQUESTS.into_response();
            }
            next.run(request).await
        }
    };
    axum::middleware::from_fn(naive).layer(hello())
}

/// `app` behind tower_governor with the same limit (100 per 60 s per client: one replenished
/// every 600 ms, a burst of 100) and its rate-limit headers on (`use_headers`).
fn governor(
    app: Router,
) -> impl Service<Request, Response = Response, Error = Infallible, Future: Send>
+ Clone
+ Send
+ Sync
+ 'static {
    let config = GovernorConfigBuilder::default()
        .per_millisecond(600)
        .burst_size(100)
        .key_extractor(ClientHeader)
        .use_headers()
        .finish()
        .expect("a valid governor config");
    GovernorLayer::new(config).layer(app)
}

fn serve<S>(server: &tokio::runtime::Runtime, app: S) -> SocketAddr
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    server.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let app = ServiceExt::<Request>::into_make_service(app);
        tokio::spawn(async move { axum::serve(listener, app).await });
        address
    })
}

/// One keep-alive connection that sends `GET /` and reads whole responses.
struct Connection {
    stream: TcpStream,
    buffer: Vec<u8>,
}

impl Connection {
    async fn open(address: SocketAddr) -> Self {
        let stream = TcpStream::connect(address).await.expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Self {
            stream,
            buffer: Vec::with_capacity(1024),
        }
    }

    async fn get(&mut self, client: &str) -> u16 {
        // Every contender is sent both keys; those of one key read only `x-client`.
        let request = format!(
            "GET / HTTP/1.1\r\nhost: bench\r\nx-client: {client}\r\nx-key: k{client}\r\n\r\n"
        );
        self.stream
            .write_all(request.as_bytes())
            .await
            .expect("write");
        self.buffer.clear();
        let mut chunk = [0_u8; 2048];
        loop {
            let read = self.stream.read(&mut chunk).await.expect("read");
            assert!(read > 0, "the server closed the connection");
            self.buffer.extend_from_slice(&chunk[..read]);
            if let Some(status) = complete_response(&self.buffer) {
                return status;
            }
        }
    }
}

/// The status of the response in `buffer` once all of it has arrived. Kept cheap (SIMD
/// searches, no header parsing), so the load generator's cost does not grow with the headers
/// the layer adds and is not what is measured: hyper writes the status line first and
/// `content-length` in lower case.
fn complete_response(buffer: &[u8]) -> Option<u16> {
    let end = memchr::memmem::find(buffer, b"\r\n\r\n")?;
    let head = &buffer[..end];
    let length = memchr::memmem::find(head, b"content-length: ").map_or(0, |at| {
        head[at + 16..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .fold(0, |n, b| n * 10 + usize::from(b - b'0'))
    });
    (buffer.len() >= end + 4 + length).then(|| {
        head.get(9..12)
            .unwrap_or_default()
            .iter()
            .fold(0, |n, b| n * 10 + u16::from(b.wrapping_sub(b'0')))
    })
}

pub(crate) async fn run(
    url: &str,
    servers: &[(&'static str, SocketAddr)],
    settings: &Settings,
) -> Vec<Row> {
    let mut admin = admin(url);
    let clients: Arc<[String]> = (0..settings.keys).map(|k| format!("client-{k}")).collect();
    let mut tallies: Vec<Tally> = servers.iter().map(|_| Tally::default()).collect();
    let mut server_cpu_ns: Vec<Option<u64>> = vec![Some(0); servers.len()];
    // Each round's requests per second and server CPU per request, per contender.
    let mut rounds: Vec<Vec<(f64, Option<u64>)>> = vec![Vec::new(); servers.len()];
    let schedule = Schedule::new(settings);
    for round in 0..schedule.rounds {
        for at in round_order(round, servers.len()) {
            let (_, address) = &servers[at];
            let (tally, cpu) = (&mut tallies[at], &mut server_cpu_ns[at]);
            let mut connections = Vec::new();
            for _ in 0..schedule.concurrency {
                connections.push(Arc::new(Mutex::new(Connection::open(*address).await)));
            }
            let before = command_calls(&mut admin);
            let cpu_before = server_cpu_ns_now();
            let started = Instant::now();
            let tasks: Vec<_> = connections
                .into_iter()
                .enumerate()
                .map(|(task, connection)| {
                    let clients = Arc::clone(&clients);
                    tokio::spawn(async move {
                        let mut connection = connection.lock().await;
                        let mut latencies = Vec::with_capacity(schedule.per_task);
                        for j in 0..schedule.per_task {
                            let client = &clients[schedule.key(round, task, j)];
                            let begun = Instant::now();
                            let status = connection.get(client).await;
                            assert_eq!(status, 200, "every request is within its limit");
                            latencies.push(
                                u32::try_from(begun.elapsed().as_micros()).unwrap_or(u32::MAX),
                            );
                        }
                        latencies
                    })
                })
                .collect();
            let mut latencies = Vec::new();
            for task in tasks {
                latencies.extend(task.await.expect("a load task panicked"));
            }
            let elapsed = started.elapsed();
            let used = cpu_before
                .zip(server_cpu_ns_now())
                .map(|(before, after)| after.saturating_sub(before));
            *cpu = cpu.zip(used).map(|(sum, used)| sum + used);
            let requests = latencies.len() as f64;
            rounds[at].push((
                requests / elapsed.as_secs_f64().max(1e-9),
                used.map(|used| used / (latencies.len() as u64).max(1)),
            ));
            tally.add(
                latencies,
                elapsed,
                commands_sent(&before, &command_calls(&mut admin)),
            );
            // The connections are closed now; the server finishes with them before the next
            // contender's clock starts, so that work is not charged to it.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    print_rounds(servers, &rounds);
    let requests = schedule.calls().max(1) as u64;
    servers
        .iter()
        .zip(tallies)
        .zip(server_cpu_ns)
        .map(|(((name, _), tally), cpu)| {
            let mut row = tally.row("http", name, *name == "http_redis", None);
            if let Some(cpu) = cpu {
                row.extra
                    .push(("server_cpu_ns_per_request", cpu / requests));
            }
            row
        })
        .collect()
}

/// Per contender, the median and range over the rounds of its requests per second as a ratio
/// to bare axum's in the same round, and of its server CPU per request: figures a burst of
/// noise in one round does not carry, unlike the totals of the table.
fn print_rounds(servers: &[(&'static str, SocketAddr)], rounds: &[Vec<(f64, Option<u64>)>]) {
    let spread = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        let at = |i: usize| values.get(i).copied().unwrap_or(f64::NAN);
        (
            at(values.len() / 2),
            at(0),
            at(values.len().saturating_sub(1)),
        )
    };
    println!(
        "\nhttp, per round: median (min – max) of the ratio to http_bare in the same round, \
              of server CPU µs per request, and of what it adds to http_bare's in the same round"
    );
    let bare = &rounds[0];
    for ((name, _), own) in servers.iter().zip(rounds) {
        let ratios = own.iter().zip(bare).map(|(own, bare)| own.0 / bare.0);
        let (ratio, low, high) = spread(ratios.collect());
        let cpu = own
            .iter()
            .filter_map(|(_, cpu)| cpu.map(|ns| ns as f64 / 1000.0));
        let (cpu, cpu_low, cpu_high) = spread(cpu.collect());
        // What the contender adds to bare axum's server CPU per request, paired by round: a
        // round's noise moves both alike, where the medians above each carry their own.
        let added = own
            .iter()
            .zip(bare)
            .filter_map(|((_, own), (_, bare))| Some(((*own)? as f64 - (*bare)? as f64) / 1000.0));
        let (added, added_low, added_high) = spread(added.collect());
        println!(
            "{name:<24} {ratio:.3} ({low:.3} – {high:.3})   {cpu:.2} µs ({cpu_low:.2} – {cpu_high:.2})   \
             {added:+.2} µs ({added_low:+.2} – {added_high:+.2})"
        );
    }
    // The layer on Redis against the hand-written middleware on the same Redis, paired by round.
    let of = |wanted: &str| {
        servers
            .iter()
            .position(|(name, _)| *name == wanted)
            .map(|at| &rounds[at])
    };
    if let (Some(layer), Some(naive)) = (of("http_redis"), of("http_naive_redis")) {
        let less = layer
            .iter()
            .zip(naive)
            .filter_map(|((_, layer), (_, naive))| {
                Some(((*layer)? as f64 - (*naive)? as f64) / 1000.0)
            });
        let (less, less_low, less_high) = spread(less.collect());
        println!(
            "http_redis less http_naive_redis, server CPU per request paired by round: \
             {less:+.2} µs ({less_low:+.2} – {less_high:+.2})"
        );
    }
}

/// The name of the HTTP server runtime's threads.
pub(crate) const SERVER_THREAD: &str = "bench-server";

/// Nanoseconds the server runtime's threads have run on a CPU (Linux with scheduler statistics):
/// steadier than requests per second on a shared machine, and only the server's.
fn server_cpu_ns_now() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path();
        let name = std::fs::read_to_string(path.join("comm")).ok()?;
        if name.trim_end() == SERVER_THREAD {
            let stat = std::fs::read_to_string(path.join("schedstat")).ok()?;
            total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
        }
    }
    Some(total)
}
