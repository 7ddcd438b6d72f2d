//! What a backend is asked: a check ([`Query`]) and how it begins ([`Started`]), a settle
//! ([`Change`], [`Settlement`]), and an operator's read ([`Target`]). Words both backends share,
//! below the dispatcher that tells them apart.

use std::{future::Future, pin::Pin};

use crate::{
    Decisions, Error, KeyScheme, Policy, PolicySet,
    check_request::{Options, owned_keys},
    decisions::Reservation,
};

/// One check as a backend receives it.
#[derive(Clone, Copy)]
pub(crate) struct Query<'a> {
    /// How the policies' keys are named.
    pub(crate) keys: &'a KeyScheme,
    /// The policies checked together.
    pub(crate) set: &'a PolicySet,
    /// Whose check it is.
    pub(crate) client: &'a str,
    /// What the check asks for besides.
    pub(crate) options: &'a Options<'a>,
}

impl<'a> Query<'a> {
    /// Whose keys each policy uses.
    pub(crate) fn clients(&self) -> Clients<'a> {
        Clients {
            client: self.client,
            each: self.options.keys,
        }
    }
}

/// Whose keys a check's policies use: the check's client for each, or one key per policy
/// ([`CheckRequest::keys`](crate::CheckRequest::keys)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clients<'a> {
    pub(crate) client: &'a str,
    pub(crate) each: Option<&'a [&'a str]>,
}

impl<'a> Clients<'a> {
    /// The client key of the set's `i`th policy.
    pub(crate) fn of(&self, i: usize) -> &'a str {
        self.each
            .and_then(|each| each.get(i).copied())
            .unwrap_or(self.client)
    }

    /// The first policy's client key: where one key stands for the check (its Cluster slot,
    /// its request id's key).
    pub(crate) fn first(&self) -> &'a str {
        self.of(0)
    }
}

/// A check the backend has begun: decided already (in process), or an answer to wait for.
pub(crate) enum Started {
    Ready(Result<Decisions, Error>),
    /// Boxed: the Redis future is large, and callers should not carry (and move) its space.
    Waiting(Pin<Box<dyn Future<Output = Result<Decisions, Error>> + Send>>),
}

/// `decisions`, reserved if they answer an admitted reservation taken at `taken_at_us`.
pub(crate) fn stamp(
    decisions: Decisions,
    options: &Options<'_>,
    set: &PolicySet,
    client: &str,
    taken_at_us: Option<u64>,
) -> Decisions {
    match taken_at_us {
        Some(at_us) if options.reserve && decisions.allowed() && options.cost > 0 => decisions
            .reserved(Reservation {
                set: set.clone(),
                client: client.into(),
                cost: options.cost,
                at_us,
                once: options.once.map(|(id, _)| id.into()),
                each: owned_keys(options.keys),
                at_each: None,
            }),
        _ => decisions,
    }
}

/// How a settle changes what a reservation took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// Gives this much back.
    GiveBack(u64),
    /// Takes this much more, even past the limit.
    Charge(u64),
}

/// A [`Change`] as a backend applies it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Settlement {
    /// Gives back `cost` to the state the reservation taken at `at_us` counted in.
    GiveBack { cost: u64, at_us: u64 },
    /// Takes `cost` more now, even past the limit.
    Charge { cost: u64 },
    /// Gives back `cost` to the state in force now (a give-back check): a log's newest entries.
    Refund { cost: u64 },
}

impl Settlement {
    /// How much it gives back or charges.
    pub(crate) fn cost(self) -> u64 {
        match self {
            Self::GiveBack { cost, .. } | Self::Charge { cost } | Self::Refund { cost } => cost,
        }
    }

    /// This settlement of a part of a reservation that was taken at `at_us`.
    pub(crate) fn at(self, at_us: u64) -> Self {
        match self {
            Self::GiveBack { cost, .. } => Self::GiveBack { cost, at_us },
            other @ (Self::Charge { .. } | Self::Refund { .. }) => other,
        }
    }

    /// `change` of `reserved`, a charge at most `max` (what the algorithms count exactly).
    pub(crate) fn of(reserved: &Reservation, change: Change, max: u64) -> Self {
        match change {
            Change::GiveBack(cost) => Self::GiveBack {
                cost,
                at_us: reserved.at_us,
            },
            Change::Charge(cost) => Self::Charge {
                cost: cost.min(max),
            },
        }
    }
}

/// How an operator's read of one key is named: by client (the backend computes the key), or by
/// the Redis key a scan found.
pub(crate) enum Target<'a> {
    Client(&'a str),
    Key(String),
}

impl Target<'_> {
    /// The key `policy`'s state for this target lives under.
    pub(crate) fn key(&self, keys: &KeyScheme, policy: &Policy) -> String {
        match self {
            Self::Client(client) => keys.key(policy, client),
            Self::Key(key) => key.clone(),
        }
    }
}
