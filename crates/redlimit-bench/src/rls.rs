//! `--mode rls`: the rate limit service's `ShouldRateLimit` over gRPC on loopback, one and three
//! descriptors, beside a guard making the same checks in process, on the same Redis, rounds
//! interleaved.

use std::{sync::Arc, time::Duration};

use redlimit::{FailurePolicy, GuardedLimiter, PolicySet};
use redlimit_rls::{
    RlsConfig, RlsService,
    envoy_types::pb::envoy::{
        extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
        service::ratelimit::v3::{
            RateLimitRequest, rate_limit_service_client::RateLimitServiceClient,
            rate_limit_service_server::RateLimitServiceServer,
        },
    },
};
use tokio::runtime::Handle;
use tonic::transport::{Channel, server::TcpIncoming};

use crate::{
    Settings,
    decisions::{admin, redis_limiter},
    drive::{Decide, over_clients},
    report::Row,
};

/// The rules both sides check: per address, per API key, per path.
const CONFIG: &str = "
domain: bench
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: api_key
    rate_limit: { unit: hour, requests_per_unit: 1000 }
  - key: path
    rate_limit: { algorithm: gcra, unit: second, requests_per_unit: 10 }
";

/// One way of asking.
enum Contender {
    /// A guard of the rules' policies, checked in process with a key per policy.
    Guard(GuardedLimiter),
    /// The service over gRPC, with this many descriptors.
    Rls(RateLimitServiceClient<Channel>, usize),
}

/// The descriptor keys, in the configuration's order.
const KEYS: [&str; 3] = ["remote_address", "api_key", "path"];

impl Decide for Contender {
    async fn decide(&self, client: &str) {
        match self {
            Self::Guard(guard) => {
                let keys: Vec<String> = (0..guard.policies().len())
                    .map(|i| format!("{}_{client}", KEYS[i]))
                    .collect();
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                std::hint::black_box(guard.check("").keys(&keys).await.allowed());
            }
            Self::Rls(client_of, descriptors) => {
                let descriptors = KEYS[..*descriptors]
                    .iter()
                    .map(|key| RateLimitDescriptor {
                        entries: vec![Entry {
                            key: (*key).to_owned(),
                            value: client.to_owned(),
                        }],
                        ..RateLimitDescriptor::default()
                    })
                    .collect();
                let request = RateLimitRequest {
                    domain: "bench".to_owned(),
                    descriptors,
                    hits_addend: 0,
                };
                let answer = client_of.clone().should_rate_limit(request).await;
                std::hint::black_box(answer.expect("an answer").into_inner().overall_code);
            }
        }
    }
}

/// The service of [`CONFIG`] on `url`'s Redis, on a loopback port, served by `server` (a
/// runtime of its own, as a service is a process of its own), failing open after `budget`: a
/// client of it.
async fn service(url: &str, server: &Handle, budget: Duration) -> RateLimitServiceClient<Channel> {
    let config = RlsConfig::from_files([("bench.yaml", CONFIG)]).expect("a valid configuration");
    let backend = redlimit::RedisBackend::builder(url)
        .budget(budget)
        .build()
        .expect("a valid url");
    let limiter = redlimit::Limiter::with_prefix(backend, "rls").expect("a valid prefix");
    let rls = RlsService::new(limiter, config, FailurePolicy::Open, budget);
    // Bound inside the server's runtime, whose reactor then drives it.
    let incoming = {
        let _inside = server.enter();
        TcpIncoming::bind(([127, 0, 0, 1], 0).into()).expect("a loopback port")
    };
    let address = format!("http://{}", incoming.local_addr().expect("its address"));
    server.spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(rls))
            .serve_with_incoming(incoming),
    );
    RateLimitServiceClient::connect(address)
        .await
        .expect("the service answers")
}

/// A guard of the first `n` rules' policies, as the service builds them, on `url`'s Redis.
fn guard(url: &str, n: usize) -> GuardedLimiter {
    let policies = [
        ("remote_address", redlimit::Algorithm::FixedWindow, 100, 60),
        ("api_key", redlimit::Algorithm::FixedWindow, 1_000, 3_600),
        ("path", redlimit::Algorithm::Gcra, 10, 1),
    ]
    .into_iter()
    .take(n)
    .map(|(name, algorithm, limit, seconds)| {
        redlimit::Policy::builder(format!("guard.{name}"), algorithm)
            .limit(limit)
            .window(Duration::from_secs(seconds))
            .build()
            .expect("a valid policy")
    });
    let set = PolicySet::new(policies).expect("a valid set");
    GuardedLimiter::builder(redis_limiter(url, "guard"), set)
        .failure(FailurePolicy::Open)
        .budget(Duration::from_secs(30))
        .build()
}

pub(crate) async fn run(url: &str, settings: &Settings, server: Handle) -> Vec<Row> {
    let mut admin = admin(url);
    // Long enough for a loaded machine: a check that ran out of it would end the run.
    let client = service(url, &server, Duration::from_secs(30)).await;
    let contenders: Vec<(&str, Arc<Contender>)> = vec![
        ("guard_one", Arc::new(Contender::Guard(guard(url, 1)))),
        ("rls_one", Arc::new(Contender::Rls(client.clone(), 1))),
        ("guard_three", Arc::new(Contender::Guard(guard(url, 3)))),
        ("rls_three", Arc::new(Contender::Rls(client, 3))),
    ];
    let tallies = over_clients(&contenders, settings, &mut admin).await;
    contenders
        .iter()
        .zip(tallies)
        .map(|((name, _), tally)| tally.row("rls", name, true, None))
        .collect()
}

/// How long calls take while the bench's own Redis is paused (SIGSTOP): the service's budget
/// of 20 ms, then its failure policy (open), answers each; the circuit opens after a few.
pub(crate) async fn stalled(url: &str, redis: &redlimit_tests::RedisServer, server: Handle) {
    const BUDGET: Duration = Duration::from_millis(20);
    let client = service(url, &server, BUDGET).await;
    let ask = Contender::Rls(client, 1);
    // Warm: connections open, the script loaded.
    for k in 0..100 {
        ask.decide(&format!("warm-{k}")).await;
    }
    let signal = |name: &str| {
        std::process::Command::new("kill")
            .args([name, &redis.pid().to_string()])
            .status()
            .expect("kill runs");
    };
    signal("-STOP");
    let mut took: Vec<Duration> = Vec::with_capacity(200);
    for k in 0..200 {
        let started = std::time::Instant::now();
        ask.decide(&format!("stalled-{k}")).await;
        took.push(started.elapsed());
    }
    signal("-CONT");
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\nrls stalled (Redis paused, budget {} ms, failing open; 200 calls one after another): \
         p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        BUDGET.as_millis(),
        ms(took[100]),
        ms(took[198]),
        ms(took[199]),
    );
}
