//! The `redlimit-demo` binary as users run it: real processes, real Redis.

use std::{
    net::SocketAddr,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use redlimit_tests::{Pki, RedisCluster, RedisSentinel, RedisServer, free_port, http_get};

const DEMO: &str = env!("CARGO_BIN_EXE_redlimit-demo");

/// A running demo, killed and reaped on drop.
struct Demo {
    child: Child,
    address: SocketAddr,
    config: tempfile_lite::File,
    /// Everything it printed, both streams.
    output: tempfile_lite::File,
}

impl Demo {
    async fn start(config_body: &str) -> Self {
        Self::start_with_env(config_body, &[]).await
    }

    /// As [`start`](Self::start), with these environment variables set.
    async fn start_with_env(config_body: &str, env: &[(&str, &str)]) -> Self {
        let address = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let config = tempfile_lite::File::new(&format!("listen = \"{address}\"\n{config_body}"));
        let output = tempfile_lite::File::new("");
        let stdout = std::fs::File::create(output.path()).expect("an output file");
        let stderr = stdout.try_clone().expect("an output file");
        let child = Command::new(DEMO)
            .args(["--config", config.path()])
            .envs(env.iter().copied())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("starting redlimit-demo");
        let demo = Self {
            child,
            address,
            config,
            output,
        };
        let started = Instant::now();
        while tokio::net::TcpStream::connect(address).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the demo never listened"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        demo
    }
}

impl Demo {
    /// The file it was started with.
    fn config_path(&self) -> &str {
        self.config.path()
    }

    /// What it has printed so far.
    fn output(&self) -> String {
        std::fs::read_to_string(self.output.path()).expect("the output file")
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Just enough of a temporary file for a config.
mod tempfile_lite {
    use std::sync::atomic::{AtomicU32, Ordering};

    pub(crate) struct File(std::path::PathBuf);

    impl File {
        pub(crate) fn new(text: &str) -> Self {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "redlimit-demo-{}-{}.toml",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::write(&path, text).expect("writing a config");
            Self(path)
        }

        pub(crate) fn path(&self) -> &str {
            self.0.to_str().expect("a UTF-8 temp path")
        }
    }

    impl Drop for File {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

fn route(algorithm: &str, limit: u64) -> String {
    format!(
        "[[route]]\npath = \"/limited\"\nalgorithm = \"{algorithm}\"\nlimit = {limit}\nwindow = \"1h\"\n"
    )
}

/// 20 requests alternating between two demo processes configured with `store` (TOML lines)
/// and a limit of 7: how many were admitted.
async fn admitted_by_two_processes(store: &str, algorithm: &str) -> usize {
    let config = format!("{store}\nbudget = \"1s\"\n{}", route(algorithm, 7));
    let (a, b) = (Demo::start(&config).await, Demo::start(&config).await);
    let mut admitted = 0;
    for i in 0..20 {
        let demo = if i % 2 == 0 { &a } else { &b };
        let response = http_get(demo.address, "/limited", &[]).await;
        assert!(
            response.status == 200 || response.status == 429,
            "{response:?}"
        );
        if response.status == 200 {
            assert!(response.body.contains("decided by redis"), "{response:?}");
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_demo_processes_sharing_one_redis_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let store = format!("redis_url = \"{}\"", server.url());
    for algorithm in ["fixed_window_anchored", "sliding_window_log", "gcra"] {
        assert_eq!(
            admitted_by_two_processes(&store, algorithm).await,
            7,
            "{algorithm}"
        );
        redlimit_tests::flush_all(&mut server.connection());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_demo_processes_on_a_cluster_or_through_sentinel_admit_exactly_the_limit() {
    let cluster = RedisCluster::start();
    let store = format!("redis_cluster = [{}]", quoted(&cluster.urls()));
    assert_eq!(
        admitted_by_two_processes(&store, "sliding_window_counter").await,
        7
    );
    drop(cluster);

    let sentinel = RedisSentinel::start();
    let store = format!(
        "redis_sentinel = {{ urls = [{}], master = \"{}\" }}",
        quoted(&sentinel.urls()),
        RedisSentinel::MASTER
    );
    assert_eq!(admitted_by_two_processes(&store, "token_bucket").await, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_serves_while_its_redis_is_down() {
    let nowhere = format!("redis://127.0.0.1:{}", free_port());
    let config = format!(
        "redis_url = \"{nowhere}\"\nfailure = \"local\"\n{}",
        route("gcra", 2)
    );
    let demo = Demo::start(&config).await;
    let statuses: Vec<u16> = {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let response = http_get(demo.address, "/limited", &[]).await;
            if response.status == 200 {
                assert!(
                    response.body.contains("decided by fallback"),
                    "{response:?}"
                );
            }
            statuses.push(response.status);
        }
        statuses
    };
    assert_eq!(
        statuses,
        [200, 200, 429],
        "the local fallback limits on its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_logged_at_the_first_failing_check_and_never_printed() {
    let (right, wrong) = ("right-pass-5e1d", "wrong-pass-0c4b");
    let server = RedisServer::start_with(&["--requirepass", right]);
    let url = format!("redis://:{wrong}@127.0.0.1:{}", server.port());
    let demo = Demo::start(&format!("redis_url = \"{url}\"\n{}", route("gcra", 2))).await;
    for _ in 0..3 {
        let response = http_get(demo.address, "/limited", &[]).await;
        assert_eq!(response.status, 200, "the failure policy (open) answers");
    }
    // The line is written before the failure policy's answer is sent.
    let output = demo.output();
    assert!(
        output.contains(&format!("redis at redis://***@127.0.0.1:{}", server.port())),
        "the banner hides the password: {output}"
    );
    let failures = output
        .lines()
        .filter(|line| line.contains("authentication failed"))
        .count();
    assert_eq!(failures, 1, "one line for three failing checks: {output}");
    assert!(
        !output.contains(wrong) && !output.contains(right),
        "a password was printed: {output}"
    );
}

fn run(args: &[&str]) -> Output {
    Command::new(DEMO)
        .args(args)
        .output()
        .expect("running redlimit-demo")
}

#[test]
fn a_bad_file_exits_non_zero_naming_the_field() {
    let cases = [
        (route("leaky_bucket", 1), "algorithm"),
        (route("gcra", 0), "limit"),
        (
            "failure = \"sometimes\"\n".to_owned() + &route("gcra", 1),
            "failure",
        ),
        (route("gcra", 1).replace("1h", "an hour"), "window"),
        (route("gcra", 1) + "colour = \"red\"\n", "colour"),
        (route("gcra", 1).replace("/limited", "/:id"), "route /:id"),
        (route("gcra", 1).replace("/limited", "/{"), "route /{"),
        (
            route("gcra", 1).replace("/limited", "/{a}")
                + &route("gcra", 1).replace("/limited", "/{b}"),
            "route /{b}: path: conflicts with route /{a}",
        ),
        (
            "redis_url = \"rediss://127.0.0.1:6380/#insecure\"\n".to_owned() + &route("gcra", 1),
            "redis_url: rediss://127.0.0.1:6380/#insecure turns certificate checks off",
        ),
        (
            "redis_cluster = [\"rediss://127.0.0.1:7000/#insecure\"]\n".to_owned()
                + &route("gcra", 1),
            "redis_cluster:",
        ),
        (
            "redis_url = \"rediss://127.0.0.1:6380\"\ntls_ca_file = \"/nonexistent/ca.pem\"\n"
                .to_owned()
                + &route("gcra", 1),
            "tls_ca_file: /nonexistent/ca.pem",
        ),
        (
            "hash_clients_secret_env = \"REDLIMIT_TEST_UNSET_SECRET\"\n".to_owned()
                + &route("gcra", 1),
            "hash_clients_secret_env: the environment variable REDLIMIT_TEST_UNSET_SECRET",
        ),
        (
            route("gcra", 1) + "idempotency_header = \"bad header\"\n",
            "route /limited: idempotency_header",
        ),
        (
            route("gcra", 1)
                + "[[route.also]]\nname = \"daily\"\nalgorithm = \"gcra\"\nlimit = 0\nwindow = \"1d\"\n",
            "route /limited: also daily:",
        ),
    ];
    for (body, field) in cases {
        let file = tempfile_lite::File::new(&body);
        let output = run(&["--config", file.path()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{field}: {stderr}");
        assert!(stderr.contains(field), "{field}: {stderr}");
    }
    let missing = run(&["--config", "/nonexistent/redlimit.toml"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/redlimit.toml"));
    assert_eq!(run(&["--frobnicate"]).status.code(), Some(2));
}

/// The sum of `redlimit_decisions_total` samples of `policy` whose labels include `labels`,
/// from the exposition at `address`, which must parse as Prometheus text.
async fn decisions(address: SocketAddr, policy: &str, labels: &[(&str, &str)]) -> f64 {
    let response = http_get(address, "/metrics", &[]).await;
    assert_eq!(response.status, 200, "{response:?}");
    let lines = response.body.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text");
    let durations = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "redlimit_check_duration_seconds");
    for sample in durations {
        assert!(
            matches!(sample.value, prometheus_parse::Value::Histogram(_)),
            "round trips are a histogram: {sample:?}"
        );
    }
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == "redlimit_decisions_total")
        .filter(|s| s.labels.get("policy") == Some(policy))
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(n) | prometheus_parse::Value::Untyped(n) => n,
            ref other => panic!("a counter: {other:?}"),
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_15_limited_of_20_requests_over_a_limit_of_5() {
    let demo = Demo::start(&route("fixed_window_anchored", 5)).await;
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(http_get(demo.address, "/limited", &[]).await.status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 15);
    let limited = decisions(demo.address, "limited", &[("outcome", "limited")]).await;
    assert_eq!(limited, 15.0);
    let all = decisions(demo.address, "limited", &[]).await;
    assert_eq!(all, 20.0, "one decision per request");
    let near = decisions(demo.address, "limited", &[("outcome", "near_limit")]).await;
    assert_eq!(near, 2.0, "remaining 1 and 0 are within 20% of 5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_route_answers_every_request_and_counts_its_would_be_denials() {
    let server = RedisServer::start();
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let config = format!(
        "redis_url = \"{}\"\nbudget = \"2s\"\nmetrics_listen = \"{metrics}\"\n{}shadow = true\n",
        server.url(),
        route("sliding_window_log", 3)
    );
    let demo = Demo::start(&config).await;
    let mut last = None;
    for _ in 0..10 {
        let response = http_get(demo.address, "/limited", &[]).await;
        assert_eq!(response.status, 200, "{response:?}");
        last = Some(response);
    }
    let last = last.expect("ten responses");
    assert!(
        last.header("ratelimit")
            .is_some_and(|v| v.contains(";r=0;")),
        "the header stays truthful: {last:?}"
    );
    assert_eq!(
        http_get(demo.address, "/metrics", &[]).await.status,
        404,
        "metrics are on metrics_listen only"
    );
    let shadow = decisions(metrics, "limited", &[("reason", "shadow")]).await;
    assert_eq!(shadow, 7.0);
    let outcome = decisions(metrics, "limited", &[("outcome", "limited")]).await;
    assert_eq!(outcome, 7.0);
}

/// 30 requests at once, alternating between two demo processes sharing Redis, on a route of
/// 10 per second in delay mode: how many were served, and the Retry-After of the others.
async fn thirty_at_once_through_two_demos(
    server: &RedisServer,
    max_delay: &str,
) -> (usize, Vec<u64>) {
    let config = format!(
        "redis_url = \"{}\"\nbudget = \"2s\"\n[[route]]\npath = \"/slow\"\nname = \"slow-{}\"\nalgorithm = \"gcra\"\nlimit = 10\nwindow = \"1s\"\nmode = \"delay\"\nmax_delay = \"{max_delay}\"\n",
        server.url(),
        max_delay.replace('s', "")
    );
    let (a, b) = (Demo::start(&config).await, Demo::start(&config).await);
    let requests: Vec<_> = (0..30)
        .map(|i| {
            let address = if i % 2 == 0 { a.address } else { b.address };
            tokio::spawn(async move { http_get(address, "/slow", &[]).await })
        })
        .collect();
    let (mut served, mut retries) = (0, Vec::new());
    for request in requests {
        let response = request.await.expect("a request task");
        match response.status {
            200 => served += 1,
            429 => retries.push(
                response
                    .header("retry-after")
                    .and_then(|v| v.parse().ok())
                    .expect("Retry-After in seconds"),
            ),
            other => panic!("{other}: {response:?}"),
        }
    }
    (served, retries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_route_serves_what_fits_within_max_delay_across_two_processes() {
    let server = RedisServer::start();
    assert_eq!(
        thirty_at_once_through_two_demos(&server, "2s").await,
        (30, Vec::new()),
        "10 at once, 20 one every 100 ms within 2 s"
    );
    // Redis's clock decides: requests that reach it a little later find a slot a little
    // nearer, so on a busy machine one or two more may fit than the 20 of an instant.
    let (served, retries) = thirty_at_once_through_two_demos(&server, "1s").await;
    assert!(
        (20..=23).contains(&served),
        "10 at once, 10 more within 1 s: {served}"
    );
    assert_eq!(served + retries.len(), 30);
    assert!(retries.iter().all(|secs| *secs >= 1), "{retries:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_a_process_that_holds_leases_frees_them_within_their_ttl() {
    let server = RedisServer::start();
    let route = |handler: &str| {
        format!(
            "redis_url = \"{}\"\nbudget = \"2s\"\n[[route]]\npath = \"/busy\"\nalgorithm = \"gcra\"\nlimit = 1000\nwindow = \"1s\"\nkey = \"global\"\nconcurrency = 2\nlease_ttl = \"3s\"\nhandler = \"{handler}\"\n",
            server.url()
        )
    };
    let mut holder = Demo::start(&route("sleep:1h")).await;
    let other = Demo::start(&route("hello")).await;
    // Two requests that never finish hold both slots: sent, never read.
    let mut held = Vec::new();
    for _ in 0..2 {
        use tokio::io::AsyncWriteExt;
        let mut stream = tokio::net::TcpStream::connect(holder.address)
            .await
            .expect("a connection");
        stream
            .write_all(b"GET /busy HTTP/1.1\r\nHost: demo\r\n\r\n")
            .await
            .expect("a request");
        held.push(stream);
    }
    // Both leases are taken (seen in Redis), then the other process is turned away.
    let started = Instant::now();
    let mut redis = server.connection();
    while redlimit::deadpool_redis::redis::cmd("ZCARD")
        .arg("redlimit:busy.in-flight:{global}:cc")
        .query::<u64>(&mut redis)
        .expect("ZCARD")
        < 2
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the slots were never taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let turned_away = http_get(other.address, "/busy", &[]).await;
    assert_eq!(turned_away.status, 429, "{turned_away:?}");
    assert!(
        turned_away
            .header("ratelimit-policy")
            .is_some_and(|v| v.contains("\"busy.in-flight\";q=2;qu=\"concurrent-requests\"")),
        "{turned_away:?}"
    );
    // Kept alive past their TTL while the holder lives (renewed every second).
    tokio::time::sleep(Duration::from_secs(4)).await;
    let still = http_get(other.address, "/busy", &[]).await;
    assert_eq!(still.status, 429, "renewed past the 3 s TTL: {still:?}");
    holder.child.kill().expect("killing the holder");
    holder.child.wait().expect("reaping it");
    let killed = Instant::now();
    loop {
        let response = http_get(other.address, "/busy", &[]).await;
        if response.status == 200 {
            break;
        }
        assert_eq!(response.status, 429, "{response:?}");
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the dead process's leases were never reclaimed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "slots free {:?} after the kill (lease TTL 3 s)",
        killed.elapsed()
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_takes_effect_without_a_restart_and_a_broken_one_is_refused() {
    let routes = |limit: u64| {
        format!(
            "{}[[route]]\npath = \"/slow\"\nalgorithm = \"gcra\"\nlimit = 100\nwindow = \"1m\"\nkey = \"global\"\nhandler = \"sleep:1500ms\"\n",
            route("fixed_window_anchored", limit)
        )
    };
    let demo = Demo::start(&routes(5)).await;
    let quota = |response: &redlimit_tests::HttpResponse| {
        response.header("ratelimit-policy").map(str::to_owned)
    };
    let address = demo.address;
    let statuses = |n: usize| async move {
        let mut statuses = Vec::new();
        for _ in 0..n {
            statuses.push(http_get(address, "/limited", &[]).await.status);
        }
        statuses
    };
    let first = http_get(address, "/limited", &[]).await;
    assert_eq!(first.status, 200);
    assert!(
        quota(&first).is_some_and(|q| q.contains("q=5;")),
        "{first:?}"
    );
    assert_eq!(statuses(5).await, [200, 200, 200, 200, 429], "5 of 5 used");
    // A request in flight while the file changes.
    let in_flight = tokio::spawn(async move { http_get(address, "/slow", &[]).await });
    tokio::time::sleep(Duration::from_millis(100)).await;

    // The limit raised to 10 keeps the count: 5 more in this window, not 10.
    let written = Instant::now();
    std::fs::write(
        demo.config_path(),
        format!("listen = \"{}\"\n{}", demo.address, routes(10)),
    )
    .expect("rewriting the file");
    loop {
        let response = http_get(address, "/limited", &[]).await;
        if quota(&response).is_some_and(|q| q.contains("q=10;")) {
            assert_eq!(response.status, 200, "the 6th of 10: {response:?}");
            break;
        }
        assert_eq!(response.status, 429, "still 5 of 5: {response:?}");
        assert!(
            written.elapsed() < Duration::from_secs(10),
            "never reloaded: {response:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "the new limit answered {:?} after the file changed",
        written.elapsed()
    );
    assert_eq!(
        statuses(5).await,
        [200, 200, 200, 200, 429],
        "raised from 5 to 10 after 5: 5 more, then 429"
    );
    assert_eq!(
        in_flight.await.expect("the request").status,
        200,
        "not dropped by the reload"
    );

    // A reload that changes only the headers keeps the count too.
    let written = Instant::now();
    std::fs::write(
        demo.config_path(),
        format!(
            "listen = \"{}\"\nheaders = \"both\"\n{}",
            demo.address,
            routes(10)
        ),
    )
    .expect("rewriting the file");
    let after = loop {
        let response = http_get(address, "/limited", &[]).await;
        if response.header("x-ratelimit-limit").is_some() {
            break response;
        }
        assert!(
            written.elapsed() < Duration::from_secs(20),
            "never reloaded: {response:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(after.status, 429, "the count went on: {after:?}");

    std::fs::write(demo.config_path(), "[[route]]\npath = 3\n").expect("breaking the file");
    let broken = Instant::now();
    while !demo.output().contains("reload refused") {
        assert!(
            broken.elapsed() < Duration::from_secs(10),
            "{}",
            demo.output()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let still = http_get(demo.address, "/limited", &[]).await;
    assert!(
        quota(&still).is_some_and(|q| q.contains("q=10;")),
        "{still:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_api_keys_of_different_tiers_get_their_own_tiers_limit() {
    let server = RedisServer::start();
    let config = format!(
        "redis_url = \"{}\"\nbudget = \"2s\"\n[[tier]]\nname = \"pro\"\nkeys = [\"k-pro\"]\n[[route]]\npath = \"/api\"\nalgorithm = \"fixed_window_anchored\"\nlimit = 2\nwindow = \"1h\"\nkey = \"header:x-api-key\"\nlimits = {{ pro = {{ limit = 5 }} }}\n",
        server.url()
    );
    let demo = Demo::start(&config).await;
    let admitted = |key: &'static str| {
        let address = demo.address;
        async move {
            let mut admitted = 0;
            for _ in 0..8 {
                let response = http_get(address, "/api", &[("x-api-key", key)]).await;
                match response.status {
                    200 => admitted += 1,
                    429 => {}
                    other => panic!("{other}: {response:?}"),
                }
            }
            admitted
        }
    };
    assert_eq!(admitted("k-free").await, 2, "the route's own limit");
    assert_eq!(admitted("k-pro").await, 5, "the pro tier's");
    let pro = http_get(demo.address, "/api", &[("x-api-key", "k-pro")]).await;
    assert!(
        pro.header("ratelimit-policy")
            .is_some_and(|v| v.contains("\"api.pro\";q=5")),
        "{pro:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_resets_and_overrides_reach_both_processes_through_their_block_caches() {
    let server = RedisServer::start();
    let store = format!("redis_url = \"{}\"", server.url());
    operators_actions_reach_both_processes(&store, &server.limiter(), |_| server.connection())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_resets_and_overrides_reach_both_processes_on_a_cluster() {
    let cluster = RedisCluster::start();
    let store = format!("redis_cluster = [{}]", quoted(&cluster.urls()));
    let operator = redlimit::Limiter::new(
        redlimit::RedisBackend::cluster(cluster.urls())
            .budget(Duration::from_secs(5))
            .build()
            .expect("valid"),
    );
    operators_actions_reach_both_processes(&store, &operator, |key| {
        cluster.connection(cluster.primary_of(key).expect("a primary"))
    })
    .await;
}

/// Two demo processes on `store`: a client blocked at both (its 429s served by each block
/// cache), then an operator's reset, override and clear-override on `operator` lift it at
/// both. `connection` reaches the node holding a key, to count Redis commands.
async fn operators_actions_reach_both_processes(
    store: &str,
    operator: &redlimit::Limiter,
    connection: impl Fn(&str) -> redlimit::deadpool_redis::redis::Connection,
) {
    let config = format!(
        "{store}\nbudget = \"2s\"\n[[route]]\npath = \"/api\"\nalgorithm = \"fixed_window_anchored\"\nlimit = 2\nwindow = \"1h\"\nkey = \"header:x-api-key\"\noverrides = true\n"
    );
    let demos = [Demo::start(&config).await, Demo::start(&config).await];
    let addresses = [demos[0].address, demos[1].address];
    let get = async |at: usize, key: &'static str| {
        http_get(addresses[at], "/api", &[("x-api-key", key)]).await
    };
    // `key` over its limit at both processes, each then denying it from its block cache: no
    // Redis command for the request.
    let block_at_both = async |key: &'static str| {
        let redis = &mut connection(&format!("redlimit:api:{{{key}}}:fwa:3600000"));
        for at in 0..2 {
            let started = Instant::now();
            loop {
                let before = redlimit_tests::command_calls(redis);
                let response = get(at, key).await;
                let sent =
                    redlimit_tests::commands_sent(&before, &redlimit_tests::command_calls(redis));
                if response.status == 429 && sent.commands == 0 {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "never blocked locally"
                );
            }
        }
    };
    // How long until `key`'s next request at each process is 200, with `remaining[at]` left.
    let lifted = async |key: &'static str, remaining: [&str; 2], what: &str| {
        for (at, remaining) in remaining.into_iter().enumerate() {
            let started = Instant::now();
            loop {
                let response = get(at, key).await;
                if response.status == 200 {
                    let state = response.header("ratelimit").unwrap_or_default();
                    let r = format!(";r={remaining};");
                    assert!(state.contains(&r), "{what}: {response:?}");
                    println!(
                        "{what}: process {at} answered 200 after {:?}",
                        started.elapsed()
                    );
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "{what}: never lifted"
                );
            }
        }
    };
    // The operator, as redlimit-cli does: the route's policy on the same Redis.
    let policy = redlimit::Policy::builder("api", redlimit::Algorithm::FixedWindowAnchored)
        .limit(2)
        .window(Duration::from_secs(3_600))
        .overrides(true)
        .build()
        .expect("the route's policy");

    block_at_both("k1").await;
    assert!(operator.reset(&policy, "k1").await.expect("reset"));
    // Process 0 takes 1 of the fresh 2, process 1 the other.
    lifted("k1", ["1", "0"], "after a reset").await;

    block_at_both("k2").await;
    operator
        .set_override(
            &policy,
            "k2",
            redlimit::Override::default().limit(5),
            Duration::from_secs(600),
        )
        .await
        .expect("set");
    // 2 of the override's 5 used already.
    lifted("k2", ["2", "1"], "after an override raised the limit").await;
    let limited = get(1, "k2").await;
    assert!(
        limited
            .header("ratelimit-policy")
            .is_some_and(|v| v.contains("\"api\";q=5")),
        "{limited:?}"
    );
    block_at_both("k2").await;
    assert!(operator.clear_override(&policy, "k2").await.expect("clear"));
    assert!(operator.reset(&policy, "k2").await.expect("reset"));
    lifted("k2", ["1", "0"], "after clear-override and a reset").await;
    assert_eq!(get(0, "k3").await.status, 200, "other keys keep theirs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_started_in_one_process_is_honoured_by_the_other() {
    let server = RedisServer::start();
    let config = format!(
        "redis_url = \"{}\"\nbudget = \"2s\"\n[[route]]\npath = \"/login\"\nalgorithm = \"fixed_window_anchored\"\nlimit = 2\nwindow = \"1h\"\nkey = \"header:x-api-key\"\nban = {{ after = 3, within = \"1m\", for = \"10m\", max = \"1d\" }}\n",
        server.url()
    );
    let demos = [Demo::start(&config).await, Demo::start(&config).await];
    let mut statuses = Vec::new();
    let mut retry = Vec::new();
    for _ in 0..6 {
        let response = http_get(demos[0].address, "/login", &[("x-api-key", "k1")]).await;
        statuses.push(response.status);
        retry.push(response.header("retry-after").unwrap_or("-").to_owned());
    }
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429]);
    let last: u64 = retry[5].parse().expect("a Retry-After");
    assert!(
        last >= 599,
        "the fourth denial bans for 10 minutes: {retry:?}"
    );
    let other = http_get(demos[1].address, "/login", &[("x-api-key", "k1")]).await;
    assert_eq!(other.status, 429, "{other:?}");
    let left: u64 = other
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After");
    assert!(left >= 590, "the other process sees the ban: {left}");
    let fresh = http_get(demos[1].address, "/login", &[("x-api-key", "k2")]).await;
    assert_eq!(fresh.status, 200, "only k1 is banned");
}

/// With `hash_clients_secret_env`, no Redis key holds the client's text; the same request id 5
/// times is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_clients_and_request_ids_from_the_file() {
    let server = RedisServer::start();
    let config = format!(
        "redis_url = \"{}\"\nhash_clients_secret_env = \"REDLIMIT_DEMO_TEST_SECRET\"\n\
         repair_corrupt_state = true\n\
         [[route]]\npath = \"/limited\"\nalgorithm = \"fixed_window_anchored\"\nlimit = 3\n\
         window = \"1h\"\nkey = \"header:x-api-key\"\nidempotency_header = \"idempotency-key\"\n",
        server.url()
    );
    let demo = Demo::start_with_env(
        &config,
        &[("REDLIMIT_DEMO_TEST_SECRET", "a secret of the test")],
    )
    .await;
    let address = demo.address;
    let headers = [("x-api-key", "visible-client"), ("idempotency-key", "once")];
    for _ in 0..5 {
        let response = http_get(address, "/limited", &headers).await;
        assert_eq!(response.status, 200, "{response:?}");
    }
    let response = http_get(address, "/limited", &[("x-api-key", "visible-client")]).await;
    let state = response.header("ratelimit").unwrap_or_default();
    assert!(
        state.starts_with("\"limited\";r=1;"),
        "five retries of one id counted once, then one more: {response:?}"
    );
    let keys: Vec<String> = redis_tests_keys(&server);
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|k| !k.contains("visible-client")),
        "a key holds the client's text: {keys:?}"
    );
}

/// Every key in `server`.
fn redis_tests_keys(server: &RedisServer) -> Vec<String> {
    let mut connection = server.connection();
    redlimit::deadpool_redis::redis::cmd("KEYS")
        .arg("*")
        .query(&mut connection)
        .expect("KEYS")
}

/// A Redis with a private CA, given in the file: decided by Redis; with `tls-auth-clients`,
/// mutual TLS with the client certificate and key in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_ca_and_a_client_certificate_from_the_file() {
    for mutual in [false, true] {
        let pki = Pki::new(if mutual { "demo-mutual" } else { "demo-ca" });
        let (_server, url) = pki.start_server(mutual);
        let mut store = format!(
            "redis_url = \"{url}\"\ntls_ca_file = \"{}\"\nbudget = \"2s\"\n",
            pki.file("ca.crt")
        );
        if mutual {
            store += &format!(
                "tls_client_cert_file = \"{}\"\ntls_client_key_file = \"{}\"\n",
                pki.file("client.crt"),
                pki.file("client.key")
            );
        }
        let demo = Demo::start(&format!("{store}{}", route("gcra", 3))).await;
        let response = http_get(demo.address, "/limited", &[]).await;
        assert_eq!(response.status, 200, "mutual {mutual}: {response:?}");
        assert!(
            response.body.contains("decided by redis"),
            "mutual {mutual}: {response:?}: {}",
            demo.output()
        );
    }
}

/// A route of 3 per second and also 5 per minute, checked together: the 4th request within a
/// second is denied by the first limit (its `Retry-After` a second), and once that second has
/// passed, the 6th admitted request is refused by the second (its `Retry-After` the minute's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_with_two_limits_denies_by_whichever_is_spent() {
    let server = RedisServer::start();
    let config = format!(
        "redis_url = \"{}\"\nbudget = \"2s\"\n[[route]]\npath = \"/limited\"\nname = \"per-second\"\n\
         algorithm = \"gcra\"\nlimit = 3\nwindow = \"1s\"\n\
         [[route.also]]\nname = \"per-minute\"\nalgorithm = \"sliding_window_log\"\nlimit = 5\n\
         window = \"1m\"\n",
        server.url()
    );
    let demo = Demo::start(&config).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(http_get(demo.address, "/limited", &[]).await);
    }
    let codes: Vec<u16> = statuses.iter().map(|r| r.status).collect();
    assert_eq!(codes, [200, 200, 200, 429]);
    let denied = &statuses[3];
    assert_eq!(denied.header("retry-after"), Some("1"), "{denied:?}");
    let policy = denied.header("ratelimit-policy").unwrap_or_default();
    assert!(
        policy.contains("\"per-second\";q=3;w=1") && policy.contains("\"per-minute\";q=5;w=60"),
        "{policy}"
    );
    // The per-second limit's own wait, as it answered it: then 2 more fit the minute's 5.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut later = Vec::new();
    for _ in 0..3 {
        later.push(http_get(demo.address, "/limited", &[]).await);
    }
    let codes: Vec<u16> = later.iter().map(|r| r.status).collect();
    assert_eq!(codes, [200, 200, 429], "{later:?}");
    let retry: u64 = later[2]
        .header("retry-after")
        .and_then(|s| s.parse().ok())
        .expect("Retry-After");
    assert!(retry > 50, "the per-minute limit's wait: {retry}");
}

/// `urls` quoted and joined, for a TOML array.
fn quoted(urls: &[String]) -> String {
    let quoted: Vec<String> = urls.iter().map(|url| format!("\"{url}\"")).collect();
    quoted.join(", ")
}

/// A demo on `store` (TOML lines) decides its first request on Redis.
async fn decided_by_redis(store: &str) {
    let demo = Demo::start(&format!("{store}{}", route("gcra", 3))).await;
    let response = http_get(demo.address, "/limited", &[]).await;
    assert!(
        response.body.contains("decided by redis"),
        "{response:?}: {}",
        demo.output()
    );
}

/// A Cluster serving TLS with a private CA, the CA given in the file: decided by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_a_private_ca_from_the_file() {
    let pki = Pki::new("demo-cluster");
    let (_cluster, urls) = RedisCluster::start_tls(&pki);
    let store = format!(
        "redis_cluster = [{}]\ntls_ca_file = \"{}\"\nbudget = \"2s\"\n",
        quoted(&urls),
        pki.file("ca.crt")
    );
    decided_by_redis(&store).await;
}

/// A primary serving mutual TLS, named by sentinels, the CA and the client certificate given
/// in the file: decided by Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_primary_over_mutual_tls_from_the_file() {
    let pki = Pki::new("demo-sentinel");
    let sentinel = RedisSentinel::start_tls(&pki);
    let store = format!(
        "redis_sentinel = {{ urls = [{}], master = \"{}\" }}\ntls_ca_file = \"{}\"\n\
         tls_client_cert_file = \"{}\"\ntls_client_key_file = \"{}\"\nbudget = \"2s\"\n",
        quoted(&sentinel.urls()),
        RedisSentinel::MASTER,
        pki.file("ca.crt"),
        pki.file("client.crt"),
        pki.file("client.key")
    );
    decided_by_redis(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metered_route_settles_each_request_at_the_cost_its_response_states() {
    let server = RedisServer::start();
    let config = format!(
        "redis_url = \"{}\"\nbudget = \"2s\"\n[[route]]\npath = \"/generate\"\nalgorithm = \"token_bucket\"\nlimit = 1000\nwindow = \"1h\"\nkey = \"header:x-api-key\"\nhandler = \"metered\"\nsettle_header = \"x-cost\"\n",
        server.url()
    );
    let demo = Demo::start(&config).await;
    let generate = |cost: u64| {
        let path = format!("/generate?cost={cost}");
        async move { http_get(demo.address, &path, &[("x-api-key", "k1")]).await }
    };
    let remaining = |response: &redlimit_tests::HttpResponse| {
        let state = response.header("ratelimit").unwrap_or_default().to_owned();
        let at = state.find(";r=").expect("r=") + 3;
        state[at..]
            .split(';')
            .next()
            .expect("a number")
            .parse::<u64>()
            .expect("r")
    };
    // Each request reserves 1; its response says what it cost.
    let first = generate(250).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("x-cost"), Some("250"));
    assert_eq!(remaining(&first), 750, "250 taken, shown after the settle");
    let second = generate(900).await;
    assert_eq!(second.status, 200, "admitted with 750 left: {second:?}");
    assert_eq!(remaining(&second), 0, "900 charged past the 750 left");
    let third = generate(1).await;
    assert_eq!(
        third.status, 429,
        "the debt of 150 refills first: {third:?}"
    );
    let wait: u64 = third
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    // 151 tokens at 1,000 an hour: 543.6 s.
    assert!((540..=545).contains(&wait), "waits {wait} s");
}
