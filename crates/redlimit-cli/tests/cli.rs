//! `redlimit` as operators run it, against real Redis servers: inspect, reset and check on a
//! standalone server and a Cluster, top over 100,000 keys, suggest on a known distribution.

use std::{
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

use axum_demo::Config;
use redlimit_tests::{RedisCluster, RedisServer, command_calls, http_get, serve};

const CLI: &str = env!("CARGO_BIN_EXE_redlimit");

/// A config file, removed on drop.
struct File(std::path::PathBuf);

impl File {
    fn new(text: &str) -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "redlimit-cli-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, text).expect("writing a config");
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("a UTF-8 path")
    }
}

impl Drop for File {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn cli(args: &[&str]) -> Output {
    Command::new(CLI)
        .args(args)
        .output()
        .expect("running redlimit")
}

/// Runs `redlimit` and returns its standard output, which it must exit 0 with.
fn ok(args: &[&str]) -> String {
    let output = cli(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{args:?}: {stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

// Anchored windows open at each client's first request: no aligned boundary (an hour, a
// quarter) can fall inside a test and empty the state it reads.
const ROUTES: &str = "[[route]]
path = \"/api\"
algorithm = \"fixed_window_anchored\"
limit = 5
window = \"1h\"
key = \"header:x-api-key\"
";

/// check, inspect and reset of one client through the tool.
fn inspect_check_reset(config: &str, redis: &[&str]) {
    let with = |command: &str, client: &str| {
        let mut args = vec![
            command, "--config", config, "--route", "/api", "--client", client,
        ];
        args.extend_from_slice(redis);
        ok(&args)
    };
    assert!(with("inspect", "k1").contains("remaining  5 of 5"));
    assert!(with("inspect", "k1").contains("state      none"));
    for left in [4, 3, 2] {
        let checked = with("check", "k1");
        assert!(
            checked.starts_with(&format!("allowed: {left} of 5 remaining")),
            "{checked}"
        );
    }
    let seen = with("inspect", "k1");
    assert!(seen.contains("remaining  2 of 5"), "{seen}");
    assert!(seen.contains("next       allowed"), "{seen}");
    assert!(seen.contains("key        redlimit:api:{k1}:fwa:"), "{seen}");
    assert!(seen.contains(" n=3"), "{seen}");
    assert!(
        with("inspect", "k1").contains("remaining  2 of 5"),
        "inspect consumes nothing"
    );
    assert!(with("reset", "k1").contains("deleted"));
    assert!(with("reset", "k1").contains("nothing stored"));
    assert!(with("inspect", "k1").contains("remaining  5 of 5"));
    assert!(with("check", "k2").starts_with("allowed: 4 of 5"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_check_reset_and_top_on_a_standalone_server() {
    let server = RedisServer::start();
    let file = File::new(ROUTES);
    let url = server.url();
    inspect_check_reset(file.path(), &["--redis", &url]);

    let top = ok(&[
        "top",
        "--config",
        file.path(),
        "--route",
        "/api",
        "--redis",
        &url,
    ]);
    assert!(
        top.starts_with("1 keys of policy api in 1 SCAN calls\n"),
        "{top}"
    );
    assert!(top.contains("k2") && top.contains("1/5"), "{top}");
}

/// A config file of [`ROUTES`] with `limit`, on `server`, and its parsed form.
fn on_server(server: &RedisServer, limit: u64) -> (File, Config) {
    let text = format!(
        "redis_url = \"{}\"\nbudget = \"5s\"\n{}",
        server.url(),
        ROUTES.replace("limit = 5", &format!("limit = {limit}"))
    );
    (
        File::new(&text),
        Config::parse(&text).expect("a valid file"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn top_on_100_000_keys_takes_a_bounded_number_of_scans_and_no_keys() {
    let server = RedisServer::start();
    let (file, config) = on_server(&server, 100);
    let limiter = axum_demo::limiter(&config).expect("a limiter");
    let policy = redlimit_core::PolicySet::from(config.routes[0].policy().expect("a policy"));
    // 100,000 clients; "hot-N" has used N of its 100.
    let mut tasks = tokio::task::JoinSet::new();
    for part in 0..50_u64 {
        let (limiter, policy) = (limiter.clone(), policy.clone());
        tasks.spawn(async move {
            for i in (part..100_000).step_by(50) {
                let (client, cost) = match i {
                    0..95 => (format!("hot-{}", i + 1), i + 1),
                    _ => (format!("c{i}"), 1 + i % 3),
                };
                let decisions = limiter
                    .check(&policy, &client)
                    .cost(cost)
                    .await
                    .expect("check");
                assert!(decisions.allowed());
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a filling task");
    }
    let before = command_calls(&mut server.connection());
    let top = ok(&[
        "top",
        "--config",
        file.path(),
        "--route",
        "/api",
        "--count",
        "3",
    ]);
    let after = command_calls(&mut server.connection());
    let calls = |name: &str| {
        after.get(name).map_or(0, |s| s.calls) - before.get(name).map_or(0, |s| s.calls)
    };
    let scans = calls("scan");
    assert!(
        top.starts_with(&format!(
            "100000 keys of policy api in {scans} SCAN calls\n"
        )),
        "{top}"
    );
    assert!(
        (100..=150).contains(&scans),
        "100,000 keys at 1,000 a call: {scans}"
    );
    assert_eq!(calls("keys"), 0, "never KEYS");
    let rows: Vec<&str> = top.lines().skip(2).collect();
    assert_eq!(rows.len(), 3, "{top}");
    for (row, hot) in rows.iter().zip(["hot-95", "hot-94", "hot-93"]) {
        assert!(row.starts_with(hot), "{row} should be {hot}");
    }
    assert!(rows[0].contains("95/100"), "{}", rows[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_check_reset_and_top_on_a_cluster() {
    let cluster = RedisCluster::start();
    let urls: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
    let file = File::new(&format!("redis_cluster = [{}]\n{ROUTES}", urls.join(", ")));
    inspect_check_reset(file.path(), &[]);
    for client in ["a", "b", "c", "d", "e", "f"] {
        ok(&[
            "check",
            "--config",
            file.path(),
            "--route",
            "/api",
            "--client",
            client,
        ]);
    }
    let top = ok(&["top", "--config", file.path(), "--route", "/api"]);
    assert!(top.starts_with("7 keys of policy api in "), "{top}");
    for client in ["k2", "a", "f"] {
        assert!(top.contains(&format!("\n{client} ")), "{client}: {top}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suggest_reports_the_p99_of_a_known_distribution_driven_through_the_demo() {
    let server = RedisServer::start();
    let (file, config) = on_server(&server, 50);
    let address = serve(axum_demo::app(&config).expect("the demo's app")).await;
    // 120 clients; client i sends 1 + (37 i mod 30) requests.
    let mut sent: Vec<u64> = (0..120_u64).map(|i| 1 + (37 * i) % 30).collect();
    for (i, n) in sent.iter().enumerate() {
        let key = format!("client-{i}");
        for _ in 0..*n {
            let response = http_get(address, "/api", &[("x-api-key", &key)]).await;
            assert_eq!(response.status, 200, "{response:?}");
        }
    }
    sent.sort_unstable();
    let true_p99 = sent[(sent.len() * 99).div_ceil(100) - 1];

    let json = ok(&["suggest", "--config", file.path(), "--json"]);
    let parsed: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    let usage = &parsed[0]["usage"];
    let p99 = usage["p99"].as_u64().expect("a p99");
    assert!(p99.abs_diff(true_p99) <= 1, "p99 {p99}, true {true_p99}");
    assert_eq!(usage["clients"], 120);
    assert_eq!(usage["max"].as_u64(), sent.last().copied());
    assert_eq!(usage["limited_share"], 0.0);
    let suggested = usage["suggested_limit"].as_u64().expect("a suggestion");
    assert_eq!(suggested, (p99 * 3).div_ceil(2), "p99 x 1.5, rounded up");

    let table = ok(&["suggest", "--config", file.path()]);
    let row = table
        .lines()
        .find(|l| l.starts_with("/api "))
        .expect("a row for /api");
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[2], "120", "{row}");
    assert_eq!(columns[5], p99.to_string(), "{row}");
    assert!(table.contains("Advice only"), "{table}");
}

#[test]
fn mistakes_exit_2_naming_what_is_wrong() {
    let memory = File::new(ROUTES);
    for (args, says) in [
        (vec!["frob"], "unknown command"),
        (
            vec!["top", "--config", "/nonexistent.toml", "--route", "/api"],
            "/nonexistent.toml",
        ),
        (
            vec!["top", "--config", memory.path(), "--route", "/api"],
            "no redis_url",
        ),
        (
            vec![
                "top",
                "--config",
                memory.path(),
                "--route",
                "/nope",
                "--redis",
                "redis://127.0.0.1:1",
            ],
            "--route: no route \"/nope\"",
        ),
        (
            vec![
                "suggest",
                "--config",
                memory.path(),
                "--redis",
                "redis://127.0.0.1:1",
                "--headroom",
                "0",
            ],
            "--headroom",
        ),
    ] {
        let output = cli(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let down = cli(&[
        "top",
        "--config",
        memory.path(),
        "--route",
        "/api",
        "--redis",
        "redis://:hunter2@127.0.0.1:1",
    ]);
    let stderr = String::from_utf8_lossy(&down.stderr);
    assert_eq!(down.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("redlimit: redis:"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "no password: {stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_gives_one_client_other_numbers_until_cleared() {
    let server = RedisServer::start();
    let (plain, _) = on_server(&server, 5);
    let text = std::fs::read_to_string(plain.path()).expect("the file") + "overrides = true\n";
    let file = File::new(&text);
    let config = Config::parse(&text).expect("a valid file");
    // Two instances of the app on the same Redis.
    let one = serve(axum_demo::app(&config).expect("the demo's app")).await;
    let two = serve(axum_demo::app(&config).expect("the demo's app")).await;
    let client = ["--config", file.path(), "--route", "/api", "--client", "k1"];
    let with = |command: &str, more: &[&str]| {
        let mut args = vec![command];
        args.extend_from_slice(&client);
        args.extend_from_slice(more);
        ok(&args)
    };
    let set = with("override", &["--limit", "7", "--ttl", "10m"]);
    assert_eq!(set, "override: k1 on /api for 10m\n");
    let mut passed = 0;
    for i in 0..8 {
        let response = http_get([one, two][i % 2], "/api", &[("x-api-key", "k1")]).await;
        passed += u32::from(response.status == 200);
    }
    assert_eq!(passed, 7, "both instances count k1 by the override");
    assert!(with("check", &[]).starts_with("denied: 0 of 7"));
    assert!(with("clear-override", &[]).contains("back on the route's numbers"));
    assert!(with("clear-override", &[]).contains("had no override"));
    assert!(
        with("check", &[]).starts_with("denied: 0 of 5"),
        "the 7 used under the override count under the route's 5 too"
    );

    let refused = cli(&[
        "override",
        "--config",
        plain.path(),
        "--route",
        "/api",
        "--client",
        "k1",
        "--ttl",
        "1m",
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("does not take overrides"), "{stderr}");
    for (more, says) in [
        (vec![], "--ttl"),
        (vec!["--ttl", "0s"], "ttl"),
        (vec!["--ttl", "soon"], "--ttl"),
        (vec!["--ttl", "1m", "--burst", "3"], "burst"),
    ] {
        let mut args = vec!["override"];
        args.extend_from_slice(&client);
        args.extend_from_slice(&more);
        let output = cli(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_lifts_a_client_blocked_at_both_instances_within_milliseconds_of_the_cli() {
    let server = RedisServer::start();
    let (file, config) = on_server(&server, 2);
    let instances = [
        serve(axum_demo::app(&config).expect("the demo's app")).await,
        serve(axum_demo::app(&config).expect("the demo's app")).await,
    ];
    let mut redis = server.connection();
    // k1 over its limit at both, each then denying it from its block cache: no Redis command.
    for at in instances {
        let started = std::time::Instant::now();
        loop {
            let before = redlimit_tests::command_calls(&mut redis);
            let response = http_get(at, "/api", &[("x-api-key", "k1")]).await;
            let after = redlimit_tests::command_calls(&mut redis);
            if response.status == 429
                && redlimit_tests::commands_sent(&before, &after).commands == 0
            {
                break;
            }
            assert!(started.elapsed() < std::time::Duration::from_secs(10));
        }
    }
    let reset = ok(&[
        "reset",
        "--config",
        file.path(),
        "--route",
        "/api",
        "--client",
        "k1",
    ]);
    assert!(reset.contains("deleted"), "{reset}");
    let exited = std::time::Instant::now();
    for (at, remaining) in instances.into_iter().zip(["1", "0"]) {
        loop {
            let response = http_get(at, "/api", &[("x-api-key", "k1")]).await;
            if response.status == 200 {
                let state = response.header("ratelimit").unwrap_or_default();
                assert!(state.contains(&format!(";r={remaining};")), "{response:?}");
                break;
            }
            assert!(
                exited.elapsed() < std::time::Duration::from_secs(10),
                "never lifted"
            );
        }
    }
    println!(
        "both instances answered 200 {:?} after the CLI exited",
        exited.elapsed()
    );
}

/// An application that is not the demo, with keys under its own prefix: the policy named on
/// the command line, no file. inspect sees what the application's checks used, top lists the
/// client, reset deletes its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_named_on_the_command_line_reaches_any_applications_keys() {
    let server = RedisServer::start();
    let login =
        redlimit_core::Policy::builder("login", redlimit_core::Algorithm::FixedWindowAnchored)
            .limit(5)
            .window(std::time::Duration::from_secs(900))
            .build()
            .expect("a policy");
    let limiter = redlimit_core::Limiter::with_prefix(server.backend(), "shop").expect("prefix");
    for _ in 0..2 {
        let checked = limiter.check(&login.clone().into(), "alice").await;
        assert!(checked.expect("a check")[0].allowed);
    }
    let url = server.url();
    // `command` of the application's keys, its policy named `policy`.
    let with_policy = |policy: &str, command: &str, client: Option<&str>| {
        let mut args = vec![
            command, "--policy", policy, "--redis", &url, "--prefix", "shop",
        ];
        if let Some(client) = client {
            args.extend(["--client", client]);
        }
        ok(&args)
    };
    let with = |command: &str, client: Option<&str>| {
        with_policy("login:fixed_window_anchored:5/15m", command, client)
    };
    let seen = with("inspect", Some("alice"));
    assert!(seen.contains("remaining  3 of 5"), "{seen}");
    assert!(
        seen.contains("key        shop:login:{alice}:fwa:"),
        "{seen}"
    );
    assert!(with("top", None).contains("alice"));
    // Another limit reads the same state, under its own numbers.
    let seen = with_policy(
        "login:fixed_window_anchored:6/15m",
        "inspect",
        Some("alice"),
    );
    assert!(seen.contains("remaining  4 of 6"), "{seen}");
    assert!(!seen.contains("warning"), "{seen}");
    // Another window: no state, and a warning naming the windows the keys have.
    let seen = with_policy(
        "login:fixed_window_anchored:5/10m",
        "inspect",
        Some("alice"),
    );
    assert!(seen.contains("remaining  5 of 5"), "{seen}");
    assert!(
        seen.contains(
            "warning: no state of login under this algorithm and window (fwa:600000); its keys \
             have: fwa:900000"
        ),
        "{seen}"
    );
    assert!(!with("inspect", Some("alice")).contains("warning"));
    assert!(with("reset", Some("alice")).contains("deleted"));
    assert!(with("inspect", Some("alice")).contains("remaining  5 of 5"));
    let bad = cli(&[
        "inspect",
        "--policy",
        "login:fixed_window_anchored:5",
        "--redis",
        &url,
    ]);
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("NAME:ALGORITHM:LIMIT/WINDOW"), "{stderr}");
}

/// A policy of a key group, named with its group (`@GROUP`): inspect reads its record in the
/// client's group key, top finds the client, reset deletes the client's group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_policy_named_on_the_command_line_reads_its_record() {
    let server = RedisServer::start();
    let grouped = |name: &str, algorithm, limit| {
        redlimit_core::Policy::builder(name, algorithm)
            .limit(limit)
            .window(std::time::Duration::from_secs(60))
            .key_group("api")
            .build()
            .expect("a policy")
    };
    let set = redlimit_core::PolicySet::new([
        grouped("per-minute", redlimit_core::Algorithm::FixedWindow, 10),
        grouped("burst", redlimit_core::Algorithm::Gcra, 30),
    ])
    .expect("a set");
    let limiter = redlimit_core::Limiter::with_prefix(server.backend(), "shop").expect("prefix");
    for _ in 0..3 {
        assert!(limiter.check(&set, "bob").await.expect("a check").allowed());
    }
    let url = server.url();
    let with = |command: &str, client: Option<&str>| {
        let mut args = vec![
            command,
            "--policy",
            "per-minute:fixed_window:10/1m@api",
            "--redis",
            &url,
            "--prefix",
            "shop",
        ];
        if let Some(client) = client {
            args.extend(["--client", client]);
        }
        ok(&args)
    };
    let seen = with("inspect", Some("bob"));
    assert!(seen.contains("remaining  7 of 10"), "{seen}");
    assert!(seen.contains("key        shop:api:{bob}:group"), "{seen}");
    assert!(with("top", None).contains("bob"));
    assert!(with("reset", Some("bob")).contains("deleted"));
    assert!(with("inspect", Some("bob")).contains("remaining  10 of 10"));
    let bad = cli(&[
        "inspect",
        "--policy",
        "log:sliding_window_log:5/1m@api",
        "--redis",
        &url,
        "--client",
        "bob",
    ]);
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("key_group"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_service_descriptor_is_inspected_and_reset_by_its_yaml() {
    use redlimit_rls::{
        RlsConfig, RlsService,
        envoy_types::pb::envoy::{
            extensions::common::ratelimit::v3::{
                RateLimitDescriptor, rate_limit_descriptor::Entry,
            },
            service::ratelimit::v3::{
                RateLimitRequest, rate_limit_service_server::RateLimitService,
            },
        },
    };

    let server = RedisServer::start();
    let url = server.url();
    let dir = std::env::temp_dir().join(format!("redlimit-cli-rls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder");
    // An anchored window: no aligned boundary can fall inside the test.
    let yaml = "domain: edge
descriptors:
  - key: remote_address
    rate_limit: { algorithm: fixed_window_anchored, unit: hour, requests_per_unit: 5 }
";
    std::fs::write(dir.join("edge.yaml"), yaml).expect("written");
    let config = RlsConfig::load_dir(&dir).expect("valid");
    let limiter = redlimit_core::Limiter::new(server.backend());
    let rls = RlsService::new(
        limiter,
        config,
        redlimit_core::FailurePolicy::Closed,
        std::time::Duration::from_secs(10),
    );
    let ask = || async {
        let request = RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".to_owned(),
                    value: "10.0.0.1".to_owned(),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 0,
        };
        let answer = rls.should_rate_limit(tonic::Request::new(request)).await;
        answer.expect("an answer").into_inner().statuses[0].limit_remaining
    };
    for left in [4, 3, 2] {
        assert_eq!(ask().await, left);
    }
    let folder = dir.to_str().expect("a UTF-8 path");
    let with = |command: &str| {
        ok(&[
            command,
            "--rls",
            folder,
            "--domain",
            "edge",
            "--descriptor",
            "remote_address=10.0.0.1",
            "--redis",
            &url,
        ])
    };
    let seen = with("inspect");
    assert!(seen.contains("remaining  2 of 5"), "{seen}");
    let reset = with("reset");
    assert!(reset.contains("deleted"), "{reset}");
    assert!(with("inspect").contains("remaining  5 of 5"));
    // The service sees the reset: its next request finds the whole limit.
    assert_eq!(ask().await, 4);
    // A descriptor no rule counts is named as such.
    let none = cli(&[
        "inspect",
        "--rls",
        folder,
        "--domain",
        "edge",
        "--descriptor",
        "path=/x",
        "--redis",
        &url,
    ]);
    assert_eq!(none.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&none.stderr).contains("no rule"));
    let _ = std::fs::remove_dir_all(&dir);
}
