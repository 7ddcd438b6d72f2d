//! Hot-key mode: an instance takes several units from the backend at once and spends them in
//! process.

use std::time::Duration;

use crate::ConfigError;

/// Hot-key mode for a [`Policy`](crate::Policy): a [`GuardedLimiter`](crate::GuardedLimiter) on
/// Redis takes up to [`max`](Self::max) units beyond a request's cost in the check's own script
/// call (as many as every policy of the set has room for, never more), holds them for at most
/// [`life`](Self::life), and decides that client's next requests in process from them, with
/// [`Reason::Grant`](crate::Reason::Grant). One hot key then costs Redis one call per grant
/// instead of one per request.
///
/// How much it takes adapts to the key's rate: about the requests this instance saw of the key
/// in half a life, so a quiet key is checked exactly (one call per request, nothing held) and a
/// hot one holds up to `max`. A new grant is fetched in the background once half the last one
/// is spent. Units still held when a grant's life ends are given back (a settle, as
/// [`Limiter::settle`](crate::Limiter::settle)).
///
/// # What it costs in accuracy
/// Every unit spent was taken from the backend first, so over any span the instances admit no
/// more than the backend granted. What moves is *when*: a unit taken at one moment may be spent
/// up to a life later. So in any window a policy admits at most its limit plus the units the
/// instances held unspent when the window began, **at most `instances × max`**. For the fixed
/// and anchored windows a grant ends with the window it was taken in, so they admit **at most
/// their limit**. The other way round, units one instance holds are not available to the
/// others until spent or given back: near the limit, another instance may be denied while
/// they are held.
///
/// A set checks with grants only if every one of its policies has them; the smallest `max` and
/// `life` of the set apply. Not with a ban, delay mode or a concurrency limit (each request
/// must reach the backend for those), and checks with a request id, a reservation or a key per
/// policy stay exact. Defaults to none: every check is exact.
///
/// ```
/// use std::time::Duration;
/// use redlimit::{Algorithm, Grants, Policy};
///
/// // A global limit of 50,000 a minute shared by every instance: each holds up to 500.
/// let global = Policy::builder("global", Algorithm::FixedWindow)
///     .limit(50_000)
///     .window(Duration::from_secs(60))
///     .grants(Grants::up_to(500).life(Duration::from_millis(500)))
///     .build()?;
/// assert_eq!(global.grants().map(|g| g.max()), Some(500));
/// # Ok::<(), redlimit::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grants {
    max: u64,
    life: Duration,
}

impl Grants {
    /// Grants of at most `max` units beyond a request's cost, living 1 s (see
    /// [`life`](Self::life)).
    pub fn up_to(max: u64) -> Self {
        Self {
            max,
            life: Duration::from_secs(1),
        }
    }

    /// The longest a grant is spent before what is left of it is given back: a whole number of
    /// milliseconds; one longer than the policy's window is the window. Defaults to 1 s.
    #[must_use]
    pub fn life(mut self, life: Duration) -> Self {
        self.life = life;
        self
    }

    /// The most units a grant takes beyond its request's cost.
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The longest a grant is spent.
    pub fn life_span(&self) -> Duration {
        self.life
    }

    /// These grants for a policy of `burst` and a window of `window_ms`, or the field at
    /// fault: the life no longer than the window.
    pub(crate) fn validated(self, burst: u64, window_ms: u64) -> Result<Self, ConfigError> {
        if self.max == 0 {
            return Err(ConfigError::Zero {
                field: "grants.max",
            });
        }
        if self.max > burst {
            return Err(ConfigError::TooLarge {
                field: "grants.max",
                max: burst,
            });
        }
        if !self.life.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(ConfigError::NotWholeMillis {
                field: "grants.life",
            });
        }
        if self.life.is_zero() {
            return Err(ConfigError::Zero {
                field: "grants.life",
            });
        }
        let window = Duration::from_millis(window_ms);
        Ok(Self {
            life: self.life.min(window),
            ..self
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Algorithm, Ban, ConcurrencyPolicy, ConfigError, Grants, Policy, PolicySet};

    fn policy(name: &str, grants: Option<Grants>) -> crate::PolicyBuilder {
        let builder = Policy::builder(name, Algorithm::Gcra)
            .limit(100)
            .window(Duration::from_secs(10));
        match grants {
            Some(grants) => builder.grants(grants),
            None => builder,
        }
    }

    #[test]
    fn bad_grants_are_refused_naming_the_field() {
        let refused = |grants: Grants| policy("p", Some(grants)).build().unwrap_err();
        assert_eq!(
            refused(Grants::up_to(0)),
            ConfigError::Zero {
                field: "grants.max"
            }
        );
        assert_eq!(
            refused(Grants::up_to(101)),
            ConfigError::TooLarge {
                field: "grants.max",
                max: 100
            }
        );
        let odd = Grants::up_to(5).life(Duration::from_micros(1_500));
        assert_eq!(
            refused(odd),
            ConfigError::NotWholeMillis {
                field: "grants.life"
            }
        );
        assert_eq!(
            refused(Grants::up_to(5).life(Duration::ZERO)),
            ConfigError::Zero {
                field: "grants.life"
            }
        );
        let long = policy("p", Some(Grants::up_to(5).life(Duration::from_secs(60))));
        let long = long.build().expect("valid");
        assert_eq!(
            long.grants().map(|g| g.life_span()),
            Some(Duration::from_secs(10))
        );
    }

    #[test]
    fn grants_stay_out_of_what_must_reach_the_backend() {
        let grants = Some(Grants::up_to(5));
        let ban = Ban::new(3, Duration::from_secs(1), Duration::from_secs(60));
        let banning = policy("p", grants).ban(ban).build().unwrap_err();
        assert!(matches!(
            banning,
            ConfigError::Conflict {
                field: "grants",
                ..
            }
        ));
        let delayed = policy("p", grants)
            .max_delay(Duration::from_secs(1))
            .build();
        assert!(matches!(
            delayed.unwrap_err(),
            ConfigError::Conflict {
                field: "grants",
                ..
            }
        ));
        let (with, without) = (
            policy("a", grants).build().expect("valid"),
            policy("b", None).build().expect("valid"),
        );
        let mixed = PolicySet::new([with.clone(), without]).unwrap_err();
        assert!(matches!(
            mixed,
            ConfigError::Conflict {
                field: "grants",
                ..
            }
        ));
        let lease = ConcurrencyPolicy::builder("c")
            .limit(2)
            .build()
            .expect("valid");
        let leased = PolicySet::from(with).with_concurrency(lease).unwrap_err();
        assert!(matches!(
            leased,
            ConfigError::Conflict {
                field: "grants",
                ..
            }
        ));
    }

    #[test]
    fn a_set_grants_the_least_of_its_policies() {
        let a = policy("a", Some(Grants::up_to(50).life(Duration::from_secs(2))));
        let b = policy("b", Some(Grants::up_to(20).life(Duration::from_secs(5))));
        let set = PolicySet::new([a.build().expect("valid"), b.build().expect("valid")]);
        let grants = set.expect("valid").grants().expect("grants");
        assert_eq!(
            (grants.max(), grants.life_span()),
            (20, Duration::from_secs(2))
        );
    }
}
