use std::{ops::Deref, sync::Arc, time::Duration};

use crate::{Decision, Error, Lease, PolicySet, Reason, RetryAfter};

/// The decisions of one check: one [`Decision`] per policy, in the order the policies were
/// given, then the set's concurrency limit's when it has one; never empty. The request passes only if [`allowed`](Self::allowed).
///
/// Derefs to `[Decision]` for iterating and indexing.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Limiter, MemoryBackend, Policy, PolicySet, RetryAfter};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let limiter = Limiter::new(MemoryBackend::default());
/// let burst = Policy::builder("burst", Algorithm::Gcra)
///     .limit(1)
///     .window(Duration::from_secs(1))
///     .build()?;
/// let daily = Policy::builder("daily", Algorithm::FixedWindow)
///     .limit(100)
///     .window(Duration::from_secs(86_400))
///     .build()?;
/// let policies = [burst, daily];
/// assert!(limiter.check(&PolicySet::new(policies.iter().cloned()).expect("a valid set"), "k").await?.allowed());
/// let second = limiter.check(&PolicySet::new(policies.iter().cloned()).expect("a valid set"), "k").await?;
/// assert!(!second.allowed());
/// assert_eq!(&*second.most_restrictive().policy, "burst");
/// assert!(matches!(second.retry_after(), Some(RetryAfter::After(_))));
/// assert_eq!(second[1].remaining, 99, "the denied request consumed nothing");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Decisions {
    /// Shared, so a clone (into a handler's extensions, say) costs no copy.
    items: Arc<[Decision]>,
    /// Shared, so the decisions can be cloned (into a handler's extensions, say).
    error: Option<Arc<Error>>,
    /// An admitted reservation: what a settle changes.
    reservation: Option<Arc<Reservation>>,
    /// The lease of the set's concurrency limit, given back when the last clone drops.
    lease: Option<Arc<Lease>>,
}

/// What an admitted reservation took: from whom, how much, and the backend's time it took it
/// at, which names the window a give-back is owed by.
#[derive(Debug)]
pub(crate) struct Reservation {
    /// The policies it was checked by, which the settle changes.
    pub(crate) set: PolicySet,
    pub(crate) client: Box<str>,
    pub(crate) cost: u64,
    pub(crate) at_us: u64,
    /// The request id it was checked with: a settle moves what a retry of it is answered too.
    pub(crate) once: Option<Box<str>>,
    /// Its policies' own client keys, when they were not all `client`'s.
    pub(crate) each: Option<crate::check_request::OwnedKeys>,
    /// Each policy's time of take (us), when its keys lived in several Cluster slots, each
    /// taken by its own server's clock.
    pub(crate) at_each: Option<Box<[u64]>>,
}

impl Decisions {
    /// Decisions of a check that the backend answered; `items` is not empty.
    pub(crate) fn new(items: impl Into<Arc<[Decision]>>) -> Self {
        let items = items.into();
        debug_assert!(!items.is_empty(), "a check has at least one policy");
        Self {
            items,
            error: None,
            reservation: None,
            lease: None,
        }
    }

    /// The decisions of an admitted check holding `lease`.
    pub(crate) fn leased(mut self, lease: Lease) -> Self {
        self.lease = Some(Arc::new(lease));
        self
    }

    /// The lease of the set's concurrency limit (see
    /// [`PolicySet::with_concurrency`](crate::PolicySet::with_concurrency)) that this admitted
    /// check holds: shared by every clone of these decisions, and given back when the last
    /// of them is dropped.
    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_deref()
    }

    /// The decisions of an admitted reservation.
    pub(crate) fn reserved(mut self, reservation: Reservation) -> Self {
        self.reservation = Some(Arc::new(reservation));
        self
    }

    /// What this admitted reservation took, if it is one.
    pub(crate) fn reservation(&self) -> Option<&Reservation> {
        self.reservation.as_deref()
    }

    /// The cost an admitted reservation took, which a settle may change (see
    /// [`CheckRequest::reserve`](crate::CheckRequest::reserve)); `None` for a plain check, a denial,
    /// or decisions of the failure policy.
    pub fn reserved_cost(&self) -> Option<u64> {
        self.reservation.as_ref().map(|r| r.cost)
    }

    /// Decisions the failure policy made because the backend failed with `error`.
    pub(crate) fn with_error(mut self, error: Option<Error>) -> Self {
        self.error = error.map(Arc::new);
        self
    }

    /// The same decisions (and reservation), every one of them decided by `reason`.
    pub(crate) fn decided_by(mut self, reason: Reason) -> Self {
        for decision in self.items_mut() {
            decision.reason = reason;
        }
        self
    }

    /// The same decisions with every denial let through as [`Reason::Shadow`], its quota and
    /// waits kept.
    pub(crate) fn shadowed(mut self) -> Self {
        for decision in self.items_mut().iter_mut().filter(|d| !d.allowed) {
            decision.allowed = true;
            decision.reason = Reason::Shadow;
        }
        self
    }

    /// Whether every policy allows the request.
    pub fn allowed(&self) -> bool {
        self.items.iter().all(|d| d.allowed)
    }

    /// The decision a single-valued answer reports (a handler's extension, the legacy
    /// `X-RateLimit-*` headers, a denial's message): the first denial, else the one with the least
    /// remaining.
    pub fn most_restrictive(&self) -> &Decision {
        let first_denial = self.items.iter().find(|d| !d.allowed);
        let least = || self.items.iter().min_by_key(|d| d.remaining);
        first_denial
            .or_else(least)
            .unwrap_or_else(|| unreachable!("a check has at least one policy"))
    }

    /// When the request could pass: `None` when it is allowed, [`RetryAfter::Never`] when a
    /// policy can never grant its cost, else the longest wait of the denying policies (the
    /// request passes only once every one of them admits it).
    pub fn retry_after(&self) -> Option<RetryAfter> {
        let mut longest: Option<Duration> = None;
        for decision in self.items.iter().filter(|d| !d.allowed) {
            match decision.retry_after {
                Some(RetryAfter::After(wait)) => longest = longest.max(Some(wait)),
                Some(RetryAfter::Never) => return Some(RetryAfter::Never),
                None => {}
            }
        }
        longest.map(RetryAfter::After)
    }

    /// Delay mode: how long the request must wait before it is served, the longest of the
    /// policies' [`Decision::delay`]; zero when it is served at once (or denied).
    pub fn delay(&self) -> Duration {
        self.items
            .iter()
            .map(|d| d.delay)
            .max()
            .unwrap_or(Duration::ZERO)
    }

    /// These decisions and `decision`, of the set's concurrency limit: the request passes only
    /// if it allows too.
    pub(crate) fn and(mut self, decision: Decision) -> Self {
        let items = self.items.iter().cloned().chain([decision]);
        self.items = items.collect();
        self
    }

    /// The decisions to change, copied first if a clone shares them.
    pub(crate) fn items_mut(&mut self) -> &mut [Decision] {
        if Arc::get_mut(&mut self.items).is_none() {
            self.items = self.items.iter().cloned().collect();
        }
        Arc::get_mut(&mut self.items).unwrap_or_default()
    }

    /// Why the failure policy answered instead of the backend, when a
    /// [`GuardedLimiter`](crate::GuardedLimiter)'s backend failed. `None` when the backend
    /// decided, or when a failure reason shows with no error: the circuit was open.
    pub fn error(&self) -> Option<&Error> {
        self.error.as_deref()
    }

    /// The decisions as they stand once their reservation was settled at `actual` (see
    /// [`Limiter::settle`](crate::Limiter::settle)): each admitting decision's `remaining`
    /// raised by what was given back, or lowered (never below 0) by what was charged, for
    /// headers that tell what is left after the settle.
    ///
    /// Only the reservation's own policies count: the set's concurrency limit's decision stays
    /// as it is.
    #[must_use]
    pub fn settled(mut self, actual: u64) -> Self {
        let Some(reservation) = &self.reservation else {
            return self;
        };
        let (reserved, cost) = (reservation.set.len(), reservation.cost);
        for d in self
            .items_mut()
            .iter_mut()
            .take(reserved)
            .filter(|d| d.allowed)
        {
            d.remaining = (d.remaining.saturating_add(cost)).saturating_sub(actual);
        }
        self
    }

    /// The decisions, one per policy.
    pub fn into_vec(self) -> Vec<Decision> {
        self.items.to_vec()
    }
}

impl Deref for Decisions {
    type Target = [Decision];

    fn deref(&self) -> &[Decision] {
        &self.items
    }
}

impl<'a> IntoIterator for &'a Decisions {
    type Item = &'a Decision;
    type IntoIter = std::slice::Iter<'a, Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl IntoIterator for Decisions {
    type Item = Decision;
    type IntoIter = std::vec::IntoIter<Decision>;

    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}
