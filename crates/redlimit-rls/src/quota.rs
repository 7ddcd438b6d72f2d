//! RLQS, `envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas`: each
//! bucket a proxy reports gets a token bucket of units taken from the same Redis budget as the
//! rate limit service's checks, so that many proxies share one global limit.

use std::{collections::HashMap, pin::Pin, time::Duration};

use envoy_types::pb::{
    envoy::{
        service::rate_limit_quota::v3::{
            RateLimitQuotaResponse, RateLimitQuotaUsageReports,
            rate_limit_quota_response::{
                BucketAction,
                bucket_action::{self, QuotaAssignmentAction},
            },
            rate_limit_quota_service_server::RateLimitQuotaService,
            rate_limit_quota_usage_reports::BucketQuotaUsage,
        },
        r#type::v3::{
            RateLimitStrategy, TokenBucket,
            rate_limit_strategy::{BlanketRule, Strategy},
        },
    },
    google::protobuf,
};
use futures_util::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::{config::Limit, service::RlsService};

/// The quota service: [`RlsService`]'s configuration and guards, assignments of at most `max`
/// units living at most `interval` each.
///
/// # The bound
/// Each assignment is a token bucket of units taken from Redis when it is made (as many as the
/// bucket's rule has room for, up to what the proxy used in its last report's interval, at most
/// `max`), living at most `interval` and never past the window it was taken in (its reset), and
/// refilling nothing within its life. What a proxy did not spend of its last assignment, its
/// next report says, and it is given back. So a rule admits, across every proxy, at most its
/// limit plus the units assigned and unspent when a window begins: **at most `proxies × max`**,
/// and **none past the limit for the fixed and anchored windows**. This holds when the proxy's
/// `expired_assignment_behavior` does not allow more than the assignment (Envoy's
/// `fallback_rate_limit` of `DENY_ALL`, or none, which keeps no expired assignment).
#[derive(Debug, Clone)]
pub struct RlqsService {
    rls: RlsService,
    max: u64,
    interval: Duration,
}

/// One stream's last assignment per bucket: what a report of that bucket settles.
type Assigned = HashMap<Vec<(String, String)>, u64>;

/// The most buckets one stream's assignments are remembered for: a proxy reporting more gets
/// them, and what it leaves unspent of the others stays counted until their window passes.
const MAX_BUCKETS: usize = 10_000;

impl RlqsService {
    /// The quota service of `rls`'s configuration and backend, assigning at most `max` units
    /// for at most `interval` at a time (a proxy's reporting interval is a good `interval`).
    pub fn new(rls: RlsService, max: u64, interval: Duration) -> Self {
        Self {
            rls,
            max: max.max(1),
            interval,
        }
    }

    /// The action for one bucket's usage report in `domain`, after `assigned`'s last one.
    async fn assign(
        &self,
        domain: &str,
        usage: BucketQuotaUsage,
        assigned: &mut Assigned,
    ) -> BucketAction {
        let bucket_id = usage.bucket_id.unwrap_or_default();
        let mut entries: Vec<(String, String)> = bucket_id
            .bucket
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        entries.sort();
        let config = self.rls.config();
        let pairs: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let matched = config.matched(domain, pairs.iter().copied());
        let action = |strategy: Option<Strategy>, life: Duration| BucketAction {
            bucket_id: Some(bucket_id.clone()),
            bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
                QuotaAssignmentAction {
                    assignment_time_to_live: Some(duration(life)),
                    rate_limit_strategy: strategy.map(|strategy| RateLimitStrategy {
                        strategy: Some(strategy),
                    }),
                },
            )),
        };
        let Some(matched) = matched else {
            // No rule: allow all (no strategy), until the next report.
            return action(None, self.interval);
        };
        match matched.rule.limit {
            Limit::Unlimited => return action(None, self.interval),
            Limit::Nothing => {
                let deny = Strategy::BlanketRule(BlanketRule::DenyAll as i32);
                return action(Some(deny), self.interval);
            }
            Limit::Policy(_) => {}
        }
        let guard = self.rls.guard(&[&matched]);
        let client = matched.client.as_str();
        // What the last assignment left unspent goes back first.
        let last = assigned.remove(&entries).unwrap_or(0);
        let unspent = last.saturating_sub(usage.num_requests_allowed);
        if unspent > 0 {
            guard.check(client).cost(unspent).give_back().await;
        }
        // What the proxy asked for in its last interval, scaled to one of ours.
        let asked = usage.num_requests_allowed + usage.num_requests_denied;
        let elapsed = usage.time_elapsed.map_or(self.interval, |d| {
            Duration::new(
                u64::try_from(d.seconds).unwrap_or(0),
                u32::try_from(d.nanos).unwrap_or(0),
            )
        });
        let scaled = u128::from(asked) * self.interval.as_micros() / elapsed.as_micros().max(1);
        let wanted = u64::try_from(scaled).unwrap_or(u64::MAX).clamp(1, self.max);
        let mut decisions = guard.check(client).cost(wanted).await;
        let mut granted = wanted;
        if !decisions.allowed() {
            // As much as there is room for.
            let room = decisions
                .iter()
                .map(|d| d.remaining)
                .min()
                .unwrap_or(0)
                .min(wanted);
            granted = 0;
            if room > 0 {
                decisions = guard.check(client).cost(room).await;
                granted = if decisions.allowed() { room } else { 0 };
            }
        }
        // Never past the window the units were taken in.
        let reset = decisions
            .iter()
            .map(|d| d.reset_after)
            .min()
            .unwrap_or_default();
        let life = self
            .interval
            .min(reset.saturating_sub(Duration::from_millis(1)));
        if granted > 0 && assigned.len() < MAX_BUCKETS {
            assigned.insert(entries, granted);
        }
        let tokens = u32::try_from(granted).unwrap_or(u32::MAX);
        let bucket = TokenBucket {
            max_tokens: tokens,
            tokens_per_fill: Some(protobuf::UInt32Value {
                value: tokens.max(1),
            }),
            // No refill within the assignment's life.
            fill_interval: Some(duration(
                life.saturating_mul(2).max(Duration::from_millis(2)),
            )),
        };
        action(
            Some(Strategy::TokenBucket(bucket)),
            life.max(Duration::from_millis(1)),
        )
    }
}

fn duration(d: Duration) -> protobuf::Duration {
    protobuf::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// The stream of assignments answering one proxy's reports.
type Assignments = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl RateLimitQuotaService for RlqsService {
    type StreamRateLimitQuotasStream = Assignments;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Assignments>, Status> {
        let mut reports = request.into_inner();
        let (sender, receiver) = tokio::sync::mpsc::channel(16);
        let this = self.clone();
        tokio::spawn(async move {
            // The domain comes with the stream's first report.
            let (mut domain, mut assigned) = (String::new(), Assigned::new());
            while let Ok(Some(report)) = reports.message().await {
                if !report.domain.is_empty() {
                    domain = report.domain;
                }
                let mut actions = Vec::with_capacity(report.bucket_quota_usages.len());
                for usage in report.bucket_quota_usages {
                    actions.push(this.assign(&domain, usage, &mut assigned).await);
                }
                let response = RateLimitQuotaResponse {
                    bucket_action: actions,
                };
                if sender.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        });
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|item| (item, receiver))
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
