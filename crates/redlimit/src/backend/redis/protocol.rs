//! The Redis wire protocol, the client's half of `lua/protocol.lua`: every script call's `KEYS`
//! and `ARGV` are built here ([`encode`], [`renewal`], [`Call::keys`]), and every check's reply is
//! read here ([`decode`]). A call carries its policy sets once, then a list of requests (one
//! check, or a batch of them), each a fixed header of cost and flags naming its set, so no
//! script infers what it was sent from how many arguments there are.

use std::borrow::Cow;

use deadpool_redis::redis::{Cmd, FromRedisValue, ParsingError, RedisError, Value};
use smallvec::SmallVec;

use super::{scripts::Script, stored_state};
use crate::{
    Algorithm, ConcurrencyPolicy, Error, ErrorKind, KeyScheme, Policy,
    algorithm::{Denial, View},
    backend::answer::{Acquired, Answer, Inspected},
    policy::MAX_EXACT,
};

/// The protocol's numbers, each a Rust constant here and, through [`lua_constants!`], a Lua local
/// at the head of every script: written once, so the two sides cannot disagree.
macro_rules! constants {
    ($($(#[$doc:meta])* $name:ident = $value:literal;)*) => {
        $($(#[$doc])* const $name: u64 = $value;)*

        /// The protocol's numbers as Lua locals, for the head of every script.
        macro_rules! lua_constants {
            () => {
                concat!($("local ", stringify!($name), " = ", stringify!($value), "\n"),*)
            };
        }
        pub(crate) use lua_constants;
    };
}

constants! {
    // A request's flags: counted once per request id, reserved for a settle, a settle giving
    // back (carrying the time its reservation was taken at; without it a settle charges),
    // repeated (it stands for a run of requests alike but for their keys), holding a
    // concurrency limit's lease, a settle made at most once by its token, a grant.
    /// A request's flag: counted once per request id.
    ONCE = 1;
    /// A request's flag: reserved for a settle.
    RESERVE = 2;
    /// A request's flag: a settle giving back, carrying the time its reservation was taken at.
    TAKEN_AT = 4;
    /// A request's flag: it stands for a run of requests alike but for their keys.
    REPEAT = 8;
    /// A request's flag: it holds a concurrency limit's lease.
    LEASE = 16;
    /// A request's flag: a settle made at most once, however often it is sent, by its token's
    /// key: a give-back sent again after its answer was lost.
    GIVEN = 32;
    /// A request's flag: it takes up to this many more than its cost where every policy has
    /// room (a guard's grant, spent locally).
    GRANT = 64;
    /// A request's flag: a settle giving back its cost to the state in force now, replying
    /// each policy's quota after it (four integers, as a check's) instead of what changed.
    REFUND = 128;
    /// A head is its flags plus this many times its set's number.
    SET_STEP = 256;
    /// A policy's flag: it reads an override.
    OVERRIDES = 1;
    /// A policy's flag: it bans.
    BAN = 2;
    /// A policy's flag: it is in delay mode.
    DELAY = 4;
    /// A policy's flag: it keeps its state in its key group's key, a record among its group's
    /// (its record's id follows its other arguments).
    ONE_KEY = 8;
    /// A fixed window's count from which its state is a hash instead of one packed string,
    /// which a key group's record cannot hold (half the packing's 10^6).
    WINDOW_COUNTS = 500000;
}

/// The limit a grouped fixed window stays below (see `WINDOW_COUNTS`).
pub(crate) const MAX_GROUPED_WINDOW_LIMIT: u64 = WINDOW_COUNTS;

/// How many integers a lease's answer is: granted, free slots, wait.
const LEASE_REPLY: usize = 3;

/// The error code a script raises for a key it cannot read.
const CORRUPT: &str = "REDLIMIT_CORRUPT";
/// Redis's error code for a command on a key of another type.
const WRONGTYPE: &str = "WRONGTYPE";

/// One request of a call: a check of `policies` for `client` (or a settle of a reservation).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) policies: &'a [Policy],
    pub(crate) client: &'a str,
    pub(crate) cost: u64,
    /// A request id and how long (ms) its first answer is remembered.
    pub(crate) once: Option<(&'a str, u64)>,
    pub(crate) reserve: bool,
    /// A settle giving back: the time (us) its reservation was taken at (a settle without it
    /// charges).
    pub(crate) taken_at_us: Option<u64>,
    /// Whether the policies' overrides and bans are read: not for an inspection of a key a
    /// scan found, which has no client to read them for.
    pub(crate) marks: bool,
    /// One client key per policy, instead of `client` for all.
    pub(crate) each: Option<&'a [&'a str]>,
    /// A concurrency limit's lease to take when every policy admits.
    pub(crate) lease: Option<LeaseRequest<'a>>,
    /// A settle's token: made at most once however often it is sent.
    pub(crate) given: Option<&'a str>,
    /// The most an admitted check takes beyond its cost where every policy has room: a grant.
    pub(crate) grant: Option<u64>,
    /// A settle giving back its cost now, replying each policy's quota after it.
    pub(crate) refund: bool,
}

/// A lease a check asks for: of `policy`, named `id`, in the set at `key`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseRequest<'a> {
    pub(crate) policy: &'a ConcurrencyPolicy,
    pub(crate) key: &'a str,
    pub(crate) id: &'a str,
}

impl<'a> Request<'a> {
    /// A plain check of cost 1 of `policies` for `client`.
    pub(crate) fn new(policies: &'a [Policy], client: &'a str) -> Self {
        Self {
            policies,
            client,
            cost: 1,
            once: None,
            reserve: false,
            taken_at_us: None,
            marks: true,
            each: None,
            lease: None,
            given: None,
            grant: None,
            refund: false,
        }
    }

    /// The client key of its `i`th policy.
    fn client_of(&self, i: usize) -> &'a str {
        self.each
            .and_then(|each| each.get(i).copied())
            .unwrap_or(self.client)
    }

    /// The algorithm whose lean script of one policy can run it alone: one policy that reads
    /// no override and bans no one.
    pub(crate) fn lean(&self) -> Option<Algorithm> {
        match self.policies {
            [policy]
                if self.marks_of(policy) == 0
                    && policy.key_group().is_none()
                    && self.lease.is_none()
                    && self.grant.is_none() =>
            {
                Some(policy.algorithm())
            }
            _ => None,
        }
    }

    /// How many integers its reply is (see [`decode`]).
    pub(crate) fn reply_len(&self) -> usize {
        if self.refund {
            return 4 * self.policies.len();
        }
        let overridable = self
            .policies
            .iter()
            .filter(|p| self.marks_of(p) & OVERRIDES != 0)
            .count();
        4 * self.policies.len()
            + IN_FORCE * overridable
            + usize::from(self.reserve)
            + usize::from(self.grant.is_some())
            + if self.lease.is_some() { LEASE_REPLY } else { 0 }
    }

    /// The override and ban flags of `policy` in this request.
    fn marks_of(&self, policy: &Policy) -> u64 {
        if !self.marks {
            return 0;
        }
        let overrides = if policy.takes_overrides() {
            OVERRIDES
        } else {
            0
        };
        overrides | if policy.ban().is_some() { BAN } else { 0 }
    }
}

#[derive(Clone, PartialEq, Eq)]
enum Arg {
    Int(u64),
    Text(&'static str),
    Owned(Box<str>),
}

impl Arg {
    fn write(&self, cmd: &mut Cmd) {
        match self {
            Self::Int(n) => cmd.arg(*n),
            Self::Text(text) => cmd.arg(*text),
            Self::Owned(text) => cmd.arg(&**text),
        };
    }
}

/// A call's keys.
pub(crate) type Keys = SmallVec<[String; 1]>;
/// One policy set's arguments.
type SetArgs = SmallVec<[Arg; 6]>;
/// A call's policy sets, each once.
type Sets = SmallVec<[SetArgs; 1]>;

/// One script call: its `KEYS` and `ARGV`, built in one place.
///
/// A check of one policy, the common one, allocates nothing but its key: its key, its set's six
/// arguments and its request sit inline, where a vector of each took four allocations (a call
/// waiting in a batch is boxed, one; see the bench's README, "A check's call inline").
pub(crate) struct Call {
    pub(crate) keys: Keys,
    args: Args,
}

#[expect(
    clippy::large_enum_variant,
    reason = "a check's arguments inline are the point; a call waiting in a batch is boxed"
)]
enum Args {
    /// A lease's or a key command's arguments, as sent.
    Plain(Vec<Arg>),
    /// Checks (or settles): each policy set once, however many requests name it, so a batch
    /// of one route's checks sends its numbers once and each request as its cost and head.
    Requests {
        now_us: Option<u64>,
        sets: Sets,
        requests: SmallVec<[Encoded; 1]>,
    },
}

/// One request's arguments: its cost, flags and set (the set's number is its place in the
/// call, given when the call is sent), then the request id's window and the reservation's time
/// when its flags say so.
struct Encoded {
    cost: u64,
    flags: u64,
    set: usize,
    extra: Vec<Arg>,
}

/// The call checking (or settling) `requests` at `now_us` (`None`: Redis `TIME`).
pub(crate) fn encode(scheme: &KeyScheme, now_us: Option<u64>, requests: &[Request<'_>]) -> Call {
    let mut keys = Keys::new();
    let mut sets = Sets::new();
    let mut encoded = SmallVec::with_capacity(requests.len());
    for request in requests {
        let mut flags = 0;
        let mut extra = Vec::new();
        if let Some((id, window_ms)) = request.once {
            flags |= ONCE;
            extra.push(Arg::Int(window_ms));
            keys.push(scheme.once(
                request.policies,
                request.client_of(0),
                request.each,
                id,
                request.reserve,
            ));
        }
        if let Some(token) = request.given {
            flags |= GIVEN;
            keys.push(scheme.given(request.client_of(0), token));
        }
        if request.reserve {
            flags |= RESERVE;
        }
        if let Some(at_us) = request.taken_at_us {
            flags |= TAKEN_AT;
            extra.push(Arg::Int(at_us));
        }
        // Room for every policy's five numbers, inline for one policy: grown only for a
        // delay's, a key group's record or a ban's two.
        let mut set = SetArgs::with_capacity(1 + 5 * request.policies.len());
        set.push(Arg::Int(request.policies.len() as u64));
        for (i, policy) in request.policies.iter().enumerate() {
            let client = request.client_of(i);
            let marks = request.marks_of(policy);
            let delay = if policy.max_delay_ms() > 0 { DELAY } else { 0 };
            let grouped = if policy.key_group().is_some() {
                ONE_KEY
            } else {
                0
            };
            set.extend([
                Arg::Text(policy.algorithm().tag()),
                Arg::Int(policy.limit()),
                Arg::Int(policy.window_ms()),
                Arg::Int(policy.burst()),
                Arg::Int(marks | delay | grouped),
            ]);
            keys.push(scheme.key(policy, client));
            if marks & OVERRIDES != 0 {
                keys.push(scheme.override_key(policy, client));
            }
            if let Some(ban) = policy.ban().filter(|_| marks & BAN != 0) {
                set.extend(ban.millis().unwrap_or_default().map(Arg::Int));
                keys.push(scheme.strikes_key(policy, client));
                keys.push(scheme.ban_key(policy, client));
            }
            if delay != 0 {
                set.push(Arg::Int(policy.max_delay_ms()));
            }
            if grouped != 0 {
                set.push(Arg::Int(policy.record_id()));
            }
        }
        if let Some(lease) = request.lease {
            flags |= LEASE;
            extra.extend([
                Arg::Int(lease.policy.limit()),
                Arg::Int(lease.policy.lease_ttl_ms()),
                Arg::Owned(lease.id.into()),
            ]);
            keys.push(lease.key.to_owned());
        }
        if request.refund {
            flags |= REFUND;
        }
        if let Some(grant) = request.grant {
            flags |= GRANT;
            extra.push(Arg::Int(grant.min(MAX_EXACT)));
        }
        encoded.push(Encoded {
            // Any cost above 2^53 is as impossible as 2^53 itself, and stays exact in Lua.
            cost: request.cost.min(MAX_EXACT),
            flags,
            set: set_of(&mut sets, Cow::Owned(set)),
            extra,
        });
    }
    Call {
        keys,
        args: Args::Requests {
            now_us,
            sets,
            requests: encoded,
        },
    }
}

/// The place of `set` in `sets`, added (copied, if borrowed) when it is not there yet: a batch
/// of one route's checks copies its set once, not once per check.
fn set_of(sets: &mut Sets, set: Cow<'_, SetArgs>) -> usize {
    sets.iter().position(|s| *s == *set).unwrap_or_else(|| {
        sets.push(set.into_owned());
        sets.len() - 1
    })
}

/// The call renewing lease `id` for `ttl_ms` in the set at `key`.
pub(crate) fn renewal(key: String, ttl_ms: u64, id: &str) -> Call {
    Call {
        keys: Keys::from_buf([key]),
        args: Args::Plain(vec![
            Arg::Text(""),
            Arg::Int(0),
            Arg::Int(ttl_ms),
            Arg::Owned(id.into()),
        ]),
    }
}

/// What an override's key holds: the numbers a client is checked by and the key its state
/// lives under with them (read by `marks.lua`'s `overridden`).
pub(crate) fn override_value(overridden: &Policy, key: &str) -> String {
    format!(
        "{},{},{},{key}",
        overridden.limit(),
        overridden.window_ms(),
        overridden.burst(),
    )
}

impl Call {
    /// One call of the requests of `calls` (each [`encode`]d alone, all at one time), in order.
    /// Their keys are moved into it, not copied: each call keeps an empty key in each key's
    /// place until [`give_back_keys`](Self::give_back_keys) returns them.
    pub(crate) fn joined<'a>(calls: impl ExactSizeIterator<Item = &'a mut Call>) -> Self {
        // Sized for a batch of one-policy checks, the common one, so they are not regrown.
        let (mut keys, mut sets, mut requests, mut time) = (
            Keys::with_capacity(calls.len()),
            Sets::new(),
            SmallVec::with_capacity(calls.len()),
            None,
        );
        for call in calls {
            keys.extend(call.keys.iter_mut().map(std::mem::take));
            if let Args::Requests {
                now_us,
                sets: own,
                requests: theirs,
            } = &call.args
            {
                time = *now_us;
                for request in theirs {
                    requests.push(Encoded {
                        set: set_of(&mut sets, Cow::Borrowed(&own[request.set])),
                        extra: request.extra.clone(),
                        ..*request
                    });
                }
            }
        }
        Self {
            keys,
            args: Args::Requests {
                now_us: time,
                sets,
                requests,
            },
        }
    }

    /// Hands `calls`, those [`joined`](Self::joined) was made of and in its order, their keys
    /// back: for calls sent again alone.
    pub(crate) fn give_back_keys<'a>(self, calls: impl Iterator<Item = &'a mut Call>) {
        let mut keys = self.keys.into_iter();
        for place in calls.flat_map(|call| call.keys.iter_mut()) {
            if let Some(key) = keys.next() {
                *place = key;
            }
        }
    }

    /// A check's time, equal for calls that may be joined.
    pub(crate) fn time(&self) -> Option<u64> {
        match &self.args {
            Args::Requests { now_us, .. } => *now_us,
            Args::Plain(_) => None,
        }
    }

    /// Roughly the bytes it sends, to bound a batch.
    pub(crate) fn size(&self) -> usize {
        let keys: usize = self.keys.iter().map(|k| k.len() + 8).sum();
        let args = match &self.args {
            Args::Plain(args) => args.len(),
            Args::Requests { sets, requests, .. } => {
                sets.iter().map(|set| set.len()).sum::<usize>()
                    + requests.iter().map(|r| 2 + r.extra.len()).sum::<usize>()
            }
        };
        keys + args * 8
    }

    /// A command about `keys`, all in one slot, with no arguments of the protocol's.
    pub(crate) fn keys(keys: Vec<String>) -> Self {
        Self {
            keys: Keys::from_vec(keys),
            args: Args::Plain(Vec::new()),
        }
    }

    /// `EVALSHA sha …`: the one command of a check at steady state where functions are refused.
    pub(crate) fn evalsha(&self, script: &Script) -> Cmd {
        self.command("EVALSHA", script.sha1())
    }

    /// `EVAL source …`: for a node that lacks the script (`NOSCRIPT`: a restart, a flush, a
    /// freshly promoted replica). It runs the check and caches the script on that very node,
    /// which is the one owning the keys.
    pub(crate) fn eval(&self, script: &Script) -> Cmd {
        self.command("EVAL", script.source())
    }

    /// `name script …`: the call as a command of `name` (`FCALL`, `EVAL`, `EVALSHA`) naming
    /// `script` (a function, a source, a SHA-1).
    pub(crate) fn command(&self, name: &str, script: &str) -> Cmd {
        // Sized once, not grown by doubling as its arguments are written: with the batch's
        // vectors sized alike, the bench's process ran 2,824,652,562 -> 2,798,127,383
        // instructions (valgrind, `--mode saturation --decisions 60000 --rounds 1 --only
        // fixed_window`), some 220 fewer per decision.
        let size = self.size();
        let mut cmd = Cmd::with_capacity(4 + size / 8, name.len() + script.len() + size);
        cmd.arg(name)
            .arg(script)
            .arg(self.keys.len())
            .arg(self.keys.as_slice());
        match &self.args {
            Args::Plain(args) => args.iter().for_each(|arg| arg.write(&mut cmd)),
            Args::Requests {
                now_us,
                sets,
                requests,
            } => {
                now_us.map_or(Arg::Text(""), Arg::Int).write(&mut cmd);
                cmd.arg(sets.len());
                sets.iter().flatten().for_each(|arg| arg.write(&mut cmd));
                let mut rest = &requests[..];
                while let [request, ..] = rest {
                    // A run of requests without flags of one cost and set (a batch of one
                    // route's checks) goes as one head and its length: Redis makes a Lua
                    // string of every argument, some 750 instructions each.
                    let run = if request.flags == 0 {
                        rest.iter()
                            .take_while(|r| {
                                (r.flags, r.cost, r.set) == (0, request.cost, request.set)
                            })
                            .count()
                    } else {
                        1
                    };
                    let repeat = if run > 1 { REPEAT } else { 0 };
                    // The head: the flags below SET_STEP, the set's number (from 1) above.
                    let head = request.flags + repeat + SET_STEP * (request.set as u64 + 1);
                    cmd.arg(request.cost).arg(head);
                    request.extra.iter().for_each(|arg| arg.write(&mut cmd));
                    if run > 1 {
                        cmd.arg(run);
                    }
                    rest = &rest[run..];
                }
            }
        }
        cmd
    }

    /// Whether `err` says a key of this call holds corrupt state that deleting the call's keys
    /// repairs: never for a call of several requests, whose keys hold other clients' counts.
    pub(crate) fn is_repairable(&self, err: &RedisError) -> bool {
        let one = match &self.args {
            Args::Plain(_) => true,
            Args::Requests { requests, .. } => requests.len() == 1,
        };
        one && matches!(err.code(), Some(CORRUPT | WRONGTYPE))
    }

    /// Classifies a Redis error of this call: corrupt state (the script's own error, or a key
    /// of the wrong type), a timeout, or a backend failure.
    pub(crate) fn error(&self, err: RedisError) -> Error {
        if err.code() == Some(CORRUPT) {
            let detail = err.detail().unwrap_or_default();
            let detail = detail.split(" script:").next().unwrap_or(detail).to_owned();
            return Error::new(
                ErrorKind::CorruptState,
                format!("corrupt limiter state: {detail}"),
            );
        }
        if err.code() == Some(WRONGTYPE) {
            return Error::new(
                ErrorKind::CorruptState,
                format!(
                    "corrupt limiter state: {} holds the wrong type of value",
                    self.keys.join(" or ")
                ),
            );
        }
        if let Some(cause) = super::refusal::cause(&err) {
            return Error::new(ErrorKind::Backend, format!("redis refused: {cause}"))
                .with_source(err);
        }
        let kind = if err.is_timeout() {
            ErrorKind::Timeout
        } else {
            ErrorKind::Backend
        };
        Error::new(kind, "redis").with_source(err)
    }
}

/// A script's integers: a check's reply, one MessagePack array of integers (see `packed` in
/// `lua/prelude.lua`), or another script's array of integers.
pub(crate) struct Integers(pub(crate) Vec<i64>);

impl FromRedisValue for Integers {
    fn from_redis_value(value: Value) -> Result<Self, ParsingError> {
        match value {
            Value::BulkString(bytes) => unpack(&bytes).map(Self).ok_or_else(|| {
                format!(
                    "a reply of {} bytes that is not packed integers",
                    bytes.len()
                )
                .into()
            }),
            other => Vec::from_redis_value(other).map(Self),
        }
    }
}

/// The integers of a MessagePack array of integers, as Redis's cmsgpack writes them; `None`
/// for anything else, or for bytes left over.
fn unpack(bytes: &[u8]) -> Option<Vec<i64>> {
    let mut rest = bytes;
    let mut take = |n: usize| -> Option<u64> {
        let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
        rest = tail;
        Some(
            head.iter()
                .fold(0, |value, &byte| value << 8 | u64::from(byte)),
        )
    };
    let len = match take(1)? {
        head @ 0x90..=0x9f => head - 0x90,
        0xdc => take(2)?,
        0xdd => take(4)?,
        _ => return None,
    };
    // Each integer is at least a byte: a length past the bytes is a lie, not an allocation.
    let mut integers = Vec::with_capacity(usize::try_from(len).ok()?.min(bytes.len()));
    for _ in 0..len {
        // Two's complement reinterpretation is the point of each cast.
        #[allow(clippy::cast_possible_wrap, clippy::cast_possible_truncation)]
        let integer = match take(1)? {
            head @ 0x00..=0x7f => head as i64,
            head @ 0xe0..=0xff => i64::from(head as u8 as i8),
            0xcc => take(1)? as i64,
            0xcd => take(2)? as i64,
            0xce => take(4)? as i64,
            0xcf => i64::try_from(take(8)?).ok()?,
            0xd0 => i64::from(take(1)? as u8 as i8),
            0xd1 => i64::from(take(2)? as u16 as i16),
            0xd2 => i64::from(take(4)? as u32 as i32),
            0xd3 => take(8)? as i64,
            _ => return None,
        };
        integers.push(integer);
    }
    rest.is_empty().then_some(integers)
}

/// How many integers a reply's numbers in force of one overridable policy are.
const IN_FORCE: usize = 3;

/// The numbers a policy that takes overrides checked a client by: the policy's, or the
/// client's override's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InForce {
    pub(crate) limit: u64,
    pub(crate) window_ms: u64,
    pub(crate) burst: u64,
}

/// A request's reply, read.
#[derive(Debug)]
pub(crate) struct Reply {
    /// One per policy.
    pub(crate) answers: Vec<Answer>,
    /// The numbers in force for each policy that takes overrides, in order.
    pub(crate) in_force: Vec<InForce>,
    /// A reservation's time; `None` for a retry, which took nothing.
    pub(crate) taken_at_us: Option<u64>,
    /// What a grant took beyond the request's cost.
    pub(crate) granted: u64,
    /// The answer of the request's concurrency limit, when it asked for a lease.
    pub(crate) lease: Option<Acquired>,
}

/// The Lua source of the script a check of `policies` for one client runs.
pub(crate) fn source_of(policies: &[Policy]) -> &'static str {
    super::scripts::source_for(Request::new(policies, "").lean())
}

/// Reads the reply to `request`, a check's part of its call's reply: four integers per policy,
/// then the numbers in force (limit, window, burst) of each policy that reads an override, then
/// for a reservation the time it was taken at, then for a grant what it took beyond the cost,
/// then a lease's answer when it asked for one.
pub(crate) fn decode(reply: &[i64], request: &Request<'_>) -> Result<Reply, Error> {
    let leased = if request.lease.is_some() {
        LEASE_REPLY
    } else {
        0
    };
    if reply.len() != request.reply_len() {
        return Err(short_reply(reply.len()));
    }
    if request.refund {
        return Ok(Reply {
            answers: reply
                .chunks_exact(4)
                .map(answer)
                .collect::<Result<_, _>>()?,
            in_force: Vec::new(),
            taken_at_us: None,
            granted: 0,
            lease: None,
        });
    }
    let grant = usize::from(request.grant.is_some());
    let overridable =
        reply.len() - 4 * request.policies.len() - usize::from(request.reserve) - grant - leased;
    debug_assert_eq!(overridable % IN_FORCE, 0);
    let (answers, after) = reply.split_at(4 * request.policies.len());
    let (limits, after) = after.split_at(overridable);
    let (taken, after) = after.split_at(usize::from(request.reserve));
    let (granted, lease) = after.split_at(grant);
    Ok(Reply {
        answers: answers
            .chunks_exact(4)
            .map(answer)
            .collect::<Result<_, _>>()?,
        in_force: limits
            .chunks_exact(IN_FORCE)
            .map(|numbers| {
                let [limit, window_ms, burst] =
                    [0, 1, 2].map(|i| u64::try_from(numbers[i]).unwrap_or(0));
                InForce {
                    limit,
                    window_ms,
                    burst,
                }
            })
            .collect(),
        taken_at_us: taken
            .first()
            .and_then(|&at| u64::try_from(at).ok())
            .filter(|&at| at > 0),
        granted: granted
            .first()
            .and_then(|&n| u64::try_from(n).ok())
            .unwrap_or(0),
        lease: (leased > 0).then(|| acquired(lease)).transpose()?,
    })
}

/// Reads a lease's answer: granted (1/0), free slots after, the wait (ms) until the earliest
/// lease expires.
fn acquired(reply: &[i64]) -> Result<Acquired, Error> {
    let &[granted, free, wait] = reply else {
        return Err(short_reply(reply.len()));
    };
    Ok(Acquired {
        granted: granted == 1,
        free: u64::try_from(free).unwrap_or(0),
        wait_ms: u64::try_from(wait).unwrap_or(0),
    })
}

/// Reads a settle's reply: per request, how many of its policies changed.
pub(crate) fn decode_settled(reply: &[i64]) -> Vec<u64> {
    reply
        .iter()
        .map(|&n| u64::try_from(n).unwrap_or(0))
        .collect()
}

/// The inspect script's reply (`lua/inspect.lua`): the answer's four integers, the key's PTTL,
/// its state as field and value pairs, the limit in force, the key read, whether an override
/// was in force, the window in force and the time of the inspection (ms).
type InspectReply = (
    i64,
    i64,
    i64,
    i64,
    i64,
    Vec<String>,
    i64,
    String,
    i64,
    u64,
    u64,
);

/// Reads the inspect script's reply for the key `key` of `algorithm`.
pub(crate) fn decode_inspected(
    reply: InspectReply,
    algorithm: Algorithm,
) -> Result<Inspected, Error> {
    let (allowed, remaining, reset, retry, pttl, state, limit, read, overridden, window, now_ms) =
        reply;
    let answer = answer(&[allowed, remaining, reset, retry])?;
    Ok(Inspected {
        answer,
        ttl_ms: u64::try_from(pttl).ok(),
        state: stored_state::named(algorithm, state, window, now_ms),
        overridden: (overridden == 1).then(|| (u64::try_from(limit).unwrap_or(0), read)),
    })
}

fn short_reply(integers: usize) -> Error {
    Error::new(
        ErrorKind::Backend,
        format!("script replied {integers} integers, not what its requests ask for"),
    )
}

/// One policy's four integers: allowed (1, 0, or 2 for a ban's denial), remaining, reset (ms),
/// retry (ms; -1 when admitted without delay, the wait for its slot in delay mode, -2 never).
fn answer(four: &[i64]) -> Result<Answer, Error> {
    let &[allowed, remaining, reset_ms, retry] = four else {
        return Err(short_reply(four.len()));
    };
    let unsigned = |n: i64| {
        u64::try_from(n)
            .map_err(|_| Error::new(ErrorKind::Backend, format!("script replied a negative {n}")))
    };
    let view = View {
        remaining: unsigned(remaining)?,
        reset_ms: unsigned(reset_ms)?,
    };
    Ok(match (allowed, retry) {
        (1, wait) => Answer::allowed(view, u64::try_from(wait).unwrap_or(0)),
        (2, ms) => Answer::banned(view, unsigned(ms)?),
        (_, -2) => Answer::denied(view, Denial::Never),
        (_, ms) => Answer::denied(view, Denial::RetryAfterMs(unsigned(ms)?)),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use deadpool_redis::redis::Arg as Sent;

    use super::*;

    #[test]
    fn packed_integers_of_every_width_are_read_and_anything_else_refused() {
        let mut array16 = vec![0xdc, 0x00, 0x10];
        array16.extend([0x05; 16]);
        let cases: &[(&[u8], Option<Vec<i64>>)] = &[
            (&[0x90], Some(vec![])),
            (&[0x94, 0x01, 0x7f, 0xff, 0xe0], Some(vec![1, 127, -1, -32])),
            (
                &[
                    0x93, 0xcc, 0xff, 0xcd, 0x01, 0x00, 0xce, 0x00, 0x01, 0x00, 0x00,
                ],
                Some(vec![255, 256, 65_536]),
            ),
            (
                &[
                    0x92, 0xcf, 0x00, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xd0, 0x80,
                ],
                Some(vec![(1 << 53) - 1, -128]),
            ),
            (
                &[
                    0x93, 0xd1, 0xff, 0x00, 0xd2, 0xff, 0xff, 0x00, 0x00, 0xd3, 0xff, 0xff, 0xff,
                    0xff, 0xff, 0xff, 0xff, 0xfe,
                ],
                Some(vec![-256, -65_536, -2]),
            ),
            (&array16, Some(vec![5; 16])),
            // A double, a string, a short array, bytes left over, a length past the bytes,
            // a u64 past i64, and not an array.
            (&[0x91, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0], None),
            (&[0x91, 0xa1, b'x'], None),
            (&[0x92, 0x01], None),
            (&[0x91, 0x01, 0x01], None),
            (&[0xdd, 0xff, 0xff, 0xff, 0xff], None),
            (&[0x91, 0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0], None),
            (&[0x01], None),
            (&[], None),
        ];
        for (bytes, integers) in cases {
            assert_eq!(&unpack(bytes), integers, "{bytes:02x?}");
        }
    }

    fn policy(name: &str, algorithm: Algorithm, limit: u64) -> Policy {
        Policy::builder(name, algorithm)
            .limit(limit)
            .window(Duration::from_secs(60))
            .build()
            .expect("a valid policy")
    }

    /// ARGV of `call`'s `EVAL` as text: what follows the script, the key count and the keys.
    fn argv(call: &Call) -> Vec<String> {
        call.command("EVAL", "")
            .args_iter()
            .skip(3 + call.keys.len())
            .map(|arg| match arg {
                Sent::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => String::new(),
            })
            .collect()
    }

    #[test]
    fn a_joined_call_sends_each_policy_set_once_and_each_request_as_cost_and_head() {
        let scheme = KeyScheme::new("t").expect("a prefix");
        let (a, b) = (
            [policy("a", Algorithm::FixedWindow, 5)],
            [policy("b", Algorithm::Gcra, 7)],
        );
        let one = |policies: &[Policy], client: &str, cost: u64| {
            let request = Request {
                cost,
                ..Request::new(policies, client)
            };
            encode(&scheme, Some(42), &[request])
        };
        let mut calls = [one(&a, "x", 1), one(&b, "y", 2), one(&a, "z", 3)];
        let keys: Vec<Keys> = calls.iter().map(|call| call.keys.clone()).collect();
        let joined = Call::joined(calls.iter_mut());
        assert_eq!(joined.keys.len(), 3);
        assert_eq!(joined.time(), Some(42));
        // Moved, not copied: each call holds an empty key in each place until given them back.
        assert!(
            calls
                .iter()
                .all(|call| call.keys.iter().all(String::is_empty))
        );
        let sent: Vec<String> = joined.keys.to_vec();
        assert_eq!(sent, keys.iter().flatten().cloned().collect::<Vec<_>>());
        assert_eq!(
            argv(&joined),
            [
                "42", "2", // the time, two sets
                "1", "fw", "5", "60000", "5", "0", // set 1: a
                "1", "gcra", "7", "60000", "7", "0", // set 2: b
                "1", "256", "2", "512", "3", "256", // cost and head (flags + 256 × set) each
            ]
        );
        joined.give_back_keys(calls.iter_mut());
        assert!(calls.iter().map(|call| &call.keys).eq(&keys));
    }

    #[test]
    fn a_run_of_requests_alike_but_for_their_keys_is_sent_as_one_head_and_its_length() {
        let scheme = KeyScheme::new("t").expect("a prefix");
        let (a, b) = (
            [policy("a", Algorithm::FixedWindow, 5)],
            [policy("b", Algorithm::Gcra, 7)],
        );
        let one = |policies: &[Policy], client: &str, once: Option<(&str, u64)>| {
            let request = Request {
                once,
                ..Request::new(policies, client)
            };
            encode(&scheme, None, &[request])
        };
        let mut calls = [
            one(&a, "w", None),
            one(&a, "x", None),
            one(&a, "y", None),
            one(&b, "y", None),
            one(&b, "z", Some(("id", 9))),
            one(&b, "z", Some(("id", 9))),
            one(&a, "z", None),
        ];
        let joined = Call::joined(calls.iter_mut());
        assert_eq!(joined.keys.len(), 9);
        assert_eq!(
            &argv(&joined)[14..],
            [
                "1", "264", "3", // three of set 1: REPEAT + 256, then the run's length
                "1", "512", // one of set 2
                "1", "513", "9", "1", "513", "9", // request ids are never a run
                "1", "256", // set 1 again
            ]
        );
    }

    #[test]
    fn a_check_of_one_policy_is_encoded_inline_but_for_its_key() {
        let scheme = KeyScheme::new("t").expect("a prefix");
        let one = [policy("a", Algorithm::FixedWindow, 5)];
        let call = encode(&scheme, None, &[Request::new(&one, "c")]);
        let Args::Requests { sets, requests, .. } = &call.args else {
            panic!("a check's arguments")
        };
        assert!(!call.keys.spilled() && !sets.spilled() && !requests.spilled());
        assert!(
            sets.iter().all(|set| !set.spilled()),
            "its set's six arguments"
        );
    }

    #[test]
    fn a_lone_policy_without_overrides_or_bans_is_lean() {
        let (a, b) = (
            policy("a", Algorithm::FixedWindow, 10),
            policy("b", Algorithm::Gcra, 10),
        );
        let one = [a.clone()];
        let lone = Request::new(&one, "c");
        assert_eq!(lone.lean(), Some(Algorithm::FixedWindow));
        let reserved = Request {
            reserve: true,
            once: Some(("id", 1_000)),
            ..lone
        };
        assert_eq!(
            reserved.lean(),
            Some(Algorithm::FixedWindow),
            "ids and reservations do not need the general script"
        );
        let two = [a, b];
        assert_eq!(Request::new(&two, "c").lean(), None);
        let banning = [Policy::builder("ban", Algorithm::FixedWindow)
            .limit(10)
            .window(Duration::from_secs(60))
            .ban(crate::Ban::new(
                3,
                Duration::from_secs(60),
                Duration::from_secs(600),
            ))
            .build()
            .expect("a valid policy")];
        assert_eq!(Request::new(&banning, "c").lean(), None);
        assert_eq!(source_of(&two), super::super::CHECK);
    }
}
