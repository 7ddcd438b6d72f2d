-- Key groups: the policies of one group keep a client's states in one key, a record each, so
-- that a check of several of them reads the key once and writes it once (a key each cost each
-- policy its own commands and its own lookup in Redis's keyspace).
--
-- A group's key holds its expiry (ms of Redis time, -1 for none), then records of four numbers:
-- its policy's id, its deadline (ms of Redis time, -1 for none) and its state's two numbers (a
-- fixed window's head and count, GCRA's TAT and interval, a token bucket's tokens taken and
-- last refill). Each number is an integer below 2^53 kept as a little-endian 8-byte double,
-- which struct reads and writes without the byte-by-byte work of its integers (Redis
-- instructions per fixed window and GCRA decision, big-endian integers then doubles: 45,736 ->
-- 41,131, see the bench's README).
--
-- A check whose grouped policies are aligned fixed windows, GCRA or token buckets, beside
-- policies of keys of their own that take at once, is decided on the records' numbers
-- (decide_runs): each key read once and written once, in place (SETRANGE, which keeps its TTL)
-- while its length stays and no deadline passes the key's expiry, else by SET ... PX (see
-- expiry_of). Every other use runs the policy's algorithm unchanged over a virtual Redis
-- (vcall, vpcall) that shows a record as the value a key of its own would hold, on tables
-- read at a key's first use in a call and written once at its end (flush_groups). Records
-- whose deadline has passed read as none, and are dropped when a table is read.
local RECORD_BYTES = 32
-- The key's expiry before its records.
local HEAD_BYTES = 8

-- This call's groups by key (see group_of), and Redis's time.
local groups, redis_now_ms = {}, nil

-- Forgets what this call read of its groups: a library's functions outlive the call.
local function forget_groups()
  groups, redis_now_ms = {}, nil
end

-- Redis's time (ms), read once per call: records expire by it, as keys do.
local function group_now()
  if not redis_now_ms then
    if server_time then
      -- The call's own time is Redis's (clock, in the prelude).
      redis_now_ms = (server_now_us - server_now_us % 1000) / 1000
    else
      local time = redis_call('TIME')
      redis_now_ms = time[1] * 1000 + (time[2] - time[2] % 1000) / 1000
    end
  end
  return redis_now_ms
end

-- The struct formats of n records after head ('<d', a key's expiry then its records; '<', the
-- records alone), made once for each n.
local function formats(head)
  return setmetatable({}, {
    __index = function(made, n)
      local format_of = head .. string.rep('dddd', n)
      made[n] = format_of
      return format_of
    end,
  })
end
local FORMATS, RECORDS = formats('<d'), formats('<')

-- Drops the record whose numbers begin at at + 1 from group, the last moved into its place.
local function drop(group, at)
  local last = 4 * (group.n - 1)
  group[at + 1], group[at + 2], group[at + 3], group[at + 4] =
    group[last + 1], group[last + 2], group[last + 3], group[last + 4]
  group[last + 1], group[last + 2], group[last + 3], group[last + 4] = nil, nil, nil, nil
  group.n = group.n - 1
end

-- A group is one table: its records' numbers in its array part, four a record (id, deadline,
-- a, b), and n (records), written, stored (the key's length as read) and expiry beside them.
local function group_of(key, read)
  local group = groups[key]
  if group then
    return group
  end
  local v = read or redis_call('GET', key)
  if v then
    local size = #v
    if size < HEAD_BYTES or (size - HEAD_BYTES) % RECORD_BYTES ~= 0 then
      corrupt(key, 'is not a key group')
    end
    local n = (size - HEAD_BYTES) / RECORD_BYTES
    group = { struct.unpack(RECORDS[n], v, HEAD_BYTES + 1) }
    group[4 * n + 1] = nil
    group.n, group.written, group.stored, group.expiry = n, false, size, struct.unpack('<d', v)
    -- Every number an integer from -1 (no deadline) below 2^53: bytes of another kind of value
    -- are an error, not records of other policies to keep (NaN fails x == x).
    for i = 0, 4 * n do
      local x = i == 0 and group.expiry or group[i]
      if x ~= x or x % 1 ~= 0 or x < -1 or x >= 2 ^ 53 then
        corrupt(key, 'is not a key group')
      end
    end
    -- Records whose deadline has passed are dropped, the last moved into their place.
    local now, i = group_now(), 1
    while i <= group.n do
      local at = 4 * (i - 1)
      local deadline = group[at + 2]
      if deadline >= 0 and deadline <= now then
        drop(group, at)
      else
        i = i + 1
      end
    end
  else
    group = { n = 0, written = false, stored = nil, expiry = -1 }
  end
  groups[key] = group
  return group
end

-- Where record id's numbers begin in group (its id at at + 1), or nil.
local function slot_of(group, id)
  for at = 0, 4 * (group.n - 1), 4 do
    if group[at + 1] == id then
      return at
    end
  end
  return nil
end

-- Sets record id's numbers and deadline (a nil a deletes it).
local function put(group, id, a, b, deadline)
  local at = slot_of(group, id)
  group.written = true
  if a == nil then
    if at then
      drop(group, at)
    end
    return
  end
  if not at then
    at = 4 * group.n
    group.n, group[at + 1] = group.n + 1, id
  end
  group[at + 2], group[at + 3], group[at + 4] = deadline, a, b
end

-- A virtual key: a table naming its group, record id, group key and how its record reads as a
-- key's value ('text' for a fixed window's count, 'pair' for GCRA's and the token bucket's);
-- a corrupt state's error names it as its group's key.
local VIRTUAL = {
  __concat = function(a, b)
    return (type(a) == 'table' and a[3] or a) .. (type(b) == 'table' and b[3] or b)
  end,
}

-- The virtual key of record id in the group at key, made once per call.
local function virtual(key, id, kind)
  local group = group_of(key)
  group.keys = group.keys or {}
  local name = group.keys[id]
  if not name then
    name = setmetatable({ group, id, key, kind }, VIRTUAL)
    group.keys[id] = name
  end
  return name
end

local WINDOW_PACK = 1000000
local WRONGTYPE = { err = 'WRONGTYPE a key group holds strings only' }
local NOT_INTEGER = { err = 'ERR value is not an integer or out of range' }

-- The value a key of its own would hold for numbers a, b of kind.
local function value_of(kind, a, b)
  if kind == 'pair' then
    return struct.pack(PAIR, a, b)
  elseif a == 0 then
    return format('%d', b)
  end
  return format('%d%06d', a, b)
end

-- The numbers of value for kind; nil where it is not one (a text of digits for 'text').
local function numbers_of(kind, value)
  if kind == 'pair' then
    if #value ~= 16 then
      return nil
    end
    return struct.unpack(PAIR, value)
  end
  if #value > 19 or not string.find(value, '^%d+$') then
    return nil
  end
  if #value <= 6 then
    return 0, value + 0
  end
  return string.sub(value, 1, -7) + 0, string.sub(value, -6) + 0
end

-- The commands the grouped algorithms send, answered as Redis answers them on a key of its
-- own (an error as its table: vcall raises it, vpcall returns it).
local virtual_commands = {
  GET = function(name)
    local group = name[1]
    local i = slot_of(group, name[2])
    return i and value_of(name[4], group[i + 3], group[i + 4]) or false
  end,
  -- The forms the algorithms send: value [NX] [GET] [PX ms | KEEPTTL].
  SET = function(name, value, a, b, c, d)
    local group = name[1]
    local i = slot_of(group, name[2])
    local old, get, deadline = i and value_of(name[4], group[i + 3], group[i + 4]), false, -1
    if a == 'NX' then
      if b == 'GET' then
        get, a, b = true, c, d
      else
        a, b = b, c
      end
      if old then
        return get and old or false
      end
    elseif a == 'GET' then
      get, a, b = true, b, c
    end
    if a == 'PX' then
      deadline = group_now() + number(b)
    elseif a == 'KEEPTTL' then
      deadline = i and group[i + 2] or -1
    end
    local x, y = numbers_of(name[4], value)
    if not x then
      return WRONGTYPE
    end
    put(group, name[2], x, y, deadline)
    if get then
      return old or false
    end
    return { ok = 'OK' }
  end,
  DEL = function(name)
    if not slot_of(name[1], name[2]) then
      return 0
    end
    put(name[1], name[2], nil)
    return 1
  end,
  INCRBY = function(name, by)
    local group = name[1]
    if name[4] ~= 'text' then
      return NOT_INTEGER
    end
    local i = slot_of(group, name[2])
    local a, b, deadline = 0, number(by), -1
    if i then
      a, b, deadline = group[i + 3], group[i + 4] + b, group[i + 2]
    end
    local carry = floor(b / WINDOW_PACK)
    a, b = a + carry, b - carry * WINDOW_PACK
    put(group, name[2], a, b, deadline)
    return a * WINDOW_PACK + b
  end,
  PEXPIRE = function(name, ms)
    local group = name[1]
    local i = slot_of(group, name[2])
    if not i then
      return 0
    end
    put(group, name[2], group[i + 3], group[i + 4], group_now() + number(ms))
    return 1
  end,
  PTTL = function(name)
    local group = name[1]
    local i = slot_of(group, name[2])
    if not i then
      return -2
    end
    local deadline = group[i + 2]
    return deadline < 0 and -1 or deadline - group_now()
  end,
  TYPE = function(name)
    return { ok = slot_of(name[1], name[2]) and 'string' or 'none' }
  end,
  HMGET = function(name)
    if slot_of(name[1], name[2]) then
      return WRONGTYPE
    end
    return { false, false }
  end,
}
virtual_commands.DECRBY = function(name, by)
  return virtual_commands.INCRBY(name, -number(by))
end
for _, command in ipairs({ 'HINCRBY', 'HSET', 'HGETALL', 'SETRANGE', 'ZADD', 'ZCARD' }) do
  virtual_commands[command] = function()
    return WRONGTYPE
  end
end

-- The command on the record a virtual key names, its error returned.
local function vpcall(command, name, a, b, c, d, e)
  return virtual_commands[command](name, a, b, c, d, e)
end

-- The command on the record a virtual key names, its error raised.
local function vcall(command, name, a, b, c, d, e)
  local reply = virtual_commands[command](name, a, b, c, d, e)
  if type(reply) == 'table' and reply.err then
    error(reply)
  end
  return reply
end

-- A grouped aligned fixed window's, GCRA's or token bucket's decision (p) on its record's
-- numbers a, b (nil where it has none) kept until deadline, at now (ms), now_us and redis_now
-- (ms of Redis time, the deadlines' clock), for cost: allowed, remaining, reset, retry, then
-- when admitted the quota after it and the record's new numbers and deadline. Their alones'
-- arithmetic again, on numbers instead of a key's value, for speed (see decide_runs); the
-- parity suite holds both to the memory backend's decisions.
local function decide_member(key, p, a, b, deadline, now, now_us, cost, redis_now)
  if p.window_numbers then
    -- A fixed window: its head (window number) and count.
    local window, limit = p.window, p.limit
    -- Exact: now and window are integers below 2^53.
    local index = (now - now % window) / window
    local head, n = index, 0
    if a and a >= index then
      -- A check stamped before the stored window (a clock that stepped back) counts in it.
      head, n = a, b
    end
    local finish = (head + 1) * window
    local remaining, reset = limit, 0
    if n > 0 then
      remaining, reset = max(limit - n, 0), finish - now
    end
    if cost > limit then
      return 0, remaining, reset, NEVER
    elseif n + cost > limit then
      return 0, remaining, reset, finish - now
    end
    return 1, remaining, reset, -1, limit - n - cost, finish - now, head, n + cost,
      n == 0 and redis_now + finish - now or deadline
  end
  if p.bucket then
    -- A token bucket: the tokens taken (x window) and the last refill.
    local rate, window, burst = p.limit, p.window, p.burst
    local used, last = 0, now
    if a then
      used, last = a, b
      if last < now then
        if now - last >= ceil_div(used, rate) then
          used, last = 0, now
        else
          used, last = used - (now - last) * rate, now
        end
      end
    end
    -- Refills count from last, later than now when time stepped back.
    local lag = last - now
    local allowed, remaining, reset, retry = bucket_answer(used, lag, rate, window, burst, cost)
    if allowed == 0 then
      return 0, remaining, reset, retry
    end
    used = used + cost * window
    local new_reset = lag + ceil_div(used, rate)
    return 1, remaining, reset, -1, div(max(burst * window - used, 0), window), new_reset, used, last,
      redis_now + new_reset
  end
  -- GCRA: its TAT and the interval that reached it.
  local interval, burst = p.interval, p.burst
  local tolerance, tat = burst * interval, now_us
  if a then
    if b == 0 then
      corrupt(key, 'is not a GCRA state')
    end
    if a > now_us then
      tat = b == interval and a or now_us + ceil((a - now_us) * interval / b)
    end
  end
  -- Floors of non-negative quotients by arithmetic, not math.floor: a call costs Redis some 300
  -- instructions (a quotient of integers below 2^53 by one above 0 floors exactly so).
  local owed = tat - now_us
  local left = tolerance > owed and (tolerance - owed) / interval or 0
  local remaining, reset = left - left % 1, (owed + 999) / 1000
  reset = reset - reset % 1
  if cost > burst then
    return 0, remaining, reset, NEVER
  end
  local new_owed = owed + cost * interval
  if new_owed > tolerance then
    local wait = (new_owed - tolerance + 999) / 1000
    return 0, remaining, reset, wait - wait % 1
  end
  local new_reset, after = (new_owed + 999) / 1000, (tolerance - new_owed) / interval
  new_reset, after = new_reset - new_reset % 1, after - after % 1
  return 1, remaining, reset, -1, after, new_reset, now_us + new_owed, interval, redis_now + new_reset
end

-- The expiry of a group's key of size bytes whose records' latest deadline is latest, where
-- it held stored bytes (nil for none) until stored_expiry (-1 for none); and whether its write
-- goes in place, keeping its TTL. A new expiry is twice as far as the latest deadline, so that
-- the next writes (whose deadlines move on, as a GCRA's TAT does) go in place: a key lives at
-- most twice as long as its state matters, for one SET ... PX where each write was one.
local function expiry_of(latest, size, stored, stored_expiry, redis_now)
  if size == stored and latest <= stored_expiry then
    return stored_expiry, true
  end
  return latest + (latest - redis_now), false
end

-- Writes v, packed with its expiry, at key: in place, else with that expiry (deleted where
-- it has passed).
local function write_group(key, v, expiry, in_place, redis_now)
  if in_place then
    -- A text, not the number 0, which Redis would format as a double for each call.
    redis_call('SETRANGE', key, '0', v)
    return
  end
  local ttl = expiry - redis_now
  if ttl <= 0 then
    redis_call('DEL', key)
  else
    redis_call('SET', key, v, 'PX', format('%d', ttl))
  end
end

-- Decides members i on of a request of cost > 0 of set (set.runs: its grouped policies aligned
-- fixed windows, GCRA or token buckets, the others of keys of their own that take at once) at
-- now_us, as decide_alone in check.lua does with their alones and untakes: replies in out after
-- base, keys from keys[k]; a check takes only when every policy admits (may_take: those before
-- member i admitted). A grouped key's one or two members (side by side in the set) are decided
-- on its records' numbers, in locals: a GET and a write a key, no table. Its write waits for the
-- later members' decisions, the recursion's. Returns whether members i on admitted, or nil
-- where the key holds other records, this call has read it through the virtual Redis or its
-- members are apart in the set: decide_group decides the check another way, and nothing stays
-- written or taken. Redis instructions per fixed window and GCRA decision of one group
-- (`redlimit-bench --mode instructions --decisions 40000 --only fixed_window+gcra_one_key`):
-- 79,264-96,775 through the virtual Redis, 43,679 here.
local function decide_runs(set, out, base, k, i, now_us, cost, keys, may_take)
  local n = #set
  local key, p = keys[k + i - 1], set[i]
  if not p.group then
    -- A policy of a key of its own, decided and taken by its alone, given back by its untake
    -- where a later policy denies, as in decide_alone.
    local allowed, remaining, reset, retry
    if may_take then
      allowed, remaining, reset, retry = p.alone(key, p.limit, p.window, p.burst, now_us, cost, nil, p.slack)
      -- Marked at once, for a failure at a later policy to give back (give_back_taken).
      out[base + 4 * i - 3] = allowed
    else
      allowed, remaining, reset, retry = p.decide(key, p.limit, p.window, p.burst, now_us, cost, p.slack)
    end
    local admitted = allowed == 1
    local rest = i >= n or decide_runs(set, out, base, k, i + 1, now_us, cost, keys, may_take and admitted)
    if may_take and admitted and not rest then
      -- Given back where a later policy denied, or before the check is decided another way.
      remaining, reset = p.untake(key, p.limit, p.window, p.burst, now_us, cost)
    end
    if rest == nil then
      out[base + 4 * i - 3] = nil
      return nil
    end
    local r = base + 4 * i
    out[r - 3], out[r - 2], out[r - 1], out[r] = allowed, remaining, reset, retry
    return admitted and rest
  end
  local j = i < n and keys[k + i] == key and set[i + 1].group and i + 1 or i
  if groups[key] or (j < n and keys[k + j] == key) then
    return nil
  end
  -- A key whose members are apart in the set: the tables' way, which writes it once.
  for m = 1, i - 1 do
    if keys[k + m - 1] == key then
      return nil
    end
  end
  local q = set[j]
  local v = redis_call('GET', key)
  local redis_now = redis_now_ms or group_now()
  local pa, pb, pd, qa, qb, qd, stored_expiry = nil, nil, -1, nil, nil, -1, -1
  local size = j > i and 2 or 1
  if v then
    if #v ~= HEAD_BYTES + size * RECORD_BYTES then
      -- The tables' way, from what was read.
      group_of(key, v)
      return nil
    end
    local expiry, id1, d1, a1, b1, id2, d2, a2, b2 = struct.unpack(FORMATS[size], v)
    if size == 2 and id1 == q.group then
      id1, d1, a1, b1, id2, d2, a2, b2 = id2, d2, a2, b2, id1, d1, a1, b1
    end
    if id1 ~= p.group or d1 < 0 or (size == 2 and (id2 ~= q.group or d2 < 0)) then
      group_of(key, v)
      return nil
    end
    -- Records whose deadline has passed read as none.
    stored_expiry = expiry
    if d1 > redis_now then
      pa, pb, pd = a1, b1, d1
    end
    if size == 2 then
      if d2 > redis_now then
        qa, qb, qd = a2, b2, d2
      end
    end
  end
  local now = ms_of(now_us)
  local allowed, remaining, reset, retry, after, after_reset, na, nb, nd =
    decide_member(key, p, pa, pb, pd, now, now_us, cost, redis_now)
  local q_allowed, q_remaining, q_reset, q_retry, q_after, q_after_reset, qna, qnb, qnd = 1
  if j > i then
    q_allowed, q_remaining, q_reset, q_retry, q_after, q_after_reset, qna, qnb, qnd =
      decide_member(key, q, qa, qb, qd, now, now_us, cost, redis_now)
  end
  local admitted = allowed == 1 and q_allowed == 1
  -- The last key ends the recursion without a call.
  local rest = j >= n or decide_runs(set, out, base, k, j + 1, now_us, cost, keys, may_take and admitted)
  if rest == nil then
    return nil
  end
  if may_take and admitted and rest then
    remaining, reset, q_remaining, q_reset = after, after_reset, q_after, q_after_reset
    local latest = j > i and qnd > nd and qnd or nd
    local expiry, in_place = expiry_of(latest, HEAD_BYTES + size * RECORD_BYTES, v and #v, stored_expiry, redis_now)
    if j > i then
      write_group(key, struct.pack(FORMATS[2], expiry, p.group, nd, na, nb, q.group, qnd, qna, qnb), expiry, in_place,
        redis_now)
    else
      write_group(key, struct.pack(FORMATS[1], expiry, p.group, nd, na, nb), expiry, in_place, redis_now)
    end
  end
  local r = base + 4 * i
  out[r - 3], out[r - 2], out[r - 1], out[r] = allowed, remaining, reset, retry
  if j > i then
    out[r + 1], out[r + 2], out[r + 3], out[r + 4] = q_allowed, q_remaining, q_reset, q_retry
  end
  return admitted and rest
end

-- Decides a request as decide_runs does (see there), on each group's table where it cannot.
-- Returns where the next request's keys begin.
local taken_a, taken_b, taken_deadline = {}, {}, {}
local function decide_group(set, out, base, k, now_us, cost, keys)
  if decide_runs(set, out, base, k, 1, now_us, cost, keys, true) ~= nil then
    return k + #set
  elseif not set.arithmetic then
    -- Some policies of keys of their own: decide_alone's way (check.lua).
    return nil
  end
  local now, admitted = ms_of(now_us), true
  for i = 1, #set do
    local p, key, r = set[i], keys[k + i - 1], base + 4 * i
    local group = group_of(key)
    local slot = slot_of(group, p.group)
    local a, b, deadline = nil, nil, -1
    if slot then
      a, b, deadline = group[slot + 3], group[slot + 4], group[slot + 2]
    end
    local allowed, remaining, reset, retry, after, after_reset, na, nb, nd =
      decide_member(key, p, a, b, deadline, now, now_us, cost, group_now())
    out[r - 3], out[r - 2], out[r - 1], out[r] = allowed, remaining, reset, retry
    if allowed == 1 then
      taken_a[i], taken_b[i], taken_deadline[i], taken_a[-i], taken_b[-i] = na, nb, nd, after, after_reset
    else
      admitted = false
    end
  end
  if admitted then
    for i = 1, #set do
      local r = base + 4 * i
      out[r - 2], out[r - 1] = taken_a[-i], taken_b[-i]
      put(group_of(keys[k + i - 1]), set[i].group, taken_a[i], taken_b[i], taken_deadline[i])
    end
  end
  return k + #set
end

-- Writes each group this call changed, once; forgets the call's groups.
local function flush_groups()
  for key, group in pairs(groups) do
    if group.written then
      local latest, forever = -1, false
      for at = 2, 4 * group.n, 4 do
        local deadline = group[at]
        if deadline < 0 then
          forever = true
        elseif deadline > latest then
          latest = deadline
        end
      end
      if group.n == 0 then
        redis_call('DEL', key)
      elseif forever then
        redis_call('SET', key, struct.pack(FORMATS[group.n], -1, unpack(group, 1, 4 * group.n)))
      else
        local size = HEAD_BYTES + group.n * RECORD_BYTES
        local redis_now = group_now()
        local expiry, in_place = expiry_of(latest, size, group.stored, group.expiry, redis_now)
        write_group(key, struct.pack(FORMATS[group.n], expiry, unpack(group, 1, 4 * group.n)), expiry, in_place,
          redis_now)
      end
    end
  end
  forget_groups()
end
