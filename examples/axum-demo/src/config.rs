//! The demo's TOML configuration.

use std::{fmt, net::SocketAddr, time::Duration};

use redlimit::{Algorithm, Policy};
use serde::Deserialize;
use tower_redlimit::HeaderStyle;

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where to serve. Defaults to `127.0.0.1:3000`.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// A standalone Redis to share limits through.
    pub redis_url: Option<String>,
    /// Seed URLs of a Redis Cluster to share limits through.
    pub redis_cluster: Option<Vec<String>>,
    /// Sentinels and the name of the primary they watch.
    pub redis_sentinel: Option<Sentinel>,
    /// Proxy networks whose forwarding headers are believed.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// `open`, `closed` or `local`. Defaults to `open`.
    #[serde(default = "default_failure")]
    pub failure: String,
    /// The time budget of one check. Defaults to 50.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// `ietf`, `legacy` or `both`. Defaults to `ietf`.
    #[serde(default = "default_headers")]
    pub headers: String,
    /// The limited routes.
    #[serde(rename = "route", default)]
    pub routes: Vec<Route>,
}

/// The `redis_sentinel` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sentinel {
    /// The sentinels' URLs, such as `redis://127.0.0.1:26379`.
    pub urls: Vec<String>,
    /// The name the sentinels know the primary by.
    pub master: String,
}

/// Where limits are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// This process only.
    Memory,
    /// A standalone Redis.
    Redis(String),
    /// A Redis Cluster.
    Cluster(Vec<String>),
    /// A Sentinel-managed primary.
    Sentinel {
        /// The sentinels.
        urls: Vec<String>,
        /// The primary's name.
        master: String,
    },
}

/// One `[[route]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// The path, such as `/api`.
    pub path: String,
    /// One of the algorithm names (`fixed_window`, `gcra`, …).
    pub algorithm: String,
    /// Requests per window.
    pub limit: u64,
    /// The window, such as `"10s"`, `"500ms"`, `"1m"`, `"1h"`, `"1d"`.
    pub window: String,
    /// For token bucket and GCRA: how many a fresh client may make at once.
    pub burst: Option<u64>,
    /// `ip`, `header:NAME` or `global`. Defaults to `ip`.
    #[serde(default = "default_key")]
    pub key: String,
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3000))
}
fn default_failure() -> String {
    "open".to_owned()
}
fn default_timeout_ms() -> u64 {
    50
}
fn default_headers() -> String {
    "ietf".to_owned()
}
fn default_key() -> String {
    "ip".to_owned()
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

impl Config {
    /// Parses and checks a TOML document.
    ///
    /// # Errors
    /// A message naming the field at fault.
    pub fn parse(text: &str) -> Result<Self, ConfigFileError> {
        let config: Self = toml::from_str(text).map_err(|e| ConfigFileError(e.to_string()))?;
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

    fn validate(&self) -> Result<(), ConfigFileError> {
        let err = |message: String| Err(ConfigFileError(message));
        self.store()?;
        if !["open", "closed", "local"].contains(&self.failure.as_str()) {
            return err(format!(
                "failure: {:?} is not open, closed or local",
                self.failure
            ));
        }
        if self.timeout_ms == 0 {
            return err("timeout_ms: must be at least 1".to_owned());
        }
        if !["ietf", "legacy", "both"].contains(&self.headers.as_str()) {
            return err(format!(
                "headers: {:?} is not ietf, legacy or both",
                self.headers
            ));
        }
        if self.routes.is_empty() {
            return err("route: at least one [[route]] is needed".to_owned());
        }
        let mut seen = std::collections::HashSet::new();
        for route in &self.routes {
            if !route.path.starts_with('/') {
                return err(format!("route.path: {:?} must start with /", route.path));
            }
            if !seen.insert(&route.path) {
                return err(format!("route.path: {:?} appears twice", route.path));
            }
            route.policy()?;
            route.key_kind()?;
        }
        Ok(())
    }

    /// The header style.
    pub fn header_style(&self) -> HeaderStyle {
        self.headers.parse().unwrap_or_default()
    }
}

/// What a route is keyed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyKind {
    /// The client IP.
    Ip,
    /// A header's value.
    Header(String),
    /// One key for all.
    Global,
}

impl Route {
    /// The route's policy, named after its path.
    ///
    /// # Errors
    /// A message naming the route and the field.
    pub fn policy(&self) -> Result<Policy, ConfigFileError> {
        let at = |field: &str, message: String| {
            ConfigFileError(format!("route {}: {field}: {message}", self.path))
        };
        let algorithm: Algorithm = self
            .algorithm
            .parse()
            .map_err(|_| at("algorithm", format!("{:?} is not one of fixed_window, fixed_window_anchored, sliding_window_log, sliding_window_counter, token_bucket, gcra", self.algorithm)))?;
        let window = parse_window(&self.window).map_err(|m| at("window", m))?;
        let mut builder = Policy::builder(self.policy_name(), algorithm)
            .limit(self.limit)
            .window(window);
        if let Some(burst) = self.burst {
            builder = builder.burst(burst);
        }
        builder
            .build()
            .map_err(|e| ConfigFileError(format!("route {}: {e}", self.path)))
    }

    /// `/api/v1` → `api-v1`, `/` → `root`.
    fn policy_name(&self) -> String {
        let name: String = self
            .path
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let name = name.trim_matches('-');
        if name.is_empty() {
            "root".to_owned()
        } else {
            name.chars().take(64).collect()
        }
    }

    /// The key kind.
    ///
    /// # Errors
    /// A message naming the route's `key`.
    pub fn key_kind(&self) -> Result<KeyKind, ConfigFileError> {
        match self.key.as_str() {
            "ip" => Ok(KeyKind::Ip),
            "global" => Ok(KeyKind::Global),
            other => match other.strip_prefix("header:") {
                Some(name) if !name.is_empty() => Ok(KeyKind::Header(name.to_owned())),
                _ => Err(ConfigFileError(format!(
                    "route {}: key: {other:?} is not ip, header:NAME or global",
                    self.path
                ))),
            },
        }
    }
}

/// `"10s"`, `"500ms"`, `"1m"`, `"2h"`, `"1d"`.
fn parse_window(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a number with a unit like \"10s\""))?;
    let millis = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m, h or d")),
    };
    number
        .checked_mul(millis)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
}

const DEMO: &str = r#"
[[route]]
path = "/"
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
                route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"10x\""),
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
            (
                format!(
                    "failure = \"maybe\"\n{}",
                    route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"")
                ),
                "failure",
            ),
            (
                format!(
                    "headers = \"all\"\n{}",
                    route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"")
                ),
                "headers",
            ),
            (
                format!(
                    "listen = \"nowhere\"\n{}",
                    route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"")
                ),
                "listen",
            ),
            ("".to_owned(), "route"),
            (
                format!(
                    "redis_url = \"redis://a\"\nredis_cluster = [\"redis://b\"]\n{}",
                    route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"")
                ),
                "redis_cluster",
            ),
            (
                format!(
                    "redis_cluster = []\n{}",
                    route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"")
                ),
                "redis_cluster",
            ),
            (
                format!(
                    "redis_sentinel = {{ urls = [\"redis://a\"] }}\n{}",
                    route("algorithm = \"gcra\"\nlimit = 1\nwindow = \"1s\"")
                ),
                "master",
            ),
        ];
        for (text, field) in cases {
            let err = Config::parse(&text).expect_err(&text);
            assert!(err.0.contains(field), "{field}: {err}");
        }
    }

    #[test]
    fn windows_and_names() {
        assert_eq!(parse_window("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_window("2h"), Ok(Duration::from_secs(7_200)));
        assert!(parse_window("s").is_err());
        let route = |path: &str| Route {
            path: path.to_owned(),
            algorithm: "gcra".to_owned(),
            limit: 1,
            window: "1s".to_owned(),
            burst: None,
            key: "ip".to_owned(),
        };
        assert_eq!(route("/").policy_name(), "root");
        assert_eq!(route("/api/v1").policy_name(), "api-v1");
    }
}
