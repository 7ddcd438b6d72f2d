//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on redlimit: a request's
//! descriptors matched against the configuration, and checked as one check, a key per rule.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};

use envoy_types::pb::{
    envoy::{
        config::core::v3::HeaderValue,
        extensions::common::ratelimit::v3::RateLimitDescriptor,
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit},
            rate_limit_service_server::RateLimitService,
        },
    },
    google::protobuf,
};
use redlimit::{Decision, Decisions, FailurePolicy, GuardedLimiter, Limiter, PolicySet};
use tonic::{Request, Response, Status};

use crate::config::{ConfigError, Limit, Matched, RlsConfig, Rule};

/// The most distinct sets of rules a service keeps a guard for; past it, a set's guard is
/// built for its request and dropped.
const MAX_GUARDS: usize = 4_096;

/// The rate limit service: a [`Limiter`] (Redis, or in memory), the configuration in force
/// (swapped whole by [`reload`](Self::reload)), and a guard per set of rules that requests
/// name together, each with the service's failure policy and budget.
#[derive(Debug, Clone)]
pub struct RlsService {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    limiter: Limiter,
    failure: FailurePolicy,
    budget: Duration,
    config: RwLock<Arc<RlsConfig>>,
    /// Why the last configuration that failed to load did, until one loads.
    failed: Mutex<Option<ConfigError>>,
    /// Guards by the ids of their rules, in order; emptied when the configuration changes.
    guards: Mutex<HashMap<Vec<u64>, GuardedLimiter>>,
    /// Whether responses carry the RateLimit headers of the descriptor nearest its limit.
    headers: bool,
}

/// What a request asks of one of its descriptors.
enum Plan {
    /// No rule matches: OK, with no limit.
    Unmatched,
    /// An `unlimited` rule matches.
    Unlimited,
    /// A rule of `requests_per_unit: 0` matches: over the limit at this cost, with no check.
    Nothing(Matched, u64),
    /// A rule to check, under a client key, at a cost.
    Check(Matched, u64),
    /// A rule to give a cost back to (`is_negative_hits`), under a client key.
    GiveBack(Matched, u64),
}

impl RlsService {
    /// A service deciding with `limiter` by `config`; a check that gets no answer from the
    /// backend within `budget` is decided by `failure`.
    pub fn new(
        limiter: Limiter,
        config: RlsConfig,
        failure: FailurePolicy,
        budget: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                limiter,
                failure,
                budget,
                config: RwLock::new(Arc::new(config)),
                failed: Mutex::default(),
                guards: Mutex::default(),
                headers: false,
            }),
        }
    }

    /// The same service, its responses carrying (`on`) Envoy's `response_headers_to_add` of
    /// the descriptor nearest its limit, as envoyproxy/ratelimit's custom headers:
    /// `RateLimit-Limit` (its requests per unit), `RateLimit-Remaining` and `RateLimit-Reset`
    /// (seconds). Defaults to none.
    #[must_use]
    pub fn response_headers(self, on: bool) -> Self {
        let old = &*self.inner;
        Self {
            inner: Arc::new(Inner {
                limiter: old.limiter.clone(),
                failure: old.failure.clone(),
                budget: old.budget,
                config: RwLock::new(self.config()),
                failed: Mutex::new(self.failed()),
                guards: Mutex::default(),
                headers: on,
            }),
        }
    }

    /// Puts `config` in force for the requests that begin from now on, or, given why a
    /// configuration failed to load, keeps the one in force and remembers why (see
    /// [`failed`](Self::failed)).
    pub fn reload(&self, config: Result<RlsConfig, ConfigError>) {
        let inner = &*self.inner;
        let config = match config {
            Ok(config) => config,
            Err(error) => {
                *inner.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
                return;
            }
        };
        *inner.failed.lock().unwrap_or_else(PoisonError::into_inner) = None;
        *inner.config.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
        inner
            .guards
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Why the last configuration that failed to load did, while no later one has loaded.
    pub fn failed(&self) -> Option<ConfigError> {
        let failed = self
            .inner
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        failed.clone()
    }

    pub(crate) fn config(&self) -> Arc<RlsConfig> {
        let config = self
            .inner
            .config
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&config)
    }

    /// The guard of the rules `matched`, made once per distinct set.
    pub(crate) fn guard(&self, matched: &[&Matched]) -> GuardedLimiter {
        let inner = &*self.inner;
        let ids: Vec<u64> = matched.iter().map(|m| m.rule.id).collect();
        let mut guards = inner.guards.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(guard) = guards.get(&ids) {
            return guard.clone();
        }
        let policies = matched.iter().filter_map(|m| match &m.rule.limit {
            Limit::Policy(policy) => Some(policy.clone()),
            Limit::Unlimited | Limit::Nothing => None,
        });
        let set = PolicySet::new(policies)
            .expect("distinct rules make distinct policies, each named after its place");
        let guard = GuardedLimiter::builder(inner.limiter.clone(), set)
            .failure(inner.failure.clone())
            .budget(inner.budget)
            .build();
        if guards.len() < MAX_GUARDS {
            guards.insert(ids, guard.clone());
        }
        guard
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        if request.domain.is_empty() {
            return Err(Status::invalid_argument(
                "rate limit domain must not be empty",
            ));
        }
        if request.descriptors.is_empty() {
            return Err(Status::invalid_argument(
                "rate limit descriptor list must not be empty",
            ));
        }
        let config = self.config();
        let hits = if request.hits_addend == 0 {
            1
        } else {
            u64::from(request.hits_addend)
        };
        let plans = plans(&config, &request, hits);
        Ok(Response::new(self.decide(&plans).await))
    }
}

/// Each descriptor's plan: matched, its rule's replacements applied, at its cost.
fn plans(config: &RlsConfig, request: &RateLimitRequest, hits: u64) -> Vec<Plan> {
    let matched: Vec<Option<Matched>> = request
        .descriptors
        .iter()
        .map(|d| {
            let entries = d.entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
            // A descriptor's own limit, as Envoy's config may give it, before its tree's.
            let named = d.limit.as_ref().and_then(|limit| {
                let numbers = (limit.requests_per_unit, limit.unit);
                config.named(&request.domain, numbers, entries.clone())
            });
            named.or_else(|| config.matched(&request.domain, entries))
        })
        .collect();
    let replaced: HashSet<String> = matched
        .iter()
        .flatten()
        .flat_map(|m| m.rule.replaces.iter().cloned())
        .collect();
    matched
        .into_iter()
        .zip(&request.descriptors)
        .map(|(matched, descriptor)| match matched {
            None => Plan::Unmatched,
            // A replaced rule does not apply: as if none matched.
            Some(m) if !m.rule.name.is_empty() && replaced.contains(&m.rule.name) => {
                Plan::Unmatched
            }
            Some(m) => match m.rule.limit {
                Limit::Unlimited => Plan::Unlimited,
                Limit::Nothing => Plan::Nothing(m, cost(descriptor, hits)),
                Limit::Policy(_) if descriptor.is_negative_hits => {
                    Plan::GiveBack(m, cost(descriptor, hits))
                }
                Limit::Policy(_) => Plan::Check(m, cost(descriptor, hits)),
            },
        })
        .collect()
}

/// A descriptor's cost: its own `hits_addend` when set (0 checks without consuming), else the
/// request's.
fn cost(descriptor: &RateLimitDescriptor, hits: u64) -> u64 {
    descriptor.hits_addend.map_or(hits, |addend| addend.value)
}

/// A request is over the limit when a descriptor of a rule neither in shadow nor in quota mode
/// is, or when every quota-mode descriptor is.
fn over(plans: &[Plan], denied: &[bool]) -> bool {
    let (mut quota, mut quota_denied) = (0, 0);
    for (plan, &denied) in plans.iter().zip(denied) {
        let (Plan::Check(m, _) | Plan::Nothing(m, _)) = plan else {
            continue;
        };
        if m.rule.shadow {
            continue;
        }
        if m.rule.quota {
            quota += 1;
            quota_denied += usize::from(denied);
        } else if denied {
            return true;
        }
    }
    quota > 0 && quota == quota_denied
}

impl RlsService {
    /// Checks every planned descriptor: those of one cost that neither shadow nor quota as one
    /// check (all or nothing), each shadow or quota one alone; reserved when there are several
    /// checks, so that a request over the limit gives back what its other checks took.
    async fn decide(&self, plans: &[Plan]) -> RateLimitResponse {
        let groups = groups(plans);
        let reserve = groups.len() > 1;
        let mut decided: Vec<Option<Decision>> = vec![None; plans.len()];
        let mut taken: Vec<(GuardedLimiter, Decisions)> = Vec::new();
        for group in &groups {
            let matched: Vec<&Matched> = group
                .iter()
                .filter_map(|&i| match &plans[i] {
                    Plan::Check(m, _) => Some(m),
                    _ => None,
                })
                .collect();
            let Some(Plan::Check(_, cost)) = group.first().map(|&i| &plans[i]) else {
                continue;
            };
            let guard = self.guard(&matched);
            let keys: Vec<&str> = matched.iter().map(|m| m.client.as_str()).collect();
            // One rule is its client's check: the lean script, and the guard's block cache.
            let check = match keys[..] {
                [client] => guard.check(client),
                _ => guard.check("").keys(&keys),
            };
            let check = check.cost(*cost);
            let decisions = if reserve {
                check.reserve().await
            } else {
                check.await
            };
            for (&i, decision) in group.iter().zip(decisions.iter()) {
                decided[i] = Some(decision.clone());
            }
            if decisions.reserved_cost().is_some() {
                taken.push((guard, decisions));
            }
        }
        // Negative hits give back, each alone, whatever the request's other descriptors say.
        for (i, plan) in plans.iter().enumerate() {
            if let Plan::GiveBack(m, cost) = plan {
                let guard = self.guard(&[m]);
                let decisions = guard.check(&m.client).cost(*cost).give_back().await;
                decided[i] = decisions.first().cloned();
            }
        }
        let denied: Vec<bool> = plans
            .iter()
            .zip(&decided)
            .map(|(plan, d)| {
                matches!(plan, Plan::Nothing(..)) || d.as_ref().is_some_and(|d| !d.allowed)
            })
            .collect();
        let over = over(plans, &denied);
        if over {
            // Nothing is consumed by a request over the limit.
            for (guard, decisions) in &taken {
                guard.settle(decisions, 0).await;
            }
        }
        for ((plan, decision), &denied) in plans.iter().zip(&decided).zip(&denied) {
            count(plan, decision.as_ref(), denied);
        }
        let statuses: Vec<DescriptorStatus> = plans
            .iter()
            .zip(decided)
            .map(|(plan, decision)| status(plan, decision.as_ref()))
            .collect();
        let headers = if self.inner.headers {
            headers(&statuses)
        } else {
            Vec::new()
        };
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            ..RateLimitResponse::default()
        }
    }
}

/// The checks of `plans`, as indexes: those of one cost neither in shadow nor quota mode
/// together, the others alone.
fn groups(plans: &[Plan]) -> Vec<Vec<usize>> {
    let mut together: Vec<(u64, Vec<usize>)> = Vec::new();
    let mut alone = Vec::new();
    for (i, plan) in plans.iter().enumerate() {
        let Plan::Check(m, cost) = plan else { continue };
        if m.rule.shadow || m.rule.quota {
            alone.push(vec![i]);
            continue;
        }
        match together.iter_mut().find(|(c, group)| {
            *c == *cost
                && group.iter().all(
                    |&j| !matches!(&plans[j], Plan::Check(other, _) if other.rule.id == m.rule.id),
                )
        }) {
            Some((_, group)) => group.push(i),
            None => together.push((*cost, vec![i])),
        }
    }
    together.into_iter().map(|(_, g)| g).chain(alone).collect()
}

/// A descriptor's status: OK without a limit when no rule (or an unlimited one) applies, else
/// its rule's limit and its decision (a shadow rule's denial answered OK).
fn status(plan: &Plan, decision: Option<&Decision>) -> DescriptorStatus {
    if let Plan::Nothing(m, _) = plan {
        let rule = &m.rule;
        return DescriptorStatus {
            code: if rule.shadow {
                Code::Ok
            } else {
                Code::OverLimit
            } as i32,
            current_limit: Some(limit_of(rule)),
            ..DescriptorStatus::default()
        };
    }
    let (Plan::Check(m, _) | Plan::GiveBack(m, _), Some(decision)) = (plan, decision) else {
        let remaining = if matches!(plan, Plan::Unlimited) {
            u32::MAX
        } else {
            0
        };
        return DescriptorStatus {
            code: Code::Ok as i32,
            limit_remaining: remaining,
            ..DescriptorStatus::default()
        };
    };
    let rule = &m.rule;
    let denied = !decision.allowed && !rule.shadow;
    let reset = decision.reset_after;
    DescriptorStatus {
        code: if denied { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: Some(limit_of(rule)),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(protobuf::Duration {
            seconds: i64::try_from(reset.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(reset.subsec_nanos()).unwrap_or(0),
        }),
        ..DescriptorStatus::default()
    }
}

/// A rule's limit as a status reports it.
fn limit_of(rule: &Rule) -> RateLimit {
    RateLimit {
        name: rule.name.clone(),
        requests_per_unit: rule.requests_per_unit,
        unit: rule.unit,
    }
}

/// Counts a descriptor's hits in its rule's stats.
fn count(plan: &Plan, decision: Option<&Decision>, denied: bool) {
    match (plan, decision) {
        (Plan::Check(m, cost), Some(decision)) => {
            let rule = &m.rule;
            let (remaining, limit) = (decision.remaining, decision.limit);
            rule.stats
                .count(*cost, denied, rule.shadow, remaining, limit);
        }
        (Plan::Nothing(m, cost), _) => m.rule.stats.count(*cost, true, m.rule.shadow, 0, 0),
        _ => {}
    }
}

/// The RateLimit headers of the status nearest its limit (one over it first), if any has a
/// limit.
fn headers(statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let nearest = statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| (s.code != Code::OverLimit as i32, s.limit_remaining));
    let Some(nearest) = nearest else {
        return Vec::new();
    };
    let limit = nearest
        .current_limit
        .as_ref()
        .map_or(0, |l| l.requests_per_unit);
    let reset = nearest
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds.saturating_add(i64::from(d.nanos > 0)));
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    };
    vec![
        header("RateLimit-Limit", limit.to_string()),
        header("RateLimit-Remaining", nearest.limit_remaining.to_string()),
        header("RateLimit-Reset", reset.to_string()),
    ]
}
