//! envoyproxy/ratelimit's YAML, as written: a `domain` and a tree of `descriptors`, each
//! with an optional `rate_limit`; plus redlimit's additions on a `rate_limit` (`algorithm`,
//! `window`, `burst`). Unknown keys are refused, as that service refuses them.

use serde::Deserialize;

/// One file: a domain and its descriptors.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct YamlRoot {
    pub(crate) domain: String,
    #[serde(default)]
    pub(crate) descriptors: Vec<YamlDescriptor>,
}

/// One node of the tree: a key, an optional value (a trailing or inner `*` is a wildcard), a
/// limit, and the nodes under it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct YamlDescriptor {
    pub(crate) key: String,
    #[serde(default)]
    pub(crate) value: String,
    pub(crate) rate_limit: Option<YamlRateLimit>,
    #[serde(default)]
    pub(crate) descriptors: Vec<YamlDescriptor>,
    #[serde(default)]
    pub(crate) shadow_mode: bool,
    #[serde(default)]
    pub(crate) quota_mode: bool,
    /// Accepted for compatibility: metrics name the matched rule already.
    #[serde(default, rename = "detailed_metric")]
    _detailed_metric: bool,
    #[serde(default, rename = "value_to_metric")]
    _value_to_metric: bool,
    /// Every value a wildcard matches shares one counter.
    #[serde(default)]
    pub(crate) share_threshold: bool,
    /// Passed by that service to Envoy's dynamic metadata; accepted, not passed on here.
    #[serde(default, rename = "metadata")]
    _metadata: Option<serde_yaml::Value>,
}

/// A limit: envoyproxy/ratelimit's fields, and redlimit's.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct YamlRateLimit {
    #[serde(default)]
    pub(crate) unit: Option<String>,
    #[serde(default)]
    pub(crate) requests_per_unit: Option<u64>,
    #[serde(default)]
    pub(crate) unlimited: bool,
    #[serde(default)]
    pub(crate) name: Option<String>,
    #[serde(default)]
    pub(crate) replaces: Vec<YamlReplaces>,
    /// redlimit: one of its algorithms (`fixed_window` unless set).
    #[serde(default)]
    pub(crate) algorithm: Option<String>,
    /// redlimit: a window of any length, such as `"30s"`, instead of a `unit`.
    #[serde(default)]
    pub(crate) window: Option<String>,
    /// redlimit: the burst of a token bucket or GCRA.
    #[serde(default)]
    pub(crate) burst: Option<u64>,
}

/// One entry of `replaces`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct YamlReplaces {
    pub(crate) name: String,
}
