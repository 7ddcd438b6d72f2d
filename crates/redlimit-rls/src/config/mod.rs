//! The service's configuration: envoyproxy/ratelimit's YAML files, each a domain and a tree of
//! descriptors, read into rules (each a redlimit [`Policy`]) and the tree a request's
//! descriptors are matched against.

mod stats;
mod tree;
mod yaml;

use std::{
    collections::HashMap,
    fmt,
    path::Path,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use redlimit::{Algorithm, Policy};

pub(crate) use self::{stats::RuleStats, tree::Matched};
use self::{
    tree::Node,
    yaml::{YamlDescriptor, YamlRateLimit, YamlRoot},
};

/// A configuration that could not be loaded: the file and what is wrong, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file at fault.
    pub file: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// The units of envoyproxy/ratelimit, as Envoy's `RateLimitResponse.RateLimit.Unit` numbers
/// them, and each one's window: a month is 30 days and a year 365, as that service counts them.
const UNITS: [(&str, i32, u64); 7] = [
    ("second", 1, 1),
    ("minute", 2, 60),
    ("hour", 3, 3_600),
    ("day", 4, 86_400),
    ("month", 5, 2_592_000),
    ("year", 6, 31_536_000),
    ("week", 7, 604_800),
];

/// One limit of the tree, as a request's status reports it and as it is checked.
#[derive(Debug)]
pub(crate) struct Rule {
    /// Unique for the life of the process: what a guard of its sets is found by, which no
    /// reload can reuse.
    pub(crate) id: u64,
    /// What it allows.
    pub(crate) limit: Limit,
    /// What `current_limit` reports: requests per unit, the unit's number, the rule's name.
    pub(crate) requests_per_unit: u32,
    pub(crate) unit: i32,
    pub(crate) name: String,
    /// Names of the rules this one replaces when both match one request.
    pub(crate) replaces: Vec<String>,
    /// A denial is answered OK (and counted as shadowed).
    pub(crate) shadow: bool,
    /// A denial denies the request only if every quota-mode descriptor of it is denied.
    pub(crate) quota: bool,
    /// Its counters, under envoyproxy/ratelimit's names.
    pub(crate) stats: RuleStats,
}

/// What a rule allows.
#[derive(Debug)]
pub(crate) enum Limit {
    /// Everything: `unlimited: true`.
    Unlimited,
    /// Nothing: `requests_per_unit: 0`, every request over the limit.
    Nothing,
    /// What its policy admits.
    Policy(Policy),
}

/// Every domain's tree and the rules in it.
#[derive(Debug, Default)]
pub struct RlsConfig {
    domains: HashMap<String, Node>,
    rules: Vec<Arc<Rule>>,
    /// The rules of limits requests name themselves (a descriptor's `limit`), by domain and
    /// numbers: each built once.
    overrides: Mutex<HashMap<(String, u32, i32), Arc<Rule>>>,
}

/// The most distinct limits named by requests that a configuration keeps rules for; past it, a
/// descriptor's own limit is ignored (its tree's rule applies).
const MAX_OVERRIDES: usize = 1_024;

impl RlsConfig {
    /// Reads every `.yaml` and `.yml` file in `dir`, in name order.
    ///
    /// # Errors
    /// The first file that cannot be read or is not a valid configuration, and why.
    pub fn load_dir(dir: &Path) -> Result<Self, ConfigError> {
        let error = |file: &Path, message: String| ConfigError {
            file: file.display().to_string(),
            message,
        };
        let entries = std::fs::read_dir(dir).map_err(|e| error(dir, e.to_string()))?;
        let mut files: Vec<_> = entries
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .filter(|path| {
                path.extension()
                    .is_some_and(|ext| ext == "yaml" || ext == "yml")
            })
            .collect();
        files.sort();
        let mut texts = Vec::with_capacity(files.len());
        for file in files {
            let text = std::fs::read_to_string(&file).map_err(|e| error(&file, e.to_string()))?;
            texts.push((file.display().to_string(), text));
        }
        Self::from_files(texts.iter().map(|(f, t)| (f.as_str(), t.as_str())))
    }

    /// The configuration of `files`, each a name (for errors) and its YAML text.
    ///
    /// # Errors
    /// The first file that is not a valid configuration, and why, naming the field.
    pub fn from_files<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, ConfigError> {
        let mut config = Self::default();
        for (file, text) in files {
            let error = |message: String| ConfigError {
                file: file.to_owned(),
                message,
            };
            let root: YamlRoot = serde_yaml::from_str(text).map_err(|e| error(e.to_string()))?;
            if root.domain.is_empty() {
                return Err(error("domain: must not be empty".to_owned()));
            }
            if config.domains.contains_key(&root.domain) {
                return Err(error(format!(
                    "domain: {:?} is in another file too",
                    root.domain
                )));
            }
            let mut node = Node::default();
            config
                .load(&mut node, &root.domain, &root.descriptors)
                .map_err(error)?;
            config.domains.insert(root.domain, node);
        }
        Ok(config)
    }

    /// Loads `descriptors` under `node`, whose path is `path`.
    fn load(
        &mut self,
        node: &mut Node,
        path: &str,
        descriptors: &[YamlDescriptor],
    ) -> Result<(), String> {
        for descriptor in descriptors {
            if descriptor.key.is_empty() {
                return Err(format!("{path}: a descriptor has an empty key"));
            }
            let key = if descriptor.value.is_empty() {
                descriptor.key.clone()
            } else {
                format!("{}_{}", descriptor.key, descriptor.value)
            };
            let here = format!("{path}.{key}");
            if descriptor.share_threshold && !key.contains('*') {
                return Err(format!("{here}: share_threshold needs a wildcard value"));
            }
            let mut child = Node::default();
            if let Some(limit) = &descriptor.rate_limit {
                let rule = rule(&here, descriptor, limit)?;
                child.rule = Some(Arc::new(rule));
                self.rules.extend(child.rule.clone());
            }
            child.shared = descriptor.share_threshold;
            self.load(&mut child, &here, &descriptor.descriptors)?;
            node.add(key, child)
                .map_err(|key| format!("{path}: descriptor {key:?} is there twice"))?;
        }
        Ok(())
    }

    /// The rule `entries` match in `domain`, and the client key its counter is kept under.
    pub(crate) fn matched<'a>(
        &self,
        domain: &str,
        entries: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> Option<Matched> {
        self.domains.get(domain)?.matched(entries)
    }

    /// The rule of the limit `requests_per_unit` per `unit` (Envoy's unit number) that a
    /// descriptor of `domain` names itself, and its entries' client key; `None` for an unknown
    /// domain or unit, or past [`MAX_OVERRIDES`].
    pub(crate) fn named<'a>(
        &self,
        domain: &str,
        (requests_per_unit, unit): (u32, i32),
        entries: impl Iterator<Item = (&'a str, &'a str)>,
    ) -> Option<Matched> {
        if !self.domains.contains_key(domain) {
            return None;
        }
        let (name, _, seconds) = UNITS.iter().find(|(_, number, _)| *number == unit)?;
        let mut overrides = self
            .overrides
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (domain.to_owned(), requests_per_unit, unit);
        let rule = match overrides.get(&key) {
            Some(rule) => Arc::clone(rule),
            None if overrides.len() >= MAX_OVERRIDES => return None,
            None => {
                let path = format!("{domain}.limit_{requests_per_unit}_per_{name}");
                let limit = Policy::builder(policy_name(&path), Algorithm::FixedWindow)
                    .limit(u64::from(requests_per_unit))
                    .window(Duration::from_secs(*seconds))
                    .build()
                    .map_or(Limit::Nothing, Limit::Policy);
                let rule = Arc::new(Rule {
                    id: next_rule_id(),
                    limit,
                    requests_per_unit,
                    unit,
                    name: String::new(),
                    replaces: Vec::new(),
                    shadow: false,
                    quota: false,
                    stats: RuleStats::new(&path),
                });
                overrides.insert(key, Arc::clone(&rule));
                rule
            }
        };
        let client: Vec<String> = entries
            .map(|(key, value)| format!("{key}_{value}"))
            .collect();
        Some(Matched {
            rule,
            client: client.join("."),
        })
    }

    /// The policy a descriptor of `domain` with `entries` is checked by, and the client key
    /// its counter is kept under: what an operator's tools read and reset. `None` when no rule
    /// with a limit to count matches (none, an `unlimited` one, or one of 0).
    ///
    /// ```
    /// # use redlimit_rls::RlsConfig;
    /// let yaml = "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: { unit: minute, requests_per_unit: 9 }";
    /// let config = RlsConfig::from_files([("d.yaml", yaml)])?;
    /// let (policy, client) = config.policy_of("d", &[("ip", "10.0.0.1")]).expect("a rule");
    /// assert_eq!((policy.limit(), client.as_str()), (9, "ip_10.0.0.1"));
    /// # Ok::<(), redlimit_rls::ConfigError>(())
    /// ```
    pub fn policy_of(&self, domain: &str, entries: &[(&str, &str)]) -> Option<(Policy, String)> {
        let matched = self.matched(domain, entries.iter().copied())?;
        match &matched.rule.limit {
            Limit::Policy(policy) => Some((policy.clone(), matched.client)),
            Limit::Unlimited | Limit::Nothing => None,
        }
    }

    /// How many rules the configuration holds.
    pub fn rules(&self) -> usize {
        self.rules.len()
    }

    /// Whether `domain` is configured.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }
}

/// The rule of `limit` at `here` (of `descriptor`).
fn rule(here: &str, descriptor: &YamlDescriptor, limit: &YamlRateLimit) -> Result<Rule, String> {
    let field =
        |name: &str, message: &dyn fmt::Display| format!("{here}.rate_limit.{name}: {message}");
    let unit = limit.unit.as_deref().map(|unit| {
        UNITS
            .iter()
            .find(|(name, ..)| name.eq_ignore_ascii_case(unit))
            .ok_or_else(|| {
                field(
                    "unit",
                    &format!("{unit:?} is not one of second, minute, hour, day, week, month, year"),
                )
            })
    });
    let unit = unit.transpose()?;
    let replaces: Vec<String> = limit.replaces.iter().map(|r| r.name.clone()).collect();
    if replaces.iter().any(String::is_empty) {
        return Err(field("replaces", &"an entry has an empty name"));
    }
    let name = limit.name.clone().unwrap_or_default();
    if !name.is_empty() && replaces.contains(&name) {
        return Err(field("replaces", &"a rule cannot replace itself"));
    }
    let mut rule = Rule {
        id: next_rule_id(),
        limit: Limit::Unlimited,
        requests_per_unit: 0,
        unit: unit.map_or(0, |(_, number, _)| *number),
        name,
        replaces,
        shadow: descriptor.shadow_mode,
        quota: descriptor.quota_mode,
        stats: RuleStats::new(here),
    };
    if limit.unlimited {
        if unit.is_some() || limit.requests_per_unit.is_some() {
            return Err(field("unlimited", &"takes no unit or requests_per_unit"));
        }
        return Ok(rule);
    }
    let requests = limit
        .requests_per_unit
        .ok_or_else(|| field("requests_per_unit", &"is required"))?;
    rule.requests_per_unit = u32::try_from(requests).unwrap_or(u32::MAX);
    let window = match (&limit.window, unit) {
        (Some(window), _) => humantime::parse_duration(window)
            .map_err(|e| field("window", &format!("{window:?}: {e}")))?,
        (None, Some((_, _, seconds))) => Duration::from_secs(*seconds),
        (None, None) => return Err(field("unit", &"is required (or a window)")),
    };
    let algorithm = match &limit.algorithm {
        Some(name) => name
            .parse::<Algorithm>()
            .map_err(|e| field("algorithm", &e))?,
        None => Algorithm::FixedWindow,
    };
    let mut builder = Policy::builder(policy_name(here), algorithm)
        .limit(requests)
        .window(window);
    if let Some(burst) = limit.burst {
        builder = builder.burst(burst);
    }
    rule.limit = if requests == 0 {
        Limit::Nothing
    } else {
        Limit::Policy(
            builder
                .build()
                .map_err(|e| format!("{here}.rate_limit: {e}"))?,
        )
    };
    Ok(rule)
}

/// A policy name for the rule at `path`: its characters outside `A-Z a-z 0-9 _ - .` as `-`, and
/// a long one cut to 55 characters and a hash of the whole, so that names stay distinct.
fn policy_name(path: &str) -> String {
    let clean: String = path
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    if clean.len() <= 64 && clean == path {
        return clean;
    }
    // FNV-1a: stable across runs and builds, so a rule keeps its keys.
    let hash = path.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    let cut: String = clean.chars().take(55).collect();
    format!("{cut}-{:08x}", hash >> 32)
}

/// The next rule's id.
fn next_rule_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::RlsConfig;

    fn refused(yaml: &str) -> String {
        RlsConfig::from_files([("bad.yaml", yaml)])
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn mistakes_name_the_file_and_the_field() {
        let cases = [
            ("domain: ''", "domain: must not be empty"),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }",
                "d.k.rate_limit.unit",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second }",
                "d.k.rate_limit.requests_per_unit: is required",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limt: { unit: second }",
                "unknown field `rate_limt`",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n  - key: k",
                "descriptor \"k\" is there twice",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true",
                "d.k_v: share_threshold needs a wildcard value",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { algorithm: leaky, unit: second, requests_per_unit: 1 }",
                "d.k.rate_limit.algorithm",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { name: a, replaces: [{ name: a }], unit: second, requests_per_unit: 1 }",
                "cannot replace itself",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unlimited: true, unit: second }",
                "d.k.rate_limit.unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { window: soon, requests_per_unit: 1 }",
                "d.k.rate_limit.window",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: { unit: second, requests_per_unit: 1, burst: 3 }",
                "burst",
            ),
        ];
        for (yaml, expected) in cases {
            let message = refused(yaml);
            assert!(message.starts_with("bad.yaml: "), "{message}");
            assert!(message.contains(expected), "{yaml:?}: {message}");
        }
        let twice = RlsConfig::from_files([("a.yaml", "domain: d"), ("b.yaml", "domain: d")]);
        assert!(
            twice
                .expect_err("refused")
                .to_string()
                .starts_with("b.yaml: domain")
        );
    }

    #[test]
    fn long_or_odd_paths_make_distinct_policy_names() {
        let long = "d.".to_owned() + &"k_v.".repeat(30);
        let names = [
            super::policy_name("d.a b"),
            super::policy_name("d.a-b"),
            super::policy_name(&long),
            super::policy_name(&(long.clone() + "x")),
        ];
        assert_eq!(names[1], "d.a-b");
        assert_ne!(names[0], names[1]);
        assert_ne!(names[2], names[3]);
        assert!(names.iter().all(|n| n.len() <= 64), "{names:?}");
    }
}
