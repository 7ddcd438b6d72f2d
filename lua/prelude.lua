-- redlimit's scripts are this prelude, one or every algorithm's file, and an entry: one.lua
-- checks one policy, check.lua any requests of any policies (protocol.lua reads their
-- arguments), settle.lua gives a reservation back or charges more, inspect.lua reads without writing. Only
-- entries read KEYS and ARGV; everything else takes them as parameters.
--
-- An algorithm is four or five functions over plain numbers, so a check builds no closures or
-- plan tables; its file's NAME_functions() makes them once per call, as a table by name:
--   decide(key, limit, window_ms, burst, now_us, cost) -> allowed (1/0), remaining, reset (ms),
--     retry (ms: -1 when allowed, -2 when the cost can never pass), then up to four numbers
--     that take needs. It writes nothing.
--   take(key, limit, window_ms, burst, now_us, cost, a, b, c, d) -> remaining, reset (ms) after
--     consuming cost, which decide admitted.
--   settle(key, limit, window_ms, burst, now_us, cost, at_us) -> 1 when it gave back (at most
--     cost, only to the state a reservation taken at at_us counted in, never below empty), else
--     0; with at_us nil, takes cost now even past the limit (the client then waits for the debt
--     to refill) and returns 1.
--   alone(key, limit, window_ms, burst, now_us, cost, cost_text, slack_us) -> allowed,
--     remaining, reset, retry: a check of one policy decided and, admitted, taken in one,
--     replying as decide then take would. Its state is read once and an admission written
--     once, with nothing handed from decide to take: what a batched check costs Redis falls by
--     3-15% (callgrind). Where decide is alone with a ninth parameter, only_decide, set, it
--     writes nothing and returns what take needs.
--   untake(key, limit, window_ms, burst, now_us, cost) -> remaining, reset: what its alone took
--     at now_us given back when a later policy of the check denied, replying as decide would
--     have before it (fw, fwa, gcra and tb; a set of policies that all have one is decided by their
--     alones, see check.lua).
-- Stored state means the same under any limit or burst (counts and times, not what is left), so
-- a changed limit reads it as it stands.
-- GCRA's decide takes a seventh parameter, the slack (us) of delay mode. settle is made only in
-- a script that settles (SETTLES, set by the line that starts it): every function defined at
-- the top is made again at every run, and the others never call it.
--
-- All arithmetic is on integers below 2^53, where Lua's doubles are exact. redis.call turns a
-- number argument into its exact decimal (%.17g); Lua's own conversion, as in `..`, keeps only 14
-- significant digits, so a number joined into a string goes through str (or format's %d) first.
-- The paths every check takes hand redis.call texts (format('%d', n), kept per call), not n:
-- %.17g costs some 800 instructions more (callgrind, GCRA in batches of 64: 37,900 -> 37,350
-- per decision). A key of the wrong type fails its redis.call with WRONGTYPE, which the client
-- reports as corrupt state (only a fixed window, whose form follows its count, reads the other
-- form on WRONGTYPE).

local NEVER = -2
-- The protocol's flags (see protocol.lua), a request's (ONCE, RESERVE, TAKEN_AT, REPEAT, LEASE)
-- and a policy's (OVERRIDES, BAN, DELAY), and SET_STEP (a request's head is its flags plus
-- SET_STEP times its set's number) are locals the script's first lines declare, written from the
-- Rust constants of the protocol. Flags holds flag when flags % (2 * flag) >= flag: Redis's Lua
-- has no bit operators, and a call per test would cost more than the arithmetic.
-- Globals read once per script run, not at every use: redis.call is a global and a field read,
-- some 200 instructions of each command a check runs (callgrind, a ZCARD in a script: 3,361 ->
-- 3,167).
local floor, ceil, max, min, match, format = math.floor, math.ceil, math.max, math.min, string.match,
  string.format
local redis_call, redis_pcall = redis.call, redis.pcall

-- Corrupt state is an error, never a decision.
local function corrupt(key, why)
  error({ err = 'REDLIMIT_CORRUPT ' .. key .. ' ' .. why })
end

-- value, a stored non-negative integer of at most most digits; nil when absent.
local function digits(key, value, most)
  if value and (#value > most or not match(value, '^%d+$')) then
    corrupt(key, 'holds a non-integer value')
  end
  return value
end

-- The most entries a cache below keeps: where the functions outlive the call (a library's, see
-- library.lua), so do their caches, which then start again empty past it.
local KEPT = 512

-- Stores value at key in cache, which holds count entries, emptied first (in place: it is
-- shared by reference) when it holds KEPT. Returns how many it then holds.
local function keep(cache, count, key, value)
  if count == KEPT then
    for k in pairs(cache) do
      cache[k] = nil
    end
    count = 0
  end
  cache[key] = value
  return count + 1
end

-- A stored non-negative integer; nil when absent. Kept by text: a batch's clients share window
-- numbers and small counts, each then checked and converted once (a pattern match and a
-- conversion, some 1,200 instructions). A text of digits checked is converted by `+ 0`, which
-- runs one strtod (some 650 instructions), where tonumber runs two (lua_isnumber, then
-- lua_tonumber), here and wherever state is read.
local known_ints, ints_known = {}, 0
local function int(key, value)
  if not value then
    return nil
  end
  local n = known_ints[value]
  if not n then
    n = digits(key, value, 16) + 0
    ints_known = keep(known_ints, ints_known, value, n)
  end
  return n
end

-- The number of a protocol's text (a policy's limit, window or burst, a cost, a head), kept by
-- text: tonumber runs a strtod, some 1,100 instructions, a hit is one table read, and a call's
-- requests (and a library's calls, which keep it) repeat a few texts. Redis instructions per
-- lone check, the library kept per call and kept across calls, loaded side by side and called
-- in turn under callgrind: a fixed window 75,365 / 65,109 -> 70,190 / 56,590, one taking
-- overrides 140,752 / 138,419 -> 125,305 / 125,250; in batches of 64, 14,510 -> 14,267.
local known_numbers, numbers_known = {}, 0
local function number(text)
  local n = known_numbers[text]
  if n == nil then
    n = tonumber(text)
    if n ~= nil then
      numbers_known = keep(known_numbers, numbers_known, text, n)
    end
  end
  return n
end

-- An HMGET reply of two or three fields as integers: all present, or all nil.
local function ints(key, reply)
  local a, b, c = int(key, reply[1]), int(key, reply[2]), int(key, reply[3])
  if (a == nil) ~= (b == nil) or (reply[3] ~= nil and (a == nil) ~= (c == nil)) then
    corrupt(key, 'is missing a field')
  end
  return a, b, c
end

local function str(n)
  return format('%d', n)
end

-- A table of decimal texts: texts[n] is format('%d%s', n, suffix), formatted at its first use
-- and kept (up to KEPT), so a batch's fresh clients, which write the same state and TTL, format
-- them once: format costs some 1,900 instructions, a hit one table read.
local function texts(suffix)
  suffix = suffix or ''
  local count = 0
  return setmetatable({}, {
    __index = function(known, n)
      local text = format('%d%s', n, suffix)
      count = keep(known, count, n, text)
      return text
    end,
  })
end

-- texts by a second part: by[x][n] is format('%d%s', n, suffix_of(x)).
local function texts_by(suffix_of)
  local count = 0
  return setmetatable({}, {
    __index = function(known, x)
      local made = texts(suffix_of(x))
      count = keep(known, count, x, made)
      return made
    end,
  })
end

-- A state of two integers (GCRA's, the token bucket's), packed as big-endian 8-byte ones.
local PAIR = '>I8I8'

-- The two integers of v, a state of two: packed, or the text 'a:b' versions before stored;
-- nil, nil when it is neither. A packed pair is told from text by its numbers: a text's first
-- byte is a digit, read as packed far past 2^53.
local function pair_of(v)
  if #v == 16 then
    local a, b = struct.unpack(PAIR, v)
    if a < 2 ^ 53 and b < 2 ^ 53 then
      return a, b
    end
  end
  local a, b = match(v, '^(%d+):(%d+)$')
  if not a or #a > 16 or #b > 16 then
    return nil, nil
  end
  return a + 0, b + 0
end

-- A packer of pairs that keeps the last one packed: a call's first admissions share a time and
-- mostly a cost, so they pack one state once.
local function packer()
  local kept_a, kept_b, kept = nil, nil, nil
  return function(a, b)
    if a ~= kept_a or b ~= kept_b then
      kept_a, kept_b, kept = a, b, struct.pack(PAIR, a, b)
    end
    return kept
  end
end

-- An algorithm's tables of what this call wrote at each key (see gcra.lua), by key: two new
-- ones; or, over a key group's records (call given: groups.lua), two that keep nothing, as the
-- group's arithmetic changes the records without them.
local KEPT_NOTHING = { __newindex = function() end }
local function write_caches(call)
  if call then
    return setmetatable({}, KEPT_NOTHING), setmetatable({}, KEPT_NOTHING)
  end
  return {}, {}
end

-- The writes of a state of two numbers (PAIR) at keys: each key is written once, at the call's
-- end (flush, given the call's copies of what each key holds), with what it holds then, SET ...
-- PX reset ms (DEL where reset is false), however often the call checked it; over a key group's
-- records (call given) every write goes at once. A key a first admission wrote by its own read
-- (SET ... NX GET) waits for nothing. Redis instructions per decision, Zipf keys
-- (`redlimit-bench --mode instructions --decisions 40000 --only gcra,token_bucket`): a write a
-- check -> a hot client's later writes at the end: GCRA 24,160 -> 22,171, token bucket 25,809
-- -> 23,731; -> every write at the end (in one run beside the last): GCRA 22,426 -> 21,857, token
-- bucket 23,780 -> 23,109. Uniform keys, which seldom repeat in a call, within the runs' spread.
local function pair_writes(call, ttls)
  local pending = {}
  local function write(key, a, b, reset)
    if not call then
      pending[key] = reset
    elseif reset then
      call('SET', key, struct.pack(PAIR, a, b), 'PX', ttls[reset])
    else
      call('DEL', key)
    end
  end
  local function forget()
    pending = {}
  end
  local function flush(wrote_a, wrote_b)
    if next(pending) then
      for key, reset in pairs(pending) do
        if reset then
          redis_call('SET', key, struct.pack(PAIR, wrote_a[key], wrote_b[key]), 'PX', ttls[reset])
        else
          redis_call('DEL', key)
        end
      end
      pending = {}
    end
  end
  return write, flush, forget
end

-- An inspection's text of a state of two integers: for a key, 'a:b' of what state_of(key,
-- value) reads from its value (nil where the key is absent), as versions before stored it;
-- read by call (redis.call, or a key group's: groups.lua).
local function pair_text(state_of, call)
  return function(key)
    local v = call('GET', key)
    if not v then
      return v
    end
    local a, b = state_of(key, v)
    return str(a) .. ':' .. str(b)
  end
end

-- floor(a / b) for integers, corrected in case the double division rounded across an integer.
local function div(a, b)
  -- floor by arithmetic, not a call of math.floor (some 300 instructions).
  local q = a / b
  q = q - q % 1
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- now_us in ms, worked out once per time: a call's checks share one.
local ms_us, ms = nil, nil
local function ms_of(now_us)
  if now_us ~= ms_us then
    ms_us, ms = now_us, div(now_us, 1000)
  end
  return ms
end

-- ceil(a / b) for integers and b > 0, corrected alike: its own body, as a call to div would
-- cost as much again (a token bucket makes three a check).
local function ceil_div(a, b)
  local q = ceil(a / b)
  if q * b < a then
    return q + 1
  end
  return (q - 1) * b >= a and q - 1 or q
end

-- Whether the call's time is Redis TIME, not a client's `at`: state written at it lives no
-- longer than its TTL on that same clock (the anchored window's short form relies on that).
-- Set by clock, and false again at a call's start where the functions outlive it (library.lua).
local server_time, server_now_us = false, nil

-- The time of a call: `at` in microseconds, or Redis TIME when it is '' (then kept in
-- server_now_us, which a key group's deadlines read instead of asking Redis again).
local function clock(at)
  if at == '' then
    server_time = true
    local time = redis_call('TIME')
    server_now_us = time[1] * 1000000 + time[2]
    return server_now_us
  end
  return tonumber(at)
end

-- Raises err again as a call's error, its code first (Redis 7.0's pcall hands an error over as
-- its text alone): for an entry that caught it to write what it kept first.
local function raise(err)
  if type(err) ~= 'table' then
    err = { err = err }
  end
  error(err, 0)
end

-- Retries counted once: a request with an idempotency key answers what the first request with
-- it answered (remembered for its window, in ms).
local function seen_before(idem)
  local stored = redis_call('GET', idem)
  if not stored then
    return nil
  end
  local reply = {}
  for n in string.gmatch(stored, '%-?%d+') do
    reply[#reply + 1] = tonumber(n)
  end
  return reply
end

-- Remembers reply[first .. last], the request's own part of a batch's reply: for window ms,
-- or (window nil) for what is left of the time it was remembered for.
local function remember(idem, reply, first, last, window)
  local parts = {}
  for i = first, last do
    parts[#parts + 1] = str(reply[i])
  end
  if window then
    redis_call('SET', idem, table.concat(parts, ','), 'PX', window)
  else
    redis_call('SET', idem, table.concat(parts, ','), 'KEEPTTL')
  end
end


-- A check's reply: the integers of out as one MessagePack array (cmsgpack, in Redis's Lua), which
-- Redis sends as one bulk string and the client reads without a parser of RESP values, where an
-- array cost it a parsed value per integer: the bench's client process ran 3.40 -> 2.82 billion
-- instructions for 120,000 fixed-window decisions beside the naive script's (valgrind, the
-- saturation mode at N = 60,000, one round), while Redis runs some 200 more per decision
-- (16,204 -> 16,459 for a fixed window, --mode instructions). 8-byte integers by struct.pack
-- cost Redis some 450 more.
local function packed(out)
  return cmsgpack.pack(out)
end
