//! RLQS: proxies streaming usage reports of one bucket get token buckets of units taken from
//! one Redis budget; together they admit no more than the bucket's limit.

use std::time::Duration;

use redlimit::{FailurePolicy, Limiter};
use redlimit_rls::{
    RlqsService, RlsConfig, RlsService,
    envoy_types::pb::{
        envoy::{
            service::rate_limit_quota::v3::{
                BucketId, RateLimitQuotaUsageReports, rate_limit_quota_response::bucket_action,
                rate_limit_quota_service_client::RateLimitQuotaServiceClient,
                rate_limit_quota_service_server::RateLimitQuotaServiceServer,
                rate_limit_quota_usage_reports::BucketQuotaUsage,
            },
            r#type::v3::rate_limit_strategy::Strategy,
        },
        google::protobuf,
    },
};
use redlimit_tests::RedisServer;

use crate::rls::serve_grpc;

/// The bucket's rule: 500 an hour from its first request (no aligned boundary in a test).
const QUOTA: &str = "
domain: quota
descriptors:
  - key: api
    rate_limit: { algorithm: fixed_window_anchored, unit: hour, requests_per_unit: 500 }
";

/// The most units one assignment holds.
const MAX: u64 = 40;

/// One proxy: `rounds` reports of the bucket, each followed by its assignment, spending of it
/// what the round's demand (`demand(round)`) asks; what it admitted in all.
async fn proxy(url: String, rounds: u64, demand: impl Fn(u64) -> u64) -> u64 {
    let mut client = RateLimitQuotaServiceClient::connect(url)
        .await
        .expect("the service answers");
    let (reports, outbound) = tokio::sync::mpsc::channel(4);
    let outbound = futures_util::stream::unfold(outbound, |mut outbound| async move {
        outbound.recv().await.map(|report| (report, outbound))
    });
    let mut assignments = client
        .stream_rate_limit_quotas(outbound)
        .await
        .expect("a stream")
        .into_inner();
    let bucket = BucketId {
        bucket: [("api".to_owned(), "global".to_owned())]
            .into_iter()
            .collect(),
    };
    let (mut allowed, mut denied, mut admitted) = (0, 0, 0);
    for round in 0..rounds {
        let report = RateLimitQuotaUsageReports {
            domain: if round == 0 {
                "quota".to_owned()
            } else {
                String::new()
            },
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(bucket.clone()),
                time_elapsed: Some(protobuf::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                num_requests_allowed: allowed,
                num_requests_denied: denied,
            }],
        };
        reports.send(report).await.expect("sent");
        let response = assignments
            .message()
            .await
            .expect("an answer")
            .expect("one");
        let action = response.bucket_action[0].bucket_action.expect("an action");
        let bucket_action::BucketAction::QuotaAssignmentAction(assignment) = action else {
            panic!("an assignment, not {action:?}");
        };
        let strategy = assignment.rate_limit_strategy.and_then(|s| s.strategy);
        let Some(Strategy::TokenBucket(tokens)) = strategy else {
            panic!("a token bucket, not {strategy:?}");
        };
        let wanted = demand(round);
        allowed = wanted.min(u64::from(tokens.max_tokens));
        denied = wanted - allowed;
        admitted += allowed;
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxies_sharing_one_bucket_admit_no_more_than_its_limit() {
    let server = RedisServer::start();
    let config = RlsConfig::from_files([("quota.yaml", QUOTA)]).expect("valid");
    let limiter = Limiter::with_prefix(server.backend(), "rlqs").expect("prefix");
    let rls = RlsService::new(
        limiter,
        config,
        FailurePolicy::Closed,
        Duration::from_secs(10),
    );
    let quotas = RlqsService::new(rls, MAX, Duration::from_secs(1));
    let router =
        tonic::transport::Server::builder().add_service(RateLimitQuotaServiceServer::new(quotas));
    let url = format!("http://{}", serve_grpc(router));
    // One proxy wants 30 a round; the other 30 and 5 in turn, leaving most of some assignments
    // unspent, which its next report gives back.
    let (a, b) = tokio::join!(
        proxy(url.clone(), 30, |_| 30),
        proxy(url, 30, |round| if round % 2 == 0 { 30 } else { 5 }),
    );
    let admitted = a + b;
    // A fixed window's assignments end with it: the bound is the limit itself. What the last
    // assignments held when the limit was reached goes back unspent.
    assert!(admitted <= 500, "{a} + {b} admitted over a limit of 500");
    assert!(admitted >= 500 - 2 * MAX, "{a} + {b} admitted of 500");
}
