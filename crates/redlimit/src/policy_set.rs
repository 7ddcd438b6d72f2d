use std::{collections::HashSet, ops::Deref, sync::Arc};

use crate::{ConcurrencyPolicy, ConfigError, Grants, Policy};

/// The policies one check decides together, all or nothing, validated once when the set is
/// built: checks then never validate.
///
/// A request passes only if every policy admits it, and a denied request consumes from none.
/// Cheap to clone (the policies are shared); derefs to `[Policy]`. One policy converts with
/// `From`.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, ConfigError, Policy, PolicySet};
///
/// let per_second = Policy::builder("per-second", Algorithm::Gcra)
///     .limit(10)
///     .window(Duration::from_secs(1))
///     .build()?;
/// let per_day = Policy::builder("per-day", Algorithm::FixedWindow)
///     .limit(1_000)
///     .window(Duration::from_secs(86_400))
///     .build()?;
/// let both = PolicySet::new([per_second.clone(), per_day])?;
/// assert_eq!(both.len(), 2);
///
/// let twice = PolicySet::new([per_second.clone(), per_second.clone()]).unwrap_err();
/// assert!(matches!(twice, ConfigError::Duplicate { field: "policies", .. }));
/// let alone = PolicySet::from(per_second);
/// assert_eq!(alone[0].name(), "per-second");
/// # Ok::<(), ConfigError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySet {
    policies: Arc<[Policy]>,
    concurrency: Option<ConcurrencyPolicy>,
}

impl PolicySet {
    /// The set of `policies`, checked in this order.
    ///
    /// # Errors
    /// [`ConfigError::Missing`] for no policy, [`ConfigError::Duplicate`] naming a policy given
    /// twice, [`ConfigError::Conflict`] for a policy in delay mode beside others (a request
    /// waiting for one policy's slot cannot hold the others').
    pub fn new(policies: impl IntoIterator<Item = Policy>) -> Result<Self, ConfigError> {
        let policies: Arc<[Policy]> = policies.into_iter().collect();
        if policies.is_empty() {
            return Err(ConfigError::Missing { field: "policies" });
        }
        let mut names = HashSet::new();
        if let Some(twice) = policies.iter().find(|p| !names.insert(p.name())) {
            return Err(ConfigError::Duplicate {
                field: "policies",
                value: twice.name().to_owned(),
            });
        }
        let granted = policies.iter().filter(|p| p.grants().is_some()).count();
        if granted > 0 && granted < policies.len() {
            return Err(ConfigError::Conflict {
                field: "grants",
                with: "policies without grants in one set (a grant spent in process would pass them by)",
            });
        }
        if policies.len() > 1 && policies.iter().any(|p| p.max_delay().is_some()) {
            return Err(ConfigError::Conflict {
                field: "max_delay",
                with: "other policies in one set (a policy in delay mode is checked alone)",
            });
        }
        Ok(Self {
            policies,
            concurrency: None,
        })
    }

    /// The same set with a concurrency limit as a member: a check takes one of its leases
    /// only when every policy admits, and its policies take only when the lease is granted,
    /// in one step (one script call on Redis). Its decision comes after the policies' in
    /// [`Decisions`](crate::Decisions), which hold the lease (see
    /// [`Decisions::lease`](crate::Decisions::lease)). Its client key is the check's first
    /// (see [`CheckRequest::keys`](crate::CheckRequest::keys)).
    ///
    /// # Errors
    /// [`ConfigError::Duplicate`] when a policy has its name, [`ConfigError::Conflict`] beside
    /// a policy in delay mode (a request waiting for its slot would hold a lease meanwhile).
    pub fn with_concurrency(mut self, concurrency: ConcurrencyPolicy) -> Result<Self, ConfigError> {
        if self.policies.iter().any(|p| p.name() == concurrency.name()) {
            return Err(ConfigError::Duplicate {
                field: "policies",
                value: concurrency.name().to_owned(),
            });
        }
        if self.is_delayed() {
            return Err(ConfigError::Conflict {
                field: "max_delay",
                with: "a concurrency limit (a request waiting for its slot would hold a lease)",
            });
        }
        if self.grants().is_some() {
            return Err(ConfigError::Conflict {
                field: "grants",
                with: "a concurrency limit (each request takes a lease of its own)",
            });
        }
        self.concurrency = Some(concurrency);
        Ok(self)
    }

    /// The set's concurrency limit, if it has one.
    pub fn concurrency(&self) -> Option<&ConcurrencyPolicy> {
        self.concurrency.as_ref()
    }

    /// The largest cost every policy can grant: a larger one is denied for good.
    pub fn capacity(&self) -> u64 {
        self.policies
            .iter()
            .map(Policy::capacity)
            .min()
            .unwrap_or(0)
    }

    /// The set's hot-key mode: the smallest grant and shortest life of its policies, when every
    /// one has [`grants`](crate::PolicyBuilder::grants); `None` when none has.
    pub fn grants(&self) -> Option<Grants> {
        let mut all = self.policies.iter().map(Policy::grants);
        let first = all.next().flatten()?;
        all.try_fold(first, |least, grants| {
            grants.map(|g| {
                Grants::up_to(least.max().min(g.max())).life(least.life_span().min(g.life_span()))
            })
        })
    }

    /// Whether the set is one policy in delay mode.
    pub fn is_delayed(&self) -> bool {
        self.policies[0].max_delay().is_some()
    }
}

impl From<Policy> for PolicySet {
    fn from(policy: Policy) -> Self {
        Self {
            policies: Arc::new([policy]),
            concurrency: None,
        }
    }
}

impl Deref for PolicySet {
    type Target = [Policy];

    fn deref(&self) -> &[Policy] {
        &self.policies
    }
}
