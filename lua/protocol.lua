-- The wire protocol of check.lua, settle.lua and inspect.lua, written by the client in
-- src/backend/redis/protocol.rs.
--
-- ARGV: the time (us, or '' for Redis TIME); the number of policy sets, then each set: its
-- number of policies, then each policy: algorithm, limit, window (ms), burst, its flags
-- (OVERRIDES, BAN, DELAY, ONE_KEY), then the ban's after, within, for and max (ms) when BAN, the
-- longest delay (ms) when DELAY, its record's id in its key group's key when ONE_KEY (the key
-- given for it is then the group's: see groups.lua). Then each request, to the end: its cost,
-- its head (its flags ONCE, RESERVE, TAKEN_AT, REPEAT, LEASE, GIVEN, GRANT, REFUND, plus
-- SET_STEP times its set's number), the request id's window (ms) when ONCE, the reservation's
-- time (us) when TAKEN_AT, its concurrency limit's limit, lease TTL (ms) and lease id when
-- LEASE, the most it takes beyond its cost where every policy has room when GRANT, and when
-- REPEAT how many requests it stands for: a run of requests of one cost and set, without other
-- flags, whose keys follow one another.
-- KEYS: each request's request id key when ONCE, its token's key when GIVEN (a settle made at
-- most once: the key is set by the first), then its set's policies' in order, each its
-- key, its override key when OVERRIDES, and its strikes and ban keys when BAN, then its lease
-- set's key when LEASE.
-- Reply: a check's (check.lua, one.lua) is its integers as one MessagePack array (packed, in
-- prelude.lua); settle.lua's is an array of integers; inspect.lua's is described there.

-- The call's policy sets, read once per call: each set a list of policies, each policy a table
-- of its algorithm's functions and numbers, plain when it is one policy without overrides or
-- bans; and where the requests begin.
local function read_sets(argv)
  local sets, a = {}, 3
  for s = 1, number(argv[2]) do
    local set = {}
    for i = 1, number(argv[a]) do
      local name, flags = argv[a + 1], number(argv[a + 5])
      local grouped = flags % (2 * ONE_KEY) >= ONE_KEY
      local fns = algorithm(name, grouped)
      local p = {
        decide = fns.decide, take = fns.take, settle = fns.settle, alone = fns.alone, untake = fns.untake,
        refund = fns.refund, text = fns.text,
        limit = number(argv[a + 2]),
        window = number(argv[a + 3]), burst = number(argv[a + 4]),
        overrides = flags % (2 * OVERRIDES) >= OVERRIDES,
      }
      a = a + 5
      if flags % (2 * BAN) >= BAN then
        p.ban = { number(argv[a + 1]), number(argv[a + 2]), number(argv[a + 3]), number(argv[a + 4]) }
        a = a + 4
      end
      if flags % (2 * DELAY) >= DELAY then
        p.slack = number(argv[a + 1]) * 1000
        a = a + 1
      end
      -- Its record's id in its key group's key, and the calls its state is read and written by.
      p.call = redis_call
      if grouped then
        p.group, p.call = number(argv[a + 1]), vcall
        p.kind = (name == 'fw' or name == 'fwa') and 'text' or 'pair'
        -- What decide_group (groups.lua) reads of an aligned fixed window, GCRA or token bucket.
        p.window_numbers = name == 'fw'
        p.interval = name == 'gcra' and ceil_div(p.window * 1000, p.limit) or nil
        p.bucket = name == 'tb'
        a = a + 1
      end
      set[i] = p
    end
    set.plain = #set == 1 and not set[1].overrides and not set[1].ban and not set[1].group
    -- Several policies, each decided and taken by its alone, given back by its untake on a
    -- denial (alone, below).
    -- Grouped aligned fixed windows, GCRA and token buckets (and no other policy: arithmetic),
    -- beside policies that could be decided alone (runs): decided on their records' numbers
    -- (groups.lua).
    local alone, arithmetic, some, runs = true, true, false, true
    for i = 1, #set do
      local p = set[i]
      local numbers = p.window_numbers or p.bucket or p.interval ~= nil
      local takes_alone = p.untake ~= nil and not p.overrides and not p.ban
      alone = alone and takes_alone
      arithmetic, some = arithmetic and numbers, some or numbers
      runs = runs and (numbers or (takes_alone and not p.group))
    end
    set.alone, set.arithmetic, set.runs = alone and #set > 1, arithmetic, some and runs
    sets[s] = set
    a = a + 1
  end
  return sets, a
end

-- The request whose arguments start at argv[a]: its cost, its set's number, whether it is a
-- reservation, the request id's window (ms) or nil, the reservation's time (us) or nil, where
-- the next request begins, how many requests it stands for, its lease (limit, ttl, id) or
-- nil, whether it is made at most once by a token (GIVEN), the most it takes beyond its cost
-- (GRANT) or nil, and whether it is a refund (REFUND).
local function read_request(argv, a)
  local cost, head = number(argv[a]), number(argv[a + 1])
  local flags = head % SET_STEP
  a = a + 2
  local once_window, taken_at, repeats = nil, nil, 1
  if flags % (2 * ONCE) >= ONCE then
    once_window = argv[a]
    a = a + 1
  end
  if flags % (2 * TAKEN_AT) >= TAKEN_AT then
    taken_at = tonumber(argv[a])
    a = a + 1
  end
  local lease = nil
  if flags % (2 * LEASE) >= LEASE then
    lease = { limit = number(argv[a]), ttl = number(argv[a + 1]), id = argv[a + 2] }
    a = a + 3
  end
  local grant = nil
  if flags % (2 * GRANT) >= GRANT then
    grant = number(argv[a])
    a = a + 1
  end
  if flags % (2 * REPEAT) >= REPEAT then
    repeats = number(argv[a])
    a = a + 1
  end
  return cost, (head - flags) / SET_STEP, flags % (2 * RESERVE) >= RESERVE, once_window, taken_at, a, repeats,
    lease, flags % (2 * GIVEN) >= GIVEN, grant, flags % (2 * REFUND) >= REFUND
end

-- The key and numbers policy p checks its client by (an override's, when it reads one in
-- force), its strikes and ban keys, and where the next policy's keys begin. With skip, only
-- where the next begins, reading nothing from Redis.
local function policy_keys(p, keys, k, skip)
  local key, limit, window, burst = keys[k], p.limit, p.window, p.burst
  if p.group then
    key = virtual(key, p.group, p.kind)
  end
  k = k + 1
  if p.overrides then
    if not skip then
      key, limit, window, burst = marks_of().overridden(keys[k], key, limit, window, burst)
    end
    k = k + 1
  end
  if p.ban then
    return key, limit, window, burst, keys[k], keys[k + 1], k + 2
  end
  return key, limit, window, burst, nil, nil, k
end
