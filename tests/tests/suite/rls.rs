//! The rate limit service over gRPC, with Envoy's own protos (envoy-types' generated client), on
//! a real Redis: envoyproxy/ratelimit's configuration answers as that service documents.

use std::time::Duration;

use redlimit::{FailurePolicy, Limiter};
use redlimit_rls::{
    RlsConfig, RlsService,
    envoy_types::pb::{
        envoy::{
            extensions::common::ratelimit::v3::{
                RateLimitDescriptor,
                rate_limit_descriptor::{Entry, RateLimitOverride},
            },
            service::ratelimit::v3::{
                RateLimitRequest, RateLimitResponse,
                rate_limit_response::{Code, DescriptorStatus},
                rate_limit_service_client::RateLimitServiceClient,
                rate_limit_service_server::RateLimitServiceServer,
            },
        },
        google::protobuf::UInt64Value,
    },
};
use redlimit_tests::RedisServer;
use tonic::transport::{Channel, server::TcpIncoming};

/// The configurations of envoyproxy/ratelimit's README, as this suite writes them.
pub(crate) const EDGE: &str = r#"
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 3
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 1000
"#;

pub(crate) const MESSAGING: &str = r#"
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 2
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: free
    rate_limit:
      unlimited: true
  - key: shadowed
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: wild
    value: foo*
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: shared
    value: bar*
    share_threshold: true
    rate_limit:
      unit: minute
      requests_per_unit: 2
  - key: api
    rate_limit:
      name: per_api
      unit: minute
      requests_per_unit: 1
  - key: api_vip
    rate_limit:
      replaces:
        - name: per_api
      unit: minute
      requests_per_unit: 5
  - key: banned
    rate_limit:
      name: banned_limit
      unit: minute
      requests_per_unit: 0
  - key: unbanned
    rate_limit:
      replaces:
        - name: banned_limit
      unit: minute
      requests_per_unit: 10
  - key: refunds
    rate_limit:
      algorithm: fixed_window_anchored
      unit: hour
      requests_per_unit: 3
  - key: window
    rate_limit:
      algorithm: sliding_window_log
      window: 30s
      requests_per_unit: 2
"#;

async fn service(server: &RedisServer) -> RateLimitServiceClient<Channel> {
    let limiter = Limiter::with_prefix(server.backend(), "rls").expect("prefix");
    serve(limiter, FailurePolicy::Closed, Duration::from_secs(10)).await
}

/// The service of this suite's configuration on `limiter`, over gRPC.
async fn serve(
    limiter: Limiter,
    failure: FailurePolicy,
    budget: Duration,
) -> RateLimitServiceClient<Channel> {
    let config = RlsConfig::from_files([("edge.yaml", EDGE), ("messaging.yaml", MESSAGING)])
        .expect("valid configuration");
    let rls = RlsService::new(limiter, config, failure, budget);
    let url = format!("http://{}", listen(rls));
    RateLimitServiceClient::connect(url)
        .await
        .expect("the service answers")
}

/// Serves `rls` on a loopback port, bound before this returns (so it is listening): its address.
pub(crate) fn listen(rls: RlsService) -> std::net::SocketAddr {
    serve_grpc(tonic::transport::Server::builder().add_service(RateLimitServiceServer::new(rls)))
}

/// Serves `router` on a loopback port, bound before this returns: its address.
pub(crate) fn serve_grpc(router: tonic::transport::server::Router) -> std::net::SocketAddr {
    let incoming = TcpIncoming::bind(([127, 0, 0, 1], 0).into()).expect("a loopback port");
    let address = incoming.local_addr().expect("its address");
    tokio::spawn(router.serve_with_incoming(incoming));
    address
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    };
    client
        .should_rate_limit(request)
        .await
        .expect("an answer")
        .into_inner()
}

fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).expect("a code")
}

fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).expect("a code")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_descriptor_over_its_limit_is_over_limit_with_its_status() {
    let server = RedisServer::start();
    let mut client = service(&server).await;
    // Per IP, 3 a second; 50.0.0.5, 1,000. A second boundary may fall between the checks, so
    // the fourth within one second is what is asked for: ask until one is denied.
    let ip = descriptor(&[("remote_address", "10.0.0.1")]);
    let mut answers = Vec::new();
    for _ in 0..40 {
        let response = ask(&mut client, "edge_proxy_per_ip", vec![ip.clone()]).await;
        let denied = overall(&response) == Code::OverLimit;
        answers.push(response);
        if denied {
            break;
        }
    }
    let last = answers.last().expect("answers");
    assert_eq!(overall(last), Code::OverLimit);
    let status = &last.statuses[0];
    assert_eq!(code(status), Code::OverLimit);
    let limit = status.current_limit.as_ref().expect("its limit");
    assert_eq!((limit.requests_per_unit, limit.unit), (3, 1));
    assert_eq!(status.limit_remaining, 0);
    let reset = status.duration_until_reset.as_ref().expect("its reset");
    assert!(reset.seconds <= 1, "{reset:?}");
    // Another IP, and the one with a limit of its own, pass.
    let vip = ask(
        &mut client,
        "edge_proxy_per_ip",
        vec![descriptor(&[("remote_address", "50.0.0.5")])],
    )
    .await;
    assert_eq!(overall(&vip), Code::Ok);
    assert_eq!(
        vip.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(1000)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_descriptors_keys_without_values_and_what_a_denied_request_consumes() {
    let server = RedisServer::start();
    let mut client = service(&server).await;
    let marketing = |to: &str| descriptor(&[("message_type", "marketing"), ("to_number", to)]);
    let number = |to: &str| descriptor(&[("to_number", to)]);
    // Marketing to one number: 2 a day; any message to one number: 3 a day; each number its
    // own counter.
    for _ in 0..2 {
        let response = ask(
            &mut client,
            "messaging",
            vec![marketing("123"), number("123")],
        )
        .await;
        assert_eq!(overall(&response), Code::Ok);
    }
    let third = ask(
        &mut client,
        "messaging",
        vec![marketing("123"), number("123")],
    )
    .await;
    assert_eq!(overall(&third), Code::OverLimit);
    assert_eq!(code(&third.statuses[0]), Code::OverLimit);
    assert_eq!(code(&third.statuses[1]), Code::Ok);
    // The denied request took nothing from the per-number limit: one left, as after two.
    assert_eq!(third.statuses[1].limit_remaining, 1);
    let plain = ask(&mut client, "messaging", vec![number("123")]).await;
    assert_eq!(
        (overall(&plain), plain.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
    let other = ask(&mut client, "messaging", vec![marketing("456")]).await;
    assert_eq!(overall(&other), Code::Ok);
    // A descriptor no rule matches is OK with no limit; an unknown domain too.
    let none = ask(
        &mut client,
        "messaging",
        vec![descriptor(&[("nothing", "x")])],
    )
    .await;
    assert_eq!(overall(&none), Code::Ok);
    assert!(none.statuses[0].current_limit.is_none());
    let unknown = ask(&mut client, "nowhere", vec![number("123")]).await;
    assert_eq!(overall(&unknown), Code::Ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlimited_shadow_wildcards_and_replaces_answer_as_documented() {
    let server = RedisServer::start();
    let mut client = service(&server).await;
    for _ in 0..5 {
        let free = ask(&mut client, "messaging", vec![descriptor(&[("free", "x")])]).await;
        assert_eq!(
            (overall(&free), free.statuses[0].limit_remaining),
            (Code::Ok, u32::MAX)
        );
        // Shadow mode: over its limit of 1 from the second, yet OK.
        let shadow = ask(
            &mut client,
            "messaging",
            vec![descriptor(&[("shadowed", "x")])],
        )
        .await;
        assert_eq!(overall(&shadow), Code::Ok);
        assert_eq!(code(&shadow.statuses[0]), Code::Ok);
    }
    // A trailing wildcard: each value its own counter; with share_threshold, one for all.
    for value in ["foo1", "foo2"] {
        for _ in 0..2 {
            let wild = ask(
                &mut client,
                "messaging",
                vec![descriptor(&[("wild", value)])],
            )
            .await;
            assert_eq!(overall(&wild), Code::Ok, "{value}");
        }
    }
    let wild = ask(
        &mut client,
        "messaging",
        vec![descriptor(&[("wild", "foo1")])],
    )
    .await;
    assert_eq!(overall(&wild), Code::OverLimit);
    let not_wild = ask(
        &mut client,
        "messaging",
        vec![descriptor(&[("wild", "fo")])],
    )
    .await;
    assert!(not_wild.statuses[0].current_limit.is_none());
    for value in ["bar1", "bar2"] {
        let shared = ask(
            &mut client,
            "messaging",
            vec![descriptor(&[("shared", value)])],
        )
        .await;
        assert_eq!(overall(&shared), Code::Ok, "{value}");
    }
    let shared = ask(
        &mut client,
        "messaging",
        vec![descriptor(&[("shared", "bar3")])],
    )
    .await;
    assert_eq!(overall(&shared), Code::OverLimit);
    // `replaces`: with the VIP limit in the request, the per-API one does not apply.
    for _ in 0..3 {
        let both = vec![descriptor(&[("api", "a")]), descriptor(&[("api_vip", "a")])];
        let response = ask(&mut client, "messaging", both).await;
        assert_eq!(overall(&response), Code::Ok);
        assert!(response.statuses[0].current_limit.is_none());
    }
    // A limit of 0 denies every request, unless a matching rule replaces it.
    let banned = ask(
        &mut client,
        "messaging",
        vec![descriptor(&[("banned", "x")])],
    )
    .await;
    assert_eq!(overall(&banned), Code::OverLimit);
    let limit = banned.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit);
    assert_eq!(limit, Some(0));
    let lifted = vec![
        descriptor(&[("banned", "x")]),
        descriptor(&[("unbanned", "x")]),
    ];
    let lifted = ask(&mut client, "messaging", lifted).await;
    assert_eq!(overall(&lifted), Code::Ok);
    // A descriptor's own limit (Envoy's `limit` override) applies before its tree's.
    let own = RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: 2,
        }),
        ..descriptor(&[("nothing", "y")])
    };
    for code in [Code::Ok, Code::Ok, Code::OverLimit] {
        let response = ask(&mut client, "messaging", vec![own.clone()]).await;
        assert_eq!(overall(&response), code);
        let limit = response.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit));
        assert_eq!(limit, Some((2, 2)));
    }
    let alone = ask(&mut client, "messaging", vec![descriptor(&[("api", "a")])]).await;
    assert_eq!(overall(&alone), Code::Ok);
    let again = ask(&mut client, "messaging", vec![descriptor(&[("api", "a")])]).await;
    assert_eq!(overall(&again), Code::OverLimit);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_window_of_30_s_and_a_check_that_consumes_nothing() {
    let server = RedisServer::start();
    let mut client = service(&server).await;
    let window = descriptor(&[("window", "x")]);
    // A descriptor's hits_addend of 0 checks without consuming.
    let peek = RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: 0 }),
        ..window.clone()
    };
    for _ in 0..3 {
        let response = ask(&mut client, "messaging", vec![peek.clone()]).await;
        assert_eq!(
            (overall(&response), response.statuses[0].limit_remaining),
            (Code::Ok, 2)
        );
    }
    for left in [1, 0] {
        let response = ask(&mut client, "messaging", vec![window.clone()]).await;
        assert_eq!(
            (overall(&response), response.statuses[0].limit_remaining),
            (Code::Ok, left)
        );
    }
    let denied = ask(&mut client, "messaging", vec![window.clone()]).await;
    assert_eq!(overall(&denied), Code::OverLimit);
    let reset = denied.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("a reset");
    assert!((1..=30).contains(&reset.seconds), "{reset:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_the_failure_policy_answers_and_redis_decides_again_once_back() {
    let port = redlimit_tests::free_port();
    let mut server = RedisServer::start_on_port(port);
    let backend = redlimit::RedisBackend::builder(server.url())
        .budget(Duration::from_millis(200))
        .build()
        .expect("a valid url");
    let limiter = Limiter::with_prefix(backend, "rls").expect("prefix");
    let mut client = serve(limiter, FailurePolicy::Open, Duration::from_millis(200)).await;
    let api = |value: &str| vec![descriptor(&[("api", value)])];
    assert_eq!(
        overall(&ask(&mut client, "messaging", api("up")).await),
        Code::Ok
    );
    assert_eq!(
        overall(&ask(&mut client, "messaging", api("up")).await),
        Code::OverLimit
    );
    server.kill();
    // Open: every call answered, OK, however often it is asked (of a key no denial blocked
    // locally: one that was stays denied until its block ends, as Redis had it).
    for _ in 0..20 {
        let response = ask(&mut client, "messaging", api("down")).await;
        assert_eq!(overall(&response), Code::Ok);
    }
    // Back, empty: a later request is Redis's denial again, once the circuit lets checks
    // through (after its cooldown; asked for up to a minute).
    let _server = RedisServer::start_on_port(port);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut denied = false;
    while !denied && std::time::Instant::now() < deadline {
        denied = overall(&ask(&mut client, "messaging", api("back")).await) == Code::OverLimit;
        if !denied {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(denied, "Redis decides again once it is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rule_counts_its_hits_under_envoyproxy_ratelimits_stat_names() {
    use redlimit_rls::envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;

    use crate::observability::{recorded, value, values};

    let server = RedisServer::start();
    let yaml = "
domain: stats
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: trial
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
";
    let (config, snapshotter) =
        recorded(|| RlsConfig::from_files([("stats.yaml", yaml)]).expect("valid"));
    let limiter = Limiter::with_prefix(server.backend(), "stats").expect("prefix");
    let rls = RlsService::new(
        limiter,
        config,
        FailurePolicy::Closed,
        Duration::from_secs(10),
    );
    let ask = |key: &str| RateLimitRequest {
        domain: "stats".to_owned(),
        descriptors: vec![descriptor(&[(key, "a")])],
        hits_addend: 0,
    };
    for _ in 0..3 {
        rls.should_rate_limit(tonic::Request::new(ask("user")))
            .await
            .expect("an answer");
    }
    for _ in 0..2 {
        let answer = rls
            .should_rate_limit(tonic::Request::new(ask("trial")))
            .await;
        assert_eq!(
            answer.expect("an answer").into_inner().overall_code,
            Code::Ok as i32
        );
    }
    let all = values(&snapshotter);
    let stat = |name: &str, key1: &str| {
        let labels = [("domain", "stats"), ("key1", key1), ("key2", "")];
        value(
            &all,
            &format!("ratelimit_service_rate_limit_{name}"),
            &labels,
        )
    };
    let user: Vec<f64> = [
        "total_hits",
        "within_limit",
        "near_limit",
        "over_limit",
        "shadow_mode",
    ]
    .iter()
    .map(|name| stat(name, "user"))
    .collect();
    assert_eq!(user, [3.0, 2.0, 1.0, 1.0, 0.0]);
    let trial: Vec<f64> = ["total_hits", "within_limit", "over_limit", "shadow_mode"]
        .iter()
        .map(|name| stat(name, "trial"))
        .collect();
    assert_eq!(trial, [2.0, 1.0, 1.0, 1.0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_file_is_reloaded_and_a_bad_one_keeps_the_last_good() {
    use redlimit_rls::envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;

    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("rls-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a folder");
    let limit = |n: u64| {
        format!(
            "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: {n} }}\n"
        )
    };
    std::fs::write(dir.join("w.yaml"), limit(5)).expect("written");
    let config = RlsConfig::load_dir(&dir).expect("valid");
    let limiter = Limiter::with_prefix(server.backend(), "watch").expect("prefix");
    let rls = RlsService::new(
        limiter,
        config,
        FailurePolicy::Closed,
        Duration::from_secs(10),
    );
    tokio::spawn(redlimit_rls::watch(dir.clone(), rls.clone()));
    let limit_now = || async {
        let request = RateLimitRequest {
            domain: "w".to_owned(),
            descriptors: vec![descriptor(&[("k", "a")])],
            hits_addend: 0,
        };
        let answer = rls.should_rate_limit(tonic::Request::new(request)).await;
        let statuses = answer.expect("an answer").into_inner().statuses;
        statuses[0]
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit)
    };
    assert_eq!(limit_now().await, 5);
    // Waits (a minute at most) for the limit the folder's files give.
    let until = |want: u32| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut now = limit_now().await;
        while now != want && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            now = limit_now().await;
        }
        now
    };
    // A bad file beside it: nothing reloads, then a good change does.
    std::fs::write(dir.join("x.yaml"), "domain: ''").expect("written");
    std::fs::write(dir.join("w.yaml"), limit(7)).expect("written");
    std::fs::remove_file(dir.join("x.yaml")).expect("removed");
    assert_eq!(until(7).await, 7);
    std::fs::write(dir.join("w.yaml"), "domain: w\ndescriptors: [oops").expect("written");
    // The broken file is read, found wanting, and 7 stays in force; once mended, 9 comes in.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while rls.failed().is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let failed = rls.failed().expect("the broken file was read").to_string();
    assert!(failed.contains("w.yaml"), "{failed}");
    assert_eq!(limit_now().await, 7);
    std::fs::write(dir.join("w.yaml"), limit(9)).expect("written");
    assert_eq!(until(9).await, 9);
    assert!(rls.failed().is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_hits_give_back_never_past_the_limit() {
    let server = RedisServer::start();
    let mut client = service(&server).await;
    let hit = descriptor(&[("refunds", "x")]);
    let refund = |n: u64| RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: n }),
        is_negative_hits: true,
        ..hit.clone()
    };
    for left in [2, 1, 0] {
        let response = ask(&mut client, "messaging", vec![hit.clone()]).await;
        assert_eq!(
            (overall(&response), response.statuses[0].limit_remaining),
            (Code::Ok, left)
        );
    }
    assert_eq!(
        overall(&ask(&mut client, "messaging", vec![hit.clone()]).await),
        Code::OverLimit
    );
    // Two given back: two more pass.
    let given = ask(&mut client, "messaging", vec![refund(2)]).await;
    assert_eq!(
        (overall(&given), given.statuses[0].limit_remaining),
        (Code::Ok, 2)
    );
    for left in [1, 0] {
        let response = ask(&mut client, "messaging", vec![hit.clone()]).await;
        assert_eq!(
            (overall(&response), response.statuses[0].limit_remaining),
            (Code::Ok, left)
        );
    }
    // More than was counted: the whole limit back, never more.
    let given = ask(&mut client, "messaging", vec![refund(10)]).await;
    assert_eq!(given.statuses[0].limit_remaining, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_name_the_descriptor_nearest_its_limit() {
    use redlimit_rls::envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;

    let server = RedisServer::start();
    let config = RlsConfig::from_files([("messaging.yaml", MESSAGING)]).expect("valid");
    let limiter = Limiter::with_prefix(server.backend(), "headers").expect("prefix");
    let rls = RlsService::new(
        limiter,
        config,
        FailurePolicy::Closed,
        Duration::from_secs(10),
    )
    .response_headers(true);
    let ask = || async {
        let request = RateLimitRequest {
            domain: "messaging".to_owned(),
            descriptors: vec![
                descriptor(&[("refunds", "h")]),
                descriptor(&[("free", "h")]),
            ],
            hits_addend: 0,
        };
        let answer = rls.should_rate_limit(tonic::Request::new(request)).await;
        let headers = answer
            .expect("an answer")
            .into_inner()
            .response_headers_to_add;
        headers
            .into_iter()
            .map(|h| format!("{}: {}", h.key, h.value))
            .collect::<Vec<_>>()
    };
    let first = ask().await;
    assert_eq!(first[..2], ["RateLimit-Limit: 3", "RateLimit-Remaining: 2"]);
    let reset: u64 = first[2]["RateLimit-Reset: ".len()..]
        .parse()
        .expect("seconds");
    assert!((3_590..=3_600).contains(&reset), "{first:?}");
    ask().await;
    ask().await;
    let over = ask().await;
    assert_eq!(over[..2], ["RateLimit-Limit: 3", "RateLimit-Remaining: 0"]);
}
