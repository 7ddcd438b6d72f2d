//! The demo's TOML configuration.

use std::{collections::HashMap, fmt, net::SocketAddr, str::FromStr, time::Duration};

use redlimit::{Algorithm, Ban, ConcurrencyPolicy, FailurePolicy, Grants, Policy, PolicySet};
use serde::{Deserialize, Deserializer, de::Error as _};
use tower_redlimit::{AccessList, ClientIpHeader, HeaderStyle};

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where to serve. Defaults to `127.0.0.1:3000`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// A standalone Redis to share limits through.
    pub redis_url: Option<RedisUrl>,
    /// Seed URLs of a Redis Cluster to share limits through.
    pub redis_cluster: Option<Vec<RedisUrl>>,
    /// Sentinels and the name of the primary they watch.
    pub redis_sentinel: Option<Sentinel>,
    /// A PEM file of the CA that signed a `rediss://` server's certificate (a private CA);
    /// without it, the system's roots. For `redis_url`, `redis_cluster` and the primary of
    /// `redis_sentinel`.
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// A PEM client certificate, for mutual TLS; with `tls_client_key_file`.
    pub tls_client_cert_file: Option<std::path::PathBuf>,
    /// The PEM private key of `tls_client_cert_file`.
    pub tls_client_key_file: Option<std::path::PathBuf>,
    /// Delete a key holding what is not limiter state (and count it) instead of failing every
    /// check of its client. Defaults to `false`.
    #[serde(default)]
    pub repair_corrupt_state: bool,
    /// The name of an environment variable holding a secret: when set, clients are kept in
    /// Redis keys as a keyed hash of their identifier, never as text. The secret itself never
    /// goes in this file.
    pub hash_clients_secret_env: Option<String>,
    /// What every Redis key of the limiter starts with. Defaults to `redlimit`.
    pub key_prefix: Option<String>,
    /// Proxy networks whose forwarding headers are believed.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// The one header those proxies report the client in: `x-forwarded-for`, `forwarded`,
    /// `x-real-ip`, `cf-connecting-ip`, `fly-client-ip`, `true-client-ip`, …. Defaults to
    /// `x-forwarded-for`.
    #[serde(default, deserialize_with = "parsed")]
    pub client_ip_header: ClientIpHeader,
    /// What to answer when Redis fails. Defaults to `open`.
    #[serde(default)]
    pub failure: Failure,
    /// The time budget of one check, such as `"50ms"`. Defaults to 50 ms.
    #[serde(default = "default_budget", deserialize_with = "duration")]
    pub budget: Duration,
    /// `ietf`, `legacy`, `both` or `none`. Defaults to `ietf`.
    #[serde(default, deserialize_with = "parsed")]
    pub headers: HeaderStyle,
    /// Where `GET /metrics` (Prometheus text) is served. Defaults to the main listener.
    pub metrics_listen: Option<SocketAddr>,
    /// Clients of every route served unlimited: networks (`10.0.0.0/8`, `203.0.113.9`) and
    /// keys (`key:k1`).
    #[serde(default)]
    pub allow: Vec<String>,
    /// Clients of every route answered 403, as `allow`.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Plans of API keys, for routes with `limits` per tier.
    #[serde(rename = "tier", default)]
    pub tiers: Vec<Tier>,
    /// A header naming the request's tier (set by a gateway you trust, never by clients).
    pub tier_header: Option<String>,
    /// The limited routes.
    #[serde(rename = "route", default)]
    pub routes: Vec<Route>,
}

/// The path of the Prometheus endpoint.
pub const METRICS_PATH: &str = "/metrics";

/// A Redis URL from the file. `Debug` and `Display` show it without its credentials
/// (`redis://***@host:port`), so neither a log line nor an error can leak the password.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL with its credentials, for connecting.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redlimit::redacted_url(&self.0))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({self})")
    }
}

/// One `[[route.also]]` table: a limit checked together with its route's.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlsoLimit {
    /// The policy's name, distinct within the route.
    pub name: String,
    /// One of the algorithm names.
    #[serde(deserialize_with = "algorithm")]
    pub algorithm: Algorithm,
    /// Requests per window.
    pub limit: u64,
    /// The window, such as `"1m"`.
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
    /// For token bucket and GCRA: how many a fresh client may make at once.
    pub burst: Option<u64>,
    /// This limit's own key (`ip`, `header:NAME` or `global`), checked in the same check as
    /// the route's (per IP and per API key: a key's denied request spends none of its IP's
    /// quota). Defaults to the route's key.
    #[serde(default, deserialize_with = "optional_parsed")]
    pub key: Option<KeyKind>,
}

/// One `[[tier]]` table: the API keys on a plan.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tier {
    /// The tier's name, as in a route's `limits`.
    pub name: String,
    /// The keys (a route's `header:` key values) on this tier.
    #[serde(default)]
    pub keys: Vec<String>,
}

/// A tier's numbers on one route; what it leaves out is the route's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierLimits {
    /// Requests per window.
    pub limit: Option<u64>,
    /// The window.
    #[serde(default, deserialize_with = "optional_duration")]
    pub window: Option<Duration>,
    /// The burst (token bucket and GCRA).
    pub burst: Option<u64>,
}

/// A route's `ban` table: more than `after` denials within `within` ban a client for `for`,
/// doubled on each repeat up to `max` when it is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BanTable {
    /// Denials let go within `within`.
    pub after: u64,
    /// The span denials are counted over, such as `"1m"`.
    #[serde(deserialize_with = "duration")]
    pub within: Duration,
    /// How long a ban lasts, such as `"15m"`.
    #[serde(rename = "for", deserialize_with = "duration")]
    pub length: Duration,
    /// The longest a repeated ban lasts, such as `"24h"`; absent: bans do not escalate.
    #[serde(default, deserialize_with = "optional_duration")]
    pub max: Option<Duration>,
}

impl BanTable {
    /// The library's ban.
    pub fn ban(&self) -> Ban {
        let ban = Ban::new(self.after, self.within, self.length);
        match self.max {
            Some(max) => ban.max(max),
            None => ban,
        }
    }
}

/// A route's `grants` table, hot-key mode: each instance takes up to `max` units at once from
/// Redis and spends them in process, each grant living at most `life`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantsTable {
    /// The most units a grant takes beyond its request's cost.
    pub max: u64,
    /// The longest a grant is spent, such as `"500ms"`. Defaults to the library's (1 s).
    #[serde(default, deserialize_with = "optional_duration")]
    pub life: Option<Duration>,
}

impl GrantsTable {
    /// The library's grants.
    pub fn grants(&self) -> Grants {
        let grants = Grants::up_to(self.max);
        match self.life {
            Some(life) => grants.life(life),
            None => grants,
        }
    }
}

/// The `redis_sentinel` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sentinel {
    /// The sentinels' URLs, such as `redis://127.0.0.1:26379`.
    pub urls: Vec<RedisUrl>,
    /// The name the sentinels know the primary by.
    pub master: String,
}

/// The `failure` setting.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Failure {
    /// Allow.
    #[default]
    Open,
    /// Deny with 503.
    Closed,
    /// Limit in this process's memory.
    Local,
}

impl Failure {
    /// The library's failure policy.
    pub fn policy(self) -> FailurePolicy {
        match self {
            Self::Open => FailurePolicy::Open,
            Self::Closed => FailurePolicy::Closed,
            Self::Local => FailurePolicy::local(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Local => "local",
        })
    }
}

/// Where limits are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// This process only.
    Memory,
    /// A standalone Redis.
    Redis(RedisUrl),
    /// A Redis Cluster.
    Cluster(Vec<RedisUrl>),
    /// A Sentinel-managed primary.
    Sentinel {
        /// The sentinels.
        urls: Vec<RedisUrl>,
        /// The primary's name.
        master: String,
    },
}

/// One `[[route]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The path, in axum's syntax: `/api`, `/users/{id}`, `/files/{*rest}`.
    pub path: String,
    /// The policy's name (in Redis keys and the `RateLimit-Policy` header). Defaults to one
    /// derived from the path, distinct for every path.
    pub name: Option<String>,
    /// One of the algorithm names (`fixed_window`, `gcra`, …).
    #[serde(deserialize_with = "algorithm")]
    pub algorithm: Algorithm,
    /// Requests per window.
    pub limit: u64,
    /// The window, such as `"10s"`, `"500ms"`, `"1h30m"`, `"1d"`.
    #[serde(deserialize_with = "duration")]
    pub window: Duration,
    /// For token bucket and GCRA: how many a fresh client may make at once.
    pub burst: Option<u64>,
    /// `ip`, `header:NAME` or `global`. Defaults to `ip`.
    #[serde(default, deserialize_with = "parsed")]
    pub key: KeyKind,
    /// With `key = "header:NAME"`: requests without the header share this key (such as
    /// `"anonymous"`) and its limit. Defaults to none: such a request is answered 400, naming
    /// the header.
    pub anonymous: Option<String>,
    /// Dry run: checked, counted and logged, but a request over the limit passes (reason
    /// `shadow` in the metrics). Defaults to `false`.
    #[serde(default)]
    pub shadow: bool,
    /// `reject` (429 over the limit) or `delay` (GCRA only: wait up to `max_delay` for a
    /// reserved slot, then serve). Defaults to `reject`.
    #[serde(default)]
    pub mode: Mode,
    /// With `mode = "delay"`: the longest a request waits, such as `"2s"`.
    #[serde(default, deserialize_with = "optional_duration")]
    pub max_delay: Option<Duration>,
    /// At most this many requests of one key in flight at once. Defaults to no such limit.
    pub concurrency: Option<u64>,
    /// How long a concurrency lease lives unless given back, such as `"30s"` (the default): a
    /// crashed instance's slots come free after it.
    #[serde(default, deserialize_with = "optional_duration")]
    pub lease_ttl: Option<Duration>,
    /// Other numbers per tier, such as `{ pro = { limit = 1000 } }`; requests of no listed tier
    /// get the route's own.
    #[serde(default)]
    pub limits: std::collections::BTreeMap<String, TierLimits>,
    /// The methods the limit applies to, such as `["POST"]`: the route then serves GET, POST,
    /// PUT, PATCH and DELETE, and the others pass unlimited. Defaults to GET only, served and
    /// limited (other methods get 405).
    #[serde(default)]
    pub methods: Vec<String>,
    /// This route's failure policy, instead of the top-level one (`closed` on `/login`).
    pub failure: Option<Failure>,
    /// More limits checked with the route's own, all or nothing (`[[route.also]]` tables): "3
    /// per second and 5 per minute". Each denies with its own `Retry-After`. Defaults to none.
    #[serde(default)]
    pub also: Vec<AlsoLimit>,
    /// A key group, such as `"api"`: the route's policy and its `also` limits under the route's
    /// key keep a client's states in one Redis key of that group (fixed windows, GCRA and token
    /// buckets without tiers, bans, delay mode or grants). Defaults to a key each.
    pub key_group: Option<String>,
    /// A request header naming a request id, such as `idempotency-key`: retries with the same
    /// id within `idempotency_window` are counted once. Defaults to none.
    pub idempotency_header: Option<String>,
    /// How long a request id is remembered, such as `"10m"`. Defaults to the library's.
    #[serde(default, deserialize_with = "optional_duration")]
    pub idempotency_window: Option<Duration>,
    /// This route's time budget, instead of the top-level one.
    #[serde(default, deserialize_with = "optional_duration")]
    pub budget: Option<Duration>,
    /// This route's clients served unlimited, besides the top-level `allow`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// This route's clients answered 403, besides the top-level `deny`.
    #[serde(default)]
    pub deny: Vec<String>,
    /// What the route answers: `hello` (the default), `sleep:200ms` (hello after a pause, for
    /// trying concurrency limits), `status:401` (that status), `login` (200 when the
    /// `x-password` header is `demo`, else 401: for trying `count = "failures"`), or `metered`
    /// (200 stating in `x-cost` the cost its query's `cost` asks for, 1 without: for trying
    /// `settle_header`).
    #[serde(default, deserialize_with = "parsed")]
    pub handler: Handler,
    /// Which requests count: `all` (the default), or `failures` (responses of status 400 and
    /// above; each request reserves its slot, and a success gives it back).
    #[serde(default)]
    pub count: Count,
    /// A response header stating what the request actually cost, such as `x-cost` (tokens a
    /// model used, say): each request reserves 1, and is settled at the stated cost before
    /// the response is sent: the rest given back, or the excess charged even past the limit,
    /// so the client's next requests wait for the debt. A response without it counts 1.
    /// Defaults to none.
    pub settle_header: Option<String>,
    /// Whether clients of this route can be given other numbers at run time (`redlimit
    /// override`), read by each check in its own script call. Defaults to `false`.
    #[serde(default)]
    pub overrides: bool,
    /// Bans after repeated denials, such as `{ after = 5, within = "1m", for = "15m", max =
    /// "24h" }`. Defaults to none.
    pub ban: Option<BanTable>,
    /// Hot-key mode for a limit many requests share (a `global` key, a big tenant): each
    /// instance takes up to `max` at once from Redis and spends them in process, such as `{ max
    /// = 500, life = "500ms" }`; applies to the route's `also` limits too. A fixed window never
    /// admits past its limit; other algorithms at most `instances × max` past it. Only with
    /// Redis. Defaults to none: every request is checked exactly.
    pub grants: Option<GrantsTable>,
}

/// The `count` setting of a route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Count {
    /// Every request.
    #[default]
    All,
    /// Requests whose response has a status of 400 or above.
    Failures,
}

/// What a route's handler does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Handler {
    /// Answers at once.
    #[default]
    Hello,
    /// Answers after this pause.
    Sleep(Duration),
    /// Answers with this status.
    Status(u16),
    /// 200 when the `x-password` header is `demo`, else 401.
    Login,
    /// 200 with `x-cost` set to the query's `cost` (1 without).
    Metered,
}

/// The methods a route serves when it names the ones it limits.
pub const SERVED_METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

impl FromStr for Handler {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            None if s == "hello" => Ok(Self::Hello),
            None if s == "login" => Ok(Self::Login),
            None if s == "metered" => Ok(Self::Metered),
            Some(("sleep", pause)) => humantime::parse_duration(pause)
                .map(Self::Sleep)
                .map_err(|e| format!("handler {s:?}: {e}")),
            Some(("status", code)) => code
                .parse()
                .ok()
                .filter(|code| (200..=599).contains(code))
                .map(Self::Status)
                .ok_or_else(|| format!("handler {s:?}: a status from 200 to 599")),
            _ => Err(format!(
                "handler {s:?} is not hello, login, metered, sleep:DURATION or status:CODE"
            )),
        }
    }
}

/// What a route does with a request over its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Deny it.
    #[default]
    Reject,
    /// Let it wait for its slot, up to `max_delay`.
    Delay,
}

/// What a route is keyed by.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum KeyKind {
    /// The client IP.
    #[default]
    Ip,
    /// A header's value.
    Header(String),
    /// One key for all.
    Global,
}

impl FromStr for KeyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ip" => Ok(Self::Ip),
            "global" => Ok(Self::Global),
            other => match other.strip_prefix("header:") {
                Some(name) if !name.is_empty() => Ok(Self::Header(name.to_owned())),
                _ => Err(format!("key {other:?} is not ip, header:NAME or global")),
            },
        }
    }
}

impl fmt::Display for KeyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip => f.write_str("ip"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Global => f.write_str("global"),
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3000))
}

fn default_budget() -> Duration {
    Duration::from_millis(50)
}

/// A value through its type's own `FromStr`.
fn parsed<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(D::Error::custom)
}

fn optional_parsed<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    parsed(deserializer).map(Some)
}

fn algorithm<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Algorithm, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(|e| {
        let names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        D::Error::custom(format!("{e}: one of {}", names.join(", ")))
    })
}

/// `"10s"`, `"500ms"`, `"1h30m"`, `"1d"`.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text)
        .map_err(|e| D::Error::custom(format!("{text:?} is not a duration like \"10s\": {e}")))
}

fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    duration(deserializer).map(Some)
}

/// A configuration mistake, naming where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFileError(pub String);

impl fmt::Display for ConfigFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigFileError {}

/// A TOML error as its line, the key on that line and the message, without the quoted source line
/// toml adds, whose value could be a password.
fn toml_error(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim_end();
    let Some(span) = error.span() else {
        return message.to_owned();
    };
    let before = text.get(..span.start).unwrap_or(text);
    let number = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |at| at + 1);
    let line = text[line_start..].lines().next().unwrap_or_default();
    match line.split_once('=') {
        Some((key, _)) if !key.trim().is_empty() => {
            format!("line {number}, {}: {message}", key.trim())
        }
        _ => format!("line {number}: {message}"),
    }
}

impl Config {
    /// Parses and checks a TOML document.
    ///
    /// # Errors
    /// A message naming the field at fault.
    pub fn parse(text: &str) -> Result<Self, ConfigFileError> {
        let config: Self =
            toml::from_str(text).map_err(|e| ConfigFileError(toml_error(text, &e)))?;
        config.validate()?;
        Ok(config)
    }

    /// The built-in configuration: three routes on the in-memory backend.
    pub fn demo() -> Self {
        Self::parse(DEMO)
            .unwrap_or_else(|e| unreachable!("the built-in configuration is valid: {e}"))
    }

    /// Where limits are kept: at most one of `redis_url`, `redis_cluster`, `redis_sentinel`.
    ///
    /// # Errors
    /// More than one of them, or an empty list.
    pub fn store(&self) -> Result<Store, ConfigFileError> {
        let err = |message: &str| Err(ConfigFileError(message.to_owned()));
        match (&self.redis_url, &self.redis_cluster, &self.redis_sentinel) {
            (None, None, None) => Ok(Store::Memory),
            (Some(url), None, None) => Ok(Store::Redis(url.clone())),
            (None, Some(urls), None) if urls.is_empty() => {
                err("redis_cluster: at least one URL is needed")
            }
            (None, Some(urls), None) => Ok(Store::Cluster(urls.clone())),
            (None, None, Some(s)) if s.urls.is_empty() => {
                err("redis_sentinel.urls: at least one URL is needed")
            }
            (None, None, Some(s)) => Ok(Store::Sentinel {
                urls: s.urls.clone(),
                master: s.master.clone(),
            }),
            _ => err("redis_url, redis_cluster, redis_sentinel: set at most one"),
        }
    }

    /// Refuses what would connect without checking the server: a `#insecure` URL.
    fn check_tls(&self) -> Result<(), ConfigFileError> {
        let urls = self.redis_url.iter().map(|url| ("redis_url", url));
        let cluster = self.redis_cluster.iter().flatten();
        let sentinel = self.redis_sentinel.iter().flat_map(|s| &s.urls);
        let mut all = urls
            .chain(cluster.map(|url| ("redis_cluster", url)))
            .chain(sentinel.map(|url| ("redis_sentinel.urls", url)));
        if let Some((field, url)) = all.find(|(_, url)| url.expose().contains("#insecure")) {
            return Err(ConfigFileError(format!(
                "{field}: {url} turns certificate checks off (#insecure), which lets anyone on \
                 the path read and change limits; give the server's CA in tls_ca_file instead"
            )));
        }
        if self.tls_client_cert_file.is_some() != self.tls_client_key_file.is_some() {
            return Err(ConfigFileError(
                "tls_client_cert_file, tls_client_key_file: set both or neither".to_owned(),
            ));
        }
        Ok(())
    }

    /// Checks what the types alone do not: one store, a budget, and routes that build into one
    /// router, each with a policy of its own.
    ///
    /// # Errors
    /// A message naming the field, and the route, at fault.
    pub fn validate(&self) -> Result<(), ConfigFileError> {
        let err = |message: String| Err(ConfigFileError(message));
        self.store()?;
        self.check_tls()?;
        if self.budget.is_zero() {
            return err("budget: must be more than zero".to_owned());
        }
        if self.routes.is_empty() {
            return err("route: at least one [[route]] is needed".to_owned());
        }
        check_paths(&self.routes)?;
        let mut tier_of_key = HashMap::new();
        for (i, tier) in self.tiers.iter().enumerate() {
            if self.tiers[..i].iter().any(|t| t.name == tier.name) {
                return err(format!("tier: {:?} appears twice", tier.name));
            }
            for key in &tier.keys {
                if let Some(other) = tier_of_key.insert(key, &tier.name) {
                    return err(format!(
                        "tier {}: keys: a key is already tier {other}'s",
                        tier.name
                    ));
                }
            }
        }
        if self.metrics_listen.is_none()
            && let Some(route) = self.routes.iter().find(|r| r.path == METRICS_PATH)
        {
            return err(format!(
                "route {}: path: served by the metrics endpoint; set metrics_listen to serve it elsewhere",
                route.path
            ));
        }
        let mut names = HashMap::new();
        for route in &self.routes {
            let policy = route.policy()?;
            route.policies(policy.clone())?;
            route.concurrency_policy()?;
            for tier in route.limits.keys() {
                route.tier_policy(tier)?;
                if self.tier_header.is_none() && !self.tiers.iter().any(|t| t.name == *tier) {
                    return err(format!(
                        "route {}: limits: tier {tier:?} is not a [[tier]] (nor is tier_header set)",
                        route.path
                    ));
                }
            }
            if let Some(method) = route
                .methods
                .iter()
                .find(|m| !SERVED_METHODS.contains(&m.to_ascii_uppercase().as_str()))
            {
                return err(format!(
                    "route {}: methods: {method:?} is not one of {}",
                    route.path,
                    SERVED_METHODS.join(", ")
                ));
            }
            if route.anonymous.is_some() && !matches!(route.key, KeyKind::Header(_)) {
                return err(format!(
                    "route {}: anonymous: only a route keyed by a header (key = \"header:NAME\") \
                     can miss its key",
                    route.path
                ));
            }
            if route.budget.is_some_and(|b| b.is_zero()) {
                return err(format!(
                    "route {}: budget: must be more than zero",
                    route.path
                ));
            }
            if route.settle_header.is_some() && route.count == Count::Failures {
                return err(format!(
                    "route {}: settle_header: cannot be used with count = \"failures\" (both settle the reservation)",
                    route.path
                ));
            }
            if route.settle_header.is_some() && route.mode == Mode::Delay {
                return err(format!(
                    "route {}: settle_header: needs mode = \"reject\" (a delayed slot cannot be settled)",
                    route.path
                ));
            }
            if route.count == Count::Failures && route.mode == Mode::Delay {
                return err(format!(
                    "route {}: count: \"failures\" needs mode = \"reject\" (a delayed slot cannot be given back)",
                    route.path
                ));
            }
            for (field, top, own) in [
                ("allow", &self.allow, &route.allow),
                ("deny", &self.deny, &route.deny),
            ] {
                AccessList::new(top.iter().chain(own))
                    .map_err(|e| ConfigFileError(format!("route {}: {field}: {e}", route.path)))?;
            }
            if let Some(other) = names.insert(policy.name().to_owned(), &route.path) {
                return err(format!(
                    "route {}: name: {:?} is already route {other}'s",
                    route.path,
                    policy.name()
                ));
            }
        }
        Ok(())
    }
}

/// Every path as axum's router takes it: starting with `/`, captures written `{name}` (not the
/// older `:name` and `*name`), valid and not in conflict with another, so building the router
/// cannot panic.
fn check_paths(routes: &[Route]) -> Result<(), ConfigFileError> {
    let mut router = matchit::Router::new();
    for route in routes {
        let path = &route.path;
        let at = |message: String| ConfigFileError(format!("route {path}: path: {message}"));
        if !path.starts_with('/') {
            return Err(at("must start with /".to_owned()));
        }
        if path
            .split('/')
            .any(|segment| segment.starts_with(':') || segment.starts_with('*'))
        {
            return Err(at(
                "captures are written {name} and {*rest}, not :name or *rest".to_owned(),
            ));
        }
        router.insert(path.as_str(), ()).map_err(|e| match e {
            matchit::InsertError::Conflict { with } if with == *path => {
                at("appears twice".to_owned())
            }
            matchit::InsertError::Conflict { with } => at(format!("conflicts with route {with}")),
            other => at(other.to_string()),
        })?;
    }
    Ok(())
}

impl Route {
    /// The route's policy.
    ///
    /// # Errors
    /// A message naming the route and the field.
    pub fn policy(&self) -> Result<Policy, ConfigFileError> {
        let name = self.name.clone().unwrap_or_else(|| policy_name(&self.path));
        let at =
            |message: &dyn fmt::Display| ConfigFileError(format!("route {}: {message}", self.path));
        self.built(name, self.limit, self.window, self.burst)
            .map_err(|e| at(&e))
    }

    /// Every limit a request of the route is checked by: `first` (the route's own, or its
    /// tier's), then its `also` limits and its concurrency limit, as one set.
    ///
    /// # Errors
    /// A message naming the route and the field.
    pub fn policies(&self, first: Policy) -> Result<PolicySet, ConfigFileError> {
        let at = |what: &str, message: &dyn fmt::Display| {
            ConfigFileError(format!("route {}: {what}: {message}", self.path))
        };
        let mut policies = vec![first];
        for also in &self.also {
            let mut builder = Policy::builder(also.name.clone(), also.algorithm)
                .limit(also.limit)
                .window(also.window);
            if let Some(burst) = also.burst {
                builder = builder.burst(burst);
            }
            if let Some(grants) = &self.grants {
                builder = builder.grants(grants.grants());
            }
            if let (Some(group), None) = (&self.key_group, &also.key) {
                builder = builder.key_group(group.clone());
            }
            let what = format!("also {}", also.name);
            policies.push(builder.build().map_err(|e| at(&what, &e))?);
        }
        let set = PolicySet::new(policies).map_err(|e| at("also", &e))?;
        match self.concurrency_policy()? {
            Some(concurrency) => set
                .with_concurrency(concurrency)
                .map_err(|e| at("concurrency", &e)),
            None => Ok(set),
        }
    }

    /// The route's policy for `tier`: its own numbers where `limits` gives none, named
    /// `policy.tier`; its mode, ban and overrides are the route's.
    ///
    /// # Errors
    /// A message naming the route and the field.
    pub fn tier_policy(&self, tier: &str) -> Result<Policy, ConfigFileError> {
        let at = |message: &dyn fmt::Display| {
            ConfigFileError(format!("route {}: limits.{tier}: {message}", self.path))
        };
        let limits = self.limits.get(tier).cloned().unwrap_or_default();
        let name = format!("{}.{tier}", self.policy()?.name());
        self.built(
            name,
            limits.limit.unwrap_or(self.limit),
            limits.window.unwrap_or(self.window),
            limits.burst.or(self.burst),
        )
        .map_err(|e| at(&e))
    }

    /// A policy of this route's algorithm, mode, ban and overrides with these numbers: one
    /// place, so every tier of a route limits as the route does.
    fn built(
        &self,
        name: String,
        limit: u64,
        window: Duration,
        burst: Option<u64>,
    ) -> Result<Policy, String> {
        let mut builder = Policy::builder(name, self.algorithm)
            .limit(limit)
            .window(window)
            .overrides(self.overrides);
        if let Some(ban) = &self.ban {
            builder = builder.ban(ban.ban());
        }
        if let Some(grants) = &self.grants {
            builder = builder.grants(grants.grants());
        }
        if let Some(burst) = burst {
            builder = builder.burst(burst);
        }
        if let Some(group) = &self.key_group {
            builder = builder.key_group(group.clone());
        }
        match (self.mode, self.max_delay) {
            (Mode::Delay, Some(max_delay)) => builder = builder.max_delay(max_delay),
            (Mode::Delay, None) => return Err("max_delay is required with mode = \"delay\"".into()),
            (Mode::Reject, Some(_)) => return Err("max_delay needs mode = \"delay\"".into()),
            (Mode::Reject, None) => {}
        }
        builder.build().map_err(|e| e.to_string())
    }

    /// The route's concurrency limit, if it has one: named after its policy.
    ///
    /// # Errors
    /// A message naming the route and the field.
    pub fn concurrency_policy(&self) -> Result<Option<ConcurrencyPolicy>, ConfigFileError> {
        let at =
            |message: &dyn fmt::Display| ConfigFileError(format!("route {}: {message}", self.path));
        let Some(limit) = self.concurrency else {
            return match self.lease_ttl {
                Some(_) => Err(at(&"lease_ttl needs concurrency")),
                None => Ok(None),
            };
        };
        let name = format!("{}.in-flight", self.policy()?.name());
        let mut builder = ConcurrencyPolicy::builder(name).limit(limit);
        if let Some(ttl) = self.lease_ttl {
            builder = builder.lease_ttl(ttl);
        }
        builder.build().map(Some).map_err(|e| {
            let e = e.to_string().replace("limit", "concurrency");
            at(&e)
        })
    }
}

/// A policy name for `path`, distinct for distinct paths: `/login` is `login`; any other path
/// is made of its letters and digits, a dot, and 16 hex digits of its SHA-1 (`/a/b` is
/// `a-b.` and a hash, so it never meets `/a-b`, whose name has no dot).
fn policy_name(path: &str) -> String {
    let plain = &path[1.min(path.len())..];
    let simple = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if (1..=64).contains(&plain.len()) && plain.bytes().all(simple) {
        return plain.to_owned();
    }
    let readable: String = plain
        .chars()
        .take(40)
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let digest = sha1_smol::Sha1::from(path).digest().to_string();
    format!("{readable}.{}", &digest[..16])
}

const DEMO: &str = r#"
[[route]]
path = "/"
name = "home"
algorithm = "fixed_window"
limit = 10
window = "10s"

[[route]]
path = "/api"
algorithm = "gcra"
limit = 5
window = "10s"
burst = 5

[[route]]
path = "/login"
algorithm = "sliding_window_log"
limit = 3
window = "1m"
"#;

#[cfg(test)]
mod tests {
    use super::*;

    fn one_route(extra: &str, path: &str) -> String {
        format!(
            "{extra}\n[[route]]\npath = \"{path}\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\n"
        )
    }

    #[test]
    fn the_demo_configuration_is_valid() {
        let config = Config::demo();
        assert_eq!(config.routes.len(), 3);
        assert_eq!(config.listen, default_listen());
        assert!(config.redis_url.is_none());
    }

    #[test]
    fn mistakes_name_their_field() {
        let route = |body: &str| format!("[[route]]\npath = \"/a\"\n{body}");
        let cases = [
            (route("algorithm = \"gcra\"\nwindow = \"1s\""), "limit"),
            (
                route("algorithm = \"leaky\"\nlimit = 1\nwindow = \"1s\""),
                "algorithm",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"ten\""),
                "window",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 0\nwindow = \"1s\""),
                "limit",
            ),
            (
                route("algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\nburst = 2"),
                "burst",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nkey = \"cookie\""),
                "key",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nlmit = 3"),
                "lmit",
            ),
            (one_route("failure = \"maybe\"", "/a"), "failure"),
            (one_route("headers = \"all\"", "/a"), "headers"),
            (
                one_route("client_ip_header = \"not a header\"", "/a"),
                "client_ip_header",
            ),
            (one_route("budget = \"0s\"", "/a"), "budget"),
            (one_route("listen = \"nowhere\"", "/a"), "listen"),
            (
                one_route("metrics_listen = \"9100\"", "/a"),
                "metrics_listen",
            ),
            (one_route("", "/metrics"), "metrics_listen"),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nmode = \"delay\""),
                "max_delay is required",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nmax_delay = \"1s\""),
                "max_delay needs mode",
            ),
            (
                route(
                    "algorithm = \"fixed_window\"\nlimit = 1\nwindow = \"1s\"\nmode = \"delay\"\nmax_delay = \"1s\"",
                ),
                "max_delay does not apply",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nmode = \"wait\""),
                "mode",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nconcurrency = 0"),
                "concurrency",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nlease_ttl = \"1s\""),
                "lease_ttl needs concurrency",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nhandler = \"nap:1s\""),
                "handler",
            ),
            (one_route("allow = [\"10.0.0.0/33\"]", "/a"), "allow"),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nban = { after = 3, within = \"0s\", for = \"1m\" }"),
                "ban.within",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nban = { after = 3, within = \"1m\" }"),
                "for",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nban = { after = 3, within = \"1m\", for = \"1h\", max = \"1m\" }"),
                "ban.max",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 10\nwindow = \"1s\"\ngrants = { max = 0 }"),
                "grants.max",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 10\nwindow = \"1s\"\ngrants = { max = 5, life = \"1.5ms\" }"),
                "life",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nlimits = { gold = { limit = 5 } }"),
                "limits: tier \"gold\"",
            ),
            (
                "[[tier]]\nname = \"pro\"\nkeys = [\"k\"]\n[[tier]]\nname = \"max\"\nkeys = [\"k\"]\n".to_owned()
                    + &route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\""),
                "already tier pro",
            ),
            (
                "[[tier]]\nname = \"pro\"\n".to_owned()
                    + &route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nlimits = { pro = { limit = 0 } }"),
                "limits.pro",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nmethods = [\"BREW\"]"),
                "methods",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nfailure = \"ajar\""),
                "failure",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\nhandler = \"status:99\""),
                "handler",
            ),
            (
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\ndeny = [\"nonsense\"]"),
                "deny",
            ),
            (
                route("algorithm = \"sliding_window_log\"\nlimit = 1\nwindow = \"1s\"\nkey_group = \"api\""),
                "key_group",
            ),
            ("".to_owned(), "route"),
            (
                one_route(
                    "redis_url = \"redis://a\"\nredis_cluster = [\"redis://b\"]",
                    "/a",
                ),
                "redis_cluster",
            ),
            (one_route("redis_cluster = []", "/a"), "redis_cluster"),
            (
                one_route("redis_sentinel = { urls = [\"redis://a\"] }", "/a"),
                "master",
            ),
        ];
        for (text, field) in cases {
            let err = Config::parse(&text).expect_err(&text);
            assert!(err.0.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn a_key_group_holds_the_route_and_its_limits_under_the_routes_key() {
        let text = "[[route]]\npath = \"/a\"\nalgorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"\n\
            key_group = \"api\"\n\
            [[route.also]]\nname = \"per-minute\"\nalgorithm = \"fixed_window\"\nlimit = 5\nwindow = \"1m\"\n\
            [[route.also]]\nname = \"per-ip\"\nalgorithm = \"fixed_window\"\nlimit = 9\nwindow = \"1m\"\nkey = \"ip\"\n";
        let config = Config::parse(text).expect("valid");
        let route = &config.routes[0];
        let set = route
            .policies(route.policy().expect("policy"))
            .expect("policies");
        let groups: Vec<Option<&str>> = set.iter().map(|p| p.key_group()).collect();
        assert_eq!(groups, [Some("api"), Some("api"), None]);
    }

    #[test]
    fn the_client_ip_header_is_the_one_named() {
        let default = Config::parse(&one_route("", "/a")).expect("valid");
        assert_eq!(default.client_ip_header, ClientIpHeader::XForwardedFor);
        for (name, header) in [
            ("forwarded", ClientIpHeader::Forwarded),
            ("X-Forwarded-For", ClientIpHeader::XForwardedFor),
            (
                "cf-connecting-ip",
                ClientIpHeader::Single(axum::http::HeaderName::from_static("cf-connecting-ip")),
            ),
        ] {
            let text = one_route(&format!("client_ip_header = \"{name}\""), "/a");
            assert_eq!(
                Config::parse(&text).expect("valid").client_ip_header,
                header
            );
        }
    }

    #[test]
    fn every_header_style_and_compound_durations() {
        for style in ["ietf", "legacy", "both", "none"] {
            let text = one_route(&format!("headers = \"{style}\""), "/a");
            let config = Config::parse(&text).expect(style);
            assert_eq!(config.headers, style.parse().expect("a style"));
        }
        let text = one_route("budget = \"1s 500ms\"", "/a").replace("\"1s\"", "\"1h30m\"");
        let config = Config::parse(&text).expect("compound durations");
        assert_eq!(config.routes[0].window, Duration::from_secs(5_400));
        assert_eq!(config.budget, Duration::from_millis(1_500));
    }

    #[test]
    fn paths_axum_would_refuse_are_named() {
        for (path, says) in [
            ("/:id", "captures are written"),
            ("/files/*rest", "captures are written"),
            ("/{", "route /{: path"),
            ("api", "must start with /"),
        ] {
            let err = Config::parse(&one_route("", path)).expect_err(path);
            assert!(err.0.contains(says), "{path}: {err}");
        }
        let pair = one_route("", "/{a}") + &one_route("", "/{b}")[1..];
        let err = Config::parse(&pair).expect_err("a conflict");
        assert!(
            err.0.contains("route /{b}") && err.0.contains("/{a}"),
            "{err}"
        );
        let twice = one_route("", "/a") + &one_route("", "/a")[1..];
        assert!(
            Config::parse(&twice)
                .expect_err("twice")
                .0
                .contains("twice")
        );
    }

    #[test]
    fn every_path_gets_its_own_policy_name() {
        let paths = [
            "/",
            "/a/b",
            "/a-b",
            "/a.b",
            "/a_b",
            "/login",
            "/users/{id}",
            "/users/{name}",
        ];
        let names: std::collections::HashSet<String> =
            paths.iter().map(|p| policy_name(p)).collect();
        assert_eq!(names.len(), paths.len(), "{names:?}");
        assert_eq!(policy_name("/login"), "login");
        let long = format!("/{}", "x".repeat(100));
        assert_ne!(policy_name(&long), policy_name(&format!("{long}y")));
        for path in paths {
            assert!(
                Policy::builder(policy_name(path), Algorithm::Gcra)
                    .limit(1)
                    .window(Duration::from_secs(1))
                    .build()
                    .is_ok(),
                "{path}"
            );
        }
    }
}
