//! What every service of one layer shares while it runs: the settings all tiers share (key, cost,
//! lists, how answers are written), each tier (a guard and its headers), and the admission path.

use std::{borrow::Cow, future::Future, pin::Pin, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode, header, request::Parts};
use redlimit::{Check, Decisions, GuardedLimiter};

use crate::{
    AccessList, HeaderStyle, KeyExtractor, MissingKey, Served,
    headers::{self, policy_value, policy_value_of, seconds_up},
    http_metrics::HttpSeries,
    response::{Rejected, default_response, is_grpc, refusal, with_retry_after},
    waiting_room::{Waiters, Waiting},
};

/// Delay mode: the most requests of one layer waiting for their slot at once, by default.
const DEFAULT_MAX_WAITING: usize = 1_024;

pub(crate) type CostFn = dyn Fn(&Parts) -> u64 + Send + Sync;
pub(crate) type RejectionFn = dyn Fn(&Rejected<'_>) -> Response<Bytes> + Send + Sync;
pub(crate) type ChooseFn = dyn Fn(&Parts, &str) -> Option<usize> + Send + Sync;
/// From a response's status and headers and the cost reserved, the cost that stays counted.
pub(crate) type SettleFn = dyn Fn(&Served<'_>, u64) -> u64 + Send + Sync;

/// The settings every tier of one layer shares: who is limited, what a request costs, the lists,
/// and how answers are written.
#[derive(Clone)]
pub(crate) struct Settings {
    key: Arc<dyn KeyExtractor>,
    /// The body of [`missing_key_response`](Self::missing_key_response), written once.
    missing_key_text: String,
    pub(crate) cost: Arc<CostFn>,
    pub(crate) headers: HeaderStyle,
    pub(crate) problem_json: bool,
    pub(crate) rejection: Option<Arc<RejectionFn>>,
    pub(crate) missing_key: MissingKey,
    /// Served unlimited, with no backend call.
    pub(crate) allow: Option<AccessList>,
    /// Answered with `deny_status`, with no backend call and no service call.
    pub(crate) deny: Option<AccessList>,
    pub(crate) deny_status: StatusCode,
    /// The header carrying a request id, whose retries are counted once.
    pub(crate) idempotency: Option<HeaderName>,
    /// How long a request id's first decision is remembered; `None`: the shortest window of
    /// the guard's policies.
    pub(crate) once_window: Option<Duration>,
    /// Counting by response: checks reserve, and each is settled at the cost its response
    /// says.
    pub(crate) settle: Option<Arc<SettleFn>>,
    /// Delay mode: the requests waiting for their slot, bounded; one room for the whole layer.
    pub(crate) waiters: Arc<Waiters>,
    /// Policies keyed by an extractor of their own, by name; the others by `key`.
    pub(crate) keys_for: Vec<(String, Arc<dyn KeyExtractor>)>,
}

/// One tier of a layer: its guard, and what responses say of its policies.
pub(crate) struct Tier {
    settings: Arc<Settings>,
    pub(crate) guard: GuardedLimiter,
    /// What the HTTP side counts of this tier.
    pub(crate) series: Arc<HttpSeries>,
    /// The `RateLimit-Policy` value, the same on every response of this tier.
    policy_header: HeaderValue,
    /// Per policy of this tier's guard, its own key extractor; empty when every policy is keyed
    /// by the layer's key.
    keyed: Vec<Option<Arc<dyn KeyExtractor>>>,
}

/// Each policy's key of a request, or what becomes of a request without one of them.
enum PolicyKeys<'a> {
    /// Every policy is keyed by the layer's key.
    Layer,
    /// One key per policy.
    Each(Vec<Cow<'a, str>>),
    /// A policy's key is missing, and the missing-key rule lets the request through.
    Pass,
    /// A policy's key is missing, and this is the answer.
    Answer(Response<Bytes>),
}

/// A guard and its HTTP series, registered when the layer was given it.
pub(crate) type Guarded = (GuardedLimiter, Arc<HttpSeries>);

/// What every service of one layer shares while it runs: the tiers (the layer's own guard
/// first) and how a request's tier is chosen.
pub(crate) struct Runtime {
    tiers: Vec<Arc<Tier>>,
    choose: Option<Arc<ChooseFn>>,
}

/// What the access lists say of a request.
enum Listed {
    Allowed,
    Denied(Response<Bytes>),
    Neither,
}

/// What becomes of a request: served unlimited, answered by the layer, or admitted (or not)
/// by its tier.
pub(crate) enum Admit<'a> {
    Pass,
    Answer(Response<Bytes>),
    Check(Check, &'a Arc<Tier>),
}

/// A settle a response owes its reservation: the decisions after it, when it changed them.
pub(crate) type Settle = Pin<Box<dyn Future<Output = Option<Decisions>> + Send>>;

impl Settings {
    /// The defaults for a layer of `guard` (whose policy names label the waiting room's series).
    pub(crate) fn new(key: Arc<dyn KeyExtractor>, guard: &GuardedLimiter) -> Self {
        Self {
            waiters: Arc::new(Waiters::new(DEFAULT_MAX_WAITING, guard)),
            keys_for: Vec::new(),
            missing_key_text: missing_key_text(key.as_ref()),
            key,
            cost: Arc::new(|_: &Parts| 1),
            headers: HeaderStyle::default(),
            problem_json: false,
            rejection: None,
            missing_key: MissingKey::default(),
            allow: None,
            deny: None,
            deny_status: StatusCode::FORBIDDEN,
            idempotency: None,
            once_window: None,
            settle: None,
        }
    }

    /// Keys requests by `key`.
    pub(crate) fn set_key(&mut self, key: Arc<dyn KeyExtractor>) {
        self.missing_key_text = missing_key_text(key.as_ref());
        self.key = key;
    }

    /// The key of a request after the missing-key rule: `Ok(None)` lets it through unlimited,
    /// `Err` is the status to answer with.
    fn key_of<'a>(&'a self, parts: &'a Parts) -> Result<Option<Cow<'a, str>>, StatusCode> {
        match (self.key.extract(parts), &self.missing_key) {
            (Some(key), _) => Ok(Some(key)),
            (None, MissingKey::Allow) => Ok(None),
            (None, MissingKey::Shared(key)) => Ok(Some(Cow::Borrowed(key))),
            (None, MissingKey::Reject(status)) => Err(*status),
            (None, MissingKey::Refuse) if self.key.missing_by_client(parts) => {
                Err(StatusCode::BAD_REQUEST)
            }
            (None, MissingKey::Refuse) => Err(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    /// The deny list first, then the allow list; each counted in `series`.
    fn listed(&self, series: &HttpSeries, request: &Parts, key: Option<&str>) -> Listed {
        if self
            .deny
            .as_ref()
            .is_some_and(|deny| deny.contains(request, key))
        {
            series.listed(false);
            let mut response = Response::new(Bytes::from_static(b"this client is not allowed\n"));
            *response.status_mut() = self.deny_status;
            return Listed::Denied(response);
        }
        if self
            .allow
            .as_ref()
            .is_some_and(|allow| allow.contains(request, key))
        {
            series.listed(true);
            return Listed::Allowed;
        }
        Listed::Neither
    }

    /// The answer to `request`, in which the key extractor finds no key: `status`, and what
    /// the extractor read, in the format of a denial.
    fn missing_key_response(&self, request: &Parts, status: StatusCode) -> Response<Bytes> {
        refusal(request, status, &self.missing_key_text, self.problem_json)
    }

    /// The answer to `request`, in which a policy's own `extractor` finds no key.
    fn refuse(
        &self,
        request: &Parts,
        extractor: &dyn KeyExtractor,
        status: StatusCode,
    ) -> Response<Bytes> {
        refusal(
            request,
            status,
            &missing_key_text(extractor),
            self.problem_json,
        )
    }

    pub(crate) fn cost_of(&self, parts: &Parts) -> u64 {
        (self.cost)(parts)
    }
}

impl Runtime {
    /// The runtime of `settings` over `guard` (the layer's own) and the `tiers` that `choose`
    /// names, each tier's headers written once.
    pub(crate) fn new(
        settings: &Settings,
        guard: &Guarded,
        tiers: &[Guarded],
        choose: Option<Arc<ChooseFn>>,
    ) -> Self {
        let settings = Arc::new(settings.clone());
        let tier = |(guard, series): &Guarded| {
            let keyed = if settings.keys_for.is_empty() {
                Vec::new()
            } else {
                let own = |policy: &redlimit::Policy| {
                    let named = settings
                        .keys_for
                        .iter()
                        .find(|(name, _)| name == policy.name());
                    named.map(|(_, key)| Arc::clone(key))
                };
                guard.policies().iter().map(own).collect()
            };
            Arc::new(Tier {
                policy_header: policy_value(guard.policies()),
                settings: Arc::clone(&settings),
                series: Arc::clone(series),
                guard: guard.clone(),
                keyed,
            })
        };
        Self {
            tiers: std::iter::once(guard).chain(tiers).map(tier).collect(),
            choose,
        }
    }

    /// The layer's own tier.
    fn own(&self) -> &Arc<Tier> {
        &self.tiers[0]
    }

    /// What becomes of `request`: the lists, then its key (or the missing-key rule), then its
    /// tier's admission.
    pub(crate) fn admit(&self, request: &Parts) -> Admit<'_> {
        let settings = &self.own().settings;
        let key = settings.key_of(request);
        if settings.allow.is_some() || settings.deny.is_some() {
            let listed_key = key.as_ref().ok().and_then(Option::as_deref);
            match settings.listed(&self.own().series, request, listed_key) {
                Listed::Denied(response) => return Admit::Answer(response),
                Listed::Allowed => return Admit::Pass,
                Listed::Neither => {}
            }
        }
        match key {
            Ok(Some(key)) => {
                let tier = self.for_request(request, &key);
                let keys = match tier.keys_of(request, &key) {
                    PolicyKeys::Layer => None,
                    PolicyKeys::Each(keys) => Some(keys),
                    PolicyKeys::Pass => return Admit::Pass,
                    PolicyKeys::Answer(response) => return Admit::Answer(response),
                };
                Admit::Check(tier.check(request, &key, keys.as_deref()), tier)
            }
            Ok(None) => Admit::Pass,
            Err(status) => Admit::Answer(settings.missing_key_response(request, status)),
        }
    }

    /// The tier that `request` with `key` is limited by: the one `choose` names, else the
    /// layer's own.
    fn for_request(&self, request: &Parts, key: &str) -> &Arc<Tier> {
        self.choose
            .as_ref()
            .and_then(|choose| choose(request, key))
            .and_then(|at| self.tiers.get(at + 1))
            .unwrap_or_else(|| self.own())
    }
}

impl Tier {
    /// Delay mode: a place to wait for the slot the check reserved, held until dropped; `None`
    /// when every place is taken.
    pub(crate) fn wait(&self) -> Option<Waiting> {
        self.settings.waiters.enter()
    }

    /// The key of each policy of `request` when some have extractors of their own (`None`:
    /// every policy is keyed by the layer's key), or, for a request without one of them, the
    /// missing-key rule's answer (`None`: let it through unlimited).
    fn keys_of<'a>(&'a self, request: &'a Parts, key: &'a str) -> PolicyKeys<'a> {
        if self.keyed.is_empty() {
            return PolicyKeys::Layer;
        }
        let settings = &self.settings;
        let mut keys = Vec::with_capacity(self.keyed.len());
        for extractor in &self.keyed {
            // A policy without an extractor of its own is keyed by the layer's key, read once.
            let Some(extractor) = extractor else {
                keys.push(Cow::Borrowed(key));
                continue;
            };
            let key = match (extractor.extract(request), &settings.missing_key) {
                (Some(key), _) => key,
                (None, MissingKey::Shared(shared)) => Cow::Borrowed(shared.as_str()),
                (None, MissingKey::Allow) => return PolicyKeys::Pass,
                (None, MissingKey::Reject(status)) => {
                    return PolicyKeys::Answer(settings.refuse(
                        request,
                        extractor.as_ref(),
                        *status,
                    ));
                }
                (None, MissingKey::Refuse) => {
                    let status = if extractor.missing_by_client(request) {
                        StatusCode::BAD_REQUEST
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    };
                    return PolicyKeys::Answer(settings.refuse(
                        request,
                        extractor.as_ref(),
                        status,
                    ));
                }
            };
            keys.push(key);
        }
        PolicyKeys::Each(keys)
    }

    /// The check of `request` by `key` (and per policy by `keys`, when some have their own):
    /// counted once per request id when the layer reads one and the request carries it, and a
    /// reservation when responses settle what counts.
    fn check(&self, request: &Parts, key: &str, keys: Option<&[Cow<'_, str>]>) -> Check {
        let keys: Option<Vec<&str>> = keys.map(|keys| keys.iter().map(AsRef::as_ref).collect());
        let mut check = self.guard.check(key).cost(self.settings.cost_of(request));
        if let Some(keys) = &keys {
            check = check.keys(keys);
        }
        let id = self
            .settings
            .idempotency
            .as_ref()
            .and_then(|name| request.headers.get(name)?.to_str().ok())
            .filter(|id| !id.is_empty());
        if let Some(id) = id {
            let window = self.settings.once_window.unwrap_or_else(|| {
                let windows = self.guard.policies().iter().map(|p| p.window());
                windows.min().unwrap_or_default()
            });
            check = check.once(id, window);
        }
        if self.settings.settle.is_some() {
            check = check.reserve();
        }
        check.start()
    }

    /// The settle a response owes its admitted reservation `decisions`: the part of the cost
    /// it says not to count given back, or the cost beyond the reservation it says to count
    /// charged, within the guard's budget. `None` when the reservation stands as taken.
    pub(crate) fn settle<B>(
        &self,
        response: &Response<B>,
        decisions: &Decisions,
    ) -> Option<Settle> {
        let (settle, reserved) = (self.settings.settle.as_ref()?, decisions.reserved_cost()?);
        let actual = settle(&Served::of(response), reserved);
        if actual == reserved {
            return None;
        }
        let (guard, decisions) = (self.guard.clone(), decisions.clone());
        Some(Box::pin(async move {
            let settled = guard.settle(&decisions, actual).await;
            settled.then(|| decisions.settled(actual))
        }))
    }

    /// The response to a denied request, with `Retry-After` and the rate-limit headers; in
    /// gRPC's form when the request's headers say it is gRPC.
    pub(crate) fn reject(&self, decisions: &Decisions, request: &HeaderMap) -> Response<Bytes> {
        let grpc = is_grpc(request);
        let rejected = Rejected { decisions, grpc };
        let response = match &self.settings.rejection {
            Some(respond) => respond(&rejected),
            None => default_response(&rejected, self.settings.problem_json),
        };
        let mut response = with_retry_after(response, &rejected);
        self.add_headers(response.headers_mut(), decisions);
        response
    }

    /// The answer to a request in delay mode that found every place to wait taken: 429, to
    /// come back once its reserved slot has passed.
    pub(crate) fn waiters_full(&self, decisions: &Decisions) -> Response<Bytes> {
        let mut response = Response::new(Bytes::from_static(
            b"too many requests are waiting for this rate limit; retry later\n",
        ));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        let headers = response.headers_mut();
        headers.insert(
            header::RETRY_AFTER,
            HeaderValue::from(seconds_up(decisions.delay())),
        );
        self.add_headers(headers, decisions);
        response
    }

    /// Adds the rate-limit headers of `decisions` that `response` does not already have: a
    /// response the service (or a custom rejection) wrote its own into keeps them.
    pub(crate) fn add_headers(&self, response: &mut HeaderMap, decisions: &Decisions) {
        let policies = self.guard.policies();
        // A client with an override sees its own limits.
        if decisions.iter().any(|d| d.overridden) {
            let value = policy_value_of(policies, Some(decisions));
            return headers::add(response, self.settings.headers, &value, decisions);
        }
        headers::add(
            response,
            self.settings.headers,
            &self.policy_header,
            decisions,
        );
    }
}

fn missing_key_text(key: &dyn KeyExtractor) -> String {
    format!(
        "no rate-limit key for this request: {} found nothing",
        key.describe()
    )
}
